"""LeaderElector / AsyncLeaderElector against a real etcd: the campaign -> work -> lose ->
re-campaign loop, callbacks and their order, stop(). Both twins (``api``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll, revoke_lease

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()

Events = list[tuple[Any, ...]]


def make_work(api: Api, events: Events, label: str = "") -> Callable[..., Any]:
    """A leader's work: records its token, then runs until stopped (sync: ``stop`` is
    set; async: the coroutine is cancelled)."""
    if api.is_async:

        async def awork(token: ef.FencingToken, stop: asyncio.Event) -> None:
            events.append((label + "work", token))
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                events.append((label + "ended", token, stop.is_set()))
                raise

        return awork

    def work(token: ef.FencingToken, stop: threading.Event) -> None:
        events.append((label + "work", token))
        stop.wait(30)
        events.append((label + "ended", token, stop.is_set()))

    return work


def elector(api: Api, name: str, events: Events, label: str = "", **kw: Any) -> Any:
    return api.Elector(
        api.client,
        name,
        identity=kw.pop("identity", "node-a"),
        ttl=kw.pop("ttl", 2),
        on_elected=lambda token: events.append((label + "elected", token)),
        on_lost=lambda: events.append((label + "lost",)),
        retry_interval=0.05,
        **kw,
    )


def kinds(events: Events) -> list[str]:
    return [e[0] for e in events]


async def test_run_calls_work_with_the_token_and_stop_resigns(
    api: Api, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/svc"
    events: Events = []
    el = elector(api, name, events)
    run = api.spawn(el.run, make_work(api, events))
    try:
        await poll(lambda: "work" in kinds(events), what="work to start")
        token = events[0][1]
        assert events == [("elected", token), ("work", token)]
        assert isinstance(token, ef.FencingToken) and el.is_leader() and el.token == token
        leader = await api(api.client.leader, name)
        assert (leader.key, leader.value) == (token.key, b"node-a")
        assert token.value >= leader.create_revision == token.create_revision
        el.stop()
        await asyncio.wait_for(run, 5)
    finally:
        el.stop()
    assert events == [("elected", token), ("work", token), ("ended", token, True), ("lost",)]
    assert not el.is_leader() and el.token is None
    assert await api(api.client.leader, name) is None  # resigned
    assert await keys_under(api, name) == []


@pytest.mark.parametrize("how", ["revoke lease", "delete key"])
async def test_lost_leadership_stops_work_and_recampaigns(
    api: Api, etcd_namespace: str, how: str
) -> None:
    name = etcd_namespace + "/svc"
    events: Events = []
    el = elector(api, name, events)
    run = api.spawn(el.run, make_work(api, events))
    try:
        await poll(lambda: "work" in kinds(events), what="first term")
        first = events[0][1]
        if how == "revoke lease":
            await revoke_lease(api, first.lease_id)
        else:
            await api(api.client.delete, first.key)
        await poll(lambda: kinds(events).count("work") == 2, timeout=5, what="second term")
        second = events[-1][1]
        assert kinds(events) == ["elected", "work", "ended", "lost", "elected", "work"]
        assert events[2] == ("ended", first, True)  # stop set / task cancelled
        assert second > first and second.key != first.key  # a fresh session, a new term
        assert el.terms == 2 and el.token == second
        leader = await api(api.client.leader, name)
        assert leader.key == second.key
        el.stop()
        await asyncio.wait_for(run, 5)
    finally:
        el.stop()
    assert kinds(events)[-2:] == ["ended", "lost"]
    assert await keys_under(api, name) == []


async def test_work_that_returns_is_followed_by_a_new_term(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    events: Events = []
    el = elector(api, name, events)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def finish() -> None:
        if sum(1 for e in events if e[0] == "work") >= 3:
            el.stop()
            loop.call_soon_threadsafe(done.set)

    if api.is_async:

        async def work(token: ef.FencingToken, stop: asyncio.Event) -> None:
            events.append(("work", token))
            finish()

    else:

        def work(token: ef.FencingToken, stop: threading.Event) -> None:  # type: ignore[misc]
            events.append(("work", token))
            finish()

    run = api.spawn(el.run, work)
    try:
        await asyncio.wait_for(done.wait(), 5)
        await asyncio.wait_for(run, 5)
    finally:
        el.stop()
    tokens = [e[1] for e in events if e[0] == "work"]
    assert len(tokens) == 3 and tokens == sorted(set(tokens))
    assert kinds(events) == ["elected", "work", "lost"] * 3


async def test_leader_changes_and_callback_order_across_two_electors(
    api: Api, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/svc"
    events: Events = []
    changes_b: list[ef.Leader | None] = []
    a = elector(api, name, events, "a.", identity="node-a")
    b = elector(api, name, events, "b.", identity="node-b", on_leader_change=changes_b.append)
    run_a = api.spawn(a.run, make_work(api, events, "a."))
    try:
        await poll(lambda: "a.work" in kinds(events), what="a leads")
        run_b = api.spawn(b.run, make_work(api, events, "b."))
        await poll(lambda: _count_is(api, name, 2), what="b queued")
        await poll(lambda: changes_b, what="b observing")
        assert "b.elected" not in kinds(events)
        a.stop()
        await asyncio.wait_for(run_a, 5)
        await poll(lambda: "b.work" in kinds(events), what="b leads")
        ta, tb = events[0][1], events[-1][1]
        assert tb > ta
        # a ends, steps down, and only then is b elected
        assert kinds(events) == ["a.elected", "a.work", "a.ended", "a.lost", "b.elected", "b.work"]
        await poll(lambda: len(changes_b) >= 2, what="b seeing the change")
        seen = [(c.key, c.value) if c else None for c in changes_b]
        assert seen[:2] == [(ta.key, b"node-a"), (tb.key, b"node-b")]
        b.stop()
        await asyncio.wait_for(run_b, 5)
    finally:
        a.stop()
        b.stop()
    assert kinds(events)[-2:] == ["b.ended", "b.lost"]
    assert await api(api.client.leader, name) is None


async def _count_is(api: Api, name: str, count: int) -> bool:
    return len(await keys_under(api, name)) == count


async def test_stop_before_election_ends_a_waiting_campaign(api: Api, etcd_namespace: str) -> None:
    """stop() interrupts a candidate that is still queued: run returns, its key goes."""
    name = etcd_namespace + "/svc"
    events: Events = []
    async with api.session(ttl=5) as other:
        await api(other.election(name).campaign, b"incumbent")
        el = elector(api, name, events)
        run = api.spawn(el.run, make_work(api, events))
        try:
            await poll(lambda: _count_is(api, name, 2), what="queued")
            el.stop()
            await asyncio.wait_for(run, 5)
        finally:
            el.stop()
        assert events == []
        assert len(await keys_under(api, name)) == 1


async def test_bad_arguments(api: Api) -> None:
    with pytest.raises(ValueError):
        api.Elector(api.client, "", identity="a")
    with pytest.raises(TypeError):
        api.Elector(api.client, 5, identity="a")
    with pytest.raises(ValueError):
        api.Elector(api.client, "svc", identity="")
    with pytest.raises(ValueError):
        api.Elector(api.client, "svc", identity="a", ttl=0)


@pytest.mark.timeout(120)
def test_release_false_is_never_undone_by_a_concurrent_limit_release(
    etcd_client: ef.Client,
) -> None:
    """``etcdfence run``'s main thread calls ``limit_release(budget_end)`` every 50 ms
    while shutting down; its elector thread calls ``limit_release(None, release=False)``
    when the command could not be proven dead. ``release=False`` must stick: if a
    concurrent call put ``True`` back (an unlocked read-modify-write did, 29-37 in 500
    trials), the lease would be resigned and revoked while the command may still run.
    Here the other thread is a busy loop, so a race window would be hit often."""
    overwritten = 0
    for i in range(500):
        elector = ef.LeaderElector(etcd_client, "race", identity="a", ttl=5)
        done = threading.Event()

        def main_loop(elector: ef.LeaderElector = elector, done: threading.Event = done) -> None:
            while not done.is_set():
                elector.limit_release(time.monotonic() + 5)

        thread = threading.Thread(target=main_loop)
        thread.start()
        time.sleep(0.0001 * (i % 7))
        elector.limit_release(None, release=False)  # could not prove the command dead
        time.sleep(0.0005)
        done.set()
        thread.join()
        overwritten += bool(elector._release)
    assert overwritten == 0, f"release=False was undone in {overwritten}/500 trials"

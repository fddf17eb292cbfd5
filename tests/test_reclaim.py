"""A session that expired only locally revokes its lease on close, and an elector
with ``reclaim=True`` takes back only keys on its own former leases — never a key on a
lease it did not grant, even one holding its identity (#22 item 7, review). Both
twins, real etcd (through a FaultProxy for the cut)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from _contender_proc import Api, api_fixture, keys_under, lease_ttl, poll
from structlog.testing import capture_logs
from test_elector import Events, elector, kinds, make_work

from etcdfence.testing import FaultProxy

pytestmark = pytest.mark.integration

api = api_fixture()


async def test_a_locally_expired_session_revokes_its_lease_on_close(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """Cut off past its local deadline (TTL 10, margin 6: 4 s) while etcd still holds
    the lease for up to 6 s more; once etcd is reachable again, closing the session
    revokes the lease instead of leaving its keys to block others until the TTL."""
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client(proxy.endpoint, timeout=3)
        session = await api.open_session(10, client=client, margin=6)
        token = await api(session.lock(etcd_namespace + "/l").acquire)
        proxy.blackhole()
        assert await api(session.wait_expired, 10)
        assert "local deadline" in (session.expiry_reason or "")
        proxy.heal()
        proxy.reset()  # bytes were dropped mid-stream: the client dials afresh
        assert await lease_ttl(api, session.lease_id) > 0  # etcd still holds it
        await api.close(session)
        assert await lease_ttl(api, session.lease_id) == -1
        assert await keys_under(api, etcd_namespace + "/l") == []
        assert token.key is not None


async def test_reclaim_never_deletes_the_identity_on_a_lease_it_did_not_grant(
    api: Api, etcd_namespace: str
) -> None:
    """Another session holds identity a and leads — a second process given the same
    identity by mistake, or a frozen earlier instance whose lease runs on. An elector
    for identity a with reclaim=True must not delete that key (it used to, and then
    two works ran at once): it warns ``etcdfence.identity_in_use`` and queues; it
    leads only once the other resigns."""
    name = etcd_namespace + "/svc"
    other_session = await api.open_session(60)
    other = other_session.election(name)
    await api(other.campaign, "a")
    events: Events = []
    el = elector(api, name, events, identity="a", reclaim=True, ttl=5)
    with capture_logs() as logs:
        run = api.spawn(el.run, make_work(api, events))
        try:
            await poll(
                lambda: any(e["event"] == "etcdfence.identity_in_use" for e in logs),
                timeout=10,
                what="the identity_in_use warning",
            )
            await _keys_become(api, name, [b"a", b"a"])  # queued, not reclaimed
            kvs = await api(api.client.get_prefix, name + "/")
            assert kvs[0].lease_id == other_session.lease_id
            await asyncio.sleep(1.0)
            assert "work" not in kinds(events), "led while the other held the identity"
            await api(other.resign)
            await poll(lambda: "work" in kinds(events), timeout=10, what="a leads")
        finally:
            el.stop()
            await api.close(other_session)
        await asyncio.wait_for(run, 10)
    warned = [e for e in logs if e["event"] == "etcdfence.identity_in_use"]
    assert warned[0]["log_level"] == "warning"
    assert warned[0]["lease_id"] == f"{other_session.lease_id:x}"
    assert not any(e["event"] == "etcdfence.stale_key_reclaimed" for e in logs)


async def test_two_reclaiming_electors_with_one_identity_never_lead_together(
    api: Api, etcd_namespace: str
) -> None:
    """Two electors, both identity a and reclaim=True: each campaign must queue behind
    the other's live key, never delete it — at no moment do both lead, and no key of
    the other is ever taken (the delete is what let both lead at once)."""
    name = etcd_namespace + "/svc"
    events: Events = []
    first = elector(api, name, events, "1", identity="a", reclaim=True, ttl=5)
    second = elector(api, name, events, "2", identity="a", reclaim=True, ttl=5)
    both = [0]

    async def awork(token: object, stop: object) -> None:
        await asyncio.sleep(0.3)  # a short term: the elector campaigns again and again

    def swork(token: object, stop: threading.Event) -> None:
        stop.wait(0.3)

    work = awork if api.is_async else swork

    async def watch() -> None:
        while True:
            if first.is_leader() and second.is_leader():
                both[0] += 1
            await asyncio.sleep(0.01)

    with capture_logs() as logs:
        runs = [api.spawn(first.run, work), api.spawn(second.run, work)]
        watcher = asyncio.ensure_future(watch())
        try:
            await poll(lambda: first.terms >= 3 and second.terms >= 3, timeout=30, what="terms")
        finally:
            watcher.cancel()
            first.stop()
            second.stop()
        for run in runs:
            await asyncio.wait_for(run, 10)
    assert both[0] == 0, f"both led at once in {both[0]} samples"
    # a deleted live key is a term cut short while the other already leads
    taken = [e for e in logs if e["event"] == "etcdfence.stale_key_reclaimed"]
    assert taken == [], taken


async def _keys_become(
    api: Api, name: str, values: list[bytes], exclude_lease: int | None = None
) -> None:
    """Wait until the election's keys hold ``values`` in order (none on ``exclude_lease``)."""

    async def now() -> list[tuple[bytes, int]]:
        kvs = await api(api.client.get_prefix, name + "/")
        return [(kv.value, kv.lease_id) for kv in kvs]

    for _ in range(200):
        found = await now()
        if [v for v, _ in found] == values and all(lease != exclude_lease for _, lease in found):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"keys of {name}: {await now()}, wanted {values}")


# ------------------------------------------- 12. a raising on_leader_change is not the end


@pytest.mark.parametrize("error", [RuntimeError, SystemExit, GeneratorExit])
async def test_a_raising_on_leader_change_is_called_again_on_the_next_change(
    api: Api, etcd_namespace: str, error: type[BaseException]
) -> None:
    """The first call raises; the observer goes on: every later change is seen (it
    used to end the observer silently after that one call, in both electors; a
    SystemExit or another BaseException still did after the first fix)."""
    name = etcd_namespace + "/svc"
    seen: list[bytes | None] = []

    def on_leader_change(leader: object) -> None:
        seen.append(None if leader is None else leader.value)  # type: ignore[attr-defined]
        if len(seen) == 1:
            raise error("a bug in the callback")

    others = [await api.open_session(30)]
    elections = [s.election(name) for s in others]
    await api(elections[0].campaign, "x0")
    events: Events = []
    el = elector(api, name, events, identity="a", on_leader_change=on_leader_change)
    run = api.spawn(el.run, make_work(api, events))
    try:
        await poll(lambda: seen == [b"x0"], timeout=10, what="the first (raising) call")
        # x0 resigns: a, queued behind it, leads; the observer must see that change
        await api(elections[0].resign)
        await poll(lambda: "work" in kinds(events), timeout=10, what="a leads")
        await poll(lambda: seen[-1:] == [b"a"], timeout=10, what="the change to a")
    finally:
        el.stop()
        for session in others:
            await api.close(session)
    await asyncio.wait_for(run, 10)
    assert seen[0] == b"x0" and b"a" in seen[1:], seen

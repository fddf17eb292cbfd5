"""Faults against real etcd processes: leases revoked while queued, a leader process
frozen with SIGSTOP past its TTL, a client cut off by a network blackhole, a member of a
3-node cluster killed under a holder. Every test here fails if the protection it checks
is missing."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import pytest
from _contender_proc import (
    Api,
    LineReader,
    api_fixture,
    keys_under,
    lease_ttl,
    poll,
    revoke_lease,
    stop_process,
)

import etcdfence as ef
from etcdfence.history import Event, Layout, parse_events
from etcdfence.testing import FaultProxy
from etcdfence.testing.procs import start

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

api = api_fixture()

#: The contender process (its events: :mod:`etcdfence.history`).
CONTENDER = [sys.executable, "-m", "etcdfence.testing.contender"]


async def _count_is(api: Api, name: str, count: int, client: Any = None) -> bool:
    return len(await keys_under(api, name, client)) == count


async def contend(api: Api, session: Any, kind: str, name: str, value: bytes, **kw: Any) -> Any:
    if kind == "lock":
        return await api(session.lock(name).acquire, **kw)
    return await api(session.election(name).campaign, value, **kw)


async def release(api: Api, session: Any, kind: str, name: str) -> None:
    if kind == "lock":
        await api(session.lock(name).release)
    else:
        await api(session.election(name).resign)


@pytest.mark.parametrize("kind", ["lock", "election"])
async def test_waiter_whose_lease_is_revoked_gets_session_expired(
    api: Api, etcd_namespace: str, kind: str
) -> None:
    """Revoke a queued waiter's lease, then free the lock at once. The waiter wakes,
    finds its key gone and raises SessionExpired — Go's Election.Campaign would report
    leadership here ("phantom leadership"). The long TTL makes sure it is the post-wait
    re-read that catches it, not the keepalive."""
    name = etcd_namespace + "/x"
    waiter_client = await api.new_client()
    calls = api.count_calls(waiter_client)
    async with (
        api.session(ttl=30) as holder,
        api.session(ttl=30, client=waiter_client) as waiter,
    ):
        await contend(api, holder, kind, name, b"holder")
        task = asyncio.ensure_future(contend(api, waiter, kind, name, b"waiter"))
        await poll(lambda: calls["stream:Watch"] == 1, what="waiter parked on its watch")
        await revoke_lease(api, waiter.lease_id)
        await release(api, holder, kind, name)
        started = time.monotonic()
        with pytest.raises(ef.SessionExpired):
            token = await asyncio.wait_for(task, 3)
            pytest.fail(f"a waiter without a lease got {kind} token {token}")
        assert time.monotonic() - started < 2.0  # not the keepalive (every 10 s) noticing
        assert await keys_under(api, name) == []
        assert await api(api.client.leader, name) is None


@pytest.mark.parametrize("kind", ["lock", "election"])
async def test_waiter_whose_lease_is_revoked_while_holder_holds(
    api: Api, etcd_namespace: str, kind: str
) -> None:
    """Revoke the waiter's lease while the holder keeps holding: the waiter's keepalive
    learns the lease is gone and the waiting acquire ends with SessionExpired."""
    name = etcd_namespace + "/x"
    waiter_client = await api.new_client()
    calls = api.count_calls(waiter_client)
    async with (
        api.session(ttl=2) as holder,
        api.session(ttl=2, client=waiter_client) as waiter,
    ):
        held = await contend(api, holder, kind, name, b"holder")
        task = asyncio.ensure_future(contend(api, waiter, kind, name, b"waiter"))
        await poll(lambda: calls["stream:Watch"] == 1, what="waiter parked on its watch")
        await revoke_lease(api, waiter.lease_id)
        with pytest.raises(ef.SessionExpired):
            await asyncio.wait_for(task, 3)
        assert waiter.expired  # it was the keepalive that found out
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [held.key]


async def test_sigstopped_leader_is_fenced_and_learns_it_lost(
    api: Api, etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """A leader process (``python -m etcdfence.testing.contender --mode once``, using the
    same twin as the test) frozen with SIGSTOP past its 1 s TTL: the next leader gets a
    higher token; after SIGCONT the old leader reports the loss and its late write (the
    one it makes with its old token after the loss) bounces at the resource.

    The freeze races with the leader's own keepalives: on a busy machine its session
    may expire before the SIGSTOP lands (it then makes its late write before the
    successor exists, which is legitimately accepted). Each event carries the session's
    local deadline: the strict checks apply when the SIGSTOP was sent before it (the
    leader was frozen while it still led); either way nothing it wrote may land after
    the successor's write."""
    layout = Layout(etcd_namespace)
    args = ["--endpoints", ",".join(etcd_endpoints), "--root", layout.root, "--id", "zombie"]
    args += ["--ttl", "1", "--api", api.kind, "--mode", "once"]
    proc = start([*CONTENDER, *args])
    out = LineReader(proc.stdout)
    events: list[Event] = []

    async def take(timeout: float = 5.0) -> bool:
        """Read one more line into ``events``; False at the end of its output."""
        line = await out.aline(timeout=timeout)
        if line is None:
            return False
        events.extend(parse_events([line]))
        return True

    def kinds() -> set[str]:
        return {e.kind for e in events}

    try:
        while "elected" not in kinds():
            assert await take(15), f"it exited unelected; output: {out.seen}"
        elected = next(e for e in events if e.kind == "elected")
        assert elected.token is not None and elected.lease is not None, elected
        old = ef.FencingToken(elected.token)
        while not kinds() & {"accepted", "rejected", "unknown", "lost"}:  # it is writing
            assert await take(), f"it exited before writing; output: {out.seen}"
        events.extend(parse_events(out.ready()))
        proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        # Frozen while it still led: it cannot have seen its loss (or written after it).
        deadline = max((e.deadline or 0.0 for e in events if e.kind == "accepted"), default=0)
        frozen_leading = "lost" not in kinds() and stopped + 0.01 < deadline

        guard = layout.guard(api.client, "res")
        data_key = layout.data_key("res")
        async with api.session(ttl=5) as session:
            new = await contend(api, session, "election", layout.election, b"successor",
                                timeout=10)  # fmt: skip
            assert new > old
            # it got in because the frozen leader's lease ran out, not by any other way
            assert await lease_ttl(api, elected.lease) == -1
            await api(guard.put, new, data_key, b"successor")

            proc.send_signal(signal.SIGCONT)
            while await take():  # it exits after the late write
                pass
            lost = next((i for i, e in enumerate(events) if e.kind == "lost"), None)
            assert lost is not None, f"it never reported the loss: {out.seen}"
            late = [e for e in events[lost:] if e.kind in ("accepted", "rejected", "unknown")]
            assert late, f"no late write after the loss: {out.seen}"
            if frozen_leading:  # its late write came after the successor's: it bounced
                assert late[-1].kind == "rejected" and late[-1].current == new.value, late
            # nothing it wrote landed after the successor's write: the successor's data stands
            assert await api(guard.current) == new.value
            assert (await api(api.client.get, data_key)).value == b"successor"
            assert await asyncio.to_thread(proc.wait, 10) == 0
            leader = await api(api.client.leader, layout.election)
            assert leader is not None and leader.key == new.key
    finally:
        stop_process(proc, signal.SIGCONT)
        stop_process(proc)


async def test_blackholed_session_expires_locally_before_anyone_else_acquires(
    api: Api, etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """Cut the holder off from etcd: its session must declare itself expired (callbacks
    run) before etcd expires the lease and hands the lock to a waiter."""
    name = etcd_namespace + "/lock"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        cut_off = await api.new_client([proxy.endpoint], timeout=2.0)
        victim = await api.open_session(ttl=2, client=cut_off)
        expired_at: list[float] = []
        victim.on_expired(lambda: expired_at.append(time.monotonic()))
        held = await api(victim.lock(name).acquire)
        async with api.session(ttl=5) as other:
            waiting = api.spawn(other.lock(name).acquire)
            await poll(lambda: _count_is(api, name, 2), what="waiter queued")
            proxy.blackhole()
            cut = time.monotonic()
            token = await asyncio.wait_for(waiting, 10)
            acquired_at = time.monotonic()
            assert victim.expired
            assert expired_at, "on_expired did not run"
            assert expired_at[0] < acquired_at, "the lock changed hands before local expiry"
            assert cut < expired_at[0] <= cut + victim.ttl  # and not long before
            assert token > held
            proxy.heal()
            await api.close(victim)
            assert expired_at == expired_at[:1]


async def test_blackholed_elector_stops_work_before_the_successor_starts(
    api: Api, etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """The elector of a cut-off process stops its work (stop set / task cancelled)
    before a second elector, connected directly, is elected."""
    name = etcd_namespace + "/svc"
    stamps: dict[str, float] = {}

    def elected(label: str) -> Any:
        return lambda token: stamps.setdefault(label + ".elected", time.monotonic())

    def lost(label: str) -> Any:
        return lambda: stamps.setdefault(label + ".lost", time.monotonic())

    if api.is_async:

        async def work(token: Any, stop: asyncio.Event) -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                stamps.setdefault("a.work_ended", time.monotonic())

    else:

        def work(token: Any, stop: Any) -> None:  # type: ignore[misc]
            stop.wait(30)
            stamps.setdefault("a.work_ended", time.monotonic())

    with FaultProxy(etcd_endpoints[0]) as proxy:
        cut_off = await api.new_client([proxy.endpoint], timeout=2.0)
        a = api.Elector(cut_off, name, identity="a", ttl=2, retry_interval=0.05,
                        on_elected=elected("a"), on_lost=lost("a"))  # fmt: skip
        b = api.Elector(api.client, name, identity="b", ttl=2, retry_interval=0.05,
                        on_elected=elected("b"), on_lost=lost("b"))  # fmt: skip
        run_a = api.spawn(a.run, work)
        try:
            await poll(lambda: "a.elected" in stamps, what="a elected")

            async def idle(token: Any, stop: Any) -> None:
                await asyncio.sleep(3600)

            run_b = api.spawn(b.run, idle if api.is_async else (lambda t, stop: stop.wait(30)))
            await poll(lambda: _count_is(api, name, 2), what="b queued")
            proxy.blackhole()
            await poll(lambda: "b.elected" in stamps, timeout=10, what="b elected")
            await poll(lambda: "a.lost" in stamps, what="a lost")
            assert stamps["a.work_ended"] < stamps["b.elected"]
            assert stamps["a.lost"] < stamps["b.elected"]
            a.stop()
            b.stop()
            proxy.heal()
            await asyncio.wait_for(run_b, 5)
            await asyncio.wait_for(run_a, 10)
        finally:
            a.stop()
            b.stop()
            proxy.heal()


@pytest.mark.cluster
async def test_holder_keeps_its_lock_when_its_etcd_member_dies(
    api: Api, etcd_namespace: str, etcd_cluster: Any
) -> None:
    """Kill the member the holder talks to — the raft leader, so the cluster must elect
    a new one too: the keepalive fails over to another member and is acknowledged
    there, the lock is kept (no spurious expiry, no handoff), and the queued waiter is
    not woken until the holder releases.

    The TTL must leave room for the failover: the session expires TTL - margin after
    the send time of its last acknowledged keepalive, which may be one keepalive
    interval (TTL/3) before the kill, and the cluster needs up to two election
    timeouts (1 s here) to elect a new leader before any member renews a lease. TTL 5
    leaves 2.8 s; TTL 2 left 1.1 s, which a busy machine overran."""
    ttl = 5
    name = etcd_namespace + "/lock"
    victim = etcd_cluster.wait_for_leader()
    endpoints = etcd_cluster.endpoints
    others = [e for i, e in enumerate(endpoints) if i != victim]
    client = await api.new_client([endpoints[victim], *others], timeout=2.0)
    other = await api.new_client(others, timeout=2.0)
    holder = await api.open_session(ttl=ttl, client=client)
    waiter = await api.open_session(ttl=ttl, client=other)
    try:
        token = await api(holder.lock(name).acquire)
        waiting = api.spawn(waiter.lock(name).acquire)
        await poll(lambda: _count_is(api, name, 2, client=other), what="waiter queued")
        etcd_cluster.kill(victim)
        killed = time.monotonic()
        # A keepalive sent after the kill was acknowledged (the deadline is its send
        # time + TTL - margin), or the session expired first.
        renewed = killed + ttl - holder.margin
        await poll(
            lambda: holder.expired or holder.deadline > renewed,
            timeout=ttl,
            what="a keepalive acknowledged after the kill, or the session's expiry",
        )
        assert not holder.expired, "the session expired while the cluster failed over"
        assert not waiting.done()
        assert await lease_ttl(api, holder.lease_id, client=other) > 0
        assert await api(holder.lock(name).is_owner)
        await api(holder.lock(name).release)
        second = await asyncio.wait_for(waiting, 5)
        assert second > token
    finally:
        await api.close(holder)
        await api.close(waiter)
        etcd_cluster.restart(victim)

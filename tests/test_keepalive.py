"""One LeaseKeepAlive stream per client (issue #12): many sessions share it, and what
happens to one lease touches only its own session. Real etcd, both twins."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, lease_ttl, poll, revoke_lease, twins

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()


async def test_sessions_of_one_client_share_one_keepalive_stream(api: Api) -> None:
    client = await api.new_client()
    opened: list[str] = []
    client.on_call(lambda r: opened.append(r.method) if r.method.startswith("stream:") else None)
    sessions = [await api.open_session(ttl=2, client=client) for _ in range(20)]
    try:
        await asyncio.sleep(2.5)  # longer than the TTL: every lease must have been renewed
        assert not any(s.expired for s in sessions)
        assert opened.count("stream:LeaseKeepAlive") == 1, opened
        assert all(s.keepalives_sent >= 2 for s in sessions)
        for session in sessions[:3]:
            assert await lease_ttl(api, session.lease_id) > 0
    finally:
        for session in sessions:
            await api.close(session)


async def test_one_revoked_lease_expires_only_its_session(api: Api) -> None:
    client = await api.new_client()
    sessions = [await api.open_session(ttl=2, client=client) for _ in range(5)]
    try:
        victim = sessions[2]
        await revoke_lease(api, victim.lease_id)
        assert await api(victim.wait_expired, 3.0)
        await asyncio.sleep(2.5)
        assert [s.expired for s in sessions] == [False, False, True, False, False]
    finally:
        for session in sessions:
            await api.close(session)


async def test_an_orphaned_session_expires_locally_while_the_others_live_on(api: Api) -> None:
    client = await api.new_client()
    keep = await api.open_session(ttl=2, client=client)
    orphan = await api.open_session(ttl=2, client=client)
    try:
        await api(orphan.orphan)
        started = time.monotonic()
        assert await api(orphan.wait_expired, 3.0)
        assert time.monotonic() - started < 2.0  # by its local deadline (TTL − margin)
        await asyncio.sleep(1.0)
        assert not keep.expired
    finally:
        await api.close(keep)
        await api.close(orphan)


@pytest.mark.timeout(180)
async def test_a_thousand_sessions_on_one_async_client_stay_alive(
    etcd_endpoints: list[str],
) -> None:
    """The cliff of 0.1 (every session its own stream: 2,000 sessions all expired) is
    gone: 1,000 TTL-3 sessions enqueue at once on one client and none expires."""
    async with ef.AsyncClient(etcd_endpoints, timeout=30) as client:
        streams: list[str] = []
        client.on_call(
            lambda r: streams.append(r.method) if r.method == "stream:LeaseKeepAlive" else None
        )
        sessions: list[Any] = [client.session(ttl=3) for _ in range(1000)]
        await asyncio.gather(*(s.open() for s in sessions))
        try:
            await asyncio.sleep(4.0)
            expired = [s for s in sessions if s.expired]
            assert not expired, f"{len(expired)} of 1000 sessions expired"
            assert streams == ["stream:LeaseKeepAlive"]
        finally:
            await asyncio.gather(*(s.aclose() for s in sessions))


@pytest.mark.cluster
async def test_keepalives_fail_over_from_a_frozen_member(etcd_cluster: Any) -> None:
    """A member that stops answering (SIGSTOP) costs no lease: the shared stream moves
    to a healthy member within half a keepalive interval."""
    endpoints = list(etcd_cluster.endpoints)
    async with ef.AsyncClient(endpoints, timeout=5) as client:
        sessions = [client.session(ttl=3) for _ in range(10)]
        await asyncio.gather(*(s.open() for s in sessions))
        first = endpoints.index(client.endpoint)
        etcd_cluster.pause(first)
        try:
            await asyncio.sleep(4.0)
            assert not any(s.expired for s in sessions)
            await poll(lambda: client.endpoint != endpoints[first], what="fail-over")
        finally:
            etcd_cluster.resume(first)
            await asyncio.gather(*(s.aclose() for s in sessions))


async def _call(client: Any, fn: Any, *args: Any) -> Any:
    """Await the asyncio twin's coroutine, or run the sync twin's call in a thread."""
    if isinstance(client, ef.AsyncClient):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)


async def _until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("twin", twins())
async def test_a_silent_member_is_judged_by_the_strictest_patience(
    etcd_cluster: Any, twin: str
) -> None:
    """Sessions of TTL 60 and 10 on one client; the member goes silent (SIGSTOP) just
    before the 60 s lease's keepalive, so that keepalive is the oldest unanswered one and
    waits 10 s for its answer. The 10 s lease's keepalive, sent right after it, has 1.7 s
    of patience: the stream fails over by then and the TTL-10 session survives (judged by
    the 60 s lease's patience, it expired at its deadline while two members were fine)."""
    endpoints = list(etcd_cluster.endpoints)
    client: Any = (ef.AsyncClient if twin == "async" else ef.Client)(endpoints, timeout=5)
    long: Any = client.session(60)
    short: Any = client.session(10)
    paused: int | None = None
    try:
        await _call(client, long.open)
        kept: Any = long._kept
        await poll(lambda: kept.sent >= 1, 10, "the first keepalive of the TTL-60 lease")
        due = kept.next_due  # the TTL-60 lease's next keepalive (every 20 s)
        # the TTL-10 lease keeps alive every 3.33 s: open it so that its first keepalive
        # leaves 0.3 s after the TTL-60 lease's, both into the silence
        await _until(due - 10 / 3 + 0.3)
        await _call(client, short.open)
        assert short.deadline < due + 7.0  # granted before the silence: expires by then
        await _until(due - 0.4)
        paused = endpoints.index(client.endpoint)
        etcd_cluster.pause(paused)
        await _until(due + 7.5)  # past the TTL-10 deadline as of the silence
        assert not short.expired, short.expiry_reason
        assert not long.expired, long.expiry_reason
        assert client.endpoint != endpoints[paused]
    finally:
        if paused is not None:
            etcd_cluster.resume(paused)
        for session in (short, long):
            await _call(client, session.aclose if twin == "async" else session.close)
        await _call(client, client.aclose if twin == "async" else client.close)

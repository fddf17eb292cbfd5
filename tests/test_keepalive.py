"""One LeaseKeepAlive stream per client (issue #12): many sessions share it, and what
happens to one lease touches only its own session. Real etcd, both twins."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, lease_ttl, poll, revoke_lease

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

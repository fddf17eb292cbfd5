"""Every watch of a client on one Watch stream (issue #12): routed by id, resumed each
from its own revision after a break, compaction reported only to the watch it hits.
Real etcd, both twins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, poll

import etcdfence as ef
from etcdfence.testing import FaultProxy

pytestmark = pytest.mark.integration

api = api_fixture()


def count_streams(client: Any, name: str) -> list[str]:
    opened: list[str] = []
    client.on_call(lambda r: opened.append(r.method) if r.method == f"stream:{name}" else None)
    return opened


async def _collect(api: Api, watch: Any, count: int) -> list[bytes]:
    values: list[bytes] = []
    while len(values) < count:
        batch = await api(watch.get, 5.0)
        values.extend(ev.kv.value for ev in batch.events)
    return values


async def test_many_watches_share_one_stream_and_each_gets_its_own_events(
    api: Api, etcd_namespace: str
) -> None:
    client = await api.new_client()
    opened = count_streams(client, "Watch")
    watches = [client.watch(f"{etcd_namespace}/k{i}") for i in range(30)]
    for watch in watches:
        await api(watch.start)
    try:
        for i in range(30):
            await api(api.client.put, f"{etcd_namespace}/k{i}", f"v{i}")
        for i, watch in enumerate(watches):
            assert await _collect(api, watch, 1) == [f"v{i}".encode()]
        assert opened == ["stream:Watch"]
        # cancelling one leaves the others working
        await api.close(watches[0])
        await api(api.client.put, f"{etcd_namespace}/k1", "again")
        assert await _collect(api, watches[1], 1) == [b"again"]
    finally:
        for watch in watches:
            await api.close(watch)


async def test_every_watch_resumes_from_its_own_revision_after_a_reset(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint])
        a = client.watch(etcd_namespace + "/a")
        b = client.watch(etcd_namespace + "/b")
        await api(a.start)
        await api(b.start)
        try:
            await api(api.client.put, etcd_namespace + "/a", "a1")
            assert await _collect(api, a, 1) == [b"a1"]  # a is ahead of b now
            proxy.reset()
            await api(api.client.put, etcd_namespace + "/a", "a2")
            await api(api.client.put, etcd_namespace + "/b", "b1")
            assert await _collect(api, a, 1) == [b"a2"]  # no repeat of a1, nothing lost
            assert await _collect(api, b, 1) == [b"b1"]
        finally:
            await api.close(a)
            await api.close(b)


async def test_compaction_reaches_only_the_watch_it_hits(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    client = await api.new_client()
    await api(api.client.put, etcd_namespace + "/old", "x")
    old = await api(api.client.revision)
    for _ in range(3):
        await api(api.client.put, etcd_namespace + "/filler", "y")
    await api(api.client.compact, await api(api.client.revision))
    fine = client.watch(etcd_namespace + "/fine")
    await api(fine.start)
    behind = client.watch(etcd_namespace + "/old", start_revision=old)
    try:
        await api(behind.start)
        with pytest.raises(ef.CompactedError):
            await api(behind.get, 5.0)
        await api(api.client.put, etcd_namespace + "/fine", "ok")
        assert await _collect(api, fine, 1) == [b"ok"]
    finally:
        await api.close(fine)
        await api.close(behind)


async def test_a_slow_consumer_pauses_only_its_own_watch_and_loses_nothing(
    api: Api, etcd_namespace: str
) -> None:
    client = await api.new_client()
    opened = count_streams(client, "Watch")
    slow = client.watch(etcd_namespace + "/slow", buffer=4)
    fast = client.watch(etcd_namespace + "/fast")
    await api(slow.start)
    await api(fast.start)
    try:
        for i in range(40):  # one batch each: ten times what the slow watch may buffer
            await api(api.client.put, etcd_namespace + "/slow", f"s{i}")
        await api(api.client.put, etcd_namespace + "/fast", "f")
        assert await _collect(api, fast, 1) == [b"f"]  # not stalled behind the slow one
        assert slow.paused and slow.pending <= 4  # bounded: paused at etcd, nothing piled up
        # draining it resumes the watch from where its buffer ends: all 40, in order, once
        assert await _collect(api, slow, 40) == [f"s{i}".encode() for i in range(40)]
        assert not slow.paused
        with pytest.raises(TimeoutError):
            await api(slow.get, 0.3)  # and nothing repeated after the last one
        assert opened == ["stream:Watch"]  # pausing and resuming reuse the one stream
    finally:
        await api.close(slow)
        await api.close(fast)


@pytest.mark.parametrize("buffer", [0, 1, -5, True, 2.5, "8"])
def test_a_watch_buffer_must_hold_two_batches(etcd_client: ef.Client, buffer: Any) -> None:
    with pytest.raises(ef.InvalidArgumentError, match="buffer"):
        etcd_client.watch("k", buffer=buffer)


@pytest.mark.timeout(240)
async def test_a_thousand_queued_waiters_use_one_watch_and_one_keepalive_stream(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/crowd"
    async with ef.AsyncClient(etcd_endpoints, timeout=30) as client:
        watches = count_streams(client, "Watch")
        keepalives = count_streams(client, "LeaseKeepAlive")
        holder = client.session(ttl=3)
        await holder.open()
        await holder.lock(name).acquire()
        sessions = [client.session(ttl=3) for _ in range(1000)]
        await asyncio.gather(*(s.open() for s in sessions))
        waiting = [asyncio.ensure_future(s.lock(name).acquire()) for s in sessions]
        try:
            await poll(
                lambda: _count(client, name, 1001), timeout=120, interval=0.5, what="all enqueued"
            )
            await asyncio.sleep(3.5)  # longer than the TTL: every session kept alive
            assert not any(s.expired for s in sessions)
            assert watches == ["stream:Watch"] and keepalives == ["stream:LeaseKeepAlive"]
            await holder.lock(name).release()
            done, _ = await asyncio.wait(waiting, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1, "exactly one waiter got the lock after the release"
            winner = done.pop().result()
            assert winner.value > 0
        finally:
            # closing the sessions revokes their leases: every waiter ends (SessionExpired)
            await asyncio.gather(*(s.aclose() for s in sessions), holder.aclose())
            await asyncio.gather(*waiting, return_exceptions=True)


async def _count(client: Any, name: str, n: int) -> bool:
    return len(await client.get_prefix(name + "/")) == n

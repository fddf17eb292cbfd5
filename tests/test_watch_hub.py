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


@pytest.mark.serial  # one process keeps 1,000 TTL-3 leases alive: it needs the CPU
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


def _receive_limit(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """Clients made from now on accept responses of at most ``limit`` bytes (the
    library's 64 MiB, scaled down so that a test needs megabytes, not hundreds)."""
    from etcdfence._async import connection as async_connection
    from etcdfence._sync import connection as sync_connection

    monkeypatch.setattr(async_connection, "_MAX_RECEIVE", limit)
    monkeypatch.setattr(sync_connection, "_MAX_RECEIVE", limit)


@pytest.mark.timeout(120)
async def test_a_paused_watch_catches_up_on_values_beyond_the_receive_limit(
    api: Api, etcd_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow consumer's watch pauses; meanwhile 12 values of 1 MB land (12 MB of
    catch-up, three times the 4 MiB receive limit). Resumed, etcd's fragments bring them
    all, in order, exactly once, on the one stream."""
    _receive_limit(monkeypatch, 4 * 1024 * 1024)
    client = await api.new_client()
    opened = count_streams(client, "Watch")
    key = etcd_namespace + "/big"
    watch = client.watch(key, buffer=2)
    await api(watch.start)
    try:
        values = [bytes([65 + i]) * 1_000_000 for i in range(12)]
        for value in values:  # the consumer reads nothing: the watch pauses after two
            await api(api.client.put, key, value)
        await poll(lambda: watch.paused, 10, "the watch paused")
        got = await _collect(api, watch, 12)
        assert len(got) == 12 and got == values  # every one, in order, once
        with pytest.raises(TimeoutError):
            await api(watch.get, 0.5)
        assert opened == ["stream:Watch"]  # no reopening: nothing broke the stream
    finally:
        await api.close(watch)


@pytest.mark.timeout(120)
async def test_a_watch_that_cannot_resume_gets_an_error_and_the_others_go_on(
    api: Api, etcd_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One event alone exceeds the receive limit: no fragment can bring it. Its watch's
    consumer gets a clear error, the stream is not reopened in a loop, and another
    watch on the same stream keeps its events."""
    _receive_limit(monkeypatch, 1024 * 1024)
    client = await api.new_client()
    opened = count_streams(client, "Watch")
    big = client.watch(etcd_namespace + "/huge")
    fine = client.watch(etcd_namespace + "/fine")
    await api(big.start)
    await api(fine.start)
    try:
        await api(api.client.put, etcd_namespace + "/fine", "before")
        await api(api.client.put, etcd_namespace + "/huge", b"x" * 1_200_000)
        await api(api.client.put, etcd_namespace + "/fine", "after")
        with pytest.raises(ef.EtcdRequestError, match="cannot resume"):
            await api(big.get, 20.0)
        assert await _collect(api, fine, 2) == [b"before", b"after"]
        await asyncio.sleep(2.0)  # a loop would reopen many times a second
        assert 1 < len(opened) <= 5, opened  # a break, perhaps a retry alone, the blame
        await api(api.client.put, etcd_namespace + "/fine", "later")
        assert await _collect(api, fine, 1) == [b"later"]
    finally:
        await api.close(big)
        await api.close(fine)


@pytest.mark.timeout(120)
async def test_a_revision_split_across_fragments_is_delivered_whole(
    api: Api, etcd_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three large keys per revision (one txn), so etcd's fragments (about 2 MiB: four
    such events) end in the middle of revisions. The paused prefix watch catches up on
    eight revisions: every event once, in order, each revision in one batch."""
    from etcdfence._wire import messages as m

    _receive_limit(monkeypatch, 4 * 1024 * 1024)
    client = await api.new_client()
    prefix = etcd_namespace + "/multi/"
    watch = client.watch(prefix, prefix=True, buffer=2)
    await api(watch.start)
    try:
        expected = []
        for rev in range(8):
            puts = []
            for k in range(3):
                key, value = f"{prefix}{k}".encode(), bytes([65 + rev]) * 450_000
                puts.append(m.RequestOp(request_put=m.PutRequest(key=key, value=value)))
                expected.append((key, value))
            await api(api.client.txn_raw, m.TxnRequest(success=puts))
        got: list[tuple[bytes, bytes]] = []
        while len(got) < len(expected):
            batch = await api(watch.get, 10.0)
            revisions = [ev.kv.mod_revision for ev in batch.events]
            assert len(revisions) % 3 == 0, revisions  # whole revisions only
            got.extend((ev.kv.key, ev.kv.value) for ev in batch.events)
        assert got == expected
        with pytest.raises(TimeoutError):
            await api(watch.get, 0.5)
    finally:
        await api.close(watch)


async def _values(api: Api, watch: Any, count: int) -> list[bytes]:
    """Exactly ``count`` values, then nothing more (no duplicate, nothing late)."""
    values = await _collect(api, watch, count)
    with pytest.raises(TimeoutError):
        await api(watch.get, 0.3)
    return values


@pytest.mark.timeout(240)
async def test_only_the_watches_whose_responses_are_too_large_get_the_error(
    api: Api, etcd_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five healthy watches, one whose event alone exceeds the receive limit; while the
    hub probes for the culprit, another oversized watch is registered and a paused
    watch resumes. Exactly the two oversized watches get "cannot resume"; every other
    watch receives all its events, in order, exactly once."""
    _receive_limit(monkeypatch, 1024 * 1024)
    client = await api.new_client()
    hub = client.connection.watches
    ns = etcd_namespace
    fines = [client.watch(f"{ns}/fine{i}") for i in range(5)]
    big = client.watch(f"{ns}/huge")
    slow = client.watch(f"{ns}/slow", buffer=2)
    late: Any = None
    for watch in [*fines, big, slow]:
        await api(watch.start)
    try:
        for i in range(5):
            await api(api.client.put, f"{ns}/fine{i}", "before")
        for n in range(3):  # nobody reads: the slow watch pauses
            await api(api.client.put, f"{ns}/slow", f"s{n}")
        await poll(lambda: slow.paused, 10, "the slow watch paused")
        await api(api.client.put, f"{ns}/huge", b"x" * 1_200_000)
        await poll(hub._probing, 20, "the hub probing for the oversized response")
        # mid-probe: a new oversized watch, and the paused watch resumes as it is read
        revision = await api(api.client.put, f"{ns}/huge2", b"y" * 1_200_000)
        late = client.watch(f"{ns}/huge2", start_revision=revision)
        late_started = api.spawn(late.start, 60.0)
        assert await _collect(api, slow, 2) == [b"s0", b"s1"]
        assert hub._probing()  # both happened while the culprit was still unknown
        for i in range(5):
            await api(api.client.put, f"{ns}/fine{i}", "during")
        for culprit in (big, late):
            with pytest.raises(ef.EtcdRequestError, match="cannot resume"):
                await api(culprit.get, 90.0)
        await late_started
        await poll(lambda: not hub._probing(), 60, "probing over")
        for i in range(5):
            await api(api.client.put, f"{ns}/fine{i}", "after")
        await api(api.client.put, f"{ns}/slow", "s3")
        for fine in fines:
            assert await _values(api, fine, 3) == [b"before", b"during", b"after"]
        assert await _values(api, slow, 2) == [b"s2", b"s3"]
    finally:
        for watch in [*fines, big, slow] + ([late] if late is not None else []):
            await api.close(watch)

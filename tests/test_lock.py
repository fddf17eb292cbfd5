"""Locks against a real etcd: key layout, FIFO queueing without a thundering herd,
timeouts, guarded release, ownership and fencing tokens. Both twins (``api``)."""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()


async def owner_at(api: Api, name: str, revision: int) -> Any:
    """The first-created key under ``name/`` as etcd saw it at ``revision``."""
    keys = await api(api.client.get_prefix, name + "/", revision=revision)
    return min(keys, key=lambda kv: kv.create_revision) if keys else None


async def test_key_layout_and_token(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/jobs/nightly"
    async with api.session(ttl=5) as session:
        lock = session.lock(name)
        token = await api(lock.acquire)
        assert lock.key == token.key == f"{name}/{session.lease_id:x}"
        kv = await api(api.client.get, token.key)
        assert kv is not None
        assert kv.value == b"" and kv.lease_id == session.lease_id == token.lease_id
        assert token.create_revision == kv.create_revision
        # uncontended: the token is the revision of the acquire txn that created the key
        assert token.value == kv.create_revision == kv.mod_revision
        assert lock.token == token and await api(lock.is_owner)
        owner = await owner_at(api, name, token.value)
        assert owner.key.decode() == token.key


async def test_order_is_by_create_revision_not_key(api: Api, etcd_namespace: str) -> None:
    """The owner is the earliest-created key, whatever the lease hex sorts like."""
    name = etcd_namespace + "/order"
    # a foreign contender with a key that sorts last but was created first
    await api(api.client.put, name + "/ffffffffffffffff", b"")
    async with api.session(ttl=5) as session:
        lock = session.lock(name)
        assert await api(lock.try_acquire) is None
        await api(api.client.delete, name + "/ffffffffffffffff")
        token = await api(lock.try_acquire)
        assert token is not None and token.key.startswith(name + "/")


@dataclass
class Waiter:
    index: int
    client: Any
    session: Any
    calls: Any
    task: asyncio.Task[Any]


async def test_fifo_handoff_without_thundering_herd(api: Api, etcd_namespace: str) -> None:
    """5 waiters queue behind a holder; each release wakes exactly the next one."""
    name = etcd_namespace + "/fifo"
    holder = await api.open_session(ttl=5)
    waiters: list[Waiter] = []
    try:
        previous = await api(holder.lock(name).acquire)
        for i in range(5):
            client = await api.new_client()
            calls = api.count_calls(client)
            session = await api.open_session(ttl=5, client=client)
            task = api.spawn(session.lock(name).acquire)
            waiters.append(Waiter(i, client, session, calls, task))
            # queue strictly in order: the next waiter starts once this one's key exists
            await poll(lambda: _count_is(api, name, len(waiters) + 1), what=f"waiter {i} queued")
        # each waiter is parked on one watch (of its predecessor's key)
        await poll(lambda: all(w.calls["stream:Watch"] == 1 for w in waiters), what="watches")
        await asyncio.sleep(0.05)
        assert not any(w.task.done() for w in waiters)
        parked = [collections.Counter(w.calls) for w in waiters]
        expected_order = [w.session.lock(name).key for w in waiters]
        kvs = sorted(await keys_under(api, name), key=lambda kv: kv.create_revision)
        assert [kv.key.decode() for kv in kvs[1:]] == expected_order

        releaser = holder.lock(name)
        acquired: list[str] = []
        for i, waiter in enumerate(waiters):
            before = [dict(w.calls) for w in waiters]
            await api(releaser.release)
            token = await asyncio.wait_for(waiter.task, 5)
            acquired.append(token.key)
            assert token > previous, "tokens must strictly increase from holder to holder"
            assert token.key == waiter.session.lock(name).key
            owner = await owner_at(api, name, token.value)
            assert owner.key.decode() == token.key  # at the token's revision we own it
            await asyncio.sleep(0.05)  # a herd would be on the wire by now
            for later in waiters[i + 1 :]:
                assert not later.task.done(), f"waiter {later.index} jumped the queue"
                assert dict(later.calls) == before[later.index], (
                    f"waiter {later.index} woke up when waiter {i - 1 if i else 'H'} released"
                )
            previous = token
            releaser = waiter.session.lock(name)
        await api(releaser.release)
        assert acquired == expected_order
        # each waiter watched one key, and the drain cost every waiter the same: one
        # re-check when woken, one release (a herd would re-check at every release)
        assert {w.calls["stream:Watch"] for w in waiters} == {1}
        drained = [dict(collections.Counter(w.calls) - parked[w.index]) for w in waiters]
        assert all(d == drained[0] for d in drained), drained
        assert sum(drained[0].values()) <= 3, drained[0]
        assert await keys_under(api, name) == []
    finally:
        for w in waiters:
            w.task.cancel()
            await api.close(w.session)
        await api.close(holder)


async def _count_is(api: Api, name: str, count: int) -> bool:
    return len(await keys_under(api, name)) == count


async def test_vanished_waiters_neither_jump_the_queue_nor_wait_in_vain(
    api: Api, etcd_namespace: str
) -> None:
    """Queue H <- w1 <- w2 <- w3, then delete waiters' keys behind their backs.

    The waiter behind a vanished key re-checks and keeps waiting for the one now ahead
    of it; a waiter whose own key vanished gets SessionExpired, never the lock, by its
    next wake-up at the latest (even with others still ahead). w2 and w3 queue while
    w1 is queued from the same client, so they wait in the client's shared queue view,
    which sees w2's key go at once; w1 waits alone (the key-ahead watch)."""
    name = etcd_namespace + "/recheck"
    sessions = [await api.open_session(ttl=5) for _ in range(4)]
    try:
        holder, w1, w2, w3 = sessions
        await api(holder.lock(name).acquire)
        tasks = []
        for s in (w1, w2, w3):
            tasks.append(api.spawn(s.lock(name).acquire))
            await poll(lambda: _count_is(api, name, len(tasks) + 1))
        t1, t2, t3 = tasks

        await api(api.client.delete, w2.lock(name).key)  # w3 was behind it
        await asyncio.sleep(0.2)
        assert not t3.done(), "w3 must re-check and find w1 ahead"
        if t2.done():  # learnt at once that its key is gone: never the lock
            with pytest.raises(ef.SessionExpired):
                t2.result()

        await api(api.client.delete, w1.lock(name).key)  # wakes w2 (and w3)
        with pytest.raises(ef.SessionExpired):
            await asyncio.wait_for(t2, 2)  # at once, although the holder still holds
        await asyncio.sleep(0.2)
        assert not t3.done(), "w3 must re-check and find the holder ahead"
        assert not t1.done()  # w1 watches the holder and has not been woken

        await api(holder.lock(name).release)
        with pytest.raises(ef.SessionExpired):
            await asyncio.wait_for(t1, 5)  # its key is gone: no phantom ownership
        token = await asyncio.wait_for(t3, 5)
        assert token.key == w3.lock(name).key
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [token.key]
    finally:
        for s in sessions:
            await api.close(s)


async def test_acquire_timeout_removes_the_waiters_key(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/timeout"
    async with api.session(ttl=5) as s1, api.session(ttl=5) as s2:
        token = await api(s1.lock(name).acquire)
        started = time.monotonic()
        with pytest.raises(ef.AcquireTimeout) as info:
            await api(s2.lock(name).acquire, timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 2.0
        assert isinstance(info.value, TimeoutError)
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [token.key]
        assert s2.lock(name).token is None and not await api(s2.lock(name).is_owner)
        # the lock stays usable for the one that timed out
        await api(s1.lock(name).release)
        assert await api(s2.lock(name).acquire, timeout=1) > token


async def test_try_acquire(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/try"
    async with api.session(ttl=5) as s1, api.session(ttl=5) as s2:
        token = await api(s1.lock(name).try_acquire)
        assert token is not None and await api(s1.lock(name).is_owner)
        assert await api(s2.lock(name).try_acquire) is None
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [token.key]
        await api(s1.lock(name).release)
        second = await api(s2.lock(name).try_acquire)
        assert second is not None and second > token


async def test_release_is_guarded_by_create_revision(api: Api, etcd_namespace: str) -> None:
    """A late release must never delete a newer holder's key (etcd-io/etcd#22082)."""
    name = etcd_namespace + "/guarded"
    async with api.session(ttl=5) as s1, api.session(ttl=5) as s2:
        first = s1.lock(name)
        old = await api(first.acquire)
        await api(api.client.delete, old.key)  # lost behind its back
        assert not await api(first.is_owner)
        new = await api(s2.lock(name).acquire, timeout=2)
        assert new > old
        await api(first.release)  # late
        kv = await api(api.client.get, new.key)
        assert kv is not None and kv.create_revision == new.create_revision
        assert await api(s2.lock(name).is_owner)

        # the same key reincarnated (same lease, new create revision), e.g. re-created by
        # a retried acquire: the stale release must leave it alone too
        await api(s2.lock(name).release)
        again = await api(first.acquire)
        await api(api.client.delete, again.key)
        revision = await api(api.client.put, again.key, b"", lease_id=s1.lease_id)
        await api(first.release)
        kv = await api(api.client.get, again.key)
        assert kv is not None and kv.create_revision == revision != again.create_revision


async def test_is_owner_false_once_the_key_is_gone(api: Api, etcd_namespace: str) -> None:
    async with api.session(ttl=5) as session:
        lock = session.lock(etcd_namespace + "/owner")
        assert not await api(lock.is_owner)
        token = await api(lock.acquire)
        assert await api(lock.is_owner)
        await api(api.client.delete, token.key)
        assert not await api(lock.is_owner)
        await api(lock.release)
        assert not await api(lock.is_owner) and lock.token is None


async def test_context_manager(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/cm"
    async with api.session(ttl=5) as session:
        lock = session.lock(name)
        if api.is_async:
            async with lock as token:
                assert await lock.is_owner() and await api(api.client.get, token.key)
        else:

            def body() -> Any:
                with lock as token:
                    assert lock.is_owner() and api.client.get(token.key)
                return token

            token = await api(body)
        assert isinstance(token, ef.FencingToken)
        assert await api(api.client.get, token.key) is None
        assert not await api(lock.is_owner)


async def test_context_manager_never_enters_without_the_lock(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/cm2"
    entered: list[int] = []
    async with api.session(ttl=5) as s1:
        await api(s1.lock(name).acquire)
        s2 = await api.open_session(ttl=5)
        await api.close(s2)  # closed: acquire must raise, the body must not run
        if api.is_async:
            with pytest.raises(ef.SessionExpired):
                async with s2.lock(name):
                    entered.append(1)
        else:

            def body() -> None:
                with s2.lock(name):
                    entered.append(1)

            with pytest.raises(ef.SessionExpired):
                await api(body)
    assert entered == []


@pytest.mark.parametrize("bad", ["", "   ", "jobs/", "/", " jobs", "jobs ", "a\x00b"])
async def test_bad_names_are_value_errors(api: Api, bad: str) -> None:
    session = api.client.session(5)  # not opened: validation needs no server
    with pytest.raises(ef.InvalidArgument) as info:
        session.lock(bad)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError):
        session.election(bad)
    with pytest.raises(ValueError):
        await api(api.client.leader, bad)


@pytest.mark.parametrize("bad", [None, 5, b"jobs", ["jobs"]])
async def test_non_str_names_are_type_errors(api: Api, bad: Any) -> None:
    session = api.client.session(5)
    with pytest.raises(ef.InvalidType) as info:
        session.lock(bad)
    assert isinstance(info.value, TypeError)
    with pytest.raises(TypeError):
        session.election(bad)


async def test_tokens_increase_across_alternating_holders(api: Api, etcd_namespace: str) -> None:
    """Alternate two sessions (one always queued behind the other) and check that each
    token is the revision at which etcd confirmed that holder as owner."""
    name = etcd_namespace + "/alt"
    async with api.session(ttl=5) as a, api.session(ttl=5) as b:
        tokens: list[ef.FencingToken] = [await api(a.lock(name).acquire)]
        holders = [a, b]
        for i in range(1, 7):
            holder, waiter = holders[(i - 1) % 2], holders[i % 2]
            task = api.spawn(waiter.lock(name).acquire)
            await poll(lambda: _count_is(api, name, 2))
            await api(api.client.put, etcd_namespace + "/noise", b"x")  # unrelated revisions
            await api(holder.lock(name).release)
            token = await asyncio.wait_for(task, 5)
            assert token > tokens[-1]
            owner = await owner_at(api, name, token.value)
            assert owner.key.decode() == token.key
            assert owner.create_revision == token.create_revision < token.value
            tokens.append(token)
        await api(holders[0].lock(name).release)
        assert [int(t) for t in tokens] == sorted({int(t) for t in tokens})


async def test_handoff_right_after_queueing_is_prompt(
    api: Api, etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """Release while the waiter is still setting up its watch, with other writes going
    on. A watch that starts at a past revision is served by etcd's catch-up loop, which
    runs every 100 ms (Go's Mutex and etcdctl wait ~50 ms on average here); etcdfence's
    waiter watches from now and re-checks, so the handoff takes a few ms."""
    stop = threading.Event()

    def noise() -> None:  # unrelated writes: keep etcd's revision moving
        with ef.Client(etcd_endpoints) as client:
            while not stop.is_set():
                client.put(etcd_namespace + "/noise", b"x")

    writer = threading.Thread(target=noise, daemon=True)
    writer.start()
    latencies: list[float] = []
    try:
        async with api.session(ttl=5) as holder, api.session(ttl=5) as waiter:
            for i in range(8):
                name = f"{etcd_namespace}/prompt{i}"
                await api(holder.lock(name).acquire)
                task = api.spawn(waiter.lock(name).acquire)
                await poll(functools.partial(_count_is, api, name, 2), interval=0.001)
                started = time.monotonic()
                await api(holder.lock(name).release)
                await asyncio.wait_for(task, 5)
                latencies.append(time.monotonic() - started)
                await api(waiter.lock(name).release)
    finally:
        stop.set()
        writer.join(5)
    assert sorted(latencies)[len(latencies) // 2] < 0.025, f"handoff latencies (s): {latencies}"


@pytest.mark.parametrize("how", ["delete", "revoke", "release"])
async def test_watch_key_says_when_etcd_takes_the_held_key(
    api: Api, etcd_namespace: str, how: str
) -> None:
    """``watch_key``: an ``etcdctl del`` of the held key or a revoke of its lease (the
    lease's keepalive would say so only TTL/3 later: TTL 30) turns ``key_taken()`` true
    and calls ``on_taken`` once, within a watch event; our own release does not."""
    name = f"{etcd_namespace}/watched-{how}"
    async with api.session(ttl=30) as session:
        lock = session.lock(name)
        with pytest.raises(ef.NotOwnerError):
            lock.watch_key()  # nothing held: nothing to watch
        token = await api(lock.acquire)
        calls: list[float] = []
        lock.watch_key(lambda: calls.append(time.monotonic()))
        lock.watch_key()  # a second call while watching does nothing
        assert not lock.key_taken()
        await asyncio.sleep(0.2)  # the watch is up (it starts at the token's revision anyway)
        taken_at = time.monotonic()
        if how == "delete":
            await api(api.client.delete, token.key)
        elif how == "revoke":
            await api(api.client.lease_revoke, session.lease_id)
        else:
            await api(lock.release)
        if how == "release":
            await asyncio.sleep(0.5)
            assert calls == [] and not lock.key_taken()
            return
        await poll(lambda: bool(calls), 5.0, "on_taken was called")
        assert lock.key_taken() and len(calls) == 1
        assert calls[0] - taken_at < 2.0, "seen by the watch, not by a keepalive"
        await asyncio.sleep(0.3)
        assert len(calls) == 1

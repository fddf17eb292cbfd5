"""A crowd — several waiters of one client on one name — shares one view of the queue
(issue #12, ``_async/queue.py``): one prefix read and one prefix watch instead of a
sorted read of the whole queue per waiter per handoff. Real etcd, both twins.

What must hold: the crowd acquires in create-revision order with increasing tokens,
exactly one holder at a time; a waiter whose key goes learns it (SessionExpired, never
the lock) while the others go on; a view that falls behind a compaction reads the queue
again; a cancelled crowd waiter leaves no key behind; a crowd costs etcd O(1) per handoff.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll, revoke_lease

import etcdfence as ef
from etcdfence.testing import FaultProxy

pytestmark = pytest.mark.integration

api = api_fixture()

CROWD = 12  # within the sync twin's worker threads (32)


async def _enqueue_crowd(api: Api, name: str, sessions: list[Any]) -> list[asyncio.Task[Any]]:
    """The first waiter queues alone (it waits on the key ahead, as a lone waiter does);
    the rest queue at once while it waits, so they are its client's crowd."""
    tasks = [api.spawn(sessions[0].lock(name).acquire)]
    await poll(lambda: _count_is(api, name, 2), timeout=20)
    tasks += [api.spawn(s.lock(name).acquire) for s in sessions[1:]]
    await poll(lambda: _count_is(api, name, len(sessions) + 1), timeout=20)
    return tasks


async def _count_is(api: Api, name: str, n: int) -> bool:
    return len(await keys_under(api, name)) == n


async def test_a_crowd_acquires_in_queue_order_one_at_a_time_through_one_view(
    api: Api, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/crowd"
    client = await api.new_client()
    holder = await api.open_session(ttl=10, client=client)
    sessions = [await api.open_session(ttl=10, client=client) for _ in range(CROWD)]
    try:
        first = await api(holder.lock(name).acquire)
        tasks = await _enqueue_crowd(api, name, sessions)
        assert len(client.connection.queues) == 1, "one view for the whole crowd"
        # the classic first waiter watches the key ahead; the crowd adds one prefix watch
        assert len(client.connection.watches) <= 2
        order = [kv.key.decode() for kv in sorted(await keys_under(api, name), key=_created)]
        assert order[0] == first.key
        by_key = {s.lock(name).key: (s, t) for s, t in zip(sessions, tasks, strict=True)}
        await api(holder.lock(name).release)
        previous = first.value
        for key in order[1:]:
            session, task = by_key[key]
            token = await asyncio.wait_for(task, 10)
            assert token.key == key and token.value > previous
            previous = token.value
            pending = [t for t in tasks if not t.done()]
            await asyncio.sleep(0.02)
            assert all(not t.done() for t in pending), "nobody acquires while it is held"
            await api(session.lock(name).release)
        await poll(lambda: _views_closed(client), timeout=5)
    finally:
        for s in [holder, *sessions]:
            await api.close(s)


def _created(kv: Any) -> int:
    return int(kv.create_revision)


async def _queue_order(api: Api, name: str, sessions: list[Any]) -> list[int]:
    """Indexes of ``sessions`` whose keys are queued, in queue (create revision) order:
    the crowd enqueues concurrently, so its order is etcd's, not the spawn order."""
    index = {s.lock(name).key: i for i, s in enumerate(sessions)}
    queued = sorted(await keys_under(api, name), key=_created)
    return [index[kv.key.decode()] for kv in queued if kv.key.decode() in index]


async def _views_closed(client: Any) -> bool:
    return len(client.connection.queues) == 0


async def test_a_crowd_waiter_whose_lease_goes_fails_at_once_and_the_rest_go_on(
    api: Api, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/revoked"
    client = await api.new_client()
    holder = await api.open_session(ttl=10, client=client)
    sessions = [await api.open_session(ttl=10, client=client) for _ in range(4)]
    try:
        await api(holder.lock(name).acquire)
        tasks = await _enqueue_crowd(api, name, sessions)
        await revoke_lease(api, sessions[2].lease_id)  # behind the session's back
        with pytest.raises(ef.SessionExpired):
            await asyncio.wait_for(tasks[2], 5)  # while the holder still holds
        assert not any(t.done() for i, t in enumerate(tasks) if i != 2)
        await api(holder.lock(name).release)
        for i in await _queue_order(api, name, sessions):  # the crowd queued in any order
            token = await asyncio.wait_for(tasks[i], 10)
            assert token.key == sessions[i].lock(name).key
            await api(sessions[i].lock(name).release)
    finally:
        for s in [holder, *sessions]:
            await api.close(s)


async def test_a_view_that_fell_behind_a_compaction_reads_the_queue_again(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/compacted"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint])
        holder = await api.open_session(ttl=10)  # on the direct client
        sessions = [await api.open_session(ttl=10, client=client) for _ in range(3)]
        try:
            await api(holder.lock(name).acquire)
            tasks = await _enqueue_crowd(api, name, sessions)
            proxy.blackhole()  # the crowd's client hears nothing for a while ...
            await api(holder.lock(name).release)  # ... in which the queue moves on
            for i in range(3):
                await api(api.client.put, etcd_namespace + "/filler", str(i))
            await api(api.client.compact, await api(api.client.revision))
            proxy.reset()  # its streams break; the watches resume into compacted history
            proxy.heal()
            order = await _queue_order(api, name, sessions)
            assert order[0] == 0  # it queued alone, first
            for i in order:
                token = await asyncio.wait_for(tasks[i], 30)  # reconnect backoff under load
                assert token.key == sessions[i].lock(name).key
                await api(sessions[i].lock(name).release)
        finally:
            for s in [holder, *sessions]:
                await api.close(s)


async def test_a_cancelled_crowd_waiter_leaves_no_key_and_the_next_one_gets_the_lock(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/cancelled"
    async with ef.AsyncClient(etcd_endpoints) as client:
        holder = await client.session(ttl=10).open()
        sessions = [await client.session(ttl=10).open() for _ in range(3)]
        try:
            await holder.lock(name).acquire()
            tasks = [asyncio.ensure_future(sessions[0].lock(name).acquire())]
            await poll(lambda: _has(client, name, 2), timeout=10)
            tasks += [asyncio.ensure_future(s.lock(name).acquire()) for s in sessions[1:]]
            await poll(lambda: _has(client, name, 4), timeout=10)
            queued = [kv.key.decode() for kv in sorted(await client.get_prefix(name + "/"),
                                                       key=_created)]  # fmt: skip
            gone = next(i for i in (1, 2) if sessions[i].lock(name).key == queued[2])
            kept = 3 - gone  # cancel the crowd waiter queued first, keep the one behind it
            tasks[gone].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks[gone]
            await poll(lambda: _has(client, name, 3), timeout=5)  # its key was withdrawn
            await holder.lock(name).release()
            assert (await asyncio.wait_for(tasks[0], 5)).key == sessions[0].lock(name).key
            await sessions[0].lock(name).release()
            assert (await asyncio.wait_for(tasks[kept], 5)).key == sessions[kept].lock(name).key
        finally:
            for s in [holder, *sessions]:
                await s.aclose()


async def _has(client: ef.AsyncClient, name: str, n: int) -> bool:
    return len(await client.get_prefix(name + "/")) == n


async def test_crowds_of_two_clients_interleave_in_queue_order(
    api: Api, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/two"
    clients = [await api.new_client(), await api.new_client()]
    holder = await api.open_session(ttl=10)
    sessions = [await api.open_session(ttl=10, client=clients[i % 2]) for i in range(8)]
    try:
        await api(holder.lock(name).acquire)
        tasks = []
        for s in sessions:  # alternate clients, one at a time: a known queue order
            tasks.append(api.spawn(s.lock(name).acquire))
            await poll(lambda: _count_is(api, name, len(tasks) + 1), timeout=10)
        await api(holder.lock(name).release)
        previous = 0
        for session, task in zip(sessions, tasks, strict=True):
            token = await asyncio.wait_for(task, 10)
            assert token.key == session.lock(name).key and token.value > previous
            previous = token.value
            await api(session.lock(name).release)
    finally:
        for s in [holder, *sessions]:
            await api.close(s)


async def test_a_crowd_fails_at_once_when_its_view_cannot_follow_etcd(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """Closing the client ends the view's watch: every crowd waiter raises at once (no
    hang until a timeout), and one joining the failed view fails alike."""
    name = etcd_namespace + "/closed"
    async with ef.AsyncClient(etcd_endpoints) as direct:
        holder = await direct.session(ttl=10).open()
        client = ef.AsyncClient(etcd_endpoints)
        sessions = [await client.session(ttl=10).open() for _ in range(3)]
        try:
            await holder.lock(name).acquire()
            tasks = [asyncio.ensure_future(sessions[0].lock(name).acquire())]
            await poll(lambda: _has(direct, name, 2), timeout=10)
            tasks += [asyncio.ensure_future(s.lock(name).acquire()) for s in sessions[1:]]
            await poll(lambda: _has(direct, name, 4), timeout=10)
            view = client.connection.queues._views[(name + "/").encode()]
            await client.aclose()
            for task in tasks:
                with pytest.raises(ef.EtcdfenceError):
                    await asyncio.wait_for(task, 5)
            assert view.failure is not None
            late = view.join(b"late", 10**9)
            assert late.woken.is_set() and late.error is view.failure
        finally:
            await holder.aclose()

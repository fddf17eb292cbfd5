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
import threading
import time
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll, revoke_lease

import etcdfence as ef
from etcdfence.testing import FaultProxy
from etcdfence.testing.procs import wait_until

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


def _view_users(client: Any, name: str) -> int:
    """How many of ``client``'s waiters are in its view of ``name``'s queue (0: none)."""
    view = client.connection.queues._views.get((name + "/").encode())
    return 0 if view is None else int(view.users)


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
        # a waiter's key is in etcd before the waiter, resumed, joins the view: wait for
        # the whole crowd (all but the first waiter) to be in the one view
        crowd = len(sessions) - 1
        await poll(lambda: _view_users(client, name) == crowd, 10, "the crowd in its view")
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


BACKLOG = 1200  # keys another client queues on one lease while the crowd is cut off


async def _view_state(api: Api, view: Any) -> tuple[int, dict[bytes, int], dict[bytes, int]]:
    """The view's revision R, its keys and etcd's keys of the queue at R (key -> create
    revision): the view must be exact at R."""
    with view._guard:
        revision, mine = view._revision, dict(view._keys)
    prefix = view._prefix.decode()
    kvs = await api(api.client.get_prefix, prefix, revision=revision)
    return revision, mine, {bytes(kv.key): int(kv.create_revision) for kv in kvs}


async def _assert_exact_once_through(api: Api, view: Any, revision: int) -> None:
    """Wait until the view has applied ``revision``, then compare it with etcd there."""
    await poll(
        lambda: _applied(view, revision), timeout=30, what=f"the view to apply {revision}"
    )  # reconnect backoff
    at, mine, etcds = await _view_state(api, view)
    missed = sorted((r, k) for k, r in etcds.items() if mine.get(k) != r)
    stale = sorted((r, k) for k, r in mine.items() if etcds.get(k) != r)
    assert not missed and not stale, (
        f"view at {at}: {len(missed)} keys missed (first {missed[:3]}), "
        f"{len(stale)} stale (first {stale[:3]})"
    )


async def _applied(view: Any, revision: int) -> bool:
    with view._guard:
        return bool(view._revision >= revision)


async def test_a_crowd_view_stays_exact_through_a_partition_that_drops_a_backlog(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """The crowd's client is partitioned (a blackhole that drops bytes) while another
    client queues a backlog on one lease, then the partition heals and the lease goes
    (the whole backlog deleted in one revision). The view is exact at its revision all
    along, and the crowd then acquires one at a time in queue order.

    It drifted (missed every put sent while partitioned, and kept keys etcd had
    deleted) because ``FaultProxy`` resumed a connection after dropping bytes from its
    middle — which TCP never does — silently losing whole watch responses."""
    name = etcd_namespace + "/backlog"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint])
        holder = await api.open_session(ttl=10)  # on the direct client
        sessions = [await api.open_session(ttl=10, client=client) for _ in range(3)]
        async with ef.AsyncClient(etcd_endpoints) as other:
            backlog = await other.session(ttl=30).open()
            try:
                first = await api(holder.lock(name).acquire)
                tasks = await _enqueue_crowd(api, name, sessions)
                view = next(iter(client.connection.queues._views.values()))
                await _assert_exact_once_through(api, view, await api(api.client.revision))
                proxy.blackhole()  # the crowd's client hears nothing ...
                for start in range(0, BACKLOG, 200):  # ... while the queue grows
                    await asyncio.gather(*(
                        other.put(f"{name}/zz-{i:04}", "", lease_id=backlog.lease_id)
                        for i in range(start, min(BACKLOG, start + 200))
                    ))  # fmt: skip
                await asyncio.sleep(0.5)  # etcd sent the events into the partition
                proxy.heal()
                marker = await other.put(f"{name}/zz-marker", "", lease_id=backlog.lease_id)
                await _assert_exact_once_through(api, view, marker)
                await backlog.aclose()  # its lease is revoked: one revision of deletes
                await _assert_exact_once_through(api, view, marker + 1)
                await api(holder.lock(name).release)
                previous = first.value
                order = await _queue_order(api, name, sessions)
                for n, i in enumerate(order):
                    token = await asyncio.wait_for(tasks[i], 30)
                    assert token.key == sessions[i].lock(name).key and token.value > previous
                    previous = token.value
                    await asyncio.sleep(0.05)
                    assert not any(tasks[j].done() for j in order[n + 1 :]), "two holders"
                    await api(sessions[i].lock(name).release)
            finally:
                await backlog.aclose()
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
            # the two crowd waiters join the view after their enqueue replies
            await poll(lambda: _view_users(client, name) >= 2, 10, "the crowd in its view")
            view = client.connection.queues._views[(name + "/").encode()]
            await client.aclose()
            for task in tasks:
                with pytest.raises(ef.EtcdfenceError):
                    await asyncio.wait_for(task, 5)
            assert view.failure is not None
            late = view.join(b"late", 10**9)
            assert late.woken.is_set() and type(late.error) is type(view.failure)
            assert str(late.error) == str(view.failure) and late.error is not view.failure
        finally:
            await holder.aclose()


async def test_a_views_heap_stays_bounded_by_the_live_keys_behind_a_long_hold(
    api: Api, etcd_namespace: str
) -> None:
    """Issue #21: the view's heap dropped a gone key only when it reached the top, so
    behind a long hold it kept every key that came and went. Bounded by the live keys."""
    name = etcd_namespace + "/churn"
    client = await api.new_client()
    holder = await api.open_session(ttl=30)
    sessions = [await api.open_session(ttl=30, client=client) for _ in range(10)]
    try:
        await api(holder.lock(name).acquire)  # the long hold
        tasks = await _enqueue_crowd(api, name, sessions[:2])  # a lone waiter and a crowd
        # the crowd's waiter joins the view after its enqueue reply (its key shows first)
        await poll(lambda: _view_users(client, name) >= 1, 10, "the crowd in its view")
        view = client.connection.queues._views[(name + "/").encode()]

        async def churn(session: Any) -> None:
            for _ in range(60):  # queue behind the hold and go, 480 times in all
                assert await api(session.lock(name).try_acquire) is None

        await asyncio.gather(*(churn(s) for s in sessions[2:]))
        await poll(lambda: _count_is(api, name, 3), timeout=10)
        live = len(view._keys)
        assert live <= 3 + len(sessions), view._keys
        assert len(view._order) <= 2 * live + 64, f"{len(view._order)} heap entries"
        await api(holder.lock(name).release)
        for i in await _queue_order(api, name, sessions[:2]):
            assert (await asyncio.wait_for(tasks[i], 10)).key == sessions[i].lock(name).key
            await api(sessions[i].lock(name).release)
    finally:
        for s in [holder, *sessions]:
            await api.close(s)


WAITERS = 200


def _check_own_exceptions(errors: list[BaseException]) -> None:
    """Each waiter got its own exception object, with a short traceback, quick to format
    (one shared object grew by each re-raise: N² frames, 12 s to format 200)."""
    import traceback

    assert len(errors) == WAITERS
    assert all(isinstance(e, ef.EtcdfenceError) for e in errors), errors[:3]
    assert len({id(e) for e in errors}) == WAITERS, "one exception object shared by waiters"
    started = time.monotonic()
    for error in errors:
        assert len(traceback.extract_tb(error.__traceback__)) < 40
        traceback.format_exception(error)
    assert time.monotonic() - started < 3.0


async def test_closing_a_client_gives_each_of_its_waiters_its_own_exception(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/own-async"
    async with ef.AsyncClient(etcd_endpoints) as direct:
        holder = await direct.session(ttl=30).open()
        client = ef.AsyncClient(etcd_endpoints)
        sessions = [await client.session(ttl=30).open() for _ in range(WAITERS)]
        try:
            await holder.lock(name).acquire()
            tasks = [asyncio.ensure_future(s.lock(name).acquire()) for s in sessions]
            await poll(lambda: _has(direct, name, WAITERS + 1), timeout=60)
            await client.aclose()
            done, _ = await asyncio.wait(tasks, timeout=30)
            assert len(done) == WAITERS
            _check_own_exceptions([t.exception() for t in tasks])  # type: ignore[misc]
        finally:
            await holder.aclose()


def test_closing_a_sync_client_gives_each_of_its_waiters_its_own_exception(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/own-sync"
    errors: list[BaseException] = []

    def wait(session: Any) -> None:
        try:
            session.lock(name).acquire()
        except BaseException as err:
            errors.append(err)

    with ef.Client(etcd_endpoints) as direct:
        holder = direct.session(ttl=30).open()
        client = ef.Client(etcd_endpoints)
        sessions = [client.session(ttl=30).open() for _ in range(WAITERS)]
        try:
            holder.lock(name).acquire()
            threads = [threading.Thread(target=wait, args=(s,), daemon=True) for s in sessions]
            for thread in threads:
                thread.start()
            wait_until(lambda: len(direct.get_prefix(name + "/")) == WAITERS + 1, timeout=60)
            client.close()
            for thread in threads:
                thread.join(30)
            _check_own_exceptions(errors)
        finally:
            holder.close()

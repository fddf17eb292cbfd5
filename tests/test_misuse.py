"""A hostile user's session against real etcd: cancelled and interrupted acquires, lost
replies, compaction under watches, threads sharing objects, callbacks that raise, a
``with`` block whose release cannot succeed, and odd input. Each test here failed on
0.1 (issue #10); both twins where the API has two.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll

import etcdfence as ef
from etcdfence.testing import FaultProxy

pytestmark = pytest.mark.integration

api = api_fixture()


class ReplyLost(Exception):
    """Stand-in for what reaches a caller when a reply is lost: raised *after* etcd
    applied the request (the injection point is the client's call boundary)."""


def lose_reply(
    api: Api, client: Any, *, method: str, nth: int = 1, error: Callable[[], BaseException]
) -> list[int]:
    """Make the ``nth`` ``method`` request of ``client`` reach etcd, be applied, and then
    raise ``error()`` instead of returning (through the client's public ``on_call``:
    an observer's exception becomes the call's). Returns a one-item call counter."""
    seen = [0]

    def observe(record: ef.CallRecord) -> None:
        if record.method == method and record.outcome == "ok":
            seen[0] += 1
            if seen[0] == nth:
                raise error()

    client.on_call(observe)
    return seen


def unavailable() -> BaseException:
    return ef.EtcdUnavailable("injected: reply lost after etcd applied the request")


# -- 1. no key outlives a failed acquire ------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "election"])
@pytest.mark.parametrize("failure", ["unavailable", "interrupt"])
async def test_lost_enqueue_reply_withdraws_the_key(
    api: Api, etcd_namespace: str, kind: str, failure: str
) -> None:
    """The enqueue txn is applied, its reply is lost (or Ctrl-C lands as it returns):
    the key must not stay behind under a lease that is still kept alive."""
    if failure == "interrupt" and api.is_async:
        error: Callable[[], BaseException] = asyncio.CancelledError
    elif failure == "interrupt":
        error = KeyboardInterrupt
    else:
        error = unavailable
    name = etcd_namespace + "/x"
    client = await api.new_client()
    async with api.session(ttl=10, client=client) as session:
        contender = session.lock(name) if kind == "lock" else session.election(name)
        lose_reply(api, client, method="Txn", nth=1, error=error)
        start = contender.acquire if kind == "lock" else contender.campaign
        args = () if kind == "lock" else (b"v",)
        with pytest.raises((ef.EtcdUnavailable, KeyboardInterrupt, asyncio.CancelledError)):
            await api(start, *args)
        assert await keys_under(api, name) == [], "the queued key outlived the failed acquire"
        assert not session.expired
        # the object is usable again, and another contender is not blocked
        token = await api(start, *args, timeout=5)
        assert token.key.endswith(f"{session.lease_id:x}")


async def test_lost_value_update_on_recampaign_withdraws_the_key(
    api: Api, etcd_namespace: str
) -> None:
    """A campaign whose key already exists with another value updates it; if that
    update's reply is lost the candidacy is withdrawn too."""
    name = etcd_namespace + "/e"
    client = await api.new_client()
    async with api.session(ttl=10, client=client) as session:
        election = session.election(name)
        await api(election.campaign, b"one")
        await api(election.resign)
        # put the key back by hand with another value, as a crashed earlier call would
        await api(client.put, f"{name}/{session.lease_id:x}", b"old", lease_id=session.lease_id)
        lose_reply(api, client, method="Txn", nth=2, error=unavailable)  # the guarded put
        with pytest.raises(ef.EtcdUnavailable):
            await api(election.campaign, b"two")
        assert await keys_under(api, name) == []


async def test_cancel_at_every_await_leaves_no_key(etcd_endpoints: list[str]) -> None:
    """asyncio: cancel a queued acquire after 0, 1, 2, ... loop iterations (every await
    of enqueue, queue read and watch set-up): the key is gone when the cancel returns."""
    name = "t/cancel-every-await"
    async with (
        ef.AsyncClient(etcd_endpoints) as client,
        client.session(ttl=10) as holder_session,
    ):
        await holder_session.lock(name).acquire()
        async with client.session(ttl=10) as session:
            lock = session.lock(name)
            if True:
                for steps in range(40):
                    task = asyncio.get_running_loop().create_task(lock.acquire())
                    for _ in range(steps):
                        await asyncio.sleep(0)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    keys = [kv.key for kv in await client.get_prefix(name + "/")]
                    assert keys == [f"{name}/{holder_session.lease_id:x}".encode()], steps
                # and wait_for, the common way to bound a wait
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(lock.acquire(), 0.3)
                assert len(await client.get_prefix(name + "/")) == 1


async def test_keyboard_interrupt_while_queued_withdraws_the_key(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """sync: Ctrl-C while waiting in the queue (raised from the queue re-read)."""
    name = etcd_namespace + "/kbd"
    with ef.Client(etcd_endpoints) as client, client.session(ttl=10) as holder:
        holder.lock(name).acquire()
        with client.session(ttl=10) as session:
            waiter = ef.Client(etcd_endpoints)
            try:
                with waiter.session(ttl=10) as wsession:
                    api = Api("sync", waiter, etcd_endpoints, None, [])
                    lose_reply(api, waiter, method="Txn", nth=2, error=KeyboardInterrupt)
                    with pytest.raises(KeyboardInterrupt):
                        wsession.lock(name).acquire(timeout=10)
                    keys = {kv.key for kv in client.get_prefix(name + "/")}
                    assert keys == {f"{name}/{holder.lease_id:x}".encode()}
            finally:
                waiter.close()
            assert session.lock(name).try_acquire() is None


async def test_withdraw_that_cannot_reach_etcd_is_done_before_the_next_acquire(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/stray"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint], timeout=1.0)
        async with api.session(ttl=30, client=client) as session:
            lock = session.lock(name)
            cut = [False]

            def blackhole_after_enqueue(record: ef.CallRecord) -> None:
                if record.method == "Txn" and not cut[0]:
                    cut[0] = True
                    proxy.blackhole()  # nothing reaches etcd any more, the withdrawal neither
                    raise unavailable()

            remove = client.on_call(blackhole_after_enqueue)
            with pytest.raises(ef.EtcdUnavailable):
                await api(lock.acquire)
            assert len(await keys_under(api, name)) == 1  # withdrawal could not reach etcd
            remove()
            proxy.heal()
            proxy.reset()  # the proxy dropped bytes mid-stream: start on fresh connections
            # release() withdraws what the failed acquire could not: nobody stays blocked
            await api(lock.release)
            assert await keys_under(api, name) == []
            async with api.session(ttl=5) as other:
                assert await api(other.lock(name).acquire, timeout=5)
            # and the object itself acquires again normally
            token = await api(lock.acquire, timeout=10)
            assert token.create_revision > 0


# -- 5. compaction is not a loss ------------------------------------------------------------


async def _compact_now(api: Api) -> None:
    for _ in range(3):  # move past every watch's resume revision
        await api(api.client.put, "t/compaction-filler", b"x")
    revision = await api(api.client.revision)
    await api(api.client.compact, revision)


async def test_compaction_and_reconnect_keep_a_healthy_leader(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/svc"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint])
        cls: Any = ef.AsyncLeaderElector if api.is_async else ef.LeaderElector
        lost: list[str] = []
        elected: list[int] = []
        elector = cls(
            client,
            name,
            identity="a",
            ttl=5,
            on_elected=lambda t: elected.append(t.value),
            on_lost=lambda: lost.append("lost"),
        )
        started = threading.Event()

        if api.is_async:

            async def work(token: Any, stop: Any) -> None:
                started.set()
                await stop.wait()

            runner: Any = asyncio.get_running_loop().create_task(elector.run(work))
        else:

            def swork(token: Any, stop: Any) -> None:
                started.set()
                stop.wait()

            runner = threading.Thread(target=elector.run, args=(swork,), daemon=True)
            runner.start()
        try:
            await poll(started.is_set, what="leadership")
            for _ in range(3):
                await _compact_now(api)
                proxy.reset()  # every stream (keepalive, the term's watch) reconnects
                await asyncio.sleep(0.5)
            await _compact_now(api)
            await asyncio.sleep(1.0)
            assert lost == [] and len(elected) == 1, (lost, elected)
            assert elector.is_leader()
            # a real change of the key still ends the term
            assert elector.token is not None and elector.token.key is not None
            await api(api.client.delete, elector.token.key)
            await poll(lambda: lost, what="the term to end after the key was deleted")
        finally:
            elector.stop()
            if api.is_async:
                await asyncio.wait_for(runner, 10)
            else:
                await asyncio.get_running_loop().run_in_executor(None, runner.join, 10)


async def test_compaction_while_queued_is_not_an_error(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/q"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint])
        async with api.session(ttl=10) as holder, api.session(ttl=10, client=client) as waiter:
            await api(holder.lock(name).acquire)
            pending = asyncio.ensure_future(api(waiter.lock(name).acquire, timeout=20))
            await poll(lambda: _queued(api, name, 2), what="the waiter to queue")
            await asyncio.sleep(0.3)
            await _compact_now(api)
            proxy.reset()
            await asyncio.sleep(0.5)
            assert not pending.done(), pending
            await api(holder.lock(name).release)
            token = await asyncio.wait_for(pending, 15)
            assert token.lease_id == waiter.lease_id


async def _queued(api: Api, name: str, count: int) -> bool:
    return len(await keys_under(api, name)) == count


# -- 8. a started watch misses nothing --------------------------------------------------------


async def test_started_watch_delivers_every_later_put(api: Api, etcd_namespace: str) -> None:
    key = etcd_namespace + "/w"
    for _ in range(5):
        watch = api.client.watch(key)
        await api(watch.start)
        try:
            for i in range(10):
                await api(api.client.put, key, str(i))
            seen: list[bytes] = []
            while len(seen) < 10:
                batch = await api(watch.get, 5.0)
                seen.extend(ev.kv.value for ev in batch.events)
            assert seen == [str(i).encode() for i in range(10)]
        finally:
            await api.close(watch)
        await api(api.client.delete, key)


async def test_watch_start_on_a_dead_endpoint_fails_clearly(api: Api) -> None:
    client = await api.new_client(["127.0.0.1:1"], timeout=0.5)
    watch = client.watch("k")
    with pytest.raises(ef.EtcdUnavailable):
        await api(watch.start)


# -- 9. stop() from another thread is prompt ---------------------------------------------------


@pytest.mark.parametrize("leading", [True, False], ids=["leader", "queued"])
async def test_async_elector_stop_from_another_thread_returns_promptly(
    etcd_endpoints: list[str], etcd_namespace: str, leading: bool
) -> None:
    name = etcd_namespace + "/s"
    # debug mode makes asyncio refuse (instead of silently delaying) loop calls made from
    # a foreign thread, so a stop() that is not thread-safe fails here deterministically
    asyncio.get_running_loop().set_debug(True)
    async with ef.AsyncClient(etcd_endpoints) as client, client.session(ttl=30) as other:
        if not leading:
            await other.election(name).campaign(b"someone else")
        elector = ef.AsyncLeaderElector(client, name, identity="a", ttl=30)
        running = asyncio.Event()

        async def work(token: Any, stop: asyncio.Event) -> None:
            running.set()
            await stop.wait()

        runner = asyncio.get_running_loop().create_task(elector.run(work))
        if leading:
            await asyncio.wait_for(running.wait(), 10)
        else:
            await poll(lambda: _queued(client_api(client), name, 2), what="the elector to queue")
            await asyncio.sleep(0.5)  # settle into the wait for the key ahead
        stopped_at = time.monotonic()
        threading.Thread(target=elector.stop).start()
        await asyncio.wait_for(runner, 15)
        # 0.1 noticed only at the next keepalive (TTL/3 = 10 s)
        assert time.monotonic() - stopped_at < 3.0
        assert not running.is_set() or leading
        leader = await client.leader(name)
        assert leader is None or leader.value == b"someone else"  # it resigned / withdrew
        assert len(await client.get_prefix(name + "/")) == (0 if leading else 1)


def client_api(client: Any) -> Api:
    return Api("async", client, [], None, [])


# -- 10. a raising on_elected leaves no phantom leader ----------------------------------------


async def test_raising_on_elected_ends_the_term_cleanly(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/phantom"
    cls = ef.AsyncLeaderElector if api.is_async else ef.LeaderElector

    def explode(token: Any) -> None:
        raise RuntimeError("callback bug")

    elector = cls(api.client, name, identity="a", ttl=5, on_elected=explode)
    ran: list[Any] = []

    if api.is_async:

        async def work(token: Any, stop: Any) -> None:
            ran.append(token)

    else:

        def work(token: Any, stop: Any) -> None:  # type: ignore[misc]
            ran.append(token)

    with pytest.raises(RuntimeError, match="callback bug"):
        await api(elector.run, work)
    assert ran == [], "work must not run when on_elected failed"
    assert not elector.is_leader() and elector.token is None
    assert await api(api.client.leader, name) is None, "leadership must be resigned"


# -- 13. leaving a with block never hides the real error --------------------------------------


async def test_with_block_keeps_the_users_exception_when_release_cannot_work(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint], timeout=3.0)
        session = await api.open_session(ttl=2, client=client)
        lock = session.lock(etcd_namespace + "/w")
        token = await api(lock.acquire)
        proxy.blackhole()
        assert await api(session.wait_expired, 5.0)

        class Boom(Exception):
            pass

        started = time.monotonic()
        # an exception inside the block of a session that expired meanwhile: leaving the
        # block neither waits for the unreachable etcd nor replaces the exception
        if api.is_async:
            await lock.__aexit__(Boom, Boom("inside"), None)
        else:
            lock.__exit__(Boom, Boom("inside"), None)
        assert time.monotonic() - started < 1.0, "no release was to be attempted"
        assert lock.token is None and token.value > 0
        proxy.heal()
        await api.close(session)


async def test_with_block_release_error_does_not_replace_the_exception(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint], timeout=1.0)
        async with api.session(ttl=30, client=client) as session:
            lock = session.lock(etcd_namespace + "/r")
            await api(lock.acquire)
            proxy.blackhole()  # the session is alive (TTL 30) but release cannot reach etcd

            class Boom(Exception):
                pass

            if api.is_async:
                await lock.__aexit__(Boom, Boom("inside"), None)  # returns, does not raise
            else:
                await api(lock.__exit__, Boom, Boom("inside"), None)
            assert lock.token is None
            proxy.heal()
            proxy.reset()  # the proxy dropped bytes mid-stream: start on fresh connections
            # the stray key is withdrawn by the next acquire
            token = await api(lock.acquire, timeout=10)
            assert token.lease_id == session.lease_id


# -- 14. one session, one name, two threads ---------------------------------------------------


async def test_second_acquire_of_a_held_or_pending_object_is_refused(
    api: Api, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/twice"
    async with api.session(ttl=10) as session:
        lock = session.lock(name)
        await api(lock.acquire)
        with pytest.raises(ef.AlreadyHeld):
            await api(lock.acquire)
        with pytest.raises(ef.AlreadyHeld):
            await api(lock.try_acquire)
        await api(lock.release)
        await api(lock.acquire, timeout=5)  # free again after release
        await api(lock.release)


def test_two_threads_on_one_lock_object_never_share_a_holding(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/threads"
    with ef.Client(etcd_endpoints) as client, client.session(ttl=10) as session:
        lock = session.lock(name)
        results: list[Any] = []
        barrier = threading.Barrier(8)

        def contend() -> None:
            barrier.wait()
            try:
                results.append(lock.acquire(timeout=5))
            except ef.AlreadyHeld as err:
                results.append(err)

        threads = [threading.Thread(target=contend) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        tokens = [r for r in results if isinstance(r, ef.FencingToken)]
        assert len(results) == 8
        assert len(tokens) == 1, results


# -- 11. bad input gets an EtcdfenceError, at once ---------------------------------------------


@pytest.mark.parametrize("timeout", [math.inf, math.nan, -1.0, 0, "5", True])
def test_client_refuses_unusable_timeouts(timeout: Any) -> None:
    with pytest.raises(ef.EtcdfenceError):
        ef.Client("127.0.0.1:1", timeout=timeout)
    with pytest.raises(ef.EtcdfenceError):
        ef.AsyncClient("127.0.0.1:1", timeout=timeout)


@pytest.mark.parametrize("ttl", [2**63, 9_000_000_001, 0, -1, 1.5, "10", None])
def test_session_refuses_ttls_etcd_cannot_grant(ttl: Any) -> None:
    client = ef.Client("127.0.0.1:1")
    try:
        with pytest.raises(ef.EtcdfenceError):
            client.session(ttl)
    finally:
        client.close()


@pytest.mark.parametrize("token", [2**63, 10**20, 0, -5, 1.0, "7", True])
async def test_guard_refuses_tokens_outside_the_revision_range(
    api: Api, etcd_namespace: str, token: Any
) -> None:
    guard = api.client.fence(etcd_namespace + "/res")
    with pytest.raises(
        ef.InvalidToken if not isinstance(token, (str, float)) else ef.EtcdfenceError
    ):
        await api(guard.put, token, etcd_namespace + "/k", b"v")
    assert await api(guard.current) == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.lock("a").acquire(timeout=-1),
        lambda s: s.lock("a").acquire(timeout="1"),
        lambda s: s.lock("a").acquire(timeout=math.nan),
        lambda s: s.lock("bad\udcff"),
        lambda s: s.election("e\ud800"),
        lambda s: s.lock(""),
        lambda s: s.lock(b"bytes"),
    ],
)
def test_contender_input_is_refused_with_our_errors(etcd_endpoints: list[str], call: Any) -> None:
    with (
        ef.Client(etcd_endpoints) as client,
        client.session(ttl=5) as session,
        pytest.raises(ef.EtcdfenceError),
    ):
        call(session)


@pytest.mark.parametrize("identity", ["", "a\x00b", "x\udcff", 5, None])
def test_elector_refuses_bad_identities(identity: Any) -> None:
    client = ef.Client("127.0.0.1:1")
    try:
        with pytest.raises(ef.EtcdfenceError):
            ef.LeaderElector(client, "svc", identity=identity)
    finally:
        client.close()


# -- 6. a guard's ops never touch any mark ------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        ef.Put("/etcdfence/fence/b", b"99999999999999999999"),
        ef.Delete("/etcdfence/fence/b"),
        ef.Delete("/etcdfence/fence/a/", prefix=True),
        ef.Delete("/etcdfence/fence/a", prefix=True),
        ef.Delete("/etcdfence/", prefix=True),
        ef.Delete("/", prefix=True),
        ef.Put("/etcdfence/fence/a", b"0"),
    ],
)
async def test_guard_ops_cannot_touch_any_fence_mark(
    api: Api, op: Any, etcd_namespace: str, revision_past: Callable[[int], int]
) -> None:
    a = api.client.fence("a")
    b = api.client.fence("a/b")
    high = revision_past(1000)  # a real revision: a made-up higher one is from the future
    await api(b.advance, high)
    with pytest.raises(ef.InvalidArgument):
        await api(a.txn, 1, [op])
    assert await api(b.current) == high
    # a zombie with a lower token is still refused by a/b
    with pytest.raises(ef.StaleTokenError):
        await api(b.put, 5, etcd_namespace + "/k", b"zombie")


# -- 12. silent by default, structured when configured -----------------------------------------


def test_unconfigured_app_sees_no_stdout_and_only_warnings_on_stderr(
    etcd_endpoints: list[str], etcd_namespace: str, revision_past: Callable[[int], int]
) -> None:
    revision_past(100)  # the made-up tokens below are not from the future
    script = textwrap.dedent(
        f"""
        import etcdfence as ef
        with ef.Client({etcd_endpoints!r}) as client:
            guard = client.fence({etcd_namespace + "/log"!r})
            guard.advance(100)
            try:
                guard.put(5, {etcd_namespace + "/k"!r}, b"x")   # fence_rejected: a warning
            except ef.StaleTokenError:
                pass
            session = client.session(ttl=2)
            session.open()
            session.lock({etcd_namespace + "/l"!r}).acquire()  # debug/info events
            session.orphan()
            session.wait_expired(5)                            # lease_lost: a warning
            session.close()
        print("DONE")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "DONE\n", f"the library wrote to stdout: {proc.stdout!r}"
    assert "etcdfence.fence_rejected" in proc.stderr
    assert "etcdfence.lease_lost" in proc.stderr
    assert "keepalive_retry" not in proc.stderr and "debug" not in proc.stderr.lower()


async def test_structlog_app_gets_events_with_fields(
    api: Api, etcd_namespace: str, revision_past: Callable[[int], int]
) -> None:
    import structlog

    revision_past(50)  # the made-up tokens below are not from the future

    guard = api.client.fence(etcd_namespace + "/s")
    await api(guard.advance, 50)
    with structlog.testing.capture_logs() as logs, pytest.raises(ef.StaleTokenError):
        await api(guard.put, 7, etcd_namespace + "/k", b"x")
    events = [e for e in logs if e["event"] == "etcdfence.fence_rejected"]
    assert events and events[0]["token"] == 7 and events[0]["current"] == 50, logs


def test_stdlib_logging_app_gets_fields_as_record_attributes(
    etcd_endpoints: list[str],
    etcd_namespace: str,
    caplog: pytest.LogCaptureFixture,
    revision_past: Callable[[int], int],
) -> None:
    import structlog

    revision_past(9)  # the made-up tokens below are not from the future

    saved = structlog.get_config()
    was_configured = structlog.is_configured()
    structlog.reset_defaults()  # an app that configured stdlib logging only
    try:
        _stale_write_with_stdlib_logging(etcd_endpoints, etcd_namespace, caplog)
    finally:
        if was_configured:
            structlog.configure(**saved)


def _stale_write_with_stdlib_logging(
    etcd_endpoints: list[str], etcd_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with ef.Client(etcd_endpoints) as client:
        guard = client.fence(etcd_namespace + "/l")
        guard.advance(9)
        with caplog.at_level("WARNING", logger="etcdfence"), pytest.raises(ef.StaleTokenError):
            guard.put(3, etcd_namespace + "/k", b"x")
    records = [r for r in caplog.records if r.getMessage().startswith("etcdfence.fence_rejected")]
    assert records, caplog.records
    fields = records[0].etcdfence_fields  # type: ignore[attr-defined]
    assert fields["token"] == 3 and fields["current"] == 9
    assert json.dumps(fields)  # plain values

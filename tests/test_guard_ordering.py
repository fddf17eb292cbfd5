"""Within-term ordering of FenceGuard writes (issue #17), against real etcd.

Equal tokens pass, so without more a write of the current term that reaches etcd late
— its reply lost, its bytes held in the network — overwrites newer data of the same
term. The guard's mark is ``(token, epoch)``: a lost outcome moves the writer to the
next epoch before the error is raised, so the late attempt is rejected. The held-write
tests use the fault proxy's hold-and-release mode; each has a control that sends the
same writes the 0.1 way (epoch never moves) and shows the late landing.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, poll

import etcdfence as ef
from etcdfence import _keys, _txn
from etcdfence import epochs as epochs_module
from etcdfence.epochs import WriterEpochs
from etcdfence.testing import FaultProxy

api = api_fixture()

# -- pure logic ---------------------------------------------------------------------------


def test_mark_byte_order_is_token_then_epoch_and_0_1_marks_read_as_epoch_0() -> None:
    marks = [(1, 0), (1, 1), (1, 2), (2, 0), (2, 9_999_999_999), (10**18, 0), (2**63 - 1, 3)]
    encoded = [_keys.encode_mark(t, e) for t, e in marks]
    assert encoded == sorted(encoded)
    assert [_keys.decode_mark_epoch(raw) for raw in encoded] == marks
    assert _keys.encode_mark(42) == b"00000000000000000042"  # exactly what 0.1 wrote
    assert _keys.decode_mark_epoch(b"00000000000000000042") == (42, 0)
    for bad in (b"", b"x", b"00000000000000000042:", b"00000000000000000042:12", b"1:-1"):
        with pytest.raises(ef.InvalidArgument):
            _keys.decode_mark_epoch(bad)
    with pytest.raises(ef.InvalidArgument):
        _keys.encode_mark(1, _keys.MAX_EPOCH + 1)


def test_writer_epochs_own_only_what_they_claimed_for_the_newest_term() -> None:
    epochs = WriterEpochs()
    assert epochs.get(5) == 0 and epochs.owned(5) is None  # nothing claimed: claim first
    epochs.claimed(5, 0)
    assert epochs.owned(5) == 0
    epochs.give_up(5, 0)  # a lost attempt: never write at epoch 0 again
    assert epochs.owned(5) is None and epochs.get(5) == 0
    epochs.claimed(5, 3)
    epochs.give_up(5, 2)  # a stale report about an epoch given up before
    assert epochs.owned(5) == 3
    epochs.claimed(5, 1)  # a late acknowledgement of an older claim: never backwards
    assert epochs.owned(5) == 3
    epochs.claimed(3, 9)  # an older term leaves no state
    assert epochs.owned(5) == 3 and epochs.owned(3) is None
    epochs.claimed(7, 0)
    assert epochs.owned(5) is None and epochs.get(5) == 0 and epochs.owned(7) == 0


def test_a_claim_is_the_smallest_mark_above() -> None:
    claim_after = epochs_module.claim_after
    assert claim_after(5, 4, 9) == (5, 0)
    assert claim_after(5, 0, 0) == (5, 0)
    assert claim_after(5, 5, 0) == (5, 1) and claim_after(5, 5, 41) == (5, 42)
    with pytest.raises(ef.InvalidArgument):
        claim_after(5, 5, _keys.MAX_EPOCH)


def test_writer_epochs_are_thread_safe() -> None:
    epochs = WriterEpochs()

    def claim(start: int) -> None:
        for epoch in range(start, 8000, 4):
            epochs.claimed(1, epoch)
            epochs.give_up(1, epoch - 4)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert epochs.get(1) == 7999 and epochs.owned(1) == 7999


# -- against etcd ---------------------------------------------------------------------------

pytestmark = pytest.mark.integration


async def _token(api: Api, session: Any, name: str) -> ef.FencingToken:
    token: ef.FencingToken = await api(session.lock(name).acquire, timeout=10)
    return token


async def test_a_0_1_mark_stays_readable_and_writable(api: Api, etcd_namespace: str) -> None:
    guard = api.client.fence(etcd_namespace + "/old")
    await api(api.client.put, guard.key, _keys.encode_mark(100))  # as 0.1 left it
    assert await api(guard.current) == 100
    assert await api(guard.current_mark) == (100, 0)
    with pytest.raises(ef.StaleTokenError) as info:
        await api(guard.put, 99, etcd_namespace + "/k", b"x")
    assert info.value.current == 100
    await api(guard.put, 100, etcd_namespace + "/k", b"y")
    # a 0.1 writer wrote at (100, 0): this guard claims the epoch above it
    assert await api(guard.current_mark) == (100, 1)
    await api(guard.put, 101, etcd_namespace + "/k", b"z")
    kv = await api(api.client.get, guard.key)
    assert kv.value == b"00000000000000000101"  # epoch 0 writes the 0.1 format


async def test_fence_off_rejects_every_earlier_attempt_and_peers_claim_their_own(
    api: Api, etcd_namespace: str
) -> None:
    resource = etcd_namespace + "/r"
    key = etcd_namespace + "/k"
    a = api.client.fence(resource)
    b = api.client.fence(resource)  # a second writer of the same term
    await api(a.put, 7, key, b"a0")
    await api(a.fence_off, 7)
    assert await api(a.current_mark) == (7, 1) and a.epoch(7) == 1
    # an attempt of the old epoch, however late, is rejected
    stray = _txn.fence_txn(a.key, 7, [_txn.op_put(key.encode(), b"stray")], epoch=0)
    response = await api(api.client.txn_raw, stray)
    assert response.succeeded  # the "stale" branch: nothing written
    assert (await api(api.client.get, key)).value == b"a0"
    # b's first write claims an epoch of its own, above a's: no two writers share one
    assert b.epoch(7) == 0
    await api(b.put, 7, key, b"b1")
    assert b.epoch(7) == 2 and (await api(api.client.get, key)).value == b"b1"
    # a meets b's epoch: refused (proof its attempt did not apply), claims a fresh one
    await api(a.put, 7, key, b"a3")
    assert a.epoch(7) == 3 and (await api(api.client.get, key)).value == b"a3"
    # a lower token is still plain stale, with the token part as `current`
    with pytest.raises(ef.StaleTokenError) as info:
        await api(b.put, 6, key, b"zombie")
    assert info.value.current == 7
    # and a new term starts at epoch 0 above any epoch of the old one
    await api(a.put, 8, key, b"next term")
    assert await api(a.current_mark) == (8, 0)
    with pytest.raises(ef.StaleTokenError):
        await api(a.fence_off, 7)


async def test_cancelled_or_interrupted_write_moves_the_writer_on(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    guard = api.client.fence(etcd_namespace + "/c")
    await api(guard.put, 3, etcd_namespace + "/k", b"v")
    if api.is_async:
        task = asyncio.ensure_future(guard.put(3, etcd_namespace + "/k", b"w"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:

        def interrupt(record: ef.CallRecord) -> None:
            if record.method == "Txn":
                raise KeyboardInterrupt  # Ctrl-C as the answer arrives

        remove = api.client.on_call(interrupt)
        try:
            with pytest.raises(KeyboardInterrupt):
                await api(guard.put, 3, etcd_namespace + "/k", b"w")
        finally:
            remove()
    assert guard._writer.epochs.owned(3) is None  # epoch 0 given up: the next write claims
    await api(guard.put, 3, etcd_namespace + "/k", b"after")
    assert await api(guard.current_mark) == (3, 1) and guard.epoch(3) == 1


async def _held_write_scenario(
    api: Api, etcd_endpoints: list[str], name: str, *, ordered: bool
) -> tuple[bytes, Any]:
    """One writer: write v0; send `stray` and hold its bytes in the network while the
    writer's client gives up; write v1, v2 (acknowledged); release the held bytes.
    Returns the key's final value and what the stray call raised."""
    key = name + "/k"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint], timeout=5.0)
        async with api.session(ttl=10) as session:
            token = await _token(api, session, name + "/lock")
            guard = client.fence(name + "/res")

            async def write(value: bytes) -> Any:
                if ordered:
                    return await api(guard.put, token, key, value)
                raw = _txn.fence_txn(guard.key, token.value, [_txn.op_put(key.encode(), value)])
                return await api(client.txn_raw, raw)  # the 0.1 guard txn: epoch never moves

            await write(b"v0")  # the connection through the proxy is up
            proxy.hold()
            stray = asyncio.ensure_future(write(b"stray"))
            # the whole request must be in the network (a gRPC call whose bytes did not
            # all leave is retried on a new connection by gRPC itself: never sent)
            body = _txn.fence_txn(guard.key, token.value, [_txn.op_put(key.encode(), b"stray")])
            size = len(body.SerializeToString()) + 9 + 5  # DATA frame + gRPC message prefix
            await asyncio.get_running_loop().run_in_executor(None, proxy.wait_held, size)
            proxy.sever_held()  # the client gives up; its bytes stay in the network
            with pytest.raises(ef.EtcdUnavailable) as lost:
                await asyncio.wait_for(stray, 10)
            await api(client.get, key)  # an idempotent read: the channel reconnects first
            await write(b"v1")
            await write(b"v2")  # acknowledged, newer than the stray attempt
            before = await api(api.client.revision)
            proxy.release()
            await poll(lambda: proxy.held_bytes == 0, what="the held bytes to be delivered")
            await asyncio.sleep(1.5)  # the server handles them (the proxy lingers 1 s)
            final = await api(api.client.get, key)
            after = await api(api.client.revision)
            return final.value, (lost.value, before, after, guard)


async def test_held_write_released_after_later_writes_is_rejected(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    value, (lost, before, after, _guard) = await _held_write_scenario(
        api, etcd_endpoints, etcd_namespace, ordered=True
    )
    assert value == b"v2", "a write of this writer landed after a later acknowledged one"
    assert isinstance(lost, ef.OutcomeUnknown) and lost.epoch == 0
    assert lost.fenced_off, "the quick fence-off goes through a fresh connection"
    assert after == before, "the late attempt changed nothing"


async def test_control_held_write_lands_late_without_epochs(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    value, (_lost, before, after, _) = await _held_write_scenario(
        api, etcd_endpoints, etcd_namespace, ordered=False
    )
    assert value == b"stray" and after > before, (
        "control: the held write must land late when the epoch never moves"
    )


# -- issue #21 item 3: a later incarnation of a writer with the same token ----------------


async def _stray_of_a_dead_writer(
    api: Api, etcd_endpoints: list[str], name: str, then: Any
) -> bytes:
    """Writer A (a guard on a client through the proxy) writes v0, then a write whose
    bytes the network holds; A's quick fence-off is cut off too (fenced_off False), and
    A is gone. ``then(token)`` is the next incarnation: it writes v1 with the same token
    (acknowledged). The held bytes are released last; returns the key's final value."""
    key = name + "/k"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint], timeout=2.0)
        async with api.session(ttl=10) as session:
            token = await _token(api, session, name + "/lock")
            a = client.fence(name + "/res")
            await api(a.put, token, key, b"v0")
            proxy.hold()
            stray = asyncio.ensure_future(api(a.put, token, key, b"stray"))
            body = _txn.fence_txn(a.key, token.value, [_txn.op_put(key.encode(), b"stray")])
            size = len(body.SerializeToString()) + 9 + 5  # DATA frame + gRPC message prefix
            await asyncio.get_running_loop().run_in_executor(None, proxy.wait_held, size)
            proxy.blackhole()  # A's quick fence-off cannot reach etcd either
            proxy.sever_held()
            with pytest.raises(ef.OutcomeUnknown) as lost:
                await asyncio.wait_for(stray, 20)
            assert not lost.value.fenced_off  # the stray may still apply
            await api(client.aclose if api.is_async else client.close)  # A is gone
            proxy.heal()
            await then(token)  # the next incarnation, acknowledged
            # what the stray could touch: the key and the mark (the etcd is shared by
            # other tests' sessions, so its global revision may move meanwhile)
            before = [await api(api.client.get, k) for k in (key, a.key)]
            proxy.release()
            await poll(lambda: proxy.held_bytes == 0, what="the held bytes to be delivered")
            await asyncio.sleep(1.5)  # the server handles them (the proxy lingers 1 s)
            final = await api(api.client.get, key)
            if final.value == b"v1":
                after = [await api(api.client.get, k) for k in (key, a.key)]
                assert after == before, "the stray wrote something"
            return bytes(final.value)


async def test_a_new_guard_with_the_same_token_never_shares_an_epoch_with_a_lost_write(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """A new guard object (client.fence() makes one per call; a restarted process makes
    one) used to start at epoch 0 — the lost attempt's epoch — so the stray landed after
    its acknowledged write. Its first write now claims an epoch above every earlier one."""

    async def b_writes(token: ef.FencingToken) -> None:
        b = api.client.fence(etcd_namespace + "/res")  # a new incarnation
        await api(b.put, token, etcd_namespace + "/k", b"v1")

    final = await _stray_of_a_dead_writer(api, etcd_endpoints, etcd_namespace, b_writes)
    assert final == b"v1", "a lost write of an earlier incarnation landed after a later one's"


def _cli(etcd_endpoints: list[str], *args: str) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "etcdfence", "--endpoints", ",".join(etcd_endpoints), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


async def test_a_cli_put_with_the_same_token_never_shares_an_epoch_with_a_lost_write(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """The next incarnation is another process: ``etcdfence fence put``."""

    async def cli_writes(token: ef.FencingToken) -> None:
        args = ("fence", "put", etcd_namespace + "/res", etcd_namespace + "/k", "v1")
        await asyncio.to_thread(_cli, etcd_endpoints, *args, "--token", str(token.value))

    final = await _stray_of_a_dead_writer(api, etcd_endpoints, etcd_namespace, cli_writes)
    assert final == b"v1"


async def test_cli_fence_off_refuses_every_earlier_write_of_the_token(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """An operator fences the dead writer's token off from the shell, then a new guard
    writes: the stray, released afterwards, is refused."""

    async def fence_off_then_write(token: ef.FencingToken) -> None:
        args = ("fence", "off", etcd_namespace + "/res", "--token", str(token.value))
        record = await asyncio.to_thread(_cli, etcd_endpoints, *args)
        assert record["token"] == token.value and record["epoch"] >= 1
        b = api.client.fence(etcd_namespace + "/res")
        await api(b.put, token, etcd_namespace + "/k", b"v1")
        assert b.epoch(token) > record["epoch"]  # b claimed its own, above the CLI's

    final = await _stray_of_a_dead_writer(api, etcd_endpoints, etcd_namespace, fence_off_then_write)
    assert final == b"v1"


def test_cli_fence_off_of_a_stale_token_exits_4(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    import subprocess
    import sys

    resource = etcd_namespace + "/res"
    assert _cli(etcd_endpoints, "fence", "off", resource, "--token", "9")["epoch"] == 0
    assert _cli(etcd_endpoints, "fence", "off", resource, "--token", "9")["epoch"] == 1
    command = [sys.executable, "-m", "etcdfence", "--endpoints", ",".join(etcd_endpoints)]
    done = subprocess.run(
        [*command, "fence", "off", resource, "--token", "8"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4, done
    assert done.stderr.strip().startswith("etcdfence: error:") and "stale" in done.stderr.lower()


# -- first writes (claims) of a term, held or racing; etcd and Redis ---------------------


async def test_a_held_first_write_claim_is_refused_after_later_writes(
    api: Api, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """Invariant 3: a guard's FIRST write (claim+write, CAS on the mark's mod_revision)
    held in the network; the quick fence-off claims; the writer writes again
    (acknowledged); the held claim+write is delivered last and must change nothing."""
    key = etcd_namespace + "/k"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        client = await api.new_client([proxy.endpoint], timeout=3.0)
        await api(client.get, key)  # the connection through the proxy is up
        guard = client.fence(etcd_namespace + "/res")
        proxy.hold()
        stray = asyncio.ensure_future(api(guard.put, 7, key, b"stray"))
        body = _txn.claim_txn(
            guard.key, 0, _keys.encode_mark(7, 0), [_txn.op_put(key.encode(), b"stray")]
        )
        size = len(body.SerializeToString()) + 9 + 5
        await asyncio.get_running_loop().run_in_executor(None, proxy.wait_held, size)
        proxy.sever_held()
        try:
            await asyncio.wait_for(stray, 20)
            raise AssertionError("the held write was acknowledged")
        except ef.EtcdUnavailable as exc:
            lost = exc
        await api(guard.put, 7, key, b"next")
        other = api.client.fence(etcd_namespace + "/res")  # a restarted writer
        await api(other.put, 7, key, b"next2")
        proxy.release()
        await poll(lambda: proxy.held_bytes == 0, what="the held bytes to be delivered")
        await asyncio.sleep(1.5)
        final = await api(api.client.get, key)
    assert final.value == b"next2", f"stray landed late (lost: {lost!r})"


@pytest.mark.parametrize("marked", [False, True])
def test_require_owner_first_write_of_a_lost_lock_moves_nothing(
    etcd_client: ef.Client, etcd_namespace: str, marked: bool
) -> None:
    """Invariant 2/3 with require_owner: the owner check nested in the CLAIM txn. A new
    guard's first write (a claim: one txn on a fresh resource, a refused guess then a
    CAS on a marked one) with a token whose lock is gone writes nothing and does not
    move the mark."""
    res, key = f"{etcd_namespace}/res", f"{etcd_namespace}/res/k"
    with etcd_client.session(ttl=5) as session:
        token = session.lock(f"{etcd_namespace}/lock").acquire()
        if marked:
            etcd_client.fence(res).put(token, key, "1")  # another writer of the term
        etcd_client.delete(token.key)  # type: ignore[arg-type]  # lost behind its back
        mark = etcd_client.get(_keys.fence_key(_keys.DEFAULT_FENCE_PREFIX, res))
        before = etcd_client.revision()
        guard = etcd_client.fence(res, require_owner=True)
        with pytest.raises(ef.NotOwnerError):
            guard.put(token, key, "2")
        assert etcd_client.revision() == before
        assert etcd_client.get(_keys.fence_key(_keys.DEFAULT_FENCE_PREFIX, res)) == mark
        assert guard.epoch(token) == 0


def _need_redis() -> Any:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis(socket_timeout=2, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis: {exc}")
    return redis


WRITERS, WRITES = 12, 15


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_many_fences_of_one_token_racing_first_writes(backend: str, etcd_client: Any) -> None:
    """Many writers of ONE token, each its own fence (a restarted process, a CLI call),
    race their first writes (the claim compare-and-set) and write on: every accepted
    write gets a version unique and increasing per writer; the shared key holds the
    value of the write with the highest version (version order = landing order); a
    writer that gives up says fenced_off (nothing written)."""
    name = f"race-{uuid.uuid4().hex[:8]}"
    if backend == "etcd":
        fences: list[Any] = [etcd_client.fence(name) for _ in range(WRITERS)]
        shared = f"{name}/shared"

        def read() -> Any:
            return etcd_client.get(shared).value

    else:
        _redis = _need_redis()
        from etcdfence.redis import RedisFence

        r = _redis.Redis(socket_timeout=10)
        fences = [RedisFence(_redis.Redis(socket_timeout=10), name) for _ in range(WRITERS)]
        shared = fences[0].key_for("shared")

        def read() -> Any:
            return r.get(shared)

    acked: list[tuple[int, bytes]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    go = threading.Barrier(WRITERS)

    def writer(i: int) -> None:
        go.wait()
        last = 0
        for n in range(WRITES):
            value = f"w{i}-{n}".encode()
            try:
                version = fences[i].put(9, shared, value)
            except ef.OutcomeUnknown as exc:
                with lock:
                    errors.append(exc)
                continue
            assert version > last, (i, n, version, last)
            last = version
            with lock:
                acked.append((version, value))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert all(e.fenced_off for e in errors), errors[:3]  # type: ignore[attr-defined]
        versions = [v for v, _ in acked]
        assert len(set(versions)) == len(versions), "two accepted writes got one version"
        assert acked, errors[:3]
        top = max(acked)
        assert read() == top[1], f"final value is not the write with the highest version {top}"
    finally:
        if backend == "redis":
            f = fences[0]
            r.delete(f.key, f.version_key, shared)

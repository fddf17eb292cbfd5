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
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, poll

import etcdfence as ef
from etcdfence import _keys, _txn
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


def test_writer_epochs_keep_the_newest_term_only() -> None:
    epochs = WriterEpochs()
    assert epochs.get(5) == 0
    assert epochs.bump(5, 0) == 1
    assert epochs.bump(5, 0) == 1  # a second report of the same lost attempt
    assert epochs.adopt(5, 4) == 4 and epochs.get(5) == 4
    assert epochs.adopt(5, 2) == 4  # never backwards
    assert epochs.adopt(3, 9) == 9 and epochs.get(5) == 4  # an older term leaves no state
    assert epochs.adopt(7, 0) == 0 and epochs.get(5) == 0 and epochs.get(7) == 0


def test_writer_epochs_are_thread_safe() -> None:
    epochs = WriterEpochs()

    def bump() -> None:
        for _ in range(2000):
            epochs.bump(1, epochs.get(1))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 2000 <= epochs.get(1) <= 8000


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
    kv = await api(api.client.get, guard.key)
    assert kv.value == b"00000000000000000100"  # epoch 0 writes the 0.1 format


async def test_fence_off_rejects_every_earlier_attempt_and_peers_adopt(
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
    # b meets epoch 1 of its own token: adopts it and its write goes through
    assert b.epoch(7) == 0
    await api(b.put, 7, key, b"b1")
    assert b.epoch(7) == 1 and (await api(api.client.get, key)).value == b"b1"
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
    assert guard.epoch(3) == 1
    await api(guard.put, 3, etcd_namespace + "/k", b"after")
    assert await api(guard.current_mark) == (3, 1)


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

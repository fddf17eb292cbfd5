"""Client and AsyncClient against real etcd: KV, txn, watch, failover, bad input."""

from __future__ import annotations

import asyncio
import time

import pytest

import etcdfence as ef
from etcdfence._wire import messages as m
from etcdfence.testing import EtcdCluster, FaultProxy

pytestmark = pytest.mark.integration


def test_kv_round_trip_returns_revisions(etcd_client: ef.Client, etcd_namespace: str) -> None:
    key = f"{etcd_namespace}/k"
    rev1 = etcd_client.put(key, "v1")
    rev2 = etcd_client.put(key.encode(), b"v2")
    assert rev2 == rev1 + 1
    kv = etcd_client.get(key)
    assert kv is not None
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) == (
        key.encode(),
        b"v2",
        rev1,
        rev2,
        2,
    )
    assert kv.lease_id == 0
    assert etcd_client.get_prefix(etcd_namespace) == [kv]
    rev3 = etcd_client.delete(key)
    assert rev3 == rev2 + 1
    assert etcd_client.get(key) is None
    assert etcd_client.revision() >= rev3


async def test_async_kv_round_trip(async_etcd_client: ef.AsyncClient, etcd_namespace: str) -> None:
    key = f"{etcd_namespace}/k"
    revs = await asyncio.gather(*(async_etcd_client.put(f"{key}{i}", str(i)) for i in range(20)))
    assert len(set(revs)) == 20
    kvs = await async_etcd_client.get_prefix(etcd_namespace)
    assert sorted(int(kv.value) for kv in kvs) == list(range(20))
    assert await async_etcd_client.delete(etcd_namespace, prefix=True) > max(revs)
    assert await async_etcd_client.get_prefix(etcd_namespace) == []


def test_raw_txn_compare_and_nested(etcd_client: ef.Client, etcd_namespace: str) -> None:
    key = f"{etcd_namespace}/t".encode()
    nested = m.TxnRequest(
        compare=[
            m.Compare(
                key=key, target=m.CompareTarget.VERSION, result=m.CompareResult.EQUAL, version=0
            )
        ],
        success=[m.RequestOp(request_put=m.PutRequest(key=key, value=b"first"))],
    )
    outer = m.TxnRequest(success=[m.RequestOp(request_txn=nested)])
    resp = etcd_client.txn_raw(outer)
    assert resp.succeeded and resp.responses[0].response_txn.succeeded
    resp = etcd_client.txn_raw(outer)  # key exists now: nested compare fails, nothing written
    assert not resp.responses[0].response_txn.succeeded
    assert etcd_client.get(key).value == b"first"  # type: ignore[union-attr]


@pytest.mark.parametrize("key,value", [(5, "v"), ("k", 5), (None, "v"), ("k", None)])
def test_wrong_types_are_type_errors(etcd_client: ef.Client, key: object, value: object) -> None:
    with pytest.raises(TypeError):
        etcd_client.put(key, value)  # type: ignore[arg-type]


def test_oversized_value_is_clear_error_and_writes_nothing(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    key = f"{etcd_namespace}/big"
    with pytest.raises(ef.EtcdRequestError) as info:
        etcd_client.put(key, b"x" * (3 * 1024 * 1024))
    assert "large" in str(info.value).lower() or "exhausted" in str(info.value).lower()
    assert etcd_client.get(key) is None


def test_unreachable_endpoint_fails_within_timeout() -> None:
    with ef.Client("http://127.0.0.1:1", timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(ef.EtcdUnavailable) as info:
            client.get("k")
        assert time.monotonic() - started < 3.0
        assert "127.0.0.1:1" in str(info.value)


async def test_async_unreachable_endpoint_fails_within_timeout() -> None:
    async with ef.AsyncClient("127.0.0.1:1", timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(ef.EtcdUnavailable):
            await client.put("k", "v")
        assert time.monotonic() - started < 3.0


def test_dead_endpoint_first_fails_over(etcd_endpoints: list[str], etcd_namespace: str) -> None:
    with ef.Client(["http://127.0.0.1:1", *etcd_endpoints], timeout=3.0) as client:
        assert client.put(f"{etcd_namespace}/fo", "1") > 0  # never sent to :1, so safe to retry
        assert client.get(f"{etcd_namespace}/fo") is not None


def test_watch_resumes_after_stream_cut(etcd_endpoints: list[str], etcd_namespace: str) -> None:
    with FaultProxy(etcd_endpoints[0]) as proxy, ef.Client(proxy.endpoint) as client:
        prefix = f"{etcd_namespace}/w/"
        start = client.put(prefix + "0", "0")
        seen: list[bytes] = []
        with client.watch(prefix, prefix=True, start_revision=start) as watch:
            for i in range(1, 4):
                client.put(prefix + str(i), str(i))
            while len(seen) < 4:
                seen += [ev.kv.value for ev in watch.get(timeout=5).events]
            proxy.reset()  # break every connection: the watch must reconnect and resume
            time.sleep(0.2)
            with ef.Client(etcd_endpoints) as direct:
                for i in range(4, 8):
                    direct.put(prefix + str(i), str(i))
            while len(seen) < 8:
                seen += [ev.kv.value for ev in watch.get(timeout=10).events]
        assert seen == [str(i).encode() for i in range(8)]  # nothing lost, nothing repeated
        assert proxy.connections >= 2


async def test_async_watch_surfaces_compaction(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    key = f"{etcd_namespace}/c"
    first = await async_etcd_client.put(key, "1")
    last = await async_etcd_client.put(key, "2")
    await async_etcd_client.compact(last)
    async with async_etcd_client.watch(key, start_revision=first) as watch:
        with pytest.raises(ef.CompactedError) as info:
            await watch.get(timeout=5)
    assert info.value.compact_revision == last


def _put_resolving_unknown(client: ef.Client, key: str, value: str, deadline: float) -> None:
    """What a careful caller does: a write whose outcome is unknown is re-read,
    and only re-sent once the read shows it did not land."""
    while True:
        try:
            client.put(key, value)
            return
        except ef.EtcdUnavailable:
            if time.monotonic() > deadline:
                raise
            try:
                kv = client.get(key)
            except ef.EtcdUnavailable:
                continue
            if kv is not None and kv.value == value.encode():
                return


@pytest.mark.cluster
def test_failover_when_the_leader_member_is_killed(
    etcd_cluster: EtcdCluster, etcd_namespace: str
) -> None:
    victim = etcd_cluster.leader_index()
    assert victim is not None
    # the client talks to the victim first: the worst case
    endpoints = [etcd_cluster.endpoints[victim]] + [
        e for i, e in enumerate(etcd_cluster.endpoints) if i != victim
    ]
    with ef.Client(endpoints, timeout=3.0) as client:
        client.put(f"{etcd_namespace}/before", "1")
        etcd_cluster.kill(victim)
        try:
            started = time.monotonic()
            for i in range(5):
                _put_resolving_unknown(client, f"{etcd_namespace}/after{i}", str(i), started + 20)
            assert [client.get(f"{etcd_namespace}/after{i}").value for i in range(5)] == [  # type: ignore[union-attr]
                str(i).encode() for i in range(5)
            ]
            assert client.get(f"{etcd_namespace}/before") is not None
            assert client.endpoint != endpoints[0]  # moved off the dead member
            with client.session(ttl=2) as session:
                assert session.lock(f"{etcd_namespace}/lk").acquire(timeout=5).value > 0
        finally:
            etcd_cluster.restart(victim)
            etcd_cluster.wait_for_leader(10)

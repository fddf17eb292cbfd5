"""``Create`` beyond the shared shape tests: deliveries racing from real processes, and
a Create whose answer was lost (a real proxy drops etcd's / Redis's replies).

The shape tests (``test_fence_shape.py``) race writers as threads and tasks on every
backend; here each delivery is its own process, as Celery workers are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.fence import Create, Op, Put
from etcdfence.testing import FaultProxy

pytestmark = pytest.mark.integration

REDIS = os.environ.get("ETCDFENCE_TEST_REDIS", "127.0.0.1:6379")

#: One worker process: connects, says "ready", then per slot read from stdin delivers
#: it once — txn(token, [Create(slot, me), Put(effect/<slot>/me)]) — and prints the
#: outcome as JSON.
WORKER = r"""
import json, sys
import etcdfence as ef
from etcdfence.fence import Create, Put, Delete

backend, address, resource, token, me = sys.argv[1:6]
if backend == "etcd":
    client = ef.Client(address.split(","), timeout=5.0)
    fence = client.fence(resource)
    key = lambda name: f"{resource}/{name}"
else:
    import redis
    from etcdfence.redis import RedisFence
    host, port = address.rsplit(":", 1)
    fence = RedisFence(redis.Redis(host=host, port=int(port), socket_timeout=5), resource)
    key = fence.key_for
print("ready", flush=True)
for line in sys.stdin:
    slot = line.strip()
    ops = [Create(key(f"slots/{slot}"), me), Put(key(f"effect/{slot}/{me}"), b"done")]
    try:
        fence.txn(int(token), ops)
        outcome = "applied"
    except ef.KeyExistsError as exc:
        outcome = "exists:" + exc.value  # str, as the Create's value (me)
    print(json.dumps({"slot": slot, "outcome": outcome}), flush=True)
"""


def _redis_or_skip() -> Any:
    redis = pytest.importorskip("redis")
    host, port = REDIS.rsplit(":", 1)
    admin = redis.Redis(host=host, port=int(port), socket_timeout=5, socket_connect_timeout=2)
    try:
        admin.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS}: {exc}")
    return admin


def _keyer(backend: str, resource: str) -> Callable[[str], str]:
    """Data keys of ``resource``: under it on etcd, in its hash slot on Redis."""
    if backend == "etcd":
        return lambda name: f"{resource}/{name}"
    return lambda name: f"{{{resource}}}:{name}"


def _read(store: Any, key: str) -> bytes | None:
    got = store.get(key)
    if got is None or isinstance(got, bytes):
        return got
    return bytes(got.value)


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_racing_worker_processes_apply_one_effect_per_slot(
    backend: str,
    etcd_endpoints: list[str],
    etcd_client: ef.Client,
    revision_past: Any,
    procs: list[subprocess.Popen[str]],
) -> None:
    """Four worker processes get every slot at once, with one token (a beat's term):
    per slot exactly one applies its effect, the others are told whose it was."""
    token = revision_past(50)
    resource = f"t/create-procs-{uuid.uuid4().hex[:8]}"
    store: Any = etcd_client
    address = ",".join(etcd_endpoints)
    if backend == "redis":
        store, address = _redis_or_skip(), REDIS
    key = _keyer(backend, resource)
    workers = [f"w{i}" for i in range(4)]
    for me in workers:
        cmd = [sys.executable, "-c", WORKER, backend, address, resource, str(token), me]
        procs.append(
            subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for slot in ("a", "b", "c"):
            for proc in procs:  # every worker gets the slot before any answers
                assert proc.stdin is not None
                proc.stdin.write(slot + "\n")
                proc.stdin.flush()
            outcomes = [json.loads(proc.stdout.readline())["outcome"] for proc in procs]  # type: ignore[union-attr]
            winners = [me for me, got in zip(workers, outcomes, strict=True) if got == "applied"]
            assert len(winners) == 1, f"slot {slot}: {outcomes}"
            assert all(got in ("applied", f"exists:{winners[0]}") for got in outcomes)
            effects = [_read(store, key(f"effect/{slot}/{me}")) for me in workers]
            assert [me for me, e in zip(workers, effects, strict=True) if e] == winners
            assert _read(store, key(f"slots/{slot}")) == winners[0].encode()
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(10)
        if backend == "redis":
            leftovers = store.keys(f"*{{{resource}}}*")
            if leftovers:
                store.delete(*leftovers)
            store.close()


def _lost_create(fence: Any, proxy: FaultProxy, token: int, ops: list[Any]) -> Any:
    """Send ``ops`` while the proxy drops every reply: the request reaches the store and
    applies, the answer is lost. Returns the OutcomeUnknownError."""
    proxy.blackhole("downstream")
    try:
        with pytest.raises(ef.OutcomeUnknownError) as lost:
            fence.txn(token, ops)
    finally:
        proxy.heal()
    return lost.value


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_a_lost_create_resent_finds_its_own_value(
    backend: str, etcd_endpoints: list[str], etcd_client: ef.Client, revision_past: Any
) -> None:
    """The documented rule after OutcomeUnknownError: fence off, send the same txn
    again; KeyExistsError whose value is this delivery's own says the earlier attempt
    applied (with its effect); another delivery's value says it did not."""
    token = revision_past(50)
    resource = f"t/create-lost-{uuid.uuid4().hex[:8]}"
    if backend == "etcd":
        proxy = FaultProxy(etcd_endpoints[0])
        client: Any = ef.Client([proxy.endpoint], timeout=1.0)
        fence: Any = client.fence(resource)
        store: Any = etcd_client
    else:
        import redis

        store = _redis_or_skip()
        proxy = FaultProxy(REDIS)
        host, port = proxy.address.rsplit(":", 1)
        flavour: Any = redis.Redis
        client = flavour(host=host, port=int(port), socket_timeout=1.0, retry=None)
        from etcdfence.redis import RedisFence

        fence = RedisFence(client, resource)
    key = _keyer(backend, resource)
    try:
        fence.put(token, key("warm"), b"up")  # the connection through the proxy is up
        slot, effect = key("slots/s"), key("effect/s")
        ops = [Create(slot, b"delivery-1"), Put(effect, b"done")]
        lost = _lost_create(fence, proxy, token, ops)
        assert not lost.fenced_off  # the quick fence-off's answer was dropped too
        fence.fence_off(token)
        assert _read(store, slot) == b"delivery-1" and _read(store, effect) == b"done"
        with pytest.raises(ef.KeyExistsError) as again:
            fence.txn(token, ops)
        assert again.value.value == b"delivery-1", "the rule: own value, own write"
        # another delivery of the slot learns it was not its own, and applies nothing
        with pytest.raises(ef.KeyExistsError) as other:
            fence.txn(token, [Create(slot, b"delivery-2"), Put(key("effect/2"), b"x")])
        assert other.value.value == b"delivery-1"
        assert _read(store, key("effect/2")) is None
    finally:
        client.close()
        proxy.close()
        if backend == "redis":
            leftovers = store.keys(f"*{{{resource}}}*")
            if leftovers:
                store.delete(*leftovers)
            store.close()


def test_a_redis_create_over_a_key_of_another_type_names_no_value() -> None:
    """The script reads the found value only from a string key: a hash there is still
    "exists" (value None), and nothing of the transaction is written."""
    admin = _redis_or_skip()
    from etcdfence.redis import RedisFence

    resource = f"t/create-type-{uuid.uuid4().hex[:8]}"
    fence = RedisFence(admin, resource)
    slot, effect = fence.key_for("slots/h"), fence.key_for("effect")
    try:
        admin.hset(slot, "field", "1")
        with pytest.raises(ef.KeyExistsError) as info:
            fence.txn(1, [Put(effect, b"x"), Create(slot, b"mine")])
        assert (info.value.key, info.value.value) == (slot, None)
        assert admin.get(effect) is None and fence.current_mark() == (0, 0)
    finally:
        leftovers = admin.keys(f"*{{{resource}}}*")
        if leftovers:
            admin.delete(*leftovers)
        admin.close()


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_key_exists_value_has_the_type_of_the_creates_value(
    backend: str, etcd_client: ef.Client, revision_past: Any
) -> None:
    """The resend rule ("a KeyExistsError whose .value is yours means your first
    attempt applied") with the README's str values: ``.value`` is a str for a str
    Create (as ``.key`` is the key as given), bytes for a bytes Create, and bytes when
    the stored value is not UTF-8."""
    token = revision_past(50)
    resource = f"t/create-type-{uuid.uuid4().hex[:8]}"
    admin: Any = None
    if backend == "etcd":
        fence: Any = etcd_client.fence(resource)
    else:
        from etcdfence.redis import RedisFence

        admin = _redis_or_skip()
        fence = RedisFence(admin, resource)
    key = _keyer(backend, resource)
    try:
        ops = [Create(key("slots/s"), "delivery-1"), Put(key("effect"), b"done")]
        fence.txn(token, ops)
        with pytest.raises(ef.KeyExistsError) as again:
            fence.txn(token, ops)
        assert (again.value.key, again.value.value) == (key("slots/s"), "delivery-1")
        with pytest.raises(ef.KeyExistsError) as as_bytes:
            fence.create(token, key("slots/s").encode(), b"delivery-2")
        assert as_bytes.value.value == b"delivery-1"
        fence.create(token, key("slots/raw"), b"\xff\xfe")
        with pytest.raises(ef.KeyExistsError) as raw:
            fence.create(token, key("slots/raw"), "delivery-3")
        assert raw.value.value == b"\xff\xfe"
    finally:
        if admin is not None:
            leftovers = admin.keys(f"*{{{resource}}}*")
            if leftovers:
                admin.delete(*leftovers)
            admin.close()


def test_too_many_ops_for_one_etcd_txn_are_refused_before_any_io(
    etcd_client: ef.Client, etcd_namespace: str, revision_past: Any
) -> None:
    """etcd takes at most --max-txn-ops (128) entries per txn level: the guard's mark put
    leaves 127 ops, and a Create's nested txn one level more, so 126. One more was etcd's
    bare RequestError, and the writer gave its epoch up (its next write claimed a new
    one). Now: InvalidArgumentError naming the limit, nothing sent, the epoch kept."""
    token = revision_past(50)
    resource = etcd_namespace
    fence = etcd_client.fence(resource)
    prefix = f"{resource}/d/"
    fence.put(token, f"{resource}/warm", b"up")
    mark = fence.current_mark()

    def puts(n: int) -> list[Any]:
        return [Put(f"{prefix}{i}", b"v") for i in range(n)]

    fence.txn(token, puts(127))
    fence.txn(token, [Create(f"{resource}/slot-1", b"v"), *puts(125)])
    with pytest.raises(ef.InvalidArgumentError, match="at most 127 ops, got 128"):
        fence.txn(token, puts(128))
    with pytest.raises(ef.InvalidArgumentError, match="at most 126 ops, got 127"):
        fence.txn(token, [Create(f"{resource}/slot-2", b"v"), *puts(126)])
    assert etcd_client.get(f"{resource}/slot-2") is None
    fence.put(token, f"{resource}/after", b"x")
    assert fence.current_mark() == mark, "a refused txn cost the writer its epoch"
    etcd_client.delete(resource + "/", prefix=True)


def test_a_txn_etcd_refuses_keeps_the_writers_epoch(
    etcd_client: ef.Client, etcd_namespace: str, revision_past: Any
) -> None:
    """A guard told the cluster takes more ops than it does (``max_txn_ops``) sends the
    txn; etcd refuses it whole ("too many operations"): a RequestError, nothing applied,
    and the writer keeps its epoch — its next write needs no new claim."""
    token = revision_past(50)
    resource = etcd_namespace
    fence = etcd_client.fence(resource, max_txn_ops=200)
    fence.put(token, f"{resource}/warm", b"up")
    mark = fence.current_mark()
    ops: list[Op] = [Create(f"{resource}/slot", b"v")]
    ops += [Put(f"{resource}/d/{i}", b"v") for i in range(150)]
    with pytest.raises(ef.RequestError, match="too many operations"):
        fence.txn(token, ops)
    assert etcd_client.get(f"{resource}/slot") is None
    fence.put(token, f"{resource}/after", b"x")
    assert fence.current_mark() == mark, "a definite refusal cost the writer its epoch"
    etcd_client.delete(resource + "/", prefix=True)

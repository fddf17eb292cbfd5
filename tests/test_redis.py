"""RedisFence / AsyncRedisFence on the real Redis at 127.0.0.1:6379 (``ETCDFENCE_TEST_REDIS``
overrides host:port). Every test uses its own resource (hash tag) and deletes its keys.

Faults are real: a FaultProxy holds a request or its answer in the network; ``CLIENT
PAUSE`` holds writes in the server; ``SCRIPT FLUSH`` drops the loaded script. The
restart test (the mark is not durable on a Redis without persistence) restarts the
shared server, so it runs only with ``ETCDFENCE_TEST_REDIS_RESTART=1``. Without a
Redis the tests skip, unless ``ETCDFENCE_REQUIRE_REDIS=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import etcdfence as ef
from etcdfence import metrics
from etcdfence._keys import MAX_EPOCH, encode_mark
from etcdfence.testing.proxy import FaultProxy
from etcdfence.token import MAX_TOKEN

redis = pytest.importorskip("redis")
pytest.importorskip("redis.asyncio")

from etcdfence.redis import (  # noqa: E402
    _SCRIPT,
    _SHA,
    AsyncRedisFence,
    CrossSlotError,
    Delete,
    Put,
    RedisFence,
    RedisRequestError,
    RedisUnavailableError,
    hash_slot,
)

pytestmark = pytest.mark.redis

ADDRESS = os.environ.get("ETCDFENCE_TEST_REDIS", "127.0.0.1:6379")
HOST, PORT = ADDRESS.rsplit(":", 1)[0], int(ADDRESS.rsplit(":", 1)[1])


def _reachable() -> str | None:
    try:
        redis.Redis(
            host=HOST, port=PORT, socket_timeout=2, socket_connect_timeout=2, retry=None
        ).ping()
    except Exception as exc:
        return f"no Redis at {ADDRESS}: {exc.__class__.__name__}: {exc}"
    return None


REQUIRE_REDIS = os.environ.get("ETCDFENCE_REQUIRE_REDIS") == "1"


@pytest.fixture(scope="module")
def redis_up() -> None:
    """Skip (or fail under ETCDFENCE_REQUIRE_REDIS=1, as CI sets) when Redis is down."""
    reason = _reachable()
    if reason and REQUIRE_REDIS:
        pytest.fail(f"{reason} (ETCDFENCE_REQUIRE_REDIS=1)")
    if reason:
        pytest.skip(reason)


@pytest.fixture
def r(redis_up: None) -> Iterator[Any]:
    client = redis.Redis(host=HOST, port=PORT, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def resource(r: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A resource name unique to the test; its mark and every ``{name}...`` key are
    deleted afterwards."""
    name = f"t-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"
    yield name
    keys = [f"etcdfence:fence:{{{name}}}", *r.scan_iter(match=f"{{{name}}}*", count=1000)]
    r.delete(*keys)


@pytest.fixture
async def ar(redis_up: None) -> AsyncIterator[Any]:
    client = redis.asyncio.Redis(host=HOST, port=PORT, socket_timeout=5)
    yield client
    await client.aclose()


def k(resource: str, name: str) -> str:
    return f"{{{resource}}}:{name}"


# --------------------------------------------------------------------------- semantics


def test_accepts_equal_and_higher_rejects_lower(r: Any, resource: str) -> None:
    fence = RedisFence(r, resource)
    assert fence.current() == 0 and fence.key == f"etcdfence:fence:{{{resource}}}".encode()
    fence.put(10, k(resource, "a"), "1")
    fence.put(10, k(resource, "a"), "2")  # one term writes many times
    assert r.get(k(resource, "a")) == b"2"
    assert r.get(fence.key) == b"00000000000000000010"  # as FenceGuard stores it in etcd
    with pytest.raises(ef.StaleTokenError) as info:
        fence.put(9, k(resource, "a"), "zombie")
    assert (info.value.resource, info.value.token, info.value.current) == (resource, 9, 10)
    assert r.get(k(resource, "a")) == b"2"
    fence.delete(12, k(resource, "a"))
    assert r.exists(k(resource, "a")) == 0 and fence.current() == 12
    fence.advance(15)
    with pytest.raises(ef.StaleTokenError):
        fence.advance(14)
    assert fence.current_mark() == (15, 0)


def test_stale_txn_writes_nothing_and_is_reported(r: Any, resource: str) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    fence = RedisFence(r, resource)
    fence.txn(34, [Put(k(resource, "x"), "new"), Put(k(resource, "y"), "new")])
    metrics.enable_metrics(registry)
    try:
        with (
            Recorder(r, resource) as rec,
            capture_logs() as logs,
            pytest.raises(ef.StaleTokenError),
        ):
            fence.txn(33, [Put(k(resource, "x"), "old"), Delete(k(resource, "y"))])
        rejected = registry.get_sample_value(
            "etcdfence_stale_rejections_total", {"resource": resource}
        )
    finally:
        metrics.disable_metrics()
    assert rec.scripts() == 1 and [c for kind, c in rec.commands if kind == "lua"] == [
        f"GET etcdfence:fence:{{{resource}}}"
    ]  # the script read the mark and wrote nothing
    assert r.mget(k(resource, "x"), k(resource, "y")) == [b"new", b"new"]
    assert rejected == 1
    (event,) = [e for e in logs if e["event"] == "etcdfence.fence_rejected"]
    assert (event["resource"], event["token"], event["current"], event["gap"]) == (
        resource,
        33,
        34,
        1,
    )
    assert event["backend"] == "redis"


def test_largest_token_and_binary_data(r: Any, resource: str) -> None:
    """Tokens near int64's top compare exactly (Lua numbers are doubles: the script
    compares the mark in 10-digit parts); keys and values are binary-safe."""
    fence = RedisFence(r, resource)
    top = MAX_TOKEN
    fence.put(top - 1, k(resource, "b"), b"\x00\xff\xfe")
    with pytest.raises(ef.StaleTokenError):
        fence.put(top - 2, k(resource, "b"), b"x")  # a double would round both to 2**63
    fence.put(top, k(resource, "c"), "ü")
    assert fence.current() == top
    assert r.mget(k(resource, "b"), k(resource, "c")) == [b"\x00\xff\xfe", "ü".encode()]
    key = f"{{{resource}}}:\xff".encode("latin-1")
    fence.put(top, key, b"")  # empty value, non-UTF-8 key
    assert r.get(key) == b""


def test_marks_compare_as_numbers_across_the_digit_split(r: Any, resource: str) -> None:
    """The script compares tokens as two 10-digit halves, then the epoch."""
    fence = RedisFence(r, resource)
    fence.advance(10**10)  # halves (1, 0)
    with pytest.raises(ef.StaleTokenError):
        fence.advance(10**10 - 1)  # halves (0, 9999999999)
    fence.advance(10**10 + 1)
    other = RedisFence(r, resource)  # another writer of the same term
    fence.fence_off(10**10 + 1)  # the mark moves to (token, epoch 1)
    assert fence.current_mark() == (10**10 + 1, 1) and other.epoch(10**10 + 1) == 0
    other.put(10**10 + 1, k(resource, "a"), "other")  # refused at epoch 0, adopts 1, writes
    assert other.epoch(10**10 + 1) == 1 and r.get(k(resource, "a")) == b"other"
    with pytest.raises(ef.StaleTokenError):
        other.put(10**10, k(resource, "a"), "older term")
    assert r.get(fence.key) == b"00000000010000000001:0000000001"


_TOKENS = st.one_of(
    st.integers(1, MAX_TOKEN),
    st.sampled_from([1, 10**10 - 1, 10**10, 10**10 + 1, 2**53, 2**53 + 1, MAX_TOKEN - 1]),
)
_EPOCHS = st.one_of(st.just(0), st.integers(0, MAX_EPOCH))


@st.composite
def _mark_pairs(draw: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """A mark and an offered mark: independent, or the mark moved by a few units (where
    a comparison of doubles or of a rounded token goes wrong)."""
    held = (draw(_TOKENS), draw(_EPOCHS))
    if draw(st.booleans()):
        return held, (draw(_TOKENS), draw(_EPOCHS))
    token = min(MAX_TOKEN, max(1, held[0] + draw(st.integers(-2, 2))))
    epoch = min(MAX_EPOCH, max(0, held[1] + draw(st.integers(-2, 2))))
    return held, (token, epoch)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pair=_mark_pairs())
def test_script_orders_marks_as_python_tuples(
    r: Any, resource: str, pair: tuple[tuple[int, int], tuple[int, int]]
) -> None:
    """The script accepts exactly when (token, epoch) >= the mark, for any int64 token
    and any epoch (the Lua side compares 10-digit parts, never doubles or strings)."""
    held, offered = pair
    key = f"etcdfence:fence:{{{resource}}}"
    r.set(key, encode_mark(*held))
    r.script_load(_SCRIPT)
    reply = r.evalsha(_SHA, 1, key, encode_mark(*offered), "")
    assert (reply[0] == 1) == (offered >= held), (held, offered, reply)
    assert r.get(key) == encode_mark(*max(held, offered))


@pytest.mark.parametrize("bad", [0, -1, True, "7", 7.0, None, 2**63])
def test_bad_tokens_touch_nothing(r: Any, resource: str, bad: object) -> None:
    fence = RedisFence(r, resource)
    fence.advance(5)
    with pytest.raises(ef.InvalidToken):
        fence.put(bad, k(resource, "k"), "v")  # type: ignore[arg-type]
    assert fence.current_mark() == (5, 0) and r.exists(k(resource, "k")) == 0


def test_odd_input_is_refused_before_anything_is_sent(r: Any, resource: str) -> None:
    fence = RedisFence(r, resource, max_value_bytes=1024)
    refusals: list[tuple[Any, type[Exception]]] = [
        ([Put("", "v")], ef.InvalidArgument),  # empty key
        ([Put(k(resource, "a"), 5)], ef.InvalidType),  # type: ignore[arg-type]
        ([Put(k(resource, "a"), "x" * 1025)], ef.InvalidArgument),  # oversized
        ([Put(k(resource, "a"), "\udc80")], ef.InvalidArgument),  # not UTF-8 encodable
        ([Put(k(resource, "a"), "v", lease_id=7)], ef.InvalidArgument),
        ([Delete(k(resource, ""), prefix=True)], ef.InvalidArgument),
        ([("k", "v")], ef.InvalidType),
        (Put(k(resource, "a"), "v"), ef.InvalidType),  # not a list
        ([Put(fence.key, "99999999999999999999")], ef.InvalidArgument),  # the mark itself
        ([Put(f"etcdfence:fence:{{{resource}}}x", "1")], ef.InvalidArgument),
        ([Put(k(resource, "a"), "v"), Put("elsewhere", "v")], CrossSlotError),
    ]
    with Recorder(r, resource) as rec:
        for ops, error in refusals:
            with pytest.raises(error):
                fence.txn(3, ops)
    assert rec.commands == []  # nothing reached Redis
    assert r.exists(fence.key, k(resource, "a")) == 0
    fence.put(3, k(resource, "a"), "x" * 1024)  # exactly the limit passes
    for bad in ["", " ", "a}b", 5]:
        with pytest.raises((ef.InvalidArgument, ef.InvalidType)):
            RedisFence(r, bad)  # type: ignore[arg-type]
    for prefix in ["", "p{", "p}"]:
        with pytest.raises(ef.InvalidArgument):
            RedisFence(r, resource, prefix=prefix)
    with pytest.raises(ef.InvalidArgument):
        RedisFence(r, resource, max_value_bytes=0)


def test_cross_slot_keys_are_refused_with_a_clear_error(r: Any, resource: str) -> None:
    fence = RedisFence(r, resource)
    assert hash_slot(fence.key) == hash_slot(resource) == fence.slot
    with pytest.raises(CrossSlotError) as info:
        fence.put(1, f"{resource}:latest", "v")  # no hash tag: another slot
    assert isinstance(info.value, ValueError) and isinstance(info.value, ef.EtcdfenceError)
    assert str(fence.slot) in str(info.value) and f"{{{resource}}}" in str(info.value)
    assert r.exists(fence.key) == 0
    fence.put(1, fence.key_for("latest"), "v")  # {resource}:latest
    fence.put(1, f"prefix-{{{resource}}}-suffix", "v")  # the tag may sit anywhere


def test_hash_slot_is_redis_cluster_rule() -> None:
    """CRC16/XMODEM mod 16384 over the hash tag; checked against the spec's check
    value and against redis-py's own implementation for many keys."""
    from redis.crc import key_slot

    assert hash_slot("123456789") == 0x31C3 % 16384
    rng = random.Random(7)
    alphabet = b"ab{}:\x00\xff"
    keys = [b"", b"{}", b"{}x", b"{a}{b}", b"x{a}y", b"}{a}", b"{{a}}", b"{a", b"a}"]
    keys += [bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    for key in keys:
        assert hash_slot(key) == key_slot(key), key
    assert hash_slot("{user1000}.following") == hash_slot("{user1000}.followers")


def test_wrong_clients_are_refused(r: Any, resource: str) -> None:
    with pytest.raises(ef.InvalidType):
        RedisFence(redis.asyncio.Redis(host=HOST, port=PORT), resource)
    with pytest.raises(ef.InvalidType):
        AsyncRedisFence(r, resource)
    with pytest.raises(ef.InvalidType):
        RedisFence(object(), resource)
    single = redis.Redis(host=HOST, port=PORT, single_connection_client=True)
    try:
        with pytest.raises(ef.InvalidArgument):
            RedisFence(single, resource)
    finally:
        single.close()


def test_decode_responses_client_works(redis_up: None, resource: str, r: Any) -> None:
    client = redis.Redis(host=HOST, port=PORT, decode_responses=True, socket_timeout=5)
    try:
        fence = RedisFence(client, resource)
        fence.put(4, k(resource, "a"), "v")
        with pytest.raises(ef.StaleTokenError):
            fence.put(3, k(resource, "a"), "w")
        assert fence.current_mark() == (4, 0)
    finally:
        client.close()


def test_tampered_marks_are_errors_not_zero(r: Any, resource: str) -> None:
    fence = RedisFence(r, resource)
    r.set(fence.key, "garbage")
    with pytest.raises(ef.ConsistencyError):
        fence.put(1, k(resource, "a"), "v")
    with pytest.raises(ef.InvalidArgument):
        fence.current()
    r.delete(fence.key)
    r.hset(fence.key, "f", "v")  # the mark key holds a hash: Redis says WRONGTYPE
    with pytest.raises(RedisRequestError):
        fence.put(1, k(resource, "a"), "v")
    assert r.exists(k(resource, "a")) == 0


def test_noscript_after_script_flush_recovers(r: Any, resource: str) -> None:
    fence = RedisFence(r, resource)
    fence.put(1, k(resource, "a"), "1")
    r.script_flush()  # what a Redis restart does too
    with Recorder(r, resource) as rec:
        fence.put(2, k(resource, "a"), "2")  # NOSCRIPT, SCRIPT LOAD, EVALSHA again
    # twice, unless another user of this Redis loaded the script in between
    assert rec.scripts() in (1, 2)
    assert r.script_exists(_SHA) == [True] and r.get(k(resource, "a")) == b"2"
    assert fence.current() == 2


def test_unreachable_redis_is_a_clear_error(resource: str) -> None:
    dead = redis.Redis(host="127.0.0.1", port=_free_port(), socket_connect_timeout=1, retry=None)
    fence = RedisFence(dead, resource)
    with pytest.raises(RedisUnavailableError) as info:
        fence.put(1, k(resource, "a"), "v")
    assert isinstance(info.value, ef.EtcdfenceError) and "nothing was sent" in str(info.value)
    assert fence.epoch(1) == 0  # nothing was sent: no epoch to skip
    with pytest.raises(RedisUnavailableError):
        fence.current()


async def test_async_unreachable_redis_is_a_clear_error(resource: str) -> None:
    dead = redis.asyncio.Redis(
        host="127.0.0.1", port=_free_port(), socket_connect_timeout=1, retry=None
    )
    fence = AsyncRedisFence(dead, resource)
    with pytest.raises(RedisUnavailableError):
        await fence.put(1, k(resource, "a"), "v")
    await dead.aclose()


def test_importing_etcdfence_does_not_import_redis() -> None:
    code = (
        "import sys, etcdfence, etcdfence.sql\n"
        "assert 'redis' not in sys.modules, 'etcdfence imported redis'\n"
        "sys.modules['redis'] = None\n"
        "try:\n"
        "    import etcdfence.redis\n"
        "except ImportError as e:\n"
        "    assert \"pip install 'etcdfence[redis]'\" in str(e), e\n"
        "else:\n"
        "    raise SystemExit('imported without redis')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- async


async def test_async_semantics(ar: Any, resource: str, r: Any) -> None:
    fence = AsyncRedisFence(ar, resource)
    await fence.txn(7, [Put(k(resource, "a"), "1"), Put(k(resource, "b"), "1")])
    await fence.put(7, k(resource, "a"), "2")
    with pytest.raises(ef.StaleTokenError):
        await fence.txn(6, [Put(k(resource, "a"), "old"), Delete(k(resource, "b"))])
    assert r.mget(k(resource, "a"), k(resource, "b")) == [b"2", b"1"]
    await fence.delete(8, k(resource, "b"))
    await fence.advance(9)
    assert await fence.current() == 9 and r.exists(k(resource, "b")) == 0
    r.script_flush()
    await fence.put(9, k(resource, "a"), "3")
    assert await fence.current_mark() == (9, 0)


# --------------------------------------------------------------------------- concurrency


def _monitor(word: str, resource: str, out: list[tuple[str, str]], ready: threading.Event) -> None:
    """Record every command that names ``resource``'s hash tag, in execution order, as
    (client type, command): ``tcp`` for what clients sent, ``lua`` for what the script ran."""
    client = redis.Redis(host=HOST, port=PORT)
    with client.monitor() as mon:
        while True:
            cmd = mon.next_command()
            text = cmd["command"]
            if text == f"PING {word}-ready":
                ready.set()
            elif text == f"PING {word}":
                return
            elif f"{{{resource}}}" in text:
                out.append((str(cmd.get("client_type")), text))


class Recorder:
    """What the server runs for one resource (MONITOR), while the test works: other
    users of the shared Redis do not disturb it, as server-wide counters would."""

    def __init__(self, r: Any, resource: str) -> None:
        self.r, self.resource = r, resource
        self.commands: list[tuple[str, str]] = []
        self._word = f"etcdfence-monitor-{uuid.uuid4().hex}"
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=_monitor, args=(self._word, resource, self.commands, self._ready), daemon=True
        )

    def __enter__(self) -> Recorder:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._ready.wait(0.05):
            assert time.monotonic() < deadline, "MONITOR did not start"
            self.r.execute_command("PING", f"{self._word}-ready")
        return self

    def __exit__(self, *exc: object) -> None:
        self.r.execute_command("PING", self._word)
        self._thread.join(10)
        assert not self._thread.is_alive()

    @property
    def sets(self) -> list[tuple[str, str]]:
        """(key, value) of every SET the script ran, in order."""
        out = []
        for kind, text in list(self.commands):
            if kind == "lua" and text.startswith("SET "):
                key, _, value = text[4:].partition(" ")
                out.append((key, value))
        return out

    def scripts(self) -> int:
        """How many EVALSHA for this resource reached the server so far."""
        return sum(1 for kind, text in list(self.commands) if kind != "lua" and "EVALSHA" in text)

    def check(self, outcomes: list[tuple[int, str, int | None]]) -> None:
        """``outcomes``: (token, unique value, None if accepted else the refusing mark).

        The mark's values never decrease, the data SETs' tokens never decrease, exactly
        the accepted writes reached the data, and every refusal names a higher mark."""
        mark_key = f"etcdfence:fence:{{{self.resource}}}"
        marks = [(int(v[:20]), int(v[21:] or 0)) for key, v in self.sets if key == mark_key]
        data = [v for key, v in self.sets if key != mark_key]
        assert marks and marks == sorted(marks), "the mark went down"
        tokens = [int(v.split(":")[0]) for v in data]
        assert tokens == sorted(tokens), "a lower token was accepted after a higher one"
        accepted = {value for _, value, refused in outcomes if refused is None}
        assert set(data) == accepted and len(data) == len(accepted)
        for token, _, refused in outcomes:
            assert refused is None or refused > token
        assert 5 < len(accepted) < len(outcomes)  # both kinds happened


def _writes(n: int, seed: int) -> list[int]:
    """Tokens that mostly rise, with stragglers far behind (zombies)."""
    rng = random.Random(seed)
    return [max(1, i * 3 + rng.choice([0, 1, 2, -10, -40])) for i in range(1, n + 1)]


def test_threads_keep_the_high_water_mark(r: Any, resource: str) -> None:
    fence = RedisFence(redis.Redis(host=HOST, port=PORT, socket_timeout=5), resource)
    outcomes: list[tuple[int, str, int | None]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for i, token in enumerate(_writes(60, w)):
            value = f"{token}:{w}:{i}"
            try:
                fence.put(token, k(resource, f"w{w}"), value)
                refused = None
            except ef.StaleTokenError as err:
                refused = err.current
            with lock:
                outcomes.append((token, value, refused))

    with Recorder(r, resource) as rec:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    rec.check(outcomes)
    assert fence.current() == max(t for t, _, refused in outcomes if refused is None)


async def test_tasks_keep_the_high_water_mark(ar: Any, r: Any, resource: str) -> None:
    fence = AsyncRedisFence(ar, resource)
    outcomes: list[tuple[int, str, int | None]] = []

    async def writer(w: int) -> None:
        for i, token in enumerate(_writes(12, w)):
            value = f"{token}:{w}:{i}"
            try:
                await fence.put(token, k(resource, f"w{w}"), value)
                outcomes.append((token, value, None))
            except ef.StaleTokenError as err:
                outcomes.append((token, value, err.current))

    with Recorder(r, resource) as rec:
        await asyncio.gather(*(writer(w) for w in range(64)))
    rec.check(outcomes)


# --------------------------------------------------------------------------- zombies


@pytest.mark.integration
def test_zombie_lock_holder_is_rejected(
    etcd_client: ef.Client, etcd_namespace: str, r: Any, resource: str
) -> None:
    """Two holders of one etcd lock, one after the other; the first keeps its token
    after losing the lock (a paused process) and writes: Redis refuses it."""
    fence = RedisFence(r, resource)
    name = f"{etcd_namespace}/job"
    with etcd_client.session(ttl=10) as old, etcd_client.session(ttl=10) as new:
        zombie = old.lock(name).acquire(timeout=10)
        fence.put(zombie, k(resource, "out"), "old holder")
        old.close()  # its lease is revoked: the lock passes on; the process lives on
        token = new.lock(name).acquire(timeout=10)
        assert int(token) > int(zombie)
        fence.put(token, k(resource, "out"), "new holder")
        with pytest.raises(ef.StaleTokenError) as info:
            fence.put(zombie, k(resource, "out"), "zombie")  # woke up, still has its token
        assert info.value.current == int(token)
    assert r.get(k(resource, "out")) == b"new holder"


# --------------------------------------------------------------------------- lost answers


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_lost_answer_after_apply_is_outcome_unknown(r: Any, resource: str) -> None:
    with FaultProxy(ADDRESS) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5)
        fence = RedisFence(client, resource)
        fence.put(5, k(resource, "a"), "0")  # a connection through the proxy, script loaded
        proxy.hold("downstream")  # Redis runs the script; its answer stays in the network
        with pytest.raises(ef.OutcomeUnknown) as info:
            fence.put(5, k(resource, "a"), "1")
        lost = info.value
        assert (lost.token, lost.epoch) == (5, 0) and lost.fenced_off  # fenced at once
        assert fence.epoch(5) == 1 and fence.current_mark() == (5, 1)
        assert r.get(k(resource, "a")) == b"1"  # it did apply: re-read, then decide
        fence.put(5, k(resource, "a"), "2")
        proxy.release()
        client.close()
    assert r.get(k(resource, "a")) == b"2"


async def test_async_lost_answer_after_apply_is_outcome_unknown(r: Any, resource: str) -> None:
    with FaultProxy(ADDRESS) as proxy:
        client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5)
        fence = AsyncRedisFence(client, resource)
        await fence.put(5, k(resource, "a"), "0")
        proxy.hold("downstream")
        with pytest.raises(ef.OutcomeUnknown) as info:
            await fence.put(5, k(resource, "a"), "1")
        assert info.value.fenced_off and fence.epoch(5) == 1
        assert await fence.current_mark() == (5, 1) and r.get(k(resource, "a")) == b"1"
        proxy.release()
        await client.aclose()


def test_partition_outcome_unknown_then_fence_off_after_heal(r: Any, resource: str) -> None:
    """Redis cut off entirely: the write's outcome is unknown and cannot be fenced off
    at once (fenced_off False); fence_off fails while the cut lasts and succeeds after."""
    with FaultProxy(ADDRESS) as proxy:
        client = redis.Redis(
            host="127.0.0.1",
            port=proxy.port,
            socket_timeout=0.3,
            socket_connect_timeout=0.3,
            retry=None,  # redis-py's own connect retries (safe, nothing sent) only slow this
        )
        fence = RedisFence(client, resource)
        fence.put(5, k(resource, "a"), "0")
        proxy.blackhole("both")
        with pytest.raises(ef.OutcomeUnknown) as info:
            fence.put(5, k(resource, "a"), "1")
        assert not info.value.fenced_off and "fence_off" in str(info.value)
        with pytest.raises(RedisUnavailableError):
            fence.fence_off(5, timeout=0.5)
        proxy.heal()
        fence.fence_off(5)
        token, epoch = fence.current_mark()
        assert token == 5 and epoch >= 2 and epoch == fence.epoch(5)
        assert r.get(k(resource, "a")) == b"0"  # the cut attempt never arrived
        client.close()


def test_held_request_landing_late_is_refused(r: Any, resource: str) -> None:
    """A write held in the network past its timeout arrives after the writer's next
    write: the epoch refuses it (a token-only check would let it overwrite)."""
    with FaultProxy(ADDRESS) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5)
        fence = RedisFence(client, resource)
        fence.put(5, k(resource, "a"), "0")
        proxy.hold("upstream")
        with pytest.raises(ef.OutcomeUnknown):
            fence.put(5, k(resource, "a"), "late")
        fence.put(5, k(resource, "a"), "next")  # a new connection passes the proxy
        with Recorder(r, resource) as rec:
            proxy.release()
            _wait(lambda: rec.scripts() > 0)  # the held attempt did run ...
        client.close()
    assert r.get(k(resource, "a")) == b"next"  # ... and was refused


async def test_cancelled_put_leaves_mark_and_data_consistent(r: Any, resource: str) -> None:
    """Cancel a put whose request is in the network; later the request arrives. At every
    point the mark and the data agree, and the late attempt cannot overwrite."""
    with FaultProxy(ADDRESS) as proxy:
        client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=5)
        fence = AsyncRedisFence(client, resource)
        mark, key = f"etcdfence:fence:{{{resource}}}", k(resource, "a")
        await fence.put(5, key, "0")
        proxy.hold("upstream")
        task = asyncio.ensure_future(fence.put(6, key, "cancelled"))
        await asyncio.to_thread(proxy.wait_held)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fence.epoch(6) == 1  # the attempt (6, 0) can no longer apply after ours
        assert r.mget(mark, key) == [b"00000000000000000005", b"0"]  # neither applied
        with Recorder(r, resource) as rec:
            proxy.release()
            _wait(lambda: rec.scripts() > 0)  # the cancelled attempt arrives, late
        both = r.mget(mark, key)
        assert both in ([b"00000000000000000005", b"0"], [b"00000000000000000006", b"cancelled"])
        await fence.put(6, key, "after")  # epoch 1: passes whether or not (6, 0) landed
        assert r.mget(mark, key) == [b"00000000000000000006:0000000001", b"after"]
        await client.aclose()


async def test_cancelled_put_in_a_paused_server(ar: Any, r: Any, resource: str) -> None:
    """The request reached Redis, which holds writes (CLIENT PAUSE WRITE): cancelling
    moves the writer on; afterwards the mark and the data agree."""
    fence = AsyncRedisFence(ar, resource)
    key = k(resource, "a")
    await fence.put(5, key, "0")
    r.execute_command("CLIENT", "PAUSE", 400, "WRITE")
    try:
        task = asyncio.ensure_future(fence.put(6, key, "paused"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    time.sleep(0.1)
    mark, data = await fence.current_mark(), r.get(key)
    assert (mark[0], data) in ((5, b"0"), (6, b"paused"))
    await fence.fence_off(6)  # now nothing of the cancelled attempt can apply
    assert await fence.current_mark() == (6, 2)
    await fence.put(6, key, "final")
    assert r.get(key) == b"final"


def _wait(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# --------------------------------------------------------------------------- restart

RESTART = os.environ.get("ETCDFENCE_TEST_REDIS_RESTART", "") not in ("", "0")
START = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


@pytest.mark.skipif(
    not RESTART,
    reason="restarts the shared Redis at 127.0.0.1:6379: set ETCDFENCE_TEST_REDIS_RESTART=1",
)
def test_mark_is_lost_when_redis_keeps_nothing_on_disk(r: Any, resource: str) -> None:
    """The documented limit, shown: on a Redis without persistence a restart forgets
    the mark, and a zombie's token is accepted. Restores the service before asserting."""
    if r.config_get("save").get("save") or r.config_get("appendonly")["appendonly"] == "yes":
        pytest.skip("this Redis persists; the limit shows only without persistence")
    fence = RedisFence(redis.Redis(host=HOST, port=PORT, socket_timeout=5), resource)
    fence.put(100, k(resource, "a"), "leader")
    try:
        admin = redis.Redis(host=HOST, port=PORT, retry=None, socket_timeout=5)
        with pytest.raises(redis.exceptions.ConnectionError):
            admin.execute_command("SHUTDOWN", "NOSAVE")  # the answer is the closed connection
        _wait(lambda: _reachable() is not None, 10)
    finally:
        subprocess.run(START, shell=True, check=True, timeout=30)
        _wait(lambda: _reachable() is None, 30)
    assert fence.current() == 0  # the mark is gone ...
    fence.put(50, k(resource, "a"), "zombie")  # ... so a stale token is accepted
    assert fence.current() == 50


# --------------------------------------------------------------------------- example


def _example() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "fenced_redis.py"
    spec = importlib.util.spec_from_file_location("fenced_redis_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_conformance_parts(r: Any, resource: str) -> None:
    parts = _example().redis_conformance_parts(r, resource)
    assert set(parts) == {"write", "read", "restart"} and parts["restart"] is None
    assert parts["read"]("x") is None
    parts["write"](8, "x", "v8")
    parts["write"](8, "x", b"v8b")
    with pytest.raises(ef.StaleTokenError):
        parts["write"](7, "x", "zombie")
    assert parts["read"]("x") == b"v8b" and r.get(k(resource, "x")) == b"v8b"
    restartable = _example().redis_conformance_parts(r, resource, restart_command="true")
    assert callable(restartable["restart"])


@pytest.mark.integration
def test_example_writes_under_a_lock_and_refuses_stale(
    env: dict[str, str], etcd_namespace: str, r: Any, resource: str
) -> None:
    from pathlib import Path

    script = str(Path(__file__).resolve().parent.parent / "examples" / "fenced_redis.py")
    args = ["--redis", ADDRESS, "--resource", resource, "--key", "latest"]
    locked = subprocess.run(
        [sys.executable, "-m", "etcdfence", "lock", f"{etcd_namespace}/orders", "--",
         sys.executable, script, *args, "--value", "v1"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert locked.returncode == 0, locked.stdout + locked.stderr
    stale = subprocess.run(
        [sys.executable, script, *args, "--value", "v0", "--token", "1"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert stale.returncode == 3, stale.stdout + stale.stderr
    assert r.get(k(resource, "latest")) == b"v1"


@pytest.mark.integration
def test_readme_snippet_runs(
    etcd_endpoints: list[str], r: Any, resource: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's RedisFence example, run as written (etcd found through
    $ETCDFENCE_ENDPOINTS; the resource swapped for a fresh one)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### Fencing Redis keys", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("ETCDFENCE_ENDPOINTS", etcd_endpoints[0])
    code = code.replace('"orders"', repr(resource)).replace("{orders}", f"{{{resource}}}")
    code = code.replace('"jobs/orders"', repr(f"t/{resource}"))
    namespace: dict[str, Any] = {}
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        if "client" in namespace:
            namespace["client"].close()
    assert r.mget(k(resource, "latest"), k(resource, "a")) == [b"...", b"1"]
    assert RedisFence(r, resource).current() > 0

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

from etcdfence.fence._redis_common import SCRIPT, SHA  # noqa: E402
from etcdfence.redis import (  # noqa: E402
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
    mark = f"etcdfence:fence:{{{name}}}"
    keys = [mark, f"{mark}:version", *r.scan_iter(match=f"*{{{name}}}*", count=1000)]
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
        f"GET etcdfence:fence:{{{resource}}}",
        f"GET etcdfence:fence:{{{resource}}}:version",
    ]  # the script read the mark and the version, and wrote nothing
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
    other.put(10**10 + 1, k(resource, "a"), "other")  # claims an epoch of its own: 2
    assert other.epoch(10**10 + 1) == 2 and r.get(k(resource, "a")) == b"other"
    with pytest.raises(ef.StaleTokenError):
        other.put(10**10, k(resource, "a"), "older term")
    assert r.get(fence.key) == b"00000000010000000001:0000000002"


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
    r.script_load(SCRIPT)
    reply = r.evalsha(SHA, 2, key, f"{key}:version", encode_mark(*offered), "W", "")
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
    with pytest.raises(ef.ConsistencyError):
        fence.current()
    r.delete(fence.key)
    r.hset(fence.key, "f", "v")  # the mark key holds a hash: Redis says WRONGTYPE
    with pytest.raises(RedisRequestError):
        fence.put(1, k(resource, "a"), "v")
    assert r.exists(k(resource, "a")) == 0


@pytest.mark.serial  # SCRIPT FLUSH is server-wide
def test_noscript_after_script_flush_recovers(r: Any, resource: str) -> None:
    fence = RedisFence(r, resource)
    fence.put(1, k(resource, "a"), "1")
    r.script_flush()  # what a Redis restart does too
    with Recorder(r, resource) as rec:
        fence.put(2, k(resource, "a"), "2")  # NOSCRIPT, SCRIPT LOAD, EVALSHA again
    # the claim and the write, each twice unless another user of this Redis loaded
    # the script in between
    assert rec.scripts() in (2, 3, 4)
    assert r.script_exists(SHA) == [True] and r.get(k(resource, "a")) == b"2"
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


@pytest.mark.serial  # SCRIPT FLUSH is server-wide
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
        with pytest.raises(ef.OutcomeUnknown) as cut:
            fence.fence_off(5, timeout=0.5)
        assert not cut.value.fenced_off
        proxy.heal()
        fence.fence_off(5)
        token, epoch = fence.current_mark()
        assert token == 5 and epoch >= 1 and epoch == fence.epoch(5)
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


# A value the proxy's buffers (64 chunks of 64 KB) and the kernel's cannot take while
# the connection is held: the client's send stalls and times out mid-command.
_STALLING_VALUE = b"s" * (24 * 1024 * 1024)


async def _wait_async(cond: Any, timeout: float = 30.0) -> None:
    """Poll ``cond`` while the event loop runs (a closed asyncio transport still
    flushes its buffer in the background; a blocking sleep would stop that)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_async_send_timeout_is_unknown_and_the_stray_never_lands_later(
    r: Any, resource: str
) -> None:
    """Issue #21 item 2: redis.asyncio hands the whole command to the transport before
    drain() times out, and the disconnect flushes it, so the command arrives after the
    error. It used to be reported as "nothing was written" with the writer's epoch
    unchanged, and landed over the writer's next acknowledged write."""
    key = k(resource, "a")
    with FaultProxy(ADDRESS) as proxy:
        client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5)
        fence = AsyncRedisFence(client, resource)
        await fence.put(5, key, "0")  # a connection through the proxy, script loaded
        assert proxy.hold("upstream") == 1
        with pytest.raises((ef.OutcomeUnknown, RedisUnavailableError)) as info:
            await fence.put(5, key, _STALLING_VALUE)
        await fence.put(5, key, "next")  # acknowledged, on a new connection
        assert r.get(key) == b"next"
        proxy.release()  # the stray's bytes reach Redis, after the acknowledged write
        await _wait_async(lambda: proxy.active_connections <= 1 and proxy.held_bytes == 0)
        await client.aclose()
        await _wait_async(lambda: proxy.active_connections == 0)
    assert r.get(key) == b"next"  # refused by the epoch: it never lands after "next"
    # ... because the send error was reported as what it is: an unknown outcome
    assert isinstance(info.value, ef.OutcomeUnknown) and "Timeout writing" in str(info.value)
    assert info.value.fenced_off and fence.epoch(5) >= 1


def test_sync_send_timeout_never_lands_later(r: Any, resource: str) -> None:
    """The sync twin of the test above: a blocking socket never sends the rest of a
    command whose send timed out, and Redis never runs an incomplete command."""
    key = k(resource, "a")
    with FaultProxy(ADDRESS) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5)
        fence = RedisFence(client, resource)
        fence.put(5, key, "0")
        assert proxy.hold("upstream") == 1
        with pytest.raises((ef.OutcomeUnknown, RedisUnavailableError)):
            fence.put(5, key, _STALLING_VALUE)
        fence.put(5, key, "next")
        proxy.release()
        _wait(lambda: proxy.active_connections <= 1 and proxy.held_bytes == 0, 30.0)
        client.close()
        _wait(lambda: proxy.active_connections == 0, 30.0)
    assert r.get(key) == b"next"


def _dead_writer(proxy: FaultProxy, put: Any, command_size: int) -> BaseException:
    """Writer A's last write: its bytes held in the network, its quick fence-off cut
    off (blackholed), its client gives up. Returns what the write raised."""
    proxy.hold("upstream")
    outcome: list[BaseException] = []

    def write() -> None:
        try:
            put()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    proxy.wait_held(command_size)
    proxy.blackhole()  # A's fence-off cannot reach Redis either
    thread.join(30)
    assert not thread.is_alive() and outcome
    proxy.heal()
    return outcome[0]


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_new_guard_with_the_same_token_never_shares_an_epoch_with_a_lost_write(
    r: Any, resource: str, twin: str
) -> None:
    """Issue #21 item 3: epochs lived in one guard's memory, so a new guard (a restarted
    writer) with the same token started at the epoch of A's lost write, and the stray
    landed after its acknowledged write. A guard's first write claims a fresh epoch."""
    key = k(resource, "a")
    with FaultProxy(ADDRESS) as proxy:
        if twin == "sync":
            client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=None)
            a: Any = RedisFence(client, resource)
            a.put(5, key, "v0")
            lost = _dead_writer(proxy, lambda: a.put(5, key, "stray"), 100)
            client.close()
        else:

            async def scenario() -> BaseException:
                client = redis.asyncio.Redis(
                    host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=None
                )
                a = AsyncRedisFence(client, resource)
                await a.put(5, key, "v0")
                loop = asyncio.get_running_loop()

                def put() -> None:
                    asyncio.run_coroutine_threadsafe(a.put(5, key, "stray"), loop).result()

                lost = await asyncio.to_thread(_dead_writer, proxy, put, 100)
                await client.aclose()
                return lost

            lost = asyncio.run(scenario())
        assert isinstance(lost, ef.OutcomeUnknown) and not lost.fenced_off, lost
        b = RedisFence(r, resource)  # the next incarnation, same token
        b.put(5, key, "v1")
        assert r.get(key) == b"v1"
        with Recorder(r, resource) as rec:
            proxy.release()
            _wait(lambda: rec.scripts() > 0)  # the stray reaches Redis ...
    assert r.get(key) == b"v1"  # ... and is refused
    assert b.epoch(5) >= 1


async def test_cancelled_put_leaves_mark_and_data_consistent(r: Any, resource: str) -> None:
    """Cancel a put whose request is in the network; later the request arrives. At every
    point the mark and the data agree, and the late attempt cannot overwrite."""
    with FaultProxy(ADDRESS) as proxy:
        client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=5)
        fence = AsyncRedisFence(client, resource)
        mark, key = f"etcdfence:fence:{{{resource}}}", k(resource, "a")
        await fence.put(6, key, "0")  # epoch 0 of token 6 claimed
        proxy.hold("upstream")
        task = asyncio.ensure_future(fence.put(6, key, "cancelled"))
        await asyncio.to_thread(proxy.wait_held)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fence._writer.epochs.owned(6) is None  # (6, 0) given up: never written at again
        assert r.mget(mark, key) == [b"00000000000000000006", b"0"]  # not applied yet
        with Recorder(r, resource) as rec:
            proxy.release()
            _wait(lambda: rec.scripts() > 0)  # the cancelled attempt arrives, late
        both = r.mget(mark, key)
        assert both in ([b"00000000000000000006", b"0"], [b"00000000000000000006", b"cancelled"])
        await fence.put(6, key, "after")  # epoch 1: passes whether or not (6, 0) landed
        assert r.mget(mark, key) == [b"00000000000000000006:0000000001", b"after"]
        await client.aclose()


@pytest.mark.serial  # CLIENT PAUSE holds every client's writes
async def test_cancelled_put_in_a_paused_server(ar: Any, r: Any, resource: str) -> None:
    """The request reached Redis, which holds writes (CLIENT PAUSE WRITE): cancelling
    moves the writer on; afterwards the mark and the data agree."""
    fence = AsyncRedisFence(ar, resource)
    key = k(resource, "a")
    await fence.put(6, key, "0")  # epoch 0 of token 6 claimed
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
    assert mark == (6, 0) and data in (b"0", b"paused")
    assert await fence.fence_off(6) == 1  # now nothing of the cancelled attempt can apply
    assert await fence.current_mark() == (6, 1)
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


# ------------------------------------------------------- the fence package's Redis store


def test_versions_grow_with_every_accepted_write(r: Any, resource: str) -> None:
    """put/delete/txn return the resource's version: +1 per accepted write (a claim and
    its write are one), kept beside the mark; refused writes leave it alone."""
    fence = RedisFence(r, resource)
    assert fence.version() == 0
    seen = [fence.put(5, k(resource, "a"), "1")]  # claims (5, 0) and writes: one script
    seen.append(fence.put(5, k(resource, "a"), "2"))
    seen.append(fence.txn(6, [Put(k(resource, "b"), "x"), Delete(k(resource, "a"))]))
    with pytest.raises(ef.StaleTokenError):
        fence.put(5, k(resource, "a"), "stale")
    seen.append(fence.delete(6, k(resource, "b")))
    fence.advance(7)  # +1
    other = RedisFence(r, resource)  # another writer of the term: claims above, +1
    seen.append(other.put(7, k(resource, "a"), "3"))
    assert seen == [1, 2, 3, 4, 6] and fence.version() == 6
    assert r.get(fence.version_key) == b"6"
    assert fence.version_key == fence.key + b":version" and hash_slot(fence.version_key) == (
        fence.slot
    )


async def test_async_versions_grow(ar: Any, resource: str) -> None:
    fence = AsyncRedisFence(ar, resource)
    assert await fence.put(3, k(resource, "a"), "1") == 1
    assert await fence.delete(3, k(resource, "a")) == 2
    assert await fence.fence_off(3) == 1 and await fence.version() == 3


def test_marks_written_by_0_2_keep_working(r: Any, resource: str) -> None:
    """A resource fenced by 0.2 has its mark and no counter: the counter starts at 0,
    the mark still orders writes (a lower token is refused, an equal one claims the
    next epoch above the 0.2 writer's)."""
    fence = RedisFence(r, resource)
    r.set(fence.key, encode_mark(40, 3))  # as 0.2's guard left it
    r.set(k(resource, "a"), "0.2")
    with pytest.raises(ef.StaleTokenError):
        fence.put(39, k(resource, "a"), "stale")
    assert fence.put(40, k(resource, "a"), "new") == 1
    assert fence.current_mark() == (40, 4) and r.get(k(resource, "a")) == b"new"
    r.set(fence.version_key, "not a number")
    with pytest.raises(ef.ConsistencyError):
        fence.put(40, k(resource, "a"), "lost")
    assert r.get(k(resource, "a")) == b"new" and fence.current_mark() == (40, 4)


def test_importing_etcdfence_redis_loads_no_grpc_and_no_protobuf() -> None:
    code = (
        "import sys, etcdfence.redis\n"
        "from etcdfence.redis import RedisFence, AsyncRedisFence, Put, Delete\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'\n"
        "             or m.startswith('google.protobuf'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_hash_slots_match_known_slots() -> None:
    """Slots Redis itself answers, from the examples of the ``CLUSTER KEYSLOT`` page
    (redis.io/docs/latest/commands/cluster-keyslot) and of the cluster specification."""
    assert hash_slot("foo") == 12182
    assert hash_slot("somekey") == 11058
    assert hash_slot("foo{hash_tag}") == hash_slot("hash_tag") == 2515
    assert hash_slot("{user1000}.following") == hash_slot("{user1000}.followers")
    assert hash_slot(b"{}foo") != hash_slot(b"foo")  # an empty tag is no tag


def test_a_lost_write_whose_fence_off_is_refused_is_still_outcome_unknown(
    r: Any, resource: str
) -> None:
    """The quick fence-off after a lost answer can fail with a definite error (here a
    mark that does not parse). The write's outcome is still unknown: the caller must get
    OutcomeUnknownError (fenced_off False), never that error — it says "nothing was
    written" while the lost write did apply."""
    key = k(resource, "a")
    with FaultProxy(ADDRESS) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=1.0)
        fence = RedisFence(client, resource)
        fence.put(5, key, "0")
        proxy.hold("downstream")  # the next write runs; its answer stays in the network
        outcome: list[BaseException] = []

        def put() -> None:
            try:
                fence.put(5, key, "1")
            except BaseException as exc:
                outcome.append(exc)

        writer = threading.Thread(target=put)
        writer.start()
        _wait(lambda: r.get(key) == b"1")
        r.set(fence.key, "garbage")  # the quick fence-off's claim will be refused
        writer.join(10)
        proxy.release()
        client.close()
    assert len(outcome) == 1 and isinstance(outcome[0], ef.OutcomeUnknown), outcome
    assert not outcome[0].fenced_off


def test_a_first_write_claims_and_writes_in_one_script(r: Any, resource: str) -> None:
    """A writer's first write with a token is one EVALSHA over a lower token (a new
    term: the common case) and two on a resource another writer of the term already
    marked: the first guess is refused with the mark and the version, the second
    claims above it only if neither changed (a compare-and-set, as on etcd)."""
    RedisFence(r, resource).put(1, k(resource, "warm"), "loads the script")
    with Recorder(r, resource) as fresh:
        RedisFence(r, resource).put(8, k(resource, "a"), "fresh token")
    with Recorder(r, resource) as marked:
        RedisFence(r, resource).put(8, k(resource, "a"), "another writer, same token")
    assert (fresh.scripts(), marked.scripts()) == (1, 2)
    assert RedisFence(r, resource).current_mark() == (8, 1)


# ---------------------------------------------------- a claim is a compare-and-set
# A writer's first write with a token claims an epoch in the same script as the write.
# The claim must be tied to what the writer last saw: held in the network past the
# client's timeout (the error says fenced_off, the quick fence-off claimed), then
# released after the writer's next write was acknowledged, it must change nothing.


def _settle(proxy: FaultProxy, timeout: float = 5.0) -> None:
    """Release the held bytes and give Redis time to run them (the stray's connection
    closes once they are delivered)."""
    proxy.release()
    deadline = time.monotonic() + timeout
    while (proxy.held_bytes or proxy.active_connections) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)


async def _asettle(proxy: FaultProxy, client: Any) -> None:
    """The async _settle: release, let the stray's bytes reach Redis, close the client."""
    proxy.release()
    deadline = time.monotonic() + 5
    while (proxy.held_bytes or proxy.active_connections > 1) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    await client.aclose()


@pytest.mark.parametrize("later", ["same-fence", "new-fence"])
@pytest.mark.parametrize("marked", [False, True], ids=["fresh", "marked-below"])
def test_a_held_first_write_never_lands_after_a_later_acknowledged_write(
    r: Any, resource: str, later: str, marked: bool
) -> None:
    key = k(resource, "a")
    if marked:
        RedisFence(r, resource).put(4, k(resource, "old"), "an older term")
    with FaultProxy(ADDRESS) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=None)
        client.ping()  # a pooled connection through the proxy, to be held
        a = RedisFence(client, resource)
        proxy.hold("upstream")
        with pytest.raises(ef.OutcomeUnknown) as info:
            a.put(5, key, "stray")  # the first write of token 5: claim + write, held
        assert info.value.fenced_off  # the quick fence-off claimed (5, 0)
        if later == "same-fence":
            a.put(5, key, "next")  # acknowledged, on a new connection
        else:
            RedisFence(r, resource).put(5, key, "next")  # a restarted writer, same token
        _settle(proxy)
        client.close()
    assert r.get(key) == b"next", f"the held claim + write landed late; mark {r.get(a.key)!r}"


async def test_a_held_first_write_never_lands_late_async(r: Any, resource: str) -> None:
    key = k(resource, "a")
    with FaultProxy(ADDRESS) as proxy:
        client = redis.asyncio.Redis(
            host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=None
        )
        await client.ping()
        a = AsyncRedisFence(client, resource)
        proxy.hold("upstream")
        with pytest.raises(ef.OutcomeUnknown) as info:
            await a.put(5, key, "stray")
        assert info.value.fenced_off
        await a.put(5, key, "next")
        await _asettle(proxy, client)
    assert r.get(key) == b"next", "the held claim + write landed late"


async def test_a_cancelled_first_write_never_lands_late(r: Any, resource: str) -> None:
    """A task cancelled while its first write (claim + write) is in the network; the
    writer's next write is acknowledged; the cancelled request, delivered later, must
    be refused (the engine has no epoch to give up for a claim)."""
    key = k(resource, "a")
    with FaultProxy(ADDRESS) as proxy:
        client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=5)
        await client.ping()
        a = AsyncRedisFence(client, resource)
        proxy.hold("upstream")
        task = asyncio.ensure_future(a.put(5, key, "stray"))
        await asyncio.to_thread(proxy.wait_held, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await a.put(5, key, "next")  # acknowledged, on a new connection
        await _asettle(proxy, client)
    assert r.get(key) == b"next", "a cancelled first write landed after a later acknowledged one"


@pytest.mark.parametrize("change", ["write-at-its-epoch", "claim-above"])
def test_a_claim_against_a_refusal_applies_only_if_mark_and_version_are_unchanged(
    r: Any, resource: str, change: str
) -> None:
    """The second round trip of a first write (the claim above a refused mark) carries
    that mark and the version beside it; anything applied in between — a write at an
    owned epoch bumps only the version, a claim moves the mark — makes it refuse."""
    from etcdfence.fence._redis_common import NO_OPS, Prepared, RedisLayout

    key = k(resource, "a")
    layout = RedisLayout(resource)
    owner = RedisFence(r, resource)
    owner.put(5, key, "owner")
    seen = (owner.current_mark(), owner.version())
    stray = Prepared([key.encode()], b"P", [b"stray"])
    late = layout.command(5, None, stray, seen)  # what a held second round trip carries
    if change == "write-at-its-epoch":
        owner.put(5, key, "next")
    else:
        RedisFence(r, resource).put(5, key, "next")
    mark, version = owner.current_mark(), owner.version()
    assert r.execute_command(*late) == [0, encode_mark(*mark), version]
    assert r.get(key) == b"next" and owner.version() == version
    fresh = layout.command(5, None, NO_OPS, (mark, version))
    assert r.execute_command(*fresh)[0] == 1  # unchanged: the claim applies
    assert owner.current_mark() == (5, mark[1] + 1)


@pytest.mark.serial  # gives up between 4.5 and 8 s
@pytest.mark.parametrize("twin", ["sync", "async"])
def test_fence_off_on_a_down_redis_resends_until_its_timeout_and_says_not_fenced(
    twin: str,
) -> None:
    """Claims that were not sent (connection refused) are resent, and do not count
    toward the claim attempts: fence_off waits its whole timeout, then says the earlier
    attempts may still apply (before the fix: 64 resends, ~3.2 s, fenced_off=True)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    started = time.monotonic()
    with pytest.raises(ef.OutcomeUnknown) as info:
        if twin == "sync":
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, retry=None)
            RedisFence(client, "t-down").fence_off(5, timeout=5)
        else:

            async def go() -> None:
                client = redis.asyncio.Redis(
                    host="127.0.0.1", port=port, socket_timeout=10, retry=None
                )
                await AsyncRedisFence(client, "t-down").fence_off(5, timeout=5)

            asyncio.run(go())
    took = time.monotonic() - started
    assert not info.value.fenced_off and "did not answer" in str(info.value), info.value
    assert 4.5 <= took < 8, f"gave up after {took:.1f}s"


@pytest.mark.parametrize("counter", [b"abc", b"1.5", b"\xff\xfe", b"-3", b"01"])
def test_a_corrupted_version_counter_is_a_consistency_error(
    r: Any, resource: str, counter: bytes
) -> None:
    f = RedisFence(r, resource)
    r.set(f.version_key, counter)
    with pytest.raises(ef.ConsistencyError):
        f.put(5, k(resource, "a"), "v")
    with pytest.raises(ef.ConsistencyError) as info:
        f.version()
    assert f.version_key.decode() in str(info.value) and repr(counter) in str(info.value)


@pytest.mark.parametrize("mark", [b"garbage", b"5", b"00000000000000000005:1", b"\xff"])
def test_a_corrupted_mark_is_a_consistency_error_for_reads_too(
    r: Any, resource: str, mark: bytes
) -> None:
    f = RedisFence(r, resource)
    r.set(f.key, mark)
    with pytest.raises(ef.ConsistencyError):
        f.put(5, k(resource, "a"), "v")
    with pytest.raises(ef.ConsistencyError) as info:
        f.current_mark()
    assert f.key.decode() in str(info.value) and repr(mark) in str(info.value)


# ------------------------------------------------------------ SCRIPT FLUSH, repeated


@pytest.fixture
def own_redis(tmp_path: Any) -> Iterator[str]:
    """A redis-server of this test's own on a free port (SCRIPT FLUSH is server-wide),
    stopped by its PID."""
    import shutil
    import socket

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_first_writes_survive_a_script_flush_loop(own_redis: str) -> None:
    """NOSCRIPT proves nothing ran: the fence loads the script and resends, again when
    a flush strikes between the load and the resend (bounded). 6 writers x 40 first
    writes under a SCRIPT FLUSH every millisecond: none fails, every claim moved the
    mark once, versions are unique and ordered per writer."""
    host, port = own_redis.rsplit(":", 1)
    admin = redis.Redis(host=host, port=int(port), socket_timeout=10)
    stop = threading.Event()
    flushes = [0]

    def flusher() -> None:
        while not stop.is_set():
            admin.script_flush()
            flushes[0] += 1
            time.sleep(0.001)

    name = "flush"
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        out = results.setdefault(i, [])
        client = redis.Redis(host=host, port=int(port), socket_timeout=10)
        for n in range(40):
            f = RedisFence(client, name)  # a new writer each time: every write claims
            try:
                out.append(f.put(3, f.key_for(f"k{i}"), f"{n}"))
            except BaseException as exc:
                errors.append(exc)
        client.close()

    flushing = threading.Thread(target=flusher)
    flushing.start()
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(120)
    stop.set()
    flushing.join()
    assert not errors, [repr(e) for e in errors[:5]]
    assert flushes[0] > 50
    versions = [v for vs in results.values() for v in vs]
    assert len(set(versions)) == len(versions) == 240
    for i, vs in results.items():
        assert vs == sorted(vs)
        assert admin.get(f"{{{name}}}:k{i}") == b"39"
    assert RedisFence(admin, name).current_mark() == (3, 239)  # one move per claim
    admin.close()

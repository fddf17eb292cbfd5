"""Every fence, one shape: the same tests over every backend and both twins (etcd on
the test cluster, Redis at ``ETCDFENCE_TEST_REDIS``, default 127.0.0.1:6379, skipped
when down).

Each case gets a :class:`Kit` — a way to make a fence bound to a resource, to read a
key back behind the fence's back, and to call a method of either twin — and asserts
what :mod:`etcdfence.fence.base` promises: the methods and return types, versions that
grow with every accepted write, stale tokens refused with nothing written, one epoch
per writer of a term, ``fence_off`` returning the epoch, ``Create`` (a put only if the
key is absent: exactly-once effects), and bad input refused before any I/O with an
etcdfence error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import socket
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import advance_revision

import etcdfence as ef
from etcdfence.errors import EtcdfenceError, UnavailableError
from etcdfence.fence import AsyncFence, Create, Delete, Fence, Put

pytestmark = pytest.mark.integration

#: The largest made-up token a test below writes.
MADE_UP_TOKENS_UP_TO = 100


@dataclass
class Kit:
    """One backend in one twin: ``make(resource)`` a fence, ``read(key)`` behind its back,
    ``unreachable(resource)`` a fence whose store does not answer."""

    name: str
    twin: str
    make: Callable[..., Any]
    read: Callable[[str], Any]
    unreachable: Callable[[str], Any]
    prefix: str
    #: A data key of the tests' resource (``prefix + "/r"``) named ``name``: on Redis it
    #: carries the resource as hash tag (one script touches one cluster slot).
    key: Callable[[str], str] = lambda name: name
    #: An etcd client of the kit's twin, for ``verify=`` (the etcd fence checks itself).
    etcd: Any = None
    #: The endpoints of the tests' etcd (to mint real tokens).
    endpoints: list[str] | None = None

    def checked(self, resource: str, **kw: Any) -> Any:
        """A fence that can tell a token from the future: the etcd fence as it is, the
        others with ``verify=`` the kit's etcd client."""
        if self.name != "etcd":
            kw.setdefault("verify", self.etcd)
        return self.make(resource, **kw)

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a fence method of either twin (the sync one off the event loop)."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def value(self, key: str) -> bytes | None:
        got = self.read(key)
        if inspect.isawaitable(got):
            got = await got
        return None if got is None else bytes(got)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def _etcd_kit(twin: str, endpoints: list[str], prefix: str) -> AsyncIterator[Kit]:
    cls: Any = ef.AsyncClient if twin == "async" else ef.Client
    client = cls(endpoints, timeout=2.0)
    dead = cls([f"http://127.0.0.1:{_closed_port()}"], timeout=0.5)

    def read(key: str) -> Any:
        got = client.get(key)
        if inspect.isawaitable(got):
            return _kv_value(got)
        return None if got is None else got.value

    try:
        yield Kit(
            "etcd", twin, client.fence, read, dead.fence, prefix, lambda n: f"{prefix}/{n}", client
        )
    finally:
        for c in (client, dead):
            if twin == "async":
                await c.aclose()
            else:
                c.close()


async def _kv_value(pending: Any) -> bytes | None:
    kv = await pending
    return None if kv is None else kv.value


@contextlib.asynccontextmanager
async def _redis_kit(twin: str, prefix: str) -> AsyncIterator[Kit]:
    redis = pytest.importorskip("redis")
    from etcdfence.redis import AsyncRedisFence, RedisFence

    address = os.environ.get("ETCDFENCE_TEST_REDIS", "127.0.0.1:6379")
    host, port = address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])
    admin = redis.Redis(host=host, port=port, socket_timeout=5, socket_connect_timeout=2)
    try:
        admin.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {address}: {exc}")
    flavour: Any = redis.asyncio.Redis if twin == "async" else redis.Redis
    fence_cls: Any = AsyncRedisFence if twin == "async" else RedisFence
    client = flavour(host=host, port=port, socket_timeout=5)
    dead = flavour(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=0.5, retry=None)
    tag = f"{{{prefix}/r}}"
    try:
        yield Kit(
            "redis",
            twin,
            lambda resource, **kw: fence_cls(client, resource, **kw),
            admin.get,
            lambda resource: fence_cls(dead, resource),
            prefix,
            lambda n: f"{tag}:{n}",
        )
    finally:
        leftovers = [*admin.keys(f"etcdfence:fence:{tag}*"), *admin.keys(f"{tag}*")]
        if leftovers:
            admin.delete(*leftovers)
        admin.close()
        for c in (client, dead):
            if twin == "async":
                await c.aclose()
            else:
                c.close()


@contextlib.asynccontextmanager
async def _sql_kit(dialect: str, path: Path, prefix: str) -> AsyncIterator[Kit]:
    """SQLFence (sync only) on a fresh fences and data table; every fence gets its own
    connection, as every writer would."""
    from test_sql import _need, _raw_connect

    from etcdfence.sql import SQLFence

    _need(dialect)
    fences, data = f"shf_{uuid.uuid4().hex[:8]}", f"shd_{uuid.uuid4().hex[:8]}"
    opened: list[Any] = []

    def connect() -> Any:
        if dialect == "sqlite":
            conn: Any = sqlite3.connect(path, timeout=30, check_same_thread=False)
        else:
            conn = _raw_connect(dialect)
        opened.append(conn)
        return conn

    def make(resource: str, **kw: Any) -> SQLFence:
        return SQLFence(connect(), resource, table=fences, data_table=data, **kw)

    def read(key: str) -> bytes | None:
        fence = SQLFence(connect(), "-", table=fences, data_table=data)
        p = "?" if dialect == "sqlite" else "%s"
        cur = fence.connection.cursor()
        cur.execute(f"SELECT v FROM {data} WHERE k = {p}", (key.encode(),))
        row = cur.fetchone()
        fence.connection.rollback()
        return None if row is None else bytes(row[0])

    def unreachable(resource: str) -> SQLFence:
        # a connection of this dialect that is gone: any statement on it fails
        if dialect == "sqlite":
            conn: Any = sqlite3.connect(":memory:", check_same_thread=False)
        else:
            conn = _raw_connect(dialect)
        conn.close()
        return SQLFence(conn, resource, dialect=dialect)

    make("-").ensure_schema()
    try:
        yield Kit(
            f"sql-{dialect}", "sync", make, read, unreachable, prefix, lambda n: f"{prefix}/{n}"
        )
    finally:
        for conn in opened:
            with contextlib.suppress(Exception):
                conn.close()
        if dialect != "sqlite":
            conn = _raw_connect(dialect, autocommit=True)
            try:
                conn.cursor().execute(f"DROP TABLE IF EXISTS {fences}, {data}")
            finally:
                conn.close()


BACKENDS = [
    ("etcd", "sync"),
    ("etcd", "async"),
    ("redis", "sync"),
    ("redis", "async"),
    ("sqlite", "sync"),
    ("postgresql", "sync"),
    ("mysql", "sync"),
]


@pytest_asyncio.fixture(
    params=[
        pytest.param(
            (b, t), id=f"{b}-{t}", marks=[pytest.mark.sql] if b in ("postgresql", "mysql") else []
        )
        for b, t in BACKENDS
    ]
)
async def kit(request: Any, tmp_path: Path) -> AsyncIterator[Kit]:
    backend, twin = request.param
    prefix = f"shape-{uuid.uuid4().hex[:8]}"
    etcd_endpoints: list[str] = request.getfixturevalue("etcd_endpoints")
    # the made-up tokens of these tests (5 .. 11) are not from the future: the etcd fence
    # (and a fence with verify=) refuses a token above etcd's revision
    advance_revision(etcd_endpoints, MADE_UP_TOKENS_UP_TO)
    if backend == "etcd":
        async with _etcd_kit(twin, etcd_endpoints, prefix) as made:
            made.endpoints = etcd_endpoints
            yield made
        return
    maker: Any = (
        _redis_kit(twin, prefix)
        if backend == "redis"
        else _sql_kit(backend, tmp_path / "shape.db", prefix)
    )
    etcd: Any = (ef.AsyncClient if twin == "async" else ef.Client)(etcd_endpoints, timeout=2.0)
    try:
        async with maker as made:
            made.etcd, made.endpoints = etcd, etcd_endpoints
            yield made
    finally:
        if twin == "async":
            await etcd.aclose()
        else:
            etcd.close()


async def test_every_backend_is_a_fence_bound_to_its_resource(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    shape = AsyncFence if kit.twin == "async" else Fence
    assert isinstance(fence, shape)
    assert fence.resource == kit.prefix + "/r"
    assert await kit(fence.current) == 0
    assert await kit(fence.current_mark) == (0, 0)


async def test_versions_grow_with_every_accepted_write(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    k1, k2 = kit.key("k1"), kit.key("k2")
    v1 = await kit(fence.put, 5, k1, b"one")
    v2 = await kit(fence.put, 5, k2, b"two")
    v3 = await kit(fence.txn, 6, [Put(k1, b"uno"), Delete(k2)])
    v4 = await kit(fence.delete, 6, k1)
    assert all(isinstance(v, int) for v in (v1, v2, v3, v4))
    assert 0 < v1 < v2 < v3 < v4
    assert await kit.value(k1) is None and await kit.value(k2) is None
    assert await kit(fence.current) == 6


async def test_a_stale_token_is_refused_and_nothing_is_written(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    key = kit.key("k")
    await kit(fence.put, 10, key, b"ten")
    with pytest.raises(ef.StaleTokenError) as info:
        await kit(fence.put, 9, key, b"nine")
    assert info.value.current == 10
    assert await kit.value(key) == b"ten"
    assert await kit(fence.advance, 11) is None
    assert await kit(fence.current) == 11
    with pytest.raises(ef.StaleTokenError):
        await kit(fence.txn, 10, [Put(key, b"ten again")])
    assert await kit.value(key) == b"ten"


async def test_each_writer_of_a_term_writes_at_its_own_epoch(kit: Kit) -> None:
    a, b = kit.make(kit.prefix + "/r"), kit.make(kit.prefix + "/r")
    key = kit.key("k")
    await kit(a.put, 7, key, b"a1")
    first = (await kit(a.current_mark))[1]
    await kit(b.put, 7, key, b"b1")
    second = (await kit(b.current_mark))[1]
    assert second > first
    await kit(a.put, 7, key, b"a2")  # a meets b's epoch, claims its own above it, writes
    assert (await kit(a.current_mark))[1] > second
    assert await kit.value(key) == b"a2"


async def test_fence_off_returns_the_epoch_it_claimed(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    await kit(fence.put, 7, kit.key("k"), b"x")
    epoch = await kit(fence.fence_off, 7)
    assert isinstance(epoch, int)
    assert await kit(fence.current_mark) == (7, epoch)
    again = await kit(fence.fence_off, 7)
    assert again > epoch
    with pytest.raises(ef.StaleTokenError):
        await kit(fence.fence_off, 6)


@pytest.mark.parametrize("bad", [0, -1, True, "7", 1.5, 2**63, None])
async def test_a_bad_token_is_refused_before_any_io(kit: Kit, bad: Any) -> None:
    fence = kit.unreachable(kit.prefix + "/r")  # any I/O would fail differently
    with pytest.raises(ef.InvalidTokenError):
        await kit(fence.put, bad, kit.key("k"), b"x")


@pytest.mark.parametrize("ops", ["not a list", [object()], Put("k", b"v")])
async def test_bad_ops_are_refused_before_any_io(kit: Kit, ops: Any) -> None:
    fence = kit.unreachable(kit.prefix + "/r")
    with pytest.raises(ef.InvalidTypeError):
        await kit(fence.txn, 5, ops)


@pytest.mark.parametrize(
    "lease_id", ["x", 2**70, -1, True, 1.5], ids=["str", "2**70", "-1", "True", "float"]
)
async def test_a_bad_lease_id_is_refused_before_any_io(kit: Kit, lease_id: Any) -> None:
    """etcd checks ``Put(lease_id=...)`` itself (an int64), never handing protobuf a
    value it raises on; Redis and SQL have no leases and refuse any."""
    fence = kit.unreachable(kit.prefix + "/r")
    with pytest.raises((ef.InvalidArgumentError, ef.InvalidTypeError)):
        await kit(fence.txn, 5, [Put(kit.key("k"), b"v", lease_id=lease_id)])


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        ("x", ef.InvalidTypeError),
        ([1], ef.InvalidTypeError),
        (True, ef.InvalidTypeError),
        (-1, ef.InvalidArgumentError),
        (float("nan"), ef.InvalidArgumentError),
        (float("inf"), ef.InvalidArgumentError),
        (0, ef.InvalidArgumentError),  # 0 s allows no attempt: refused, not "no answer"
    ],
    ids=repr,
)
async def test_a_bad_fence_off_timeout_is_refused_before_any_io(
    kit: Kit, timeout: Any, error: type[Exception]
) -> None:
    fence = kit.unreachable(kit.prefix + "/r")
    with pytest.raises(error):
        await kit(functools.partial(fence.fence_off, timeout=timeout), 5)


async def test_an_oversized_value_is_a_definite_refusal_and_the_fence_goes_on(kit: Kit) -> None:
    """A value above etcd's default request limit (1.5 MiB): refused with a definite
    error (never "outcome unknown") or accepted; either way the next write works."""
    if kit.name not in ("etcd", "redis"):
        pytest.skip("the request limits are etcd's (Redis: proto-max-bulk-len, 512 MB)")
    fence = kit.make(kit.prefix + "/r")
    try:
        await kit(fence.put, 5, kit.key("big"), b"x" * (3 * 1024 * 1024))
    except ef.EtcdfenceError as exc:
        assert not isinstance(exc, ef.OutcomeUnknownError), f"a definite refusal as {exc!r}"
    await kit(fence.put, 5, kit.key("small"), b"s")
    assert await kit.value(kit.key("small")) == b"s"


async def test_an_unreachable_store_is_an_etcdfence_error(kit: Kit) -> None:
    fence = kit.unreachable(kit.prefix + "/r")
    with pytest.raises(UnavailableError) as info:
        await kit(fence.put, 5, kit.key("k"), b"x")
    assert isinstance(info.value, EtcdfenceError)


async def test_concurrent_first_writes_of_one_fence_share_one_claim(kit: Kit) -> None:
    """Writes racing to be a fence's first with a token wait for one claim and write at
    its epoch — they do not claim over each other (which churned epochs and could run
    out of adopt attempts: 64 concurrent first writes on one etcd guard failed so)."""
    fence = kit.make(kit.prefix + "/r")
    keys = [kit.key(f"k{i}") for i in range(64)]
    versions = await asyncio.gather(*(kit(fence.put, 9, key, b"v") for key in keys))
    assert len(set(versions)) == len(keys)
    assert await kit(fence.current_mark) == (9, 0)
    assert all([await kit.value(key) == b"v" for key in keys])


# -- Create: a put only if the key is absent (exactly-once effects) -----------------------


async def test_create_writes_an_absent_key_and_returns_the_version(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    slot, effect = kit.key("slots/1"), kit.key("effect/1")
    v1 = await kit(fence.create, 5, slot, b"first")
    v2 = await kit(fence.txn, 5, [Create(kit.key("slots/2"), "second"), Put(effect, b"e")])
    assert isinstance(v1, int) and isinstance(v2, int) and 0 < v1 < v2
    assert await kit.value(slot) == b"first"
    assert await kit.value(kit.key("slots/2")) == b"second"
    assert await kit.value(effect) == b"e"
    assert (await kit(fence.current_mark))[0] == 5


async def test_create_of_an_existing_key_writes_nothing_and_moves_nothing(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    slot, effect, other = kit.key("slots/s"), kit.key("effect/b"), kit.key("other")
    await kit(fence.txn, 7, [Create(slot, b"delivery-a"), Put(other, b"kept")])
    mark = await kit(fence.current_mark)
    ops = [Put(effect, b"b's effect"), Create(slot, b"delivery-b"), Delete(other)]
    with pytest.raises(ef.KeyExistsError) as info:
        await kit(fence.txn, 7, ops)
    assert (info.value.resource, info.value.key) == (kit.prefix + "/r", slot)
    assert info.value.value == b"delivery-a"  # what the key holds, read in the same trip
    assert isinstance(info.value, ef.EtcdfenceError)
    assert await kit.value(slot) == b"delivery-a"
    assert await kit.value(effect) is None and await kit.value(other) == b"kept"
    assert await kit(fence.current_mark) == mark, "the mark moved on a refused Create"
    # a second writer of the term (a redelivery elsewhere): its first write would claim
    # an epoch, but the Create refuses the claim with the write
    peer = kit.make(kit.prefix + "/r")
    with pytest.raises(ef.KeyExistsError):
        await kit(peer.create, 7, slot, b"delivery-c")
    assert await kit(fence.current_mark) == mark, "a refused claim moved the mark"
    assert await kit.value(slot) == b"delivery-a"
    # the writer keeps its epoch: its next write needs no new claim
    await kit(fence.put, 7, effect, b"later")
    assert await kit(fence.current_mark) == mark


async def test_a_stale_token_beats_an_existing_key(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    slot = kit.key("slots/s")
    await kit(fence.create, 10, slot, b"ten")
    for writer in (fence, kit.make(kit.prefix + "/r")):
        with pytest.raises(ef.StaleTokenError) as info:
            await kit(writer.txn, 9, [Create(slot, b"nine"), Put(kit.key("e"), b"x")])
        assert info.value.current == 10
    assert await kit.value(slot) == b"ten" and await kit.value(kit.key("e")) is None


async def test_create_put_and_delete_in_one_txn_apply_together(kit: Kit) -> None:
    fence = kit.make(kit.prefix + "/r")
    slot, effect, old = kit.key("slots/x"), kit.key("effect/x"), kit.key("old")
    await kit(fence.put, 5, old, b"old")
    before = await kit(fence.put, 5, effect, b"before")
    after = await kit(fence.txn, 5, [Create(slot, b"x"), Put(effect, b"done"), Delete(old)])
    assert after > before
    assert await kit.value(slot) == b"x"
    assert await kit.value(effect) == b"done" and await kit.value(old) is None
    with pytest.raises(ef.KeyExistsError):  # the same again: all or nothing
        await kit(fence.txn, 5, [Create(slot, b"x"), Put(effect, b"again"), Put(old, b"o")])
    assert await kit.value(effect) == b"done" and await kit.value(old) is None


@pytest.mark.parametrize(
    ("ops", "error"),
    [
        (lambda k: [Create(k("s"), 5)], ef.InvalidTypeError),  # type: ignore[arg-type]
        (lambda k: [Create(7, b"v")], ef.InvalidTypeError),  # type: ignore[arg-type]
        (lambda k: [Create(k("s"), b"a"), Create(k("s"), b"b")], ef.InvalidArgumentError),
        (lambda k: [Create(k("s"), b"a"), Put(k("s"), b"b")], ef.InvalidArgumentError),
        (lambda k: [Delete(k("s")), Create(k("s"), b"a")], ef.InvalidArgumentError),
    ],
    ids=["value-int", "key-int", "create-twice", "create-and-put", "delete-and-create"],
)
async def test_bad_creates_are_refused_before_any_io(
    kit: Kit, ops: Callable[[Callable[[str], str]], list[Any]], error: type[Exception]
) -> None:
    fence = kit.unreachable(kit.prefix + "/r")  # any I/O would fail differently
    with pytest.raises(error):
        await kit(fence.txn, 5, ops(kit.key))


async def test_an_oversized_create_is_refused_like_a_put(kit: Kit) -> None:
    """Over the backend's limit: refused up front where the fence knows the limit (SQL
    keys, Redis ``max_value_bytes``), else a definite refusal from etcd — never "outcome
    unknown" — and nothing written; the next Create of the key works."""
    limited = {"redis": {"max_value_bytes": 1024}}.get(kit.name, {})
    fence = kit.make(kit.prefix + "/r", **limited)
    slot = kit.key("slots/big")
    if kit.name.startswith("sql"):
        big = [Create(kit.key("k" * 2000), b"v")]
    elif kit.name == "redis":
        big = [Create(slot, b"x" * 2048)]
    else:
        big = [Create(slot, b"x" * (3 * 1024 * 1024))]
    with pytest.raises(ef.EtcdfenceError) as info:
        await kit(fence.txn, 5, big)
    assert not isinstance(info.value, ef.OutcomeUnknownError), f"{info.value!r}"
    assert await kit.value(slot) is None
    await kit(fence.create, 5, slot, b"small")
    assert await kit.value(slot) == b"small"


@pytest.mark.parametrize("slot_op", [Create, Put], ids=["create", "control-put"])
async def test_racing_deliveries_of_one_slot_apply_one_effect(kit: Kit, slot_op: Any) -> None:
    """Six writers of one term (one fence each: a worker each) deliver the same slot at
    once with the same token — the mark lets them all pass — in three rounds: exactly
    one effect applies per round. The control marks the slot with a Put: every
    delivery applies, so the count below can fail."""
    deliveries = 6
    for round_ in range(3):
        slot = kit.key(f"slots/{round_}")
        writers = [kit.make(kit.prefix + "/r") for _ in range(deliveries)]

        async def deliver(i: int, writer: Any, slot: str = slot, round_: int = round_) -> bool:
            ops = [slot_op(slot, f"d{i}"), Put(kit.key(f"effect/{round_}/{i}"), b"done")]
            try:
                await kit(writer.txn, 9, ops)
            except ef.KeyExistsError as exc:
                assert exc.key == slot
                return False
            return True

        applied = await asyncio.gather(*(deliver(i, w) for i, w in enumerate(writers)))
        effects = [await kit.value(kit.key(f"effect/{round_}/{i}")) for i in range(deliveries)]
        assert [e is not None for e in effects] == applied
        if slot_op is Put:
            assert sum(applied) == deliveries, "control: every Put delivery applies"
            continue
        assert sum(applied) == 1, f"round {round_}: {sum(applied)} effects applied"
        assert await kit.value(slot) == f"d{applied.index(True)}".encode()


# -- bound resources and tokens from the future (issue #24) -------------------------------


@contextlib.contextmanager
def _held(endpoints: list[str], name: str) -> Iterator[ef.FencingToken]:
    """A real token of lock ``name``, held while the block runs."""
    with ef.Client(endpoints, timeout=5.0) as client, client.session(ttl=30) as session:
        lock = session.lock(name)
        yield lock.acquire(timeout=10)
        lock.release()


def _revision(endpoints: list[str]) -> int:
    with ef.Client(endpoints, timeout=5.0) as client:
        return int(client.status()["revision"])


async def test_a_bound_resource_refuses_a_token_of_another_lock(kit: Kit) -> None:
    assert kit.endpoints is not None
    ours, theirs = f"{kit.prefix}/locks/orders", f"{kit.prefix}/locks/billing"
    fence = kit.checked(kit.prefix + "/r", lock=ours)
    assert fence.lock == ours
    key = kit.key("k")
    with _held(kit.endpoints, theirs) as foreign:
        with pytest.raises(ef.ForeignTokenError) as info:
            await kit(fence.put, foreign, key, b"billing")
        assert ours in str(info.value) and theirs in str(info.value)
        assert isinstance(info.value, ef.InvalidTokenError)
        with pytest.raises(ef.ForeignTokenError):
            await kit(fence.fence_off, foreign)
    assert await kit.value(key) is None
    assert await kit(fence.current_mark) == (0, 0)
    with _held(kit.endpoints, ours) as token:
        await kit(fence.put, token, key, b"orders")
    assert await kit.value(key) == b"orders"


async def test_a_bare_number_is_refused_by_a_bound_resource_only(kit: Kit) -> None:
    assert kit.endpoints is not None
    bound = kit.make(kit.prefix + "/r", lock=f"{kit.prefix}/locks/orders")
    key = kit.key("k")
    with _held(kit.endpoints, f"{kit.prefix}/locks/orders") as token:
        for bare in (token.value, ef.FencingToken(token.value)):
            with pytest.raises(ef.ForeignTokenError, match="bare"):
                await kit(bound.put, bare, key, b"bare")
            with pytest.raises(ef.ForeignTokenError):
                await kit(bound.advance, bare)
        assert await kit.value(key) is None
        assert await kit(bound.current) == 0
        unbound = kit.make(kit.prefix + "/r")  # behaves as before: any valid token
        await kit(unbound.put, token.value, key, b"bare")
    assert await kit.value(key) == b"bare"


async def test_a_token_from_the_future_is_refused(kit: Kit) -> None:
    assert kit.endpoints is not None
    name = f"{kit.prefix}/locks/orders"
    fence = kit.checked(kit.prefix + "/r", lock=name)
    key = kit.key("k")
    with _held(kit.endpoints, name) as token:
        ahead = _revision(kit.endpoints) + 1000
        forged = ef.FencingToken(
            ahead,
            key=token.key,
            create_revision=token.create_revision,
            lease_id=token.lease_id,
            cluster_id=token.cluster_id,
        )
        with pytest.raises(ef.FutureTokenError) as info:
            await kit(fence.put, forged, key, b"future")
        assert info.value.token == ahead and 0 < info.value.revision < ahead
        # unbound: the etcd fence as it is, the others with a verifier
        unbound = kit.checked(kit.prefix + "/r")
        for value in (2**63 - 1, ahead):
            with pytest.raises(ef.FutureTokenError):
                await kit(unbound.put, value, key, b"max")
        assert await kit.value(key) is None
        assert await kit(fence.current) == 0
        await kit(fence.put, token, key, b"real")  # the real holder still writes
    assert await kit.value(key) == b"real"

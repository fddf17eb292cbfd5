"""Repair of a forged mark (issue #24): ``fence.repair(...)`` on every backend.

A mark is poisoned behind the fence's back (written straight to the store with a token
far above etcd's revision, as a typo'd or hostile ``Fencing-Token`` would leave it); the
real holder is refused; the repair lowers it to ``(revision, MAX_EPOCH)``; a fresh
holder writes again. A legitimate mark is never lowered, and the compare-and-set of
every store replaces only the exact mark it was given. Real etcd, Redis, PostgreSQL,
MariaDB and SQLite.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import test_sql_bound
from test_redis import HOST, PORT, REQUIRE_REDIS, _reachable
from test_sql import DB

import etcdfence as ef
from etcdfence._keys import MAX_EPOCH, encode_mark
from etcdfence.errors import InvalidArgumentError, RepairRefusedError, StaleTokenError
from etcdfence.redis import AsyncRedisFence, RedisFence
from etcdfence.sql import SQLFence

pytestmark = pytest.mark.integration

FUTURE = 9_000_000_000  # far above any revision of the test etcd


def _holder(client: ef.Client, name: str) -> tuple[ef.Session, ef.FencingToken]:
    session = client.session(ttl=30)
    return session, session.lock(name).acquire()


def _story(
    client: ef.Client,
    name: str,
    fence: Any,
    poison: Callable[[int], None],
    repair: Callable[[], Any],
    read: Callable[[], Any],
    key: str,
) -> None:
    """The poisoned-mark story on one sync fence."""
    session, token = _holder(client, name)
    try:
        fence.put(token, key, "before")
        poison(FUTURE)
        with pytest.raises(StaleTokenError):
            fence.put(token, key, "refused")
        assert read() == b"before"
        client.put(f"{name}-tick", "x")  # etcd moves on: the holder's token is below it
        done = repair()
        revision = client.revision()
        assert done.old == (FUTURE, 0) and done.new == (done.revision, MAX_EPOCH)
        assert token.value < done.revision <= revision
        assert fence.current_mark() == (done.revision, MAX_EPOCH)
        # the mark is legitimate now: a second repair refuses and changes nothing
        with pytest.raises(RepairRefusedError) as refused:
            repair()
        assert refused.value.mark == done.new and fence.current_mark() == done.new
        # the old holder's token is below the new mark: refused, must re-acquire
        with pytest.raises(StaleTokenError):
            fence.put(token, key, "old holder")
    finally:
        session.close()
    session, fresh = _holder(client, name)
    try:
        assert fresh.value > done.revision
        fence.put(fresh, key, "after")
        assert read() == b"after"
    finally:
        session.close()


def _legitimate_mark_is_kept(
    client: ef.Client, name: str, fence: Any, repair: Callable[[], Any], key: str = "k"
) -> None:
    session, token = _holder(client, name)
    try:
        fence.put(token, key, "v")
        before = fence.current_mark()
        assert before[0] == token.value
        with pytest.raises(RepairRefusedError) as refused:
            repair()
        assert refused.value.mark == before and refused.value.revision >= token.value
        assert fence.current_mark() == before
        fence.put(token, key, "still writes")  # the holder is untouched
    finally:
        session.close()


def _compare_and_set_bites(store: Any, fence: Any, poison: Callable[[int], object]) -> None:
    """``lower`` replaces only the exact mark given: a mark that moved stays."""
    poison(FUTURE)
    assert store.lower((FUTURE - 1, 0), (5, MAX_EPOCH)) == (FUTURE, 0)
    assert fence.current_mark() == (FUTURE, 0)
    assert store.lower((FUTURE, 0), (5, MAX_EPOCH)) == (FUTURE, 0)
    assert fence.current_mark() == (5, MAX_EPOCH)


# -- etcd ---------------------------------------------------------------------------------


def test_etcd_repair(etcd_client: ef.Client, etcd_namespace: str) -> None:
    name = f"{etcd_namespace}/lock"
    guard = etcd_client.fence(f"{etcd_namespace}/res")

    def poison(value: int) -> None:
        etcd_client.put(guard.key, encode_mark(value, 0))

    key = f"{etcd_namespace}/data"

    def read() -> bytes | None:
        kv = etcd_client.get(key)
        return None if kv is None else kv.value

    _story(etcd_client, name, guard, poison, guard.repair, read, key)
    other = etcd_client.fence(f"{etcd_namespace}/res2")
    _legitimate_mark_is_kept(etcd_client, name, other, other.repair, f"{etcd_namespace}/k")
    third = etcd_client.fence(f"{etcd_namespace}/res3")
    _compare_and_set_bites(
        third._store, third, lambda v: etcd_client.put(third.key, encode_mark(v, 0))
    )


async def test_etcd_repair_async(etcd_endpoints: list[str], etcd_namespace: str) -> None:
    async with ef.AsyncClient(etcd_endpoints, timeout=5.0) as client:
        guard = client.fence(f"{etcd_namespace}/res")
        await client.put(guard.key, encode_mark(FUTURE, 0))
        revision = await client.revision()
        with pytest.raises(StaleTokenError):
            await guard.put(revision, f"{etcd_namespace}/k", "v")
        done = await guard.repair()
        assert done.old == (FUTURE, 0) and done.new == (done.revision, MAX_EPOCH)
        assert await guard.current_mark() == done.new
        with pytest.raises(RepairRefusedError):
            await guard.repair()
        await client.put(f"{etcd_namespace}/bump", "x")  # the next revision etcd issues
        await guard.put(await client.revision(), f"{etcd_namespace}/k", "v")


def test_cas_refuses_a_mark_that_moved_between_judgement_and_lowering(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    """The engine's repair judges one mark and compare-and-sets that one: a store whose
    mark moves in between (a write lands) keeps the newer mark."""
    from etcdfence.fence._sync.engine import repair

    guard = etcd_client.fence(f"{etcd_namespace}/res")
    etcd_client.put(guard.key, encode_mark(FUTURE, 0))
    store = guard._store

    class Racing:
        resource = store.resource

        def read_mark(self) -> tuple[int, int]:
            mark = store.read_mark()
            etcd_client.put(guard.key, encode_mark(FUTURE, 1))  # another write lands
            return mark

        def lower(self, expected: tuple[int, int], new: tuple[int, int]) -> tuple[int, int]:
            return store.lower(expected, new)

    with pytest.raises(RepairRefusedError) as refused:
        repair(Racing(), etcd_client)
    assert refused.value.mark == (FUTURE, 1)
    assert guard.current_mark() == (FUTURE, 1)


# -- Redis --------------------------------------------------------------------------------


@pytest.fixture
def redis_resource() -> Iterator[tuple[Any, str]]:
    reason = _reachable()
    if reason and REQUIRE_REDIS:
        pytest.fail(f"{reason} (ETCDFENCE_REQUIRE_REDIS=1)")
    if reason:
        pytest.skip(reason)
    client = redis.Redis(host=HOST, port=PORT, socket_timeout=5)
    name = f"t-repair-{uuid.uuid4().hex[:8]}"
    yield client, name
    mark = f"etcdfence:fence:{{{name}}}"
    client.delete(mark, f"{mark}:version", *client.scan_iter(match=f"{{{name}}}*"))
    client.close()


def test_redis_repair(
    etcd_client: ef.Client, etcd_namespace: str, redis_resource: tuple[Any, str]
) -> None:
    r, name = redis_resource
    fence = RedisFence(r, name)
    key = fence.key_for("data")
    version = fence.version

    def poison(value: int) -> None:
        r.set(fence.key, encode_mark(value, 0))

    _story(
        etcd_client,
        f"{etcd_namespace}/lock",
        fence,
        poison,
        lambda: fence.repair(etcd_client),
        lambda: r.get(key),
        key,
    )
    assert version() == 2  # "before" and "after": the repair wrote no version
    other = RedisFence(r, name + "-2")
    try:
        _legitimate_mark_is_kept(
            etcd_client,
            f"{etcd_namespace}/lock",
            other,
            lambda: other.repair(etcd_client),
            other.key_for("k"),
        )
        third = RedisFence(r, name + "-3")
        _compare_and_set_bites(third, third, lambda v: r.set(third.key, encode_mark(v, 0)))
        # the script compares too: a mark written between the GET and the EVAL stays
        r.set(third.key, encode_mark(FUTURE, 1))
        stale = third._layout.lower_command(encode_mark(FUTURE, 0), (5, MAX_EPOCH))
        found = third._layout.parse_lower(r.execute_command(*stale), (FUTURE, 0))
        assert found == (FUTURE, 1) and third.current_mark() == (FUTURE, 1)
    finally:
        for n in (name + "-2", name + "-3"):
            mark = f"etcdfence:fence:{{{n}}}"
            r.delete(mark, f"{mark}:version", *r.scan_iter(match=f"{{{n}}}*"))


async def test_redis_repair_async(
    etcd_endpoints: list[str], redis_resource: tuple[Any, str]
) -> None:
    r, name = redis_resource
    ar = redis.asyncio.Redis(host=HOST, port=PORT, socket_timeout=5)
    try:
        async with ef.AsyncClient(etcd_endpoints, timeout=5.0) as client:
            fence = AsyncRedisFence(ar, name)
            r.set(fence.key, encode_mark(FUTURE, 0))
            revision = await client.revision()
            with pytest.raises(StaleTokenError):
                await fence.put(revision, fence.key_for("k"), "v")
            done = await fence.repair(client)
            assert done.old == (FUTURE, 0) and done.new == (done.revision, MAX_EPOCH)
            assert await fence.current_mark() == done.new
            with pytest.raises(RepairRefusedError):
                await fence.repair(client)
            assert await fence.lower((1, 0), (0, 0)) == done.new  # CAS: a moved mark stays
            await fence.put(await client.revision() + 1, fence.key_for("k"), "v")
    finally:
        await ar.aclose()


# -- SQL ----------------------------------------------------------------------------------


db = test_sql_bound.db  # the fixture: SQLite, PostgreSQL and MariaDB with private tables


def test_sql_repair(etcd_client: ef.Client, etcd_namespace: str, db: DB) -> None:
    conn = db.connect()
    fence = SQLFence(conn, "orders", table=db.fences, data_table=db.data)
    fence.ensure_schema()
    side = db.connect()  # "behind the fence's back": another connection, plain SQL

    def poison(value: int) -> None:
        poison_of(side, db, "orders", value)

    _story(
        etcd_client,
        f"{etcd_namespace}/lock",
        fence,
        poison,
        lambda: fence.repair(etcd_client),
        lambda: fence.get("data"),
        "data",
    )
    assert fence.version() == 2  # "before" and "after": the repair wrote no version
    other = fence.for_resource("other")
    _legitimate_mark_is_kept(
        etcd_client, f"{etcd_namespace}/lock", other, lambda: other.repair(etcd_client)
    )
    third = fence.for_resource("third")
    third.advance(1)
    _compare_and_set_bites(third._store, third, lambda v: poison_of(side, db, "third", v))


def poison_of(conn: Any, db: DB, resource: str, value: int) -> None:
    cur = conn.cursor()
    cur.execute(
        f"UPDATE {db.fences} SET token = {db.ph}, epoch = 0 WHERE resource = {db.ph}",
        (value, resource),
    )
    conn.commit()
    cur.close()


def test_repair_never_reopens_an_epoch_fenced_off_before_the_forgery(
    etcd_client: ef.Client, etcd_namespace: str, redis_resource: tuple[Any, str]
) -> None:
    """The repaired mark seals every epoch of the tokens issued so far: a holder's
    attempt fenced off before the forgery (here: epoch 0, after another writer of the
    term claimed epoch 1) stays refused, even when the holder's token is etcd's current
    revision itself (nothing was written to etcd since its lock was acquired)."""
    r, name = redis_resource
    session, token = _holder(etcd_client, f"{etcd_namespace}/lock")
    try:
        assert etcd_client.revision() == token.value  # a quiet cluster
        a, b = RedisFence(r, name), RedisFence(r, name)
        a.put(token, a.key_for("k"), "a")  # a owns epoch 0
        assert b.fence_off(token) == 1  # b fences every epoch-0 attempt off
        lost = a.attempt(token.value, 0, a._layout.prepare([]), None, None)
        assert not lost.applied  # a late epoch-0 attempt is refused: the guarantee
        r.set(a.key, encode_mark(FUTURE, 0))
        done = a.repair(etcd_client)
        assert done.revision == token.value
        late = a.attempt(token.value, 0, a._layout.prepare([]), None, None)
        assert not late.applied and a.current_mark() == (token.value, MAX_EPOCH)
        # the holder itself is refused too (its token is the sealed one): re-acquire
        for fence in (a, RedisFence(r, name)):
            with pytest.raises(InvalidArgumentError, match="a repair sealed the mark"):
                fence.put(token, a.key_for("k"), "after the repair")
        assert r.get(a.key_for("k")) == b"a"
    finally:
        session.close()

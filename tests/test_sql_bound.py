"""The SQL fence in the shape every fence has (issue #23): bound to one resource,
put/delete/txn on its data table returning the resource's version, on SQLite,
PostgreSQL and MariaDB; the 0.2 call form still working (deprecated); and a new
database being one :class:`SQLDialect` subclass."""

from __future__ import annotations

import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_sql import DB, _need, legacy

from etcdfence.errors import (
    EtcdfenceError,
    InvalidArgument,
    InvalidType,
    KeyExistsError,
    StaleTokenError,
    UnavailableError,
)
from etcdfence.fence import Create, Delete, Fence, Op, Put
from etcdfence.fence.sql.mysql import SENT_PER_BYTE, STATEMENT_OVERHEAD
from etcdfence.fence.sql.sqlite import ROW_OVERHEAD
from etcdfence.sql import SQLFence, SQLiteDialect, register_dialect


def _param(dialect: str) -> Any:
    return pytest.param(dialect, marks=[] if dialect == "sqlite" else [pytest.mark.sql])


@pytest.fixture(params=[_param(d) for d in ("sqlite", "postgresql", "mysql")])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DB]:
    dialect: str = request.param
    _need(dialect)
    d = DB(dialect, dialect, tmp_path / "fence.db")
    d.data = f"kv_{uuid.uuid4().hex[:8]}"  # the fence's own data table (ensure_schema)
    try:
        yield d
    finally:
        d.teardown()


def _bound(db: DB, resource: str, conn: Any = None) -> SQLFence:
    conn = conn if conn is not None else db.connect()
    return SQLFence(conn, resource, table=db.fences, data_table=db.data)


def test_the_bound_fence_has_the_fence_shape(db: DB) -> None:
    fence = _bound(db, "orders")
    fence.ensure_schema()
    assert isinstance(fence, Fence) and fence.resource == "orders"
    assert (fence.current(), fence.current_mark(), fence.version()) == (0, (0, 0), 0)
    v1 = fence.put(7, "a", "1")
    v2 = fence.put(7, b"b", b"\x00\xff")
    v3 = fence.delete(7, "a")
    v4 = fence.txn(7, [Put("c", "3"), Put("d/x", "4"), Put("d/y", "5"), Delete("d/", prefix=True)])
    assert v1 < v2 < v3 < v4 == fence.version() == 4
    assert (fence.get("a"), fence.get("b"), fence.get("c"), fence.get("d/x")) == (
        None,
        b"\x00\xff",
        b"3",
        None,
    )
    fence.advance(8)
    assert (fence.current(), fence.current_mark()) == (8, (8, 0))
    assert fence.fence_off(8) == 1 and fence.current_mark() == (8, 1)
    assert fence.put(8, "c", "new") == 5  # writes at the epoch it claimed

    # a stale token writes nothing: not the row, not the version
    other = _bound(db, "orders")
    with pytest.raises(StaleTokenError):
        other.put(7, "c", "zombie")
    assert (fence.get("c"), fence.version()) == (b"new", 5)
    # another writer of the term claims a fresh epoch; the first then claims above it
    assert other.put(8, "e", "x") == 6 and other.current_mark() == (8, 2)
    assert fence.put(8, "f", "y") == 7 and fence.current_mark() == (8, 3)
    # resources are separate: their own marks and versions, one data table
    elsewhere = fence.for_resource("billing")
    assert elsewhere.put(1, "c", "b") == 1 and elsewhere.get("c") == b"b"
    assert fence.get("c") == b"new"


def test_bad_writes_are_refused_before_any_io(db: DB) -> None:
    fence = _bound(db, "orders")
    fence.ensure_schema()
    for ops, exc in (
        ([Put("k", "v", lease_id=5)], InvalidArgument),
        ([Put("", "v")], InvalidArgument),
        ([Put("k" * 1025, "v")], InvalidArgument),
        ([Put("k", 5)], InvalidType),  # type: ignore[arg-type]
        (["k"], InvalidType),
        ("k", InvalidType),
    ):
        with pytest.raises(exc):
            fence.txn(5, ops)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        fence.put(0, "k", "v")
    assert fence.current_mark() == (0, 0) and fence.version() == 0


def test_a_0_2_table_gets_its_version_column(db: DB) -> None:
    """A fences table made by 0.2 (no version column) keeps its marks; ensure_schema
    adds the column and the version starts from 0."""
    conn = db.connect()
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {db.fences} (resource VARCHAR(255) NOT NULL PRIMARY KEY,"
        " token BIGINT NOT NULL, epoch BIGINT NOT NULL DEFAULT 0,"
        " updated_at TIMESTAMP NULL)"
    )
    cur.execute(f"INSERT INTO {db.fences} (resource, token, epoch) VALUES ('r', 7, 3)")
    conn.commit()
    fence = _bound(db, "r", conn)
    old = legacy(conn, table=db.fences)
    with old.guarded("r", 7):  # the 0.2 form runs on the 0.2 table as it is
        pass
    fence.ensure_schema()
    assert (fence.current_mark(), fence.version()) == ((7, 4), 0)
    assert fence.put(7, "k", "v") == 1 and fence.current_mark() == (7, 5)


def test_the_0_2_form_still_works_with_a_deprecation_warning(db: DB) -> None:
    conn = db.connect()
    old = legacy(conn, table=db.fences)  # asserts the DeprecationWarning naming the new form
    old.ensure_schema()
    old.advance("r", 5)
    with old.guarded("r", 5) as cur:
        cur.execute("SELECT 1")
    assert (old.current("r"), old.current_mark("r")) == (5, (5, 0))  # its own epoch
    assert old.fence_off("r", 5) == (5, 1)  # 0.2: the mark, not the epoch
    assert old.epoch("r", 5) == 1
    with pytest.raises(StaleTokenError):
        old.advance("r", 4)
    assert _bound(db, "r").current_mark() == (5, 1)


class _FakeDriverConnection:
    """A connection of the made-up driver module ``toysqlite``: sqlite3 underneath."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


_FakeDriverConnection.__module__ = "toysqlite.connections"


class ToyDialect(SQLiteDialect):
    """A new "database": SQLite under another driver name, counting its transactions."""

    name = "toysqlite"
    modules = ("toysqlite",)
    begun = 0

    def begin(self, conn: Any, cur: Any, *, write: bool) -> int:
        type(self).begun += 1
        return super().begin(conn, cur, write=write)


def test_a_new_dialect_is_one_class(tmp_path: Path) -> None:
    conn = _FakeDriverConnection(tmp_path / "toy.db")
    with pytest.raises(InvalidArgument, match="cannot tell the SQL dialect"):
        SQLFence(conn, "r")
    register_dialect(ToyDialect)
    fence = SQLFence(conn, "r")  # detected from the driver module
    assert fence.dialect == "toysqlite" and isinstance(fence.sql_dialect, ToyDialect)
    fence.ensure_schema()
    assert fence.put(3, "k", "v") == 1
    with pytest.raises(StaleTokenError):
        fence.put(2, "k", "zombie")
    assert fence.get("k") == b"v" and ToyDialect.begun >= 3
    assert SQLFence(sqlite3.connect(tmp_path / "toy.db"), "r", dialect="toysqlite").current() == 3


def test_the_package_dispatches_on_dialect_objects() -> None:
    """No `dialect ==` comparisons: every database difference is a method of SQLDialect."""
    root = Path(__file__).resolve().parent.parent / "etcdfence"
    offenders = [
        f"{path}:{n}"
        for path in [root / "sql.py", *sorted((root / "fence" / "sql").glob("*.py"))]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "dialect ==" in line or "dialect !=" in line
    ]
    assert offenders == []
    assert "toysqlite" not in sys.modules


def test_a_rolled_back_block_is_not_counted_as_an_accepted_write(db: DB) -> None:
    """The accepted-write metric counts a guarded SQL write once COMMIT succeeded, not
    at the check: a block that raises (rolled back, nothing written) is not counted."""
    prometheus = pytest.importorskip("prometheus_client")
    from etcdfence import metrics

    registry = prometheus.CollectorRegistry()
    metrics.enable_metrics(registry)
    try:
        fence = _bound(db, "counted")
        fence.ensure_schema()

        def accepted() -> float:
            value = registry.get_sample_value(
                "etcdfence_fenced_write_seconds_count",
                {"resource": "counted", "backend": db.dialect},
            )
            return value or 0.0

        with pytest.raises(RuntimeError), fence.guarded(5):
            raise RuntimeError("the block fails: rolled back")
        assert (accepted(), fence.current()) == (0.0, 0)
        fence.put(5, "k", "v")
        with fence.guarded(5):
            pass
        assert (accepted(), fence.current()) == (2.0, 5)
    finally:
        metrics.disable_metrics()


# -- Create and values (review/create: F1, F2, F3) ---------------------------------------

_UNENCODABLE = "\ud800"  # a lone surrogate: a str that is not UTF-8 text


@pytest.mark.parametrize(
    "op",
    [
        Create(_UNENCODABLE, b"v"),
        Create("slot", _UNENCODABLE),
        Put(_UNENCODABLE, b"v"),
        Put("k", _UNENCODABLE),
        Delete(_UNENCODABLE),
    ],
    ids=["create-key", "create-value", "put-key", "put-value", "delete-key"],
)
def test_an_unencodable_str_is_an_invalid_argument(db: DB, op: Op) -> None:
    """As on etcd and Redis: InvalidArgumentError ("... is not valid UTF-8 text"), not
    str.encode's UnicodeEncodeError; nothing of the transaction is written."""
    fence = _bound(db, "orders")
    fence.ensure_schema()
    with pytest.raises(InvalidArgument, match="not valid UTF-8 text"):
        fence.txn(5, [op, Put("effect", b"done")])
    assert fence.get("effect") is None and fence.current_mark() == (0, 0)


def test_key_exists_value_has_the_type_of_the_creates_value(db: DB) -> None:
    """The README's rule after a lost answer — send the same txn again; a KeyExistsError
    whose ``.value`` is yours means your first attempt applied — with a str value: the
    value comes back as str (as ``.key`` comes back as given), and the message names the
    key as given too. Bytes Creates get bytes; stored bytes that are not UTF-8 stay bytes."""
    fence = _bound(db, "orders")
    fence.ensure_schema()
    delivery = "delivery-1"
    ops: list[Op] = [Create("slots/nightly", delivery), Put("reports/nightly", b"the report")]
    fence.txn(5, ops)  # the first attempt applied (say its answer was lost)
    with pytest.raises(KeyExistsError) as again:
        fence.txn(5, ops)  # the documented resend
    assert (again.value.key, again.value.value) == ("slots/nightly", delivery)
    assert str(again.value).startswith("'slots/nightly' already exists in 'orders'")
    with pytest.raises(KeyExistsError) as as_bytes:
        fence.create(5, b"slots/nightly", b"delivery-2")
    assert (as_bytes.value.key, as_bytes.value.value) == (b"slots/nightly", b"delivery-1")
    fence.create(5, "slots/raw", b"\xff\xfe")
    with pytest.raises(KeyExistsError) as raw:
        fence.create(5, "slots/raw", "delivery-3")
    assert raw.value.value == b"\xff\xfe"
    assert fence.current_mark() == (5, 0) and fence.version() == 2


@pytest.mark.skipif(sys.version_info < (3, 11), reason="sqlite3 setlimit: Python >= 3.11")
def test_a_value_over_sqlites_length_limit_is_refused_before_any_io(tmp_path: Path) -> None:
    """SQLite refuses a row above its length limit (``string or blob too big``); the
    fence refuses the value up front, naming the limit, and the largest value it lets
    through lands (with the longest key and resource)."""
    conn: Any = sqlite3.connect(tmp_path / "limit.db")
    conn.setlimit(getattr(sqlite3, "SQLITE_LIMIT_LENGTH"), 20_000)  # noqa: B009  (3.11+)
    resource = "\U0001f600" * 255  # 1,020 bytes of UTF-8
    fence = SQLFence(conn, resource)
    fence.ensure_schema()
    cap = 20_000 - ROW_OVERHEAD
    for op in (Create("slots/big", b"x" * (cap + 1)), Put("big", b"x" * 20_000)):
        with pytest.raises(InvalidArgument, match=r"limit of 15904 bytes.*SQLITE_LIMIT_LENGTH"):
            fence.txn(5, [op])
    assert fence.current_mark() == (0, 0)
    key = "k" * 1024
    fence.create(5, key, b"x" * cap)
    assert fence.get(key) == b"x" * cap
    conn.close()


@pytest.mark.sql
def test_a_mysql_value_over_max_allowed_packet_is_a_clear_refusal(tmp_path: Path) -> None:
    """MariaDB drops the connection on a statement above ``max_allowed_packet``: the
    fence reported that as "the database is unreachable" and the connection was gone.
    Now the value is refused before anything is sent, naming the limit; the connection
    stays usable. The limit counts the value as the driver sends it (PyMySQL: hex, twice
    its length), and the largest value it lets through lands, with the longest key and
    resource."""
    _need("mysql")
    d = DB("mysql", "mysql", tmp_path / "unused")
    try:
        conn = d.connect()
        cur = conn.cursor()
        cur.execute("SELECT @@max_allowed_packet")
        packet = int(cur.fetchone()[0])
        cur.close()
        largest = (packet - STATEMENT_OVERHEAD) // SENT_PER_BYTE
        fence = SQLFence(conn, "\U0001f600" * 255, table=d.fences, data_table=d.data)
        fence.ensure_schema()
        for op in (Create("slots/big", b"x" * (packet + 1024)), Put("big", b"x" * (largest + 1))):
            with pytest.raises(EtcdfenceError) as info:
                fence.txn(5, [op])
            assert not isinstance(info.value, UnavailableError), repr(info.value)
            assert isinstance(info.value, InvalidArgument), repr(info.value)
            assert f"max_allowed_packet of {packet} bytes" in str(info.value)
        assert fence.current_mark() == (0, 0)  # the connection survived, nothing written
        fence.create(5, "slots/big", b"small")
        assert fence.get("slots/big") == b"small"
        key = b"\xff" * 1024
        fence.txn(5, [Put(key, b"x" * largest), Create("slots/quoted", b"'" * largest)])
        assert fence.get(key) == b"x" * largest
        assert fence.get("slots/quoted") == b"'" * largest
    finally:
        d.teardown()

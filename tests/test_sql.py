"""SQLFence against real databases: SQLite (temp file), PostgreSQL and MariaDB/MySQL.

PostgreSQL and MySQL come from ``ETCDFENCE_TEST_PG_DSN`` (libpq conninfo, default
``host=127.0.0.1 port=5432 user=postgres dbname=test``) and
``ETCDFENCE_TEST_MYSQL_DSN`` (``mysql://user:password@host:port/db``, default
``mysql://root@127.0.0.1:3306/test``). A database that does not answer skips its
tests, unless ``ETCDFENCE_REQUIRE_SQL=1`` makes that a failure. Every test uses its
own uniquely named tables and drops them afterwards.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etcdfence.errors import (
    EtcdUnavailable,
    InvalidArgument,
    InvalidToken,
    InvalidType,
    OutcomeUnknown,
    StaleTokenError,
)
from etcdfence.fence.sql._store import SQLStore
from etcdfence.sql import SQLFence, TransactionAborted, TransactionInProgress, UnboundSQLFence
from etcdfence.token import FencingToken

REQUIRE_SQL = os.environ.get("ETCDFENCE_REQUIRE_SQL") == "1"
PG_DSN = os.environ.get(
    "ETCDFENCE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)
MYSQL_DSN = os.environ.get("ETCDFENCE_TEST_MYSQL_DSN", "mysql://root@127.0.0.1:3306/test")
ROOT = Path(__file__).resolve().parent.parent
PY312 = sys.version_info >= (3, 12)

# variant -> (dialect, description of how the connection is set up)
VARIANTS = {
    "sqlite": "sqlite",  # legacy transaction control, isolation_level=""
    "sqlite-autocommit": "sqlite",  # isolation_level=None
    "sqlite-pep249": "sqlite",  # Python 3.12+: autocommit=False
    "sqlite-ac312": "sqlite",  # Python 3.12+: autocommit=True
    "postgresql": "postgresql",  # psycopg 3, READ COMMITTED, autocommit off
    "postgresql-autocommit": "postgresql",
    "postgresql-serializable": "postgresql",
    "mysql": "mysql",  # PyMySQL, REPEATABLE READ, autocommit off
    "mysql-autocommit": "mysql",
    "mysql-read-committed": "mysql",
}


def _mysql_params() -> dict[str, Any]:
    u = urlsplit(MYSQL_DSN)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
        "database": (u.path or "/test").lstrip("/") or "test",
        "connect_timeout": 5,
    }


_reachable: dict[str, str | None] = {}


def _need(dialect: str) -> None:
    """Skip (or fail under ETCDFENCE_REQUIRE_SQL=1) when the server does not answer."""
    if dialect == "sqlite":
        return
    if dialect not in _reachable:
        try:
            _raw_connect(dialect).close()
            _reachable[dialect] = None
        except Exception as exc:  # ImportError, OperationalError, ...
            _reachable[dialect] = f"{dialect} not reachable: {exc!r}"
    reason = _reachable[dialect]
    if reason is not None:
        if REQUIRE_SQL:
            pytest.fail(f"{reason} (ETCDFENCE_REQUIRE_SQL=1)")
        pytest.skip(reason)


def _raw_connect(dialect: str, **kw: Any) -> Any:
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(PG_DSN, connect_timeout=5, **kw)
    if dialect == "mysql":
        import pymysql

        return pymysql.connect(**_mysql_params(), **kw)
    raise AssertionError(dialect)


def legacy(connection: Any, **kwargs: Any) -> UnboundSQLFence:
    """``SQLFence(connection, ...)`` without a resource: the 0.2 form, which warns
    (typed here as what it returns; mypy types SQLFence(...) as the bound fence)."""
    with pytest.warns(DeprecationWarning, match=r"SQLFence\(connection, resource\)"):
        fence = SQLFence(connection, **kwargs)
    assert isinstance(fence, UnboundSQLFence)
    return fence


@dataclass
class DB:
    """One database variant with a private fences table and a private data table."""

    variant: str
    dialect: str
    path: Path  # SQLite file (unused for servers)
    fences: str = field(default_factory=lambda: f"fences_{uuid.uuid4().hex[:8]}")
    data: str = field(default_factory=lambda: f"data_{uuid.uuid4().hex[:8]}")
    _open: list[Any] = field(default_factory=list)

    @property
    def ph(self) -> str:
        return "?" if self.dialect == "sqlite" else "%s"

    def connect(self) -> Any:
        """A new connection set up the way this variant says."""
        v = self.variant
        if self.dialect == "sqlite":
            kw: dict[str, Any] = {"timeout": 30, "check_same_thread": False}
            if v == "sqlite-autocommit":
                kw["isolation_level"] = None
            elif v == "sqlite-pep249":
                kw["autocommit"] = False
            elif v == "sqlite-ac312":
                kw["autocommit"] = True
            conn: Any = sqlite3.connect(self.path, **kw)
        elif self.dialect == "postgresql":
            conn = _raw_connect("postgresql", autocommit=v.endswith("-autocommit"))
            if v == "postgresql-serializable":
                import psycopg

                conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        else:
            conn = _raw_connect("mysql", autocommit=v.endswith("-autocommit"))
            if v == "mysql-read-committed":
                with conn.cursor() as cur:
                    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        self._open.append(conn)
        return conn

    def fence(self, conn: Any = None) -> UnboundSQLFence:
        """A fence in the 0.2 form (these tests are its regression suite)."""
        return legacy(conn if conn is not None else self.connect(), table=self.fences)

    def q(self, sql: str) -> str:
        return sql.replace("{p}", self.ph).replace("{data}", self.data)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read on a fresh connection (never a stale snapshot)."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(self.q(sql), params)
            rows = [tuple(r) for r in cur.fetchall()]
            conn.commit()
            return rows
        finally:
            self._forget(conn)

    def execute(self, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> None:
        cur = conn.cursor()
        cur.execute(self.q(sql), params)
        conn.commit()

    def log(self, resource: str) -> list[int]:
        """Tokens of the writes that landed for ``resource``, in write order."""
        rows = self.query("SELECT writer FROM {data} WHERE resource = {p} ORDER BY id", (resource,))
        return [int(r[0]) for r in rows]

    def mark(self, resource: str) -> int:
        """The mark as a fresh connection sees it (0 if none)."""
        rows = self.query(f"SELECT token FROM {self.fences} WHERE resource = {{p}}", (resource,))
        return int(rows[0][0]) if rows else 0

    def insert_log(self, cur: Any, resource: str, writer: int) -> None:
        cur.execute(
            self.q("INSERT INTO {data} (resource, writer) VALUES ({p}, {p})"), (resource, writer)
        )

    def _forget(self, conn: Any) -> None:
        conn.close()
        self._open.remove(conn)

    def setup(self) -> None:
        if self.dialect == "sqlite":
            idcol = "id INTEGER PRIMARY KEY AUTOINCREMENT"
            tail = ""
        elif self.dialect == "postgresql":
            idcol, tail = "id BIGSERIAL PRIMARY KEY", ""
        else:
            idcol, tail = "id BIGINT AUTO_INCREMENT PRIMARY KEY", " ENGINE=InnoDB"
        conn = self.connect()
        self.execute(
            conn,
            f"CREATE TABLE {{data}} ({idcol}, resource VARCHAR(255) NOT NULL,"
            f" writer BIGINT NOT NULL){tail}",
        )
        self._forget(conn)
        fence = self.fence()
        fence.ensure_schema()

    def teardown(self) -> None:
        for conn in list(self._open):
            try:
                conn.close()
            except Exception:
                pass
        self._open.clear()
        if self.dialect == "sqlite":
            return  # the file lives in tmp_path
        conn = _raw_connect(self.dialect, autocommit=True)
        try:
            cur = conn.cursor()
            cur.execute(f"DROP TABLE IF EXISTS {self.fences}")
            cur.execute(f"DROP TABLE IF EXISTS {self.data}")
        finally:
            conn.close()


def _variant_param(name: str) -> Any:
    dialect = VARIANTS[name]
    marks = [] if dialect == "sqlite" else [pytest.mark.sql]
    if name in ("sqlite-pep249", "sqlite-ac312") and not PY312:
        marks.append(pytest.mark.skip(reason="sqlite3 autocommit attribute needs Python 3.12+"))
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(params=[_variant_param(v) for v in VARIANTS])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DB]:
    variant: str = request.param
    dialect = VARIANTS[variant]
    _need(dialect)
    d = DB(variant, dialect, tmp_path / "fence.db")
    try:
        d.setup()
        yield d
    finally:
        d.teardown()


def _res() -> str:
    return f"res/{uuid.uuid4().hex[:12]}"


def _no_transaction_open(db: DB, conn: Any) -> bool:
    if db.dialect == "sqlite":
        return db.variant == "sqlite-pep249" or not conn.in_transaction
    if db.dialect == "postgresql":
        return int(conn.info.transaction_status) == 0
    return not (conn.server_status & 1)


# -- schema ------------------------------------------------------------------------------


def test_ensure_schema_is_idempotent_and_keeps_marks(db: DB) -> None:
    fence = db.fence()
    fence.ensure_schema()
    r = _res()
    fence.advance(r, 7)
    fence.ensure_schema()
    fence.ensure_schema()
    assert fence.current(r) == 7
    assert db.mark(r) == 7
    assert _no_transaction_open(db, fence.connection)


def test_ensure_schema_concurrently_from_several_connections(db: DB) -> None:
    fresh = f"fences_{uuid.uuid4().hex[:8]}"
    fences = [legacy(db.connect(), table=fresh) for _ in range(4)]
    barrier = threading.Barrier(len(fences), timeout=10)
    errors: list[BaseException] = []

    def run(f: SQLFence) -> None:
        try:
            barrier.wait()
            f.ensure_schema()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in fences]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        fences[0].advance("x", 3)
        assert fences[1].current("x") == 3
    finally:
        conn = db.connect()
        db.execute(conn, f"DROP TABLE {fresh}")


# -- the fence -----------------------------------------------------------------------------


def test_accepted_write_is_visible_with_its_mark(db: DB) -> None:
    fence = db.fence()
    r = _res()
    with fence.guarded(r, 10) as cur:
        db.insert_log(cur, r, 10)
    assert db.log(r) == [10]
    assert db.mark(r) == 10
    assert fence.current(r) == 10
    assert _no_transaction_open(db, fence.connection)


def test_equal_token_is_accepted(db: DB) -> None:
    fence = db.fence()
    r = _res()
    for _ in range(3):
        with fence.guarded(r, FencingToken(10)) as cur:
            db.insert_log(cur, r, 10)
    assert db.log(r) == [10, 10, 10]
    assert db.mark(r) == 10


def test_lower_token_is_rejected_and_nothing_lands(db: DB) -> None:
    fence = db.fence()
    r = _res()
    with fence.guarded(r, 10) as cur:
        db.insert_log(cur, r, 10)
    body_ran = False
    with pytest.raises(StaleTokenError) as info, fence.guarded(r, 9) as cur:
        body_ran = True
        db.insert_log(cur, r, 9)
    assert (info.value.resource, info.value.token, info.value.current) == (r, 9, 10)
    assert not body_ran
    assert db.log(r) == [10]
    assert db.mark(r) == 10
    assert _no_transaction_open(db, fence.connection)
    # the connection is still usable, and the fence still moves forward
    with fence.guarded(r, 11) as cur:
        db.insert_log(cur, r, 11)
    assert db.log(r) == [10, 11]


def test_exception_in_block_rolls_back_writes_and_mark(db: DB) -> None:
    fence = db.fence()
    r = _res()
    fence.advance(r, 10)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), fence.guarded(r, 20) as cur:
        db.insert_log(cur, r, 20)
        raise Boom
    assert db.log(r) == []
    assert db.mark(r) == 10
    assert fence.current(r) == 10
    assert _no_transaction_open(db, fence.connection)
    # a failed SQL statement inside the block is rolled back the same way
    driver = sys.modules[type(fence.connection).__module__.split(".")[0]]
    with pytest.raises(driver.Error), fence.guarded(r, 20) as cur:  # DB-API's base error
        db.insert_log(cur, r, 20)
        cur.execute("SELECT * FROM no_such_table_etcdfence")
    assert db.log(r) == []
    assert db.mark(r) == 10
    fence.advance(r, 20)
    assert db.mark(r) == 20


@pytest.mark.parametrize("bad", [0, -1, "5", 5.0, None, True, 2**63], ids=repr)
def test_bad_tokens_raise_invalid_token_and_touch_nothing(db: DB, bad: object) -> None:
    fence = db.fence()
    r = _res()
    body_ran = False
    with pytest.raises(InvalidToken), fence.guarded(r, bad) as cur:  # type: ignore[arg-type]
        body_ran = True
        db.insert_log(cur, r, 1)
    with pytest.raises(InvalidToken):
        fence.advance(r, bad)  # type: ignore[arg-type]
    assert not body_ran
    assert _no_transaction_open(db, fence.connection)
    assert db.query(f"SELECT resource FROM {db.fences}") == []
    assert db.log(r) == []


def test_open_caller_transaction_is_refused_and_left_alone(db: DB) -> None:
    if db.variant == "sqlite-pep249":
        pytest.skip("with autocommit=False sqlite3 always has a transaction open")
    conn = db.connect()
    fence = db.fence(conn)
    r = _res()
    cur = conn.cursor()
    if db.variant.endswith(("-autocommit", "-ac312")):
        cur.execute("BEGIN")
    db.insert_log(cur, r, 99)  # the caller's own, uncommitted work
    with pytest.raises(TransactionInProgress), fence.guarded(r, 5):
        pass
    with pytest.raises(TransactionInProgress):
        fence.advance(r, 5)
    assert fence.current(r) == 0  # reads are fine inside the caller's transaction
    if db.variant.endswith(("-autocommit", "-ac312")):
        cur.execute("COMMIT")
    else:
        conn.commit()
    assert db.log(r) == [99]  # still the caller's to commit, untouched by us
    assert db.mark(r) == 0


def test_nested_guarded_on_one_fence_is_refused(db: DB) -> None:
    fence = db.fence()
    r = _res()
    with fence.guarded(r, 5) as cur:
        db.insert_log(cur, r, 5)
        with pytest.raises(TransactionInProgress), fence.guarded(r, 6):
            pass
    assert db.log(r) == [5]
    assert db.mark(r) == 5


def test_mark_is_durable_for_other_connections(db: DB) -> None:
    conn = db.connect()
    fence = db.fence(conn)
    r = _res()
    fence.advance(r, 123)
    conn.close()
    other = db.fence()
    assert other.current(r) == 123
    with pytest.raises(StaleTokenError) as info:
        other.advance(r, 122)
    assert info.value.current == 123


def test_resource_names_are_exact(db: DB) -> None:
    fence = db.fence()
    base = _res()
    fence.advance(base + "/Orders", 10)
    fence.advance(base + "/orders", 5)  # a different resource (case matters)
    fence.advance(base + "/orders2", 1)
    assert fence.current(base + "/Orders") == 10
    assert fence.current(base + "/orders") == 5
    long_name = "r" * 255
    fence.advance(long_name, 1)
    assert fence.current(long_name) == 1


# -- a block commits whole or not at all (failed statements, ended transactions) ---------


def _driver_error(fence: UnboundSQLFence) -> type[BaseException]:
    """The DB-API base ``Error`` of the fence's driver."""
    driver = sys.modules[type(fence.connection).__module__.split(".")[0]]
    return driver.Error  # type: ignore[no-any-return]


def test_caught_failing_statement_fails_the_block(db: DB) -> None:
    """Regression: a statement that failed inside the block, its error caught by the
    caller, used to end in a "successful" block: PostgreSQL turned the COMMIT into a
    silent ROLLBACK (no mark, no row, no error); MySQL and SQLite committed the rest."""
    fence = db.fence()
    r = _res()
    fence.advance(r, 10)
    with pytest.raises(TransactionAborted) as info, fence.guarded(r, 20) as cur:
        db.insert_log(cur, r, 20)
        try:
            cur.execute("INSERT INTO no_such_table_etcdfence VALUES (1)")
        except _driver_error(fence):
            pass  # the caller swallows the error and carries on
    assert isinstance(info.value.__cause__, _driver_error(fence))
    assert db.log(r) == []
    assert db.mark(r) == 10
    assert _no_transaction_open(db, fence.connection)
    with fence.guarded(r, 20) as cur:  # the connection is fine for the next block
        db.insert_log(cur, r, 20)
    assert (db.log(r), db.mark(r)) == ([20], 20)


def test_statements_after_a_failure_are_refused(db: DB) -> None:
    fence = db.fence()
    r = _res()
    with pytest.raises(TransactionAborted), fence.guarded(r, 5) as cur:
        with pytest.raises(_driver_error(fence)):
            cur.execute("SELECT * FROM no_such_table_etcdfence")
        with pytest.raises(TransactionAborted):  # refused, not sent (MySQL autocommit
            db.insert_log(cur, r, 5)  # would otherwise write it outside any fence)
    assert db.log(r) == []
    assert db.mark(r) == 0


def test_transaction_control_inside_the_block_is_refused(db: DB) -> None:
    fence = db.fence()
    r = _res()
    for statement in ("COMMIT", "  rollback", "BEGIN", "START TRANSACTION"):
        with pytest.raises(InvalidArgument, match="not allowed"), fence.guarded(r, 5) as cur:
            db.insert_log(cur, r, 5)
            cur.execute(statement)
        with pytest.raises(TransactionAborted), fence.guarded(r, 5) as cur:
            db.insert_log(cur, r, 5)
            with pytest.raises(InvalidArgument):
                cur.execute(statement)
    assert db.log(r) == []
    assert db.mark(r) == 0
    with fence.guarded(r, 5) as cur:  # savepoints are fine
        cur.execute("SAVEPOINT s1")
        db.insert_log(cur, r, 5)
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        db.insert_log(cur, r, 6)
    assert db.log(r) == [6]


def test_transaction_ended_inside_the_block_is_reported(db: DB) -> None:
    """conn.commit() inside the block (or, on MySQL, DDL, which commits implicitly)
    commits the mark and what ran so far; the fence cannot vouch for the block."""
    if db.variant == "sqlite-pep249":
        pytest.skip("sqlite3 with autocommit=False reopens a transaction at once")
    fence = db.fence()
    r = _res()
    with pytest.raises(OutcomeUnknown, match="ended inside") as info, fence.guarded(r, 5) as cur:
        db.insert_log(cur, r, 5)
        fence.connection.commit()
    assert isinstance(info.value, EtcdUnavailable)
    assert (info.value.resource, info.value.token, info.value.epoch) == (r, 5, 0)
    assert info.value.fenced_off is True  # the connection lives: fenced off at once
    assert fence.current_mark(r) == (5, 1)
    assert db.log(r) == [5]  # committed by the caller: that is why the outcome is "unknown"
    if db.dialect == "mysql":
        with pytest.raises(OutcomeUnknown, match="CREATE TABLE"), fence.guarded(r, 6) as cur:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {db.data}_x (a INT)")
            with pytest.raises(TransactionAborted):
                db.insert_log(cur, r, 6)  # after the implicit commit: refused
        db.execute(db.connect(), f"DROP TABLE {db.data}_x")
        assert db.log(r) == [5]


@pytest.mark.sql
def test_postgresql_failure_on_another_cursor_fails_the_block(tmp_path: Path) -> None:
    _need("postgresql")
    d = DB("postgresql-autocommit", "postgresql", tmp_path / "unused")
    try:
        d.setup()
        fence = d.fence()
        r = _res()
        with pytest.raises(TransactionAborted), fence.guarded(r, 5) as cur:
            d.insert_log(cur, r, 5)
            other = fence.connection.cursor()  # not the guarded cursor
            with pytest.raises(_driver_error(fence)):
                other.execute("SELECT * FROM no_such_table_etcdfence")
        assert d.log(r) == []
        assert d.mark(r) == 0
    finally:
        d.teardown()


def _kill_session(db: DB, conn: Any) -> None:
    """Terminate ``conn``'s server session from another connection (a real fault)."""
    killer = db.connect()
    cur = killer.cursor()
    if db.dialect == "postgresql":
        cur.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    else:
        cur.execute(f"KILL {int(conn.thread_id())}")
    killer.commit()
    db._forget(killer)


@pytest.mark.parametrize("variant", ["postgresql", "postgresql-autocommit", "mysql"])
@pytest.mark.sql
def test_commit_on_a_lost_connection_is_outcome_unknown(variant: str, tmp_path: Path) -> None:
    """The session dies before COMMIT: the driver's connection error is not a "no", so the
    caller gets OutcomeUnknown (an EtcdUnavailable), not a bare driver error."""
    d = DB(variant, VARIANTS[variant], tmp_path / "unused")
    _need(d.dialect)
    try:
        d.setup()
        fence = d.fence()
        r = _res()
        with pytest.raises(OutcomeUnknown) as info, fence.guarded(r, 5) as cur:
            d.insert_log(cur, r, 5)
            _kill_session(d, fence.connection)
        assert info.value.fenced_off is False
        assert d.log(r) == []  # the server aborted it (we know; the client could not)
        assert d.mark(r) == 0
    finally:
        d.teardown()


@pytest.mark.parametrize("variant", ["postgresql", "mysql"])
@pytest.mark.sql
def test_failed_rollback_closes_the_connection(variant: str, tmp_path: Path) -> None:
    """An exception in the block whose ROLLBACK fails: the connection is closed, so the
    open transaction can never be committed later by an unsuspecting commit()."""
    d = DB(variant, VARIANTS[variant], tmp_path / "unused")
    _need(d.dialect)
    try:
        d.setup()
        fence = d.fence()
        r = _res()
        with pytest.raises(RuntimeError, match="boom"), fence.guarded(r, 5) as cur:
            d.insert_log(cur, r, 5)
            _kill_session(d, fence.connection)
            raise RuntimeError("boom")
        conn = fence.connection
        assert conn.closed if d.dialect == "postgresql" else not conn.open
        assert d.log(r) == []
    finally:
        d.teardown()


def test_guarded_cursor_behaves_like_the_driver_cursor(db: DB) -> None:
    fence = db.fence()
    r = _res()
    with fence.guarded(r, 3) as cur:
        db.insert_log(cur, r, 3)
        assert cur.rowcount == 1
        cur.execute(db.q("SELECT writer FROM {data} WHERE resource = {p}"), (r,))
        assert [tuple(row) for row in cur] == [(3,)]
        cur.executemany(
            db.q("INSERT INTO {data} (resource, writer) VALUES ({p}, {p})"), [(r, 4), (r, 5)]
        )
        with cur as inner:  # closing the caller's cursor does not disturb the fence
            inner.execute(db.q("SELECT count(*) FROM {data}"))
            assert inner.fetchone()[0] == 3
    assert db.log(r) == [3, 4, 5]
    assert db.mark(r) == 3


# -- concurrency ---------------------------------------------------------------------------


@pytest.mark.parametrize("writers", [2, 5])
def test_racing_writers_only_newer_tokens_land(db: DB, writers: int) -> None:
    """Writers with different tokens race on one resource (barrier start). Whatever the
    interleaving, writes land in token order, the newest always lands last, every
    rejected writer saw a higher mark, and the final mark is the maximum."""
    fences = [db.fence() for _ in range(writers)]
    barrier = threading.Barrier(writers, timeout=30)
    shared = _res()
    rng = random.Random(1234)
    for rnd in range(30):
        if rnd % 2:
            resource = shared  # an existing row: the mark moves up round by round
            tokens = [rnd * 1000 + t for t in rng.sample(range(1, 999), writers)]
        else:
            resource = _res()  # no row yet: writers race to create it
            tokens = rng.sample(range(1, 10_000), writers)
        outcome: list[object] = [None] * writers

        def write(
            i: int,
            resource: str = resource,
            tokens: list[int] = tokens,
            outcome: list[object] = outcome,
        ) -> None:
            try:
                barrier.wait()
                with fences[i].guarded(resource, tokens[i]) as cur:
                    db.insert_log(cur, resource, tokens[i])
                    time.sleep(rng.random() * 0.002)
                outcome[i] = "ok"
            except BaseException as exc:
                outcome[i] = exc

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i, o in enumerate(outcome):
            if o != "ok":
                assert isinstance(o, StaleTokenError), (rnd, o)
                assert o.current > tokens[i]
        accepted = sorted(tokens[i] for i, o in enumerate(outcome) if o == "ok")
        landed = db.log(resource)
        if resource == shared:
            landed = [t for t in landed if t > rnd * 1000]
        assert landed == accepted, (rnd, tokens, outcome)  # written in token order
        assert landed[-1] == max(tokens)
        assert db.mark(resource) == max(tokens)


# -- the property --------------------------------------------------------------------------


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tokens=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=20))
def test_property_accepted_tokens_never_decrease(db: DB, tokens: list[int]) -> None:
    if not hasattr(db, "_prop_fence"):
        db._prop_fence = db.fence()  # type: ignore[attr-defined]
    fence: UnboundSQLFence = db._prop_fence  # type: ignore[attr-defined]
    r = _res()
    high = 0
    accepted: list[int] = []
    for t in tokens:
        try:
            with fence.guarded(r, t) as cur:
                db.insert_log(cur, r, t)
        except StaleTokenError as exc:
            assert t < high, f"{t} rejected although the highest accepted was {high}"
            assert exc.current == high
        else:
            assert t >= high, f"{t} accepted after {high}"
            accepted.append(t)
            high = t
        assert fence.current(r) == high
    assert accepted == sorted(accepted)
    assert db.log(r) == accepted


# -- the check is what makes it safe --------------------------------------------------------


def _zombie_scenario(db: DB) -> tuple[list[str], list[tuple[int, int]]]:
    """Leader A (token 5) writes, stalls; leader B (token 9) takes over and writes; A
    wakes up and writes again. Returns the writes refused and the violations found in
    what landed: a write whose token is below one that landed before it."""
    fence_a, fence_b = db.fence(), db.fence()
    r = _res()
    refused: list[str] = []
    for fence, token in ((fence_a, 5), (fence_b, 9), (fence_a, 5)):
        try:
            with fence.guarded(r, token) as cur:
                db.insert_log(cur, r, token)
        except StaleTokenError:
            refused.append(f"token {token}")
    landed = db.log(r)
    violations = [
        (later, max(landed[:i])) for i, later in enumerate(landed) if i and later < max(landed[:i])
    ]
    return refused, violations


def test_without_the_check_the_zombie_write_lands(db: DB, monkeypatch: pytest.MonkeyPatch) -> None:
    refused, violations = _zombie_scenario(db)
    assert refused == ["token 5"]
    assert violations == []

    def fencing_disabled(self: SQLStore, cur: Any, token: int, epoch: int) -> tuple[int, int]:
        return token, epoch  # "accept everything": what a fence without the check amounts to

    monkeypatch.setattr(SQLStore, "_advance", fencing_disabled)
    refused, violations = _zombie_scenario(db)
    assert refused == []
    assert violations == [(5, 9)], "the invariant check must catch the stale write"


# -- arguments -----------------------------------------------------------------------------


def test_bad_arguments(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    for table in ("", "a-b", "a b", "1abc", 'x"; DROP TABLE y; --', "a.b.c", "t" * 64, 5):
        with pytest.raises(InvalidArgument):
            legacy(conn, table=table)
    with pytest.raises(InvalidArgument):
        legacy(conn, dialect="oracle")
    with pytest.raises(InvalidArgument, match="dialect"):
        legacy(object())
    assert legacy(object(), dialect="postgresql").dialect == "postgresql"
    assert legacy(conn, table="main.fences").table == "main.fences"
    fence = legacy(conn, table="fences")
    assert fence.dialect == "sqlite"
    fence.ensure_schema()
    for name, exc in (
        ("", InvalidArgument),
        (" x", InvalidArgument),
        ("x/", InvalidArgument),
        ("a\x00b", InvalidArgument),
        ("r" * 256, InvalidArgument),
        (b"x", InvalidType),
        (None, InvalidType),
    ):
        with pytest.raises(exc), fence.guarded(name, 1):  # type: ignore[arg-type]
            pass
        with pytest.raises(exc):
            fence.current(name)  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM fences").fetchone() == (0,)


def test_dialect_detection() -> None:
    assert legacy(sqlite3.connect(":memory:")).dialect == "sqlite"
    for dialect in ("postgresql", "mysql"):
        _need(dialect)
        conn = _raw_connect(dialect)
        try:
            assert legacy(conn).dialect == dialect
        finally:
            conn.close()


# -- the example ---------------------------------------------------------------------------


def _run_example(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {
        k: v for k, v in os.environ.items() if k not in ("ETCDFENCE_TOKEN", "ETCD_LOCK_REV")
    }
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fenced_sql_writer.py"), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


def test_example_fenced_sql_writer(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'x.db'}"
    ok = _run_example("--dsn", dsn, "--token", "42", "--key", "primary", "--value", "10.0.0.5")
    assert ok.returncode == 0, ok.stderr
    stale = _run_example("--dsn", dsn, "--token", "41", "--key", "primary", "--value", "zombie")
    assert stale.returncode == 3, stale.stderr
    assert "stale" in (stale.stdout + stale.stderr).lower()
    from_env = _run_example(
        "--dsn", dsn, "--key", "primary", "--value", "10.0.0.6", env={"ETCD_LOCK_REV": "43"}
    )
    assert from_env.returncode == 0, from_env.stderr
    no_token = _run_example("--dsn", dsn, "--key", "primary", "--value", "x")
    assert no_token.returncode == 2
    conn = sqlite3.connect(tmp_path / "x.db")
    assert conn.execute("SELECT token FROM etcdfence_fences").fetchall() == [(43,)]
    rows = conn.execute("SELECT name, value, token FROM fenced_kv").fetchall()
    assert rows == [("primary", "10.0.0.6", 43)]

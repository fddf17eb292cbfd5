"""Fencing for SQL databases: the check and the write in one transaction.

Use :class:`SQLFence` when the resource a leader protects is a table (or several)
in SQLite, PostgreSQL or MySQL/MariaDB. A small table (``etcdfence_fences`` by
default) holds each resource's high-water mark: the highest fencing token it
accepted. :meth:`SQLFence.guarded` opens a transaction, checks the caller's token
against the mark and advances it, hands the caller a cursor for its own writes in
that same transaction, and commits both together. A token below the mark rolls the
whole transaction back and raises :class:`~etcdfence.errors.StaleTokenError`, so a
paused or partitioned ex-leader can never overwrite the work of its successor::

    fence = SQLFence(conn)
    fence.ensure_schema()                     # once, at deploy or start-up
    with fence.guarded("orders", token) as cur:
        cur.execute("UPDATE orders SET state = 'shipped' WHERE id = %s", (order_id,))

Rules for the connection: :class:`SQLFence` uses the DB-API connection you give it
and runs its own transactions on it. Commit or roll back your own work before
calling :meth:`~SQLFence.guarded`, :meth:`~SQLFence.advance` or
:meth:`~SQLFence.ensure_schema` (they raise :class:`TransactionInProgress`
otherwise, where the driver lets us tell), and do not commit or roll back inside a
``guarded`` block. Works with the connection in autocommit mode or not. One
connection serves one thread at a time, as DB-API connections do.

sqlite3 with ``autocommit=False`` (Python 3.12+) always has a transaction open, so
there SQLFence cannot tell your pending work from its own and uses (and commits)
that transaction: commit first. A MySQL server reports open transactions only once
they have written, so a pending read-only transaction is ended, not refused.
"""

from __future__ import annotations

import random
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, Literal

from . import metrics
from ._keys import validate_name
from .errors import (
    EtcdfenceError,
    InvalidArgument,
    InvalidToken,
    OutcomeUnknown,
    StaleTokenError,
)
from .token import FencingToken, coerce_token

__all__ = [
    "DEFAULT_TABLE",
    "DIALECTS",
    "MAX_RESOURCE_LENGTH",
    "Dialect",
    "SQLFence",
    "TransactionAborted",
    "TransactionInProgress",
]

Dialect = Literal["sqlite", "postgresql", "mysql"]
#: The dialects :class:`SQLFence` speaks.
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql", "mysql")
#: The fences table used when none is given.
DEFAULT_TABLE = "etcdfence_fences"
#: The ``resource`` column is ``VARCHAR(255)``; longer names are refused up front
#: (SQLite would store them, MySQL and PostgreSQL would not).
MAX_RESOURCE_LENGTH = 255
# The token column is a signed BIGINT, like etcd's int64 revisions.
_MAX_TOKEN = 2**63 - 1
# Attempts for the check step when the database reports a deadlock or a
# serialization failure (only before the caller's block has run).
_CHECK_ATTEMPTS = 8

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE_RE = re.compile(rf"(?:{_IDENT}\.)?{_IDENT}")

# Driver module (top-level package of the connection's class) -> dialect.
_DIALECT_BY_MODULE: dict[str, Dialect] = {
    "sqlite3": "sqlite",
    "pysqlite2": "sqlite",
    "pysqlite3": "sqlite",
    "psycopg": "postgresql",
    "psycopg2": "postgresql",
    "pymysql": "mysql",
    "MySQLdb": "mysql",
    "mariadb": "mysql",
    "mysql": "mysql",  # mysql-connector-python
}
_DEFAULT_PARAMSTYLE: dict[Dialect, str] = {
    "sqlite": "qmark",
    "postgresql": "format",
    "mysql": "format",
}

# How a transaction was opened, which decides how it is ended.
_NONE = 0  # no transaction of ours: a single autocommitted read, or inside the caller's
_EXPLICIT = 1  # we sent BEGIN: end with COMMIT / ROLLBACK statements
_IMPLICIT = 2  # the driver opens transactions itself: end with conn.commit() / rollback()


class TransactionInProgress(EtcdfenceError, RuntimeError):
    """The connection has uncommitted work, so :class:`SQLFence` cannot start its own
    transaction on it. Commit or roll back first; never call ``guarded`` from inside
    another ``guarded`` block on the same connection."""


class TransactionAborted(EtcdfenceError, RuntimeError):
    """A :meth:`SQLFence.guarded` block could not commit, so nothing of it was committed.

    Raised when a statement inside the block failed even though the block caught the
    error (PostgreSQL would silently turn the COMMIT into a ROLLBACK; MySQL and SQLite
    would commit the statements that happened to succeed), or when the database
    answered the COMMIT by rolling back. The mark did not move and none of the block's
    writes landed; the error that failed the block is the ``__cause__``. Retry the
    whole block if that makes sense; do not retry single statements inside it.
    """


class SQLFence:
    """Resource-side fencing for a DB-API connection (sqlite3, psycopg, PyMySQL, ...).

    Use it when a leader (or lock holder) writes to SQL tables and a stale leader
    must not: every write goes through :meth:`guarded` with the writer's fencing
    token, and the database itself refuses tokens below the highest one it has
    accepted for the resource. The mark and the caller's writes commit in one
    transaction, so either both happen or neither does.

    ``dialect`` is detected from the connection's driver module (``sqlite3``;
    ``psycopg``/``psycopg2``; ``pymysql``/``MySQLdb``/``mariadb``/``mysql.connector``)
    or given as ``"sqlite"``, ``"postgresql"`` or ``"mysql"`` (MariaDB included).
    ``table`` names the fences table (``name`` or ``schema.name``, identifier
    characters only); run :meth:`ensure_schema` once to create it.

    How each dialect checks and advances the mark atomically:

    * **PostgreSQL** (any isolation level): one statement, ``INSERT ... ON CONFLICT
      (resource) DO UPDATE SET token = excluded.token WHERE f.token <=
      excluded.token``. The upsert locks the conflicting row and evaluates the
      ``WHERE`` on its newest committed version (a concurrent writer makes it wait
      for that writer's commit), so the comparison cannot interleave with another
      writer. One row affected means accepted; zero means stale, and a follow-up
      ``SELECT`` in the same transaction, still holding the row lock, reads the
      mark for the error. Under REPEATABLE READ / SERIALIZABLE a concurrent update
      surfaces as a serialization failure instead; the check step is retried in a
      fresh transaction (the caller's block has not run yet).
    * **SQLite**: the same conditional upsert inside ``BEGIN IMMEDIATE``, which
      takes the database write lock before anything is read, so concurrent writers
      (threads or processes) serialize on the lock (waiting up to the connection's
      ``timeout``) instead of failing with a stale snapshot. Needs SQLite >= 3.24.
    * **MySQL / MariaDB** (InnoDB): ``INSERT ... ON DUPLICATE KEY UPDATE token =
      GREATEST(token, %s)`` followed by ``SELECT token ... FOR UPDATE``. The upsert
      creates the row or takes an exclusive lock on the existing one (avoiding the
      gap-lock deadlock of a ``SELECT ... FOR UPDATE`` on a missing row) and moves
      the mark to ``max(mark, token)``; the locking read then returns the newest
      committed value, not a snapshot. The write is accepted exactly when that
      value equals the token. This avoids affected-row counts, which for ``ON
      DUPLICATE KEY UPDATE`` depend on ``CLIENT_FOUND_ROWS`` and report 0 for an
      update to an equal value. A deadlock (1213) is retried like above.

    In every dialect the row lock on the resource's mark is held until the block
    commits: writers to one resource run one at a time, so keep the block short.
    An equal token is accepted (a leader writes many times with one token).
    """

    def __init__(
        self,
        connection: Any,
        *,
        table: str = DEFAULT_TABLE,
        dialect: str | None = None,
    ) -> None:
        if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
            raise InvalidArgument(
                "table must be an identifier (letters, digits, '_'; at most 63 characters), "
                f"optionally schema-qualified: {table!r}"
            )
        module = type(connection).__module__.split(".")[0]
        if dialect is None:
            detected = _DIALECT_BY_MODULE.get(module)
            if detected is None:
                raise InvalidArgument(
                    f"cannot tell the SQL dialect of a {type(connection).__module__}."
                    f"{type(connection).__qualname__} connection; pass "
                    f"dialect= one of {', '.join(DIALECTS)}"
                )
            dialect = detected
        elif dialect not in DIALECTS:
            raise InvalidArgument(f"dialect must be one of {', '.join(DIALECTS)}: {dialect!r}")
        self._conn = connection
        self._dialect: Dialect = dialect
        self._table = table
        self._backend = self._dialect
        driver = sys.modules.get(module)
        paramstyle = getattr(driver, "paramstyle", None) or _DEFAULT_PARAMSTYLE[self._dialect]
        if paramstyle == "qmark":
            p = "?"
        elif paramstyle in ("format", "pyformat"):
            p = "%s"
        else:
            raise InvalidArgument(f"unsupported DB-API paramstyle {paramstyle!r} of {module}")
        version = getattr(driver, "sqlite_version_info", None)
        if self._dialect == "sqlite" and version is not None and tuple(version) < (3, 24, 0):
            raise EtcdfenceError(
                "SQLFence needs SQLite >= 3.24 (upsert); this Python links "
                + ".".join(map(str, version))
            )
        self._sql = _Statements(self._dialect, table, p)
        self._lock = threading.RLock()
        self._busy = False

    # -- properties ---------------------------------------------------------

    @property
    def connection(self) -> Any:
        """The DB-API connection this fence runs its transactions on."""
        return self._conn

    @property
    def dialect(self) -> Dialect:
        """``"sqlite"``, ``"postgresql"`` or ``"mysql"``."""
        return self._dialect

    @property
    def table(self) -> str:
        """The fences table (``resource``, ``token``, ``updated_at``)."""
        return self._table

    def __repr__(self) -> str:
        return f"SQLFence(dialect={self._dialect!r}, table={self._table!r})"

    # -- public operations ---------------------------------------------------

    def ensure_schema(self) -> None:
        """Create the fences table if it does not exist, and commit.

        Idempotent and safe to run from several processes at once; existing marks
        are kept. Run it at deploy time or start-up, before the first guarded write.
        On MySQL the DDL commits implicitly, as all MySQL DDL does.
        """
        with self._exclusive():
            cur = self._conn.cursor()
            try:
                kind = self._begin(cur, write=True)
                try:
                    cur.execute(self._sql.create)
                    self._end(cur, kind, commit=True)
                except Exception:
                    self._rollback_quietly(cur, kind)
                    # Two processes racing CREATE TABLE IF NOT EXISTS can collide in
                    # PostgreSQL's catalog; the table existing afterwards is success.
                    if self._table_exists(cur):
                        return
                    raise
            finally:
                _close(cur)

    def current(self, resource: str) -> int:
        """The resource's high-water mark: the highest token it accepted, 0 if none.

        Use it for monitoring or to show why a write was refused; do not use it to
        decide whether to write (that is :meth:`guarded`'s job, atomically). Called
        inside your own open transaction it reads there and leaves the transaction
        open; otherwise it runs in a short transaction of its own.
        """
        resource = _validate_resource(resource)
        with self._exclusive():
            cur = self._conn.cursor()
            try:
                kind = self._begin(cur, write=False)
                try:
                    cur.execute(self._sql.select, (resource,))
                    row = cur.fetchone()
                    self._end(cur, kind, commit=True)
                except BaseException:
                    self._rollback_quietly(cur, kind)
                    raise
            finally:
                _close(cur)
        return 0 if row is None else int(row[0])

    def advance(self, resource: str, token: FencingToken | int) -> None:
        """Raise the resource's mark to ``token`` without writing anything else.

        Use it when a new leader takes over, to shut out its predecessors at once
        instead of at its first write. Raises :class:`StaleTokenError` when the mark
        is already higher; an equal mark is fine.
        """
        with self.guarded(resource, token):
            pass

    @contextmanager
    def guarded(self, resource: str, token: FencingToken | int) -> Iterator[Any]:
        """Run a block of writes fenced by ``token``; yields a DB-API cursor.

        Use it for every write a leader makes to the protected tables. On entry it
        opens a transaction and atomically checks ``token`` against the resource's
        mark, advancing the mark when the token is at least as high. The block's
        statements on the yielded cursor join that transaction, which commits when
        the block ends normally.

        * Stale token: rolls back and raises :class:`StaleTokenError` (``current``
          is the mark read in the same transaction) before the block runs.
        * Exception in the block: rolls back everything, the mark included, and
          re-raises.
        * A statement on the yielded cursor failed, even if the block caught the
          error: the block is failed. Further statements on the cursor are refused,
          nothing is committed, and :class:`TransactionAborted` is raised at the end
          of the block. (PostgreSQL would turn the COMMIT into a silent ROLLBACK;
          MySQL and SQLite would commit a half-done block.) Savepoint recovery
          inside a guarded block is therefore not supported.
        * The transaction was ended inside the block (``COMMIT``/``ROLLBACK``
          statements are refused; ``conn.commit()``, or DDL on MySQL, which commits
          implicitly, is detected where the driver reports it): nothing more is
          committed and :class:`~etcdfence.errors.OutcomeUnknown` is raised, since
          what ran before the end may have been committed.
        * The COMMIT itself failed: a definite answer from the database (say a
          serialization failure) is re-raised as is, nothing was committed; a lost
          connection or an interrupted COMMIT means the outcome is unknown:
          :class:`~etcdfence.errors.OutcomeUnknown` (or the ``KeyboardInterrupt``
          itself, which is never swallowed).

        Statements run on *other* cursors of the connection join the transaction
        too, but only PostgreSQL lets the fence notice when one of them failed: use
        the yielded cursor.

        Raises :class:`~etcdfence.errors.InvalidToken` for a token that is not a
        positive int (or exceeds BIGINT) and ``InvalidArgument``/``InvalidType`` for
        a bad resource name, before touching the database.
        """
        value = _validate_token(token)
        resource = _validate_resource(resource)
        with self._exclusive():
            started = time.perf_counter()
            ctl = self._conn.cursor()  # ours: BEGIN, the check, COMMIT / ROLLBACK
            user: _GuardedCursor | None = None
            try:
                kind, mark = self._check(ctl, resource, value)
                if mark < value:  # cannot happen: the upsert leaves max(mark, token)
                    self._rollback_quietly(ctl, kind)
                    raise EtcdfenceError(
                        f"fence check for {resource!r} read mark {mark} below token {value}"
                    )
                if mark > value:
                    self._rollback_quietly(ctl, kind)
                    metrics.fence_rejected(
                        resource, value, mark, time.perf_counter() - started, self._backend
                    )
                    raise StaleTokenError(resource, value, mark)
                user = _GuardedCursor(self._conn.cursor(), self._txn_state)
                try:
                    yield user
                except BaseException:
                    self._rollback_quietly(ctl, kind)
                    raise
                user._closed_by_fence = True
                self._finish(ctl, kind, user, resource, value)
            finally:
                if user is not None:
                    _close(user._cursor)
                _close(ctl)
            metrics.fence_accepted(resource, value, time.perf_counter() - started, self._backend)

    def _finish(self, ctl: Any, kind: int, user: _GuardedCursor, resource: str, token: int) -> None:
        """Commit the block's transaction, or refuse to when it cannot commit whole."""
        if user._ended is not None:
            # Ended inside the block: what ran before the end may be committed.
            self._rollback_quietly(ctl, kind)
            raise self._outcome_unknown(
                resource,
                token,
                f"the transaction was ended inside the guarded block for {resource!r} "
                f"({user._ended}); what ran before that may have been committed",
            )
        state = self._txn_state()
        if user._failure is not None or state == _TXN_FAILED:
            self._rollback_quietly(ctl, kind)
            raise TransactionAborted(
                f"a statement failed inside the guarded block for {resource!r}; "
                "nothing was committed and the mark did not move"
            ) from user._failure
        if state == _TXN_NONE:
            self._rollback_quietly(ctl, kind)
            raise self._outcome_unknown(
                resource,
                token,
                f"the transaction was ended inside the guarded block for {resource!r}; "
                "what ran in it may have been committed",
            )
        try:
            self._end(ctl, kind, commit=True)
        except BaseException as exc:
            if _not_committed(self._dialect, self._conn, exc):
                # e.g. a serialization failure at COMMIT: nothing was committed.
                self._rollback_quietly(ctl, kind)
                raise
            self._rollback_quietly(ctl, kind)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: never swallowed
            raise self._outcome_unknown(
                resource,
                token,
                f"COMMIT of the guarded block for {resource!r} failed without an answer "
                f"({exc!r}): it may or may not have been committed",
            ) from exc
        if kind == _EXPLICIT and self._dialect == "postgresql":
            # A COMMIT of a failed transaction "succeeds" with the tag ROLLBACK.
            tag = getattr(ctl, "statusmessage", None)
            if isinstance(tag, str) and tag.upper().startswith("ROLLBACK"):
                raise TransactionAborted(
                    f"the database rolled back the guarded block for {resource!r} at "
                    "COMMIT; nothing was committed and the mark did not move"
                )

    def _outcome_unknown(self, resource: str, token: int, message: str) -> OutcomeUnknown:
        return OutcomeUnknown(
            message + "; re-read before deciding, never simply resend",
            resource=resource,
            token=token,
            epoch=0,
            fenced_off=False,
        )

    def _txn_state(self) -> int:
        """What the driver says about the connection's transaction, without a round trip."""
        return _txn_state(self._dialect, self._conn)

    # -- the check ---------------------------------------------------------------

    def _check(self, cur: Any, resource: str, token: int) -> tuple[int, int]:
        """Open the transaction and run the check-and-advance; returns how the
        transaction was opened and the mark after the check (== token iff accepted).

        Deadlocks and serialization failures are retried in a fresh transaction: the
        caller's block has not run yet, so nothing of theirs is lost.
        """
        attempt = 0
        while True:
            attempt += 1
            kind = self._begin(cur, write=True)
            try:
                return kind, self._check_and_advance(cur, resource, token)
            except BaseException as exc:
                self._rollback_quietly(cur, kind)
                if attempt >= _CHECK_ATTEMPTS or not _is_transient(self._dialect, exc):
                    raise
            time.sleep(random.uniform(0, min(0.1, 0.002 * 2**attempt)))

    def _check_and_advance(self, cur: Any, resource: str, token: int) -> int:
        """Advance the mark to ``max(mark, token)`` under a row lock held until the
        transaction ends; return the mark afterwards (equal to ``token`` exactly when
        the write is accepted)."""
        sql = self._sql
        if self._dialect == "mysql":
            cur.execute(sql.advance, (resource, token, token))
            cur.execute(sql.select_for_update, (resource,))
        else:
            cur.execute(sql.advance, (resource, token))
            if cur.rowcount == 1:
                return token
            cur.execute(sql.select, (resource,))
        row = cur.fetchone()
        if row is None:  # cannot happen: the upsert created or locked the row
            raise EtcdfenceError(f"fence row for {resource!r} missing after upsert")
        return int(row[0])

    def _table_exists(self, cur: Any) -> bool:
        kind = _NONE
        try:
            kind = self._begin(cur, write=False)
            cur.execute(self._sql.probe)
            cur.fetchall()
            self._end(cur, kind, commit=True)
        except Exception:
            self._rollback_quietly(cur, kind)
            return False
        return True

    # -- transaction control -------------------------------------------------------

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._lock:
            if self._busy:
                raise TransactionInProgress(
                    "SQLFence operation started inside a guarded() block on the same "
                    "connection; nested fenced transactions are not supported"
                )
            self._busy = True
            try:
                yield
            finally:
                self._busy = False

    def _begin(self, cur: Any, *, write: bool) -> int:
        """Start a transaction of ours (or find the one a read joins); return its kind.

        Writes refuse a connection with uncommitted work, since our COMMIT or
        ROLLBACK would take that work along. Reads join the caller's transaction.
        """
        conn = self._conn
        if self._dialect == "sqlite":
            mode = getattr(conn, "autocommit", None)  # Python >= 3.12
            if mode is False:
                # PEP 249 mode: sqlite3 always keeps a (deferred) transaction open and
                # reopens one on every commit. It is ours; the first statement in it is
                # the upsert (a write), which takes the write lock through the busy
                # handler just as BEGIN IMMEDIATE would.
                return _IMPLICIT
            # Legacy mode (any isolation_level, also None) or autocommit=True: sqlite3
            # never interferes with an explicit BEGIN, and we end it with COMMIT or
            # ROLLBACK statements (conn.commit() is a no-op when autocommit=True).
            if conn.in_transaction:
                if write:
                    raise _in_progress()
                return _NONE
            if not write:
                return _NONE
            cur.execute("BEGIN IMMEDIATE")
            return _EXPLICIT
        if _in_transaction(conn):
            if write:
                raise _in_progress()
            return _NONE
        autocommit = _autocommit(conn)
        if autocommit and not write:
            return _NONE  # one SELECT is its own transaction
        if self._dialect == "mysql":
            # Always explicit on MySQL: the server reports IN_TRANS only for
            # transactions that wrote, so a read-only one (with its REPEATABLE READ
            # snapshot) may still be open; START TRANSACTION ends it and gives the
            # caller's block a fresh snapshot.
            cur.execute("START TRANSACTION")
            return _EXPLICIT
        if autocommit:
            cur.execute("BEGIN")
            return _EXPLICIT
        return _IMPLICIT

    def _end(self, cur: Any, kind: int, *, commit: bool) -> None:
        if kind == _EXPLICIT:
            cur.execute("COMMIT" if commit else "ROLLBACK")
        elif kind == _IMPLICIT:
            if commit:
                self._conn.commit()
            else:
                self._conn.rollback()

    def _rollback_quietly(self, cur: Any, kind: int) -> None:
        """Roll back while another exception is on its way; never mask it."""
        try:
            if kind == _EXPLICIT:
                # A failed statement may already have ended the transaction (MySQL
                # deadlocks roll back on the server); ROLLBACK is then a no-op.
                cur.execute("ROLLBACK")
            elif kind == _IMPLICIT:
                self._conn.rollback()
        except Exception as exc:
            # The transaction may still be open on a live connection, where a later
            # commit() by the application would commit it after all: close the
            # connection, so the server aborts it.
            metrics.log.warning(
                "etcdfence.sql_rollback_failed",
                dialect=self._dialect,
                error=repr(exc),
                action="connection closed",
            )
            with suppress(Exception):
                self._conn.close()


class _GuardedCursor:
    """The cursor a :meth:`SQLFence.guarded` block gets: a thin wrapper that notices
    failed statements and the transaction ending, so the fence never commits a block
    that cannot commit whole. Everything else is passed through to the driver's cursor.
    """

    def __init__(self, cursor: Any, state: Any) -> None:
        self._cursor = cursor
        self._state = state
        self._failure: BaseException | None = None  # the first statement that failed
        self._ended: str | None = None  # what ended the transaction inside the block
        self._closed_by_fence = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    def __enter__(self) -> _GuardedCursor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<guarded {self._cursor!r}>"

    def close(self) -> None:
        """Close the driver's cursor (the fence's own transaction is unaffected)."""
        self._cursor.close()

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """``cursor.execute`` of the driver, inside the guarded transaction."""
        return self._run("execute", args, kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        """``cursor.executemany`` of the driver, inside the guarded transaction."""
        return self._run("executemany", args, kwargs)

    def callproc(self, *args: Any, **kwargs: Any) -> Any:
        """``cursor.callproc`` of the driver, inside the guarded transaction."""
        return self._run("callproc", args, kwargs)

    def executescript(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: sqlite3's ``executescript`` commits the open transaction first."""
        return self._refuse("executescript() (sqlite3 commits before running the script)")

    def _refuse(self, what: str) -> Any:
        exc = InvalidArgument(
            f"{what} is not allowed inside a guarded block: the fence commits or rolls "
            "back when the block ends"
        )
        if self._failure is None:
            self._failure = exc
        raise exc

    def _run(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._closed_by_fence:
            raise InvalidArgument("the guarded block has ended; this cursor is closed")
        if self._failure is not None or self._ended is not None:
            raise TransactionAborted(
                "an earlier statement of this guarded block failed or ended its "
                "transaction; the block will not commit, further statements are refused"
            ) from self._failure
        operation = args[0] if args else None
        if isinstance(operation, bytes):
            operation = operation.decode("utf-8", "replace")
        if isinstance(operation, str):
            verb = _TXN_CONTROL.match(operation)
            if verb is not None:
                self._refuse(verb.group(1).upper())
        try:
            result = getattr(self._cursor, method)(*args, **kwargs)
        except BaseException as exc:
            self._failure = exc
            raise
        if self._state() == _TXN_NONE:
            # e.g. DDL on MySQL commits implicitly; a COMMIT hidden behind a comment
            text = operation if isinstance(operation, str) else repr(operation)
            self._ended = f"by {' '.join(text.split())[:60]!r}"
        return self if result is self._cursor else result


class _Statements:
    """The SQL of one dialect, table and placeholder style."""

    def __init__(self, dialect: Dialect, table: str, p: str) -> None:
        q = '"' if dialect != "mysql" else "`"
        t = ".".join(f"{q}{part}{q}" for part in table.split("."))
        self.select = f"SELECT token FROM {t} WHERE resource = {p}"
        self.select_for_update = self.select + " FOR UPDATE"
        self.probe = f"SELECT resource FROM {t} WHERE 1 = 0"
        if dialect == "mysql":
            # utf8mb4_bin: resource names compare byte for byte, as in etcd (the
            # default collation would make 'Orders' and 'orders' one fence).
            self.create = (
                f"CREATE TABLE IF NOT EXISTS {t} ("
                "resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
                " token BIGINT NOT NULL,"
                " updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
                " PRIMARY KEY (resource)"
                ") ENGINE=InnoDB"
            )
            self.advance = (
                f"INSERT INTO {t} (resource, token, updated_at) VALUES ({p}, {p}, UTC_TIMESTAMP(6))"
                f" ON DUPLICATE KEY UPDATE token = GREATEST(token, {p}),"
                " updated_at = UTC_TIMESTAMP(6)"
            )
            return
        if dialect == "postgresql":
            ts_type, now = "TIMESTAMPTZ", "now()"
        else:
            ts_type, now = "TIMESTAMP", "CURRENT_TIMESTAMP"
        self.create = (
            f"CREATE TABLE IF NOT EXISTS {t} ("
            "resource VARCHAR(255) NOT NULL PRIMARY KEY,"
            " token BIGINT NOT NULL,"
            f" updated_at {ts_type} NOT NULL DEFAULT {now})"
        )
        self.advance = (
            f"INSERT INTO {t} AS f (resource, token, updated_at) VALUES ({p}, {p}, {now})"
            " ON CONFLICT (resource) DO UPDATE"
            " SET token = excluded.token, updated_at = excluded.updated_at"
            " WHERE f.token <= excluded.token"
        )


# -- helpers --------------------------------------------------------------------------


def _validate_token(token: object) -> int:
    value = coerce_token(token)
    if value > _MAX_TOKEN:
        raise InvalidToken(f"a fencing token must fit in a signed 64-bit integer, got {value}")
    return value


def _validate_resource(resource: object) -> str:
    name = validate_name(resource, "resource")
    if len(name) > MAX_RESOURCE_LENGTH:
        raise InvalidArgument(
            f"resource must be at most {MAX_RESOURCE_LENGTH} characters, got {len(name)}"
        )
    return name


def _in_progress() -> TransactionInProgress:
    return TransactionInProgress(
        "the connection has an open transaction with uncommitted work; commit or roll "
        "it back before a fenced write (SQLFence runs its own transaction)"
    )


def _in_transaction(conn: Any) -> bool:
    """Whether the driver reports an open transaction (False when it cannot tell)."""
    flag = getattr(conn, "in_transaction", None)  # sqlite3, mysql.connector
    if isinstance(flag, bool):
        return flag
    info = getattr(conn, "info", None)  # psycopg 3: IDLE = 0
    status = getattr(info, "transaction_status", None)
    if status is not None:
        return int(status) != 0
    get_status = getattr(conn, "get_transaction_status", None)  # psycopg2: IDLE = 0
    if callable(get_status):
        return int(get_status()) != 0
    server_status = getattr(conn, "server_status", None)  # PyMySQL: SERVER_STATUS_IN_TRANS
    if isinstance(server_status, int):
        return bool(server_status & 1)
    return False


def _autocommit(conn: Any) -> bool:
    """Whether the driver commits every statement by itself."""
    get = getattr(conn, "get_autocommit", None)  # PyMySQL, MySQLdb (autocommit is a method)
    if callable(get):
        return bool(get())
    return getattr(conn, "autocommit", False) is True  # psycopg, psycopg2, mariadb, ...


def _is_transient(dialect: Dialect, exc: BaseException) -> bool:
    """A deadlock or serialization failure: the transaction may simply be retried."""
    if dialect == "postgresql":
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        return state in ("40001", "40P01")
    if dialect == "mysql":
        code = getattr(exc, "errno", None)
        if code is None and exc.args and isinstance(exc.args[0], int):
            code = exc.args[0]
        return code == 1213  # ER_LOCK_DEADLOCK
    return False


# What a driver says about the connection's transaction (no round trip).
_TXN_UNKNOWN = 0  # the driver cannot tell
_TXN_NONE = 1  # no transaction open
_TXN_OPEN = 2
_TXN_FAILED = 3  # PostgreSQL: a statement failed; COMMIT would roll back

# Statements that end or restart the transaction; refused inside a guarded block.
_TXN_CONTROL = re.compile(
    r"\s*(COMMIT|ROLLBACK(?!\s+(?:WORK\s+)?TO\b)|BEGIN|START\s+TRANSACTION|END|ABORT"
    r"|PREPARE\s+TRANSACTION|XA|SET\s+(?:SESSION\s+|@@SESSION\.|@@)?AUTOCOMMIT)\b",
    re.IGNORECASE,
)

# MySQL server errors that do not prove a COMMIT was not applied (the connection or
# the server went away while it ran): ER_SERVER_SHUTDOWN, ER_ABORTING_CONNECTION,
# ER_NET_*, ER_QUERY_INTERRUPTED, ER_CONNECTION_KILLED.
_MYSQL_UNKNOWN = frozenset({1053, 1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161})
_MYSQL_UNKNOWN |= {1317, 1927}


def _txn_state(dialect: Dialect, conn: Any) -> int:
    if dialect == "sqlite":
        if getattr(conn, "autocommit", None) is False:
            return _TXN_UNKNOWN  # PEP 249 mode: always in a transaction
        flag = getattr(conn, "in_transaction", None)
        return _TXN_UNKNOWN if flag is None else (_TXN_OPEN if flag else _TXN_NONE)
    if dialect == "postgresql":
        info = getattr(conn, "info", None)  # psycopg 3
        status = getattr(info, "transaction_status", None)
        if status is None:
            get_status = getattr(conn, "get_transaction_status", None)  # psycopg2
            status = get_status() if callable(get_status) else None
        if status is None:
            return _TXN_UNKNOWN
        # libpq: IDLE 0, ACTIVE 1, INTRANS 2, INERROR 3, UNKNOWN 4
        return {0: _TXN_NONE, 2: _TXN_OPEN, 3: _TXN_FAILED}.get(int(status), _TXN_UNKNOWN)
    flag = getattr(conn, "in_transaction", None)  # mysql.connector
    if isinstance(flag, bool):
        return _TXN_OPEN if flag else _TXN_NONE
    server_status = getattr(conn, "server_status", None)  # PyMySQL: SERVER_STATUS_IN_TRANS
    if isinstance(server_status, int):
        return _TXN_OPEN if server_status & 1 else _TXN_NONE
    return _TXN_UNKNOWN


def _not_committed(dialect: Dialect, conn: Any, exc: BaseException) -> bool:
    """Whether a failed COMMIT is a definite "not committed" from the database (as
    opposed to a lost connection or an interruption, after which nobody knows)."""
    if not isinstance(exc, Exception):
        return False  # KeyboardInterrupt & co. may have cut the exchange anywhere
    if dialect == "postgresql":
        if getattr(conn, "broken", False) or getattr(conn, "closed", False):
            return False
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        # An answer from the server, and not "connection exception" (08),
        # "operator intervention" (57: shutdown, cancel) or "internal error" (XX).
        return isinstance(state, str) and state[:2] not in ("08", "57", "XX")
    if dialect == "mysql":
        code = getattr(exc, "errno", None)
        if code is None and exc.args and isinstance(exc.args[0], int):
            code = exc.args[0]
        # 1000-1999 are server errors; 2000+ are the client's (lost connection, ...).
        return isinstance(code, int) and 1000 <= code < 2000 and code not in _MYSQL_UNKNOWN
    # SQLite: a busy or locked database leaves the transaction open, uncommitted (we
    # roll it back); an I/O error may strike after the commit point.
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if isinstance(code, int):
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
    return "locked" in str(exc) or "busy" in str(exc)


def _close(cur: Any) -> None:
    with suppress(Exception):
        cur.close()

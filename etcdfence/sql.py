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

Within a term (issue #17): the mark is ``(token, epoch)``, compared
lexicographically. Each :class:`SQLFence` keeps, per ``(resource, token)``, the epoch
its writes carry; a COMMIT whose outcome is unknown moves it to the next epoch before
the error is raised (:class:`~etcdfence.errors.OutcomeUnknown`), and
:meth:`SQLFence.fence_off` advances the mark past every earlier attempt. A writer
refused with its own token and a higher epoch adopts that epoch and re-checks (the
refusal proves its attempt did not apply); only a lower token is stale.

Can SQL reorder writes within a term at all? Not through :meth:`SQLFence.guarded`,
and the epoch is belt and braces there. The block's first statement is the upsert on
the mark row, which takes that row's lock until COMMIT or ROLLBACK, and the client
waits for every answer before it sends the next statement. So (a) a transaction held
in the network *before* its COMMIT was sent can never commit: when its client gives
up, nothing but a ROLLBACK or an end of stream follows its bytes; and (b) once a
COMMIT is in flight, the transaction holds the mark's row lock on the server, so every
later guarded write of the resource (and :meth:`~SQLFence.fence_off`) waits until it
lands or its session dies. A later write is never acknowledged before an earlier
one's COMMIT has been resolved. ``tests/test_sql_ordering.py`` shows both with a COMMIT
and a check held by a proxy, against PostgreSQL and MariaDB. The epoch does matter
for a write that carries its check *and* its commit in one request (the etcd shape,
e.g. a one-statement ``INSERT ... SELECT ... WHERE (token, epoch) <= ...`` in
autocommit): held in the network, a token-only check lets it land after the newer
write; the epoch check rejects it (tested as the control). Caveats: the lock orders
only writes that go through the fence, and a lock wait can be long: a held COMMIT
stalls the resource until the server's session ends it (TCP keepalive,
``idle_in_transaction_session_timeout``) or the bytes arrive; a lock timeout turns
the wait into an error.

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
    ConsistencyError,
    InvalidArgument,
    InvalidToken,
    OutcomeUnknown,
    StaleTokenError,
    TransactionAbortedError,
    TransactionInProgressError,
    UnsupportedError,
)
from .token import MAX_TOKEN, FencingToken, coerce_token

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
_MAX_TOKEN = MAX_TOKEN
# How often a writer adopts a higher epoch of its own term and re-checks before it
# gives up (each adoption proves another writer of the term fenced off; see guarded).
_ADOPT_ATTEMPTS = 8
# Seconds the fence-off attempt after an unknown outcome waits for the mark's row lock.
_QUICK_FENCE_OFF_SECONDS = 2
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


# Defined in etcdfence.errors (one hierarchy); importable from here as in 0.1.
TransactionInProgress = TransactionInProgressError
TransactionAborted = TransactionAbortedError


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

    * **PostgreSQL** (any isolation level): one statement, ``INSERT ... ON CONFLICT (resource) DO
      UPDATE SET token = excluded.token, epoch = excluded.epoch WHERE (f.token, f.epoch) <=
      (excluded.token, excluded.epoch)``. The upsert locks the conflicting row and evaluates the
      ``WHERE`` on its newest committed version (a concurrent writer makes it wait for that writer's
      commit), so the comparison cannot interleave with another writer. One row affected means
      accepted; zero means stale, and a follow-up ``SELECT`` in the same transaction, still holding
      the row lock, reads the mark for the error. Under REPEATABLE READ / SERIALIZABLE a concurrent
      update surfaces as a serialization failure instead; the check step is retried in a fresh
      transaction (the caller's block has not run yet).
    * **SQLite**: the same conditional upsert inside ``BEGIN IMMEDIATE``, which
      takes the database write lock before anything is read, so concurrent writers
      (threads or processes) serialize on the lock (waiting up to the connection's
      ``timeout``) instead of failing with a stale snapshot. Needs SQLite >= 3.24.
    * **MySQL / MariaDB** (InnoDB): ``INSERT ... ON DUPLICATE KEY UPDATE epoch =
      IF((token, epoch) <= (%s, %s), ...), token = IF(...)`` (the lexicographic
      ``max(mark, (token, epoch))``) followed by ``SELECT token, epoch ... FOR UPDATE``. The upsert
      creates the row or takes an exclusive lock on the existing one (avoiding the
      gap-lock deadlock of a ``SELECT ... FOR UPDATE`` on a missing row) and moves
      the mark to ``max(mark, (token, epoch))``; the locking read then returns the
      newest committed value, not a snapshot. The write is accepted exactly when
      that value equals ``(token, epoch)``. This avoids affected-row counts, which for ``ON
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
            raise UnsupportedError(
                "SQLFence needs SQLite >= 3.24 (upsert); this Python links "
                + ".".join(map(str, version))
            )
        self._sql = _Statements(self._dialect, table, p)
        self._lock = threading.RLock()
        self._busy = False
        # resource -> {token: epoch this writer knows}; only epochs > 0 are stored, and
        # only for the highest token seen per resource (lower ones are stale anyway).
        self._epochs: dict[str, dict[int, int]] = {}
        self._epochs_lock = threading.Lock()

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
        """Create the fences table if it does not exist (or add the ``epoch`` column to
        a table made by etcdfence 0.1), and commit.

        Idempotent and safe to run from several processes at once; existing marks
        are kept (a 0.1 mark reads as epoch 0). Run it at deploy time or start-up,
        before the first guarded write, and once after upgrading from 0.1. On MySQL
        the DDL commits implicitly, as all MySQL DDL does.
        """
        with self._exclusive():
            cur = self._conn.cursor()
            try:
                self._ddl(cur, self._sql.create, self._sql.probe)
                if not self._probe(cur, self._sql.probe_epoch):
                    self._ddl(cur, self._sql.add_epoch, self._sql.probe_epoch)
            finally:
                _close(cur)

    def _ddl(self, cur: Any, statement: str, probe: str) -> None:
        """Run one idempotent schema change in a transaction of its own."""
        kind = self._begin(cur, write=True)
        try:
            cur.execute(statement)
            self._end(cur, kind, commit=True)
        except Exception:
            self._rollback_quietly(cur, kind)
            # Two processes racing the same DDL can collide (PostgreSQL's catalog,
            # a duplicate column); the change being there afterwards is success.
            if self._probe(cur, probe):
                return
            raise

    def current(self, resource: str) -> int:
        """The resource's high-water mark: the highest token it accepted, 0 if none.

        Use it for monitoring or to show why a write was refused; do not use it to
        decide whether to write (that is :meth:`guarded`'s job, atomically). Called
        inside your own open transaction it reads there and leaves the transaction
        open; otherwise it runs in a short transaction of its own.
        """
        return self.current_mark(resource)[0]

    def current_mark(self, resource: str) -> tuple[int, int]:
        """The resource's full mark ``(token, epoch)``, ``(0, 0)`` if none.

        Use it after :meth:`fence_off` to see how far a term's writers have been
        fenced, or in tests; the token part is what :meth:`current` returns.
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
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def epoch(self, resource: str, token: FencingToken | int) -> int:
        """The epoch this fence's writes with ``token`` carry next (0 until an unknown
        outcome or a fence-off moved the term on). Mostly for tests and diagnostics."""
        return self._epoch(_validate_resource(resource), _validate_token(token))

    def fence_off(self, resource: str, token: FencingToken | int) -> tuple[int, int]:
        """Make sure no earlier attempt of this writer's term can still apply.

        Use it after :class:`~etcdfence.errors.OutcomeUnknown` with ``fenced_off``
        False: it advances the mark to ``(token, known epoch + 1)`` and returns the
        mark ``(token, epoch)`` only once that is committed. From then on every
        earlier guarded attempt with ``token`` is rejected wherever it lands, so a
        re-read is final: fence off, re-read, then decide whether to write again.
        On SQL it waits for the mark's row lock, i.e. until a transaction still in
        flight on the server has committed or rolled back (see the module notes).

        Raises :class:`StaleTokenError` when a higher token holds the mark (then no
        attempt of this term can apply either) and ``OutcomeUnknown`` when its own
        commit got no answer (call it again).
        """
        value = _validate_token(token)
        resource = _validate_resource(resource)
        with self._exclusive():
            return self._fence_off(resource, value, quick=False)

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
                kind, epoch = self._check_writer(ctl, resource, value, started)
                user = _GuardedCursor(self._conn.cursor(), self._txn_state)
                try:
                    yield user
                except BaseException:
                    self._rollback_quietly(ctl, kind)
                    raise
                user._closed_by_fence = True
                self._finish(ctl, kind, user, resource, value, epoch)
            finally:
                if user is not None:
                    _close(user._cursor)
                _close(ctl)
            metrics.fence_accepted(resource, value, time.perf_counter() - started, self._backend)

    def _check_writer(
        self, ctl: Any, resource: str, token: int, started: float, *, quick: bool = False
    ) -> tuple[int, int]:
        """Open the transaction and pass the check with this writer's epoch; return how
        the transaction was opened and the epoch the mark now holds. Raises
        :class:`StaleTokenError` (rolled back) for a lower token."""
        epoch = self._epoch(resource, token)
        kind, mark = self._check(ctl, resource, token, epoch, quick=quick)
        for _ in range(_ADOPT_ATTEMPTS):
            if mark == (token, epoch):
                return kind, epoch
            if mark[0] > token:
                self._rollback_quietly(ctl, kind)
                metrics.fence_rejected(
                    resource, token, mark[0], time.perf_counter() - started, self._backend
                )
                raise StaleTokenError(resource, token, mark[0])
            if mark[0] < token or mark[1] < epoch:  # the upsert leaves max(mark, ours)
                self._rollback_quietly(ctl, kind)
                raise ConsistencyError(
                    f"fence check for {resource!r} read mark {mark} below {(token, epoch)}"
                )
            # Same term, higher epoch: a writer of this term fenced off. The rejection
            # proves no attempt of ours at ``epoch`` applied; adopt and re-check (we
            # hold the mark's row lock, so the mark cannot move meanwhile).
            epoch = self._adopt(resource, token, mark[1])
            mark = self._check_and_advance(ctl, resource, token, epoch)
        self._rollback_quietly(ctl, kind)
        raise ConsistencyError(f"fence check for {resource!r} did not settle on an epoch")

    def _finish(
        self, ctl: Any, kind: int, user: _GuardedCursor, resource: str, token: int, epoch: int
    ) -> None:
        """Commit the block's transaction, or refuse to when it cannot commit whole."""
        if user._ended is not None:
            # Ended inside the block: what ran before the end may be committed.
            self._rollback_quietly(ctl, kind)
            raise self._outcome_unknown(
                resource,
                token,
                epoch,
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
                epoch,
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
            # The COMMIT may have reached the server: move this writer to the next
            # epoch before anything else can happen, so the attempt can never apply
            # after a later write of ours (see the module notes).
            self._adopt(resource, token, epoch + 1)
            self._rollback_quietly(ctl, kind)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: never swallowed
            raise self._outcome_unknown(
                resource,
                token,
                epoch,
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

    def _outcome_unknown(
        self, resource: str, token: int, epoch: int, message: str
    ) -> OutcomeUnknown:
        """Move the writer past ``epoch``, try once to fence the attempt off, and build
        the error (``epoch`` is the lost attempt's)."""
        self._adopt(resource, token, epoch + 1)
        fenced_off = False
        if _usable(self._dialect, self._conn):
            try:
                self._fence_off(resource, token, quick=True, bump=False)
                fenced_off = True
            except StaleTokenError:
                fenced_off = True  # a newer term holds the mark: the attempt is dead too
            except Exception as exc:
                metrics.log.warning(
                    "etcdfence.sql_fence_off_failed",
                    resource=resource,
                    token=token,
                    error=repr(exc),
                )
        hint = "it cannot apply any more" if fenced_off else "call fence_off() before re-reading"
        return OutcomeUnknown(
            f"{message}; {hint}, and never simply resend",
            resource=resource,
            token=token,
            epoch=epoch,
            fenced_off=fenced_off,
        )

    def _fence_off(
        self, resource: str, token: int, *, quick: bool, bump: bool = True
    ) -> tuple[int, int]:
        """Advance the mark to ``(token, known epoch + 1)`` (``bump=False``: to the
        known epoch, already moved past a lost attempt) and commit; return the mark.
        ``quick`` bounds the wait for the mark's row lock (used right after a failure)."""
        epoch = self._epoch(resource, token)
        if bump:
            epoch = self._adopt(resource, token, epoch + 1)
        ctl = self._conn.cursor()
        try:
            kind = _NONE
            try:
                kind, epoch = self._check_writer(
                    ctl, resource, token, time.perf_counter(), quick=quick
                )
                self._end(ctl, kind, commit=True)
            except StaleTokenError:
                raise
            except BaseException as exc:
                if _not_committed(self._dialect, self._conn, exc) or kind == _NONE:
                    self._rollback_quietly(ctl, kind)
                    raise
                self._adopt(resource, token, epoch + 1)
                self._rollback_quietly(ctl, kind)
                if not isinstance(exc, Exception):
                    raise
                raise OutcomeUnknown(
                    f"COMMIT of the fence-off of {resource!r} at {(token, epoch)} got no "
                    f"answer ({exc!r}); call fence_off() again",
                    resource=resource,
                    token=token,
                    epoch=epoch,
                    fenced_off=False,
                ) from exc
        finally:
            _close(ctl)
        return token, epoch

    # -- epochs ------------------------------------------------------------------------

    def _epoch(self, resource: str, token: int) -> int:
        with self._epochs_lock:
            return self._epochs.get(resource, {}).get(token, 0)

    def _adopt(self, resource: str, token: int, epoch: int) -> int:
        """Raise the writer's epoch for ``(resource, token)`` to at least ``epoch``;
        return the epoch now known."""
        with self._epochs_lock:
            known = self._epochs.setdefault(resource, {})
            if any(t > token for t in known):
                return max(known.get(token, 0), epoch)  # a stale term: keep no state
            for t in [t for t in known if t < token]:
                del known[t]
            known[token] = max(known.get(token, 0), epoch)
            return known[token]

    def _txn_state(self) -> int:
        """What the driver says about the connection's transaction, without a round trip."""
        try:
            return _txn_state(self._dialect, self._conn)
        except Exception:  # e.g. sqlite3 on a closed connection
            return _TXN_UNKNOWN

    # -- the check ---------------------------------------------------------------

    def _check(
        self, cur: Any, resource: str, token: int, epoch: int, *, quick: bool = False
    ) -> tuple[int, tuple[int, int]]:
        """Open the transaction and run the check-and-advance; returns how the
        transaction was opened and the mark after the check (== ``(token, epoch)``
        iff accepted).

        Deadlocks and serialization failures are retried in a fresh transaction: the
        caller's block has not run yet, so nothing of theirs is lost. ``quick`` waits
        at most a couple of seconds for the mark's row lock.
        """
        attempt = 0
        with self._lock_wait(cur, quick):
            while True:
                attempt += 1
                kind = self._begin(cur, write=True)
                try:
                    if quick and self._dialect == "postgresql":
                        cur.execute(f"SET LOCAL lock_timeout = '{_QUICK_FENCE_OFF_SECONDS}s'")
                    return kind, self._check_and_advance(cur, resource, token, epoch)
                except BaseException as exc:
                    self._rollback_quietly(cur, kind)
                    if attempt >= _CHECK_ATTEMPTS or not _is_transient(self._dialect, exc):
                        raise
                time.sleep(random.uniform(0, min(0.1, 0.002 * 2**attempt)))

    @contextmanager
    def _lock_wait(self, cur: Any, quick: bool) -> Iterator[None]:
        """Bound the wait for a row (MySQL) or database (SQLite) lock while ``quick``;
        PostgreSQL uses ``SET LOCAL`` inside the transaction instead."""
        if not quick or self._dialect == "postgresql":
            yield
            return
        if self._dialect == "mysql":
            cur.execute(
                "SET @etcdfence_lock_wait = @@SESSION.innodb_lock_wait_timeout,"
                f" SESSION innodb_lock_wait_timeout = {_QUICK_FENCE_OFF_SECONDS}"
            )
            restore = "SET SESSION innodb_lock_wait_timeout = @etcdfence_lock_wait"
        else:
            cur.execute("PRAGMA busy_timeout")
            restore = f"PRAGMA busy_timeout = {int(cur.fetchone()[0])}"
            cur.execute(f"PRAGMA busy_timeout = {_QUICK_FENCE_OFF_SECONDS * 1000}")
        try:
            yield
        finally:
            with suppress(Exception):
                cur.execute(restore)

    def _check_and_advance(
        self, cur: Any, resource: str, token: int, epoch: int
    ) -> tuple[int, int]:
        """Advance the mark to ``max(mark, (token, epoch))`` under a row lock held
        until the transaction ends; return the mark afterwards (equal to ``(token,
        epoch)`` exactly when the write is accepted)."""
        sql = self._sql
        if self._dialect == "mysql":
            cur.execute(
                sql.advance,
                (resource, token, epoch, token, epoch, epoch, token, epoch, token),
            )
            cur.execute(sql.select_for_update, (resource,))
        else:
            cur.execute(sql.advance, (resource, token, epoch))
            if cur.rowcount == 1:
                return token, epoch
            cur.execute(sql.select, (resource,))
        row = cur.fetchone()
        if row is None:  # cannot happen: the upsert created or locked the row
            raise ConsistencyError(f"fence row for {resource!r} missing after upsert")
        return int(row[0]), int(row[1])

    def _probe(self, cur: Any, statement: str) -> bool:
        """Whether ``statement`` (a ``WHERE 1 = 0`` select) runs: table/column exists."""
        kind = _NONE
        try:
            kind = self._begin(cur, write=False)
            cur.execute(statement)
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
        if kind != _NONE and self._txn_state() == _TXN_NONE:
            return  # already ended (the server rolled back, or the block ended it)
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
        self.select = f"SELECT token, epoch FROM {t} WHERE resource = {p}"
        self.select_for_update = self.select + " FOR UPDATE"
        self.probe = f"SELECT resource FROM {t} WHERE 1 = 0"
        self.probe_epoch = f"SELECT epoch FROM {t} WHERE 1 = 0"
        # 0.1 tables have no epoch column; existing marks read as epoch 0.
        self.add_epoch = f"ALTER TABLE {t} ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0"
        if dialect == "mysql":
            # utf8mb4_bin: resource names compare byte for byte, as in etcd (the
            # default collation would make 'Orders' and 'orders' one fence).
            self.create = (
                f"CREATE TABLE IF NOT EXISTS {t} ("
                "resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
                " token BIGINT NOT NULL,"
                " epoch BIGINT NOT NULL DEFAULT 0,"
                " updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
                " PRIMARY KEY (resource)"
                ") ENGINE=InnoDB"
            )
            # mark := max(mark, (token, epoch)). Assignments run left to right and see
            # earlier ones: epoch first, then token under the same condition, which
            # (after epoch moved) reduces to token <= new token, true exactly when the
            # first one was. Params: resource, T, E, T, E, E, T, E, T.
            self.advance = (
                f"INSERT INTO {t} (resource, token, epoch, updated_at)"
                f" VALUES ({p}, {p}, {p}, UTC_TIMESTAMP(6))"
                f" ON DUPLICATE KEY UPDATE"
                f" epoch = IF((token, epoch) <= ({p}, {p}), {p}, epoch),"
                f" token = IF((token, epoch) <= ({p}, {p}), {p}, token),"
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
            " epoch BIGINT NOT NULL DEFAULT 0,"
            f" updated_at {ts_type} NOT NULL DEFAULT {now})"
        )
        # Row-value comparison: lexicographic (token, epoch) order (SQLite >= 3.15).
        self.advance = (
            f"INSERT INTO {t} AS f (resource, token, epoch, updated_at)"
            f" VALUES ({p}, {p}, {p}, {now})"
            " ON CONFLICT (resource) DO UPDATE"
            " SET token = excluded.token, epoch = excluded.epoch,"
            " updated_at = excluded.updated_at"
            " WHERE (f.token, f.epoch) <= (excluded.token, excluded.epoch)"
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


def _usable(dialect: Dialect, conn: Any) -> bool:
    """Whether the connection looks alive and idle (worth a quick fence-off)."""
    if getattr(conn, "broken", False):  # psycopg 3
        return False
    closed = getattr(conn, "closed", False)  # psycopg: bool / int
    if closed is True or (isinstance(closed, int) and closed != 0):
        return False
    is_open = getattr(conn, "open", True)  # PyMySQL
    if is_open is False:
        return False
    try:
        return _txn_state(dialect, conn) in (_TXN_NONE, _TXN_UNKNOWN)
    except Exception:  # e.g. sqlite3 on a closed connection
        return False


def _close(cur: Any) -> None:
    with suppress(Exception):
        cur.close()

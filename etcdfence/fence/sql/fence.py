"""The SQL fence bound to one resource: :class:`SQLFence` (see the package docstring)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, overload

from ..._keys import to_bytes, validate_name
from ...errors import (
    InvalidArgumentError,
    InvalidTokenError,
    InvalidTypeError,
    KeyExistsError,
    OutcomeUnknownError,
)
from ...errors import TransactionAbortedError as TransactionAborted
from ...token import MAX_TOKEN, FencingToken, coerce_token
from .._sync.admit import Admission
from .._sync.engine import Repaired, Reply, RevisionSource, Writer, check_fence_off_timeout, repair
from ..epochs import lost_attempt
from ..ops import Create, Delete, Op, Put, check_creates, key_exists
from ._cursor import GuardedCursor
from ._session import DEFAULT_DATA_TABLE, DEFAULT_TABLE, OnSession, Session, close_quietly
from ._store import Row, SQLStore
from .dialect import TXN_FAILED, TXN_NONE, SQLDialect

if TYPE_CHECKING:
    from .legacy import UnboundSQLFence

__all__ = [
    "DEFAULT_DATA_TABLE",
    "DEFAULT_TABLE",
    "MAX_KEY_BYTES",
    "MAX_RESOURCE_LENGTH",
    "SQLFence",
]

#: The ``resource`` column is ``VARCHAR(255)``; longer names are refused up front
#: (SQLite would store them, MySQL and PostgreSQL would not).
MAX_RESOURCE_LENGTH = 255
#: Keys of the data table are at most this many bytes (MySQL's ``VARBINARY(1024)``).
MAX_KEY_BYTES = 1024

DialectLike = str | SQLDialect | type[SQLDialect] | None


class SQLFence(OnSession):
    """Resource-side fencing of one resource in an SQL database, over a DB-API
    connection (sqlite3, psycopg, PyMySQL, ...): the :class:`~etcdfence.fence.Fence`
    shape, plus :meth:`guarded` for fenced writes of your own tables.

    Use it when a leader (or lock holder) writes to SQL tables and a stale leader must
    not. ``SQLFence(conn, "orders")`` fences the resource ``"orders"``: :meth:`put`,
    :meth:`delete` and :meth:`txn` write key/value rows of ``data_table`` in the same
    transaction as the check of the writer's token; :meth:`guarded` yields a cursor for
    any SQL, committed with the check. ``dialect`` is detected from the connection's
    driver module, or given as a registered name, an :class:`SQLDialect` or its class.
    ``table`` / ``data_table`` name the fences and data tables (``name`` or
    ``schema.name``); run :meth:`ensure_schema` once to create them.

    ``lock="jobs/nightly"`` binds the resource to that lock's tokens and ``verify=`` (an
    etcdfence ``Client``, a :class:`~etcdfence.fence._sync.admit.Verifier` or a
    callable) checks each new token against etcd (:mod:`etcdfence.fence._async.admit`):
    a refused token raises :class:`~etcdfence.errors.ForeignTokenError` /
    :class:`~etcdfence.errors.FutureTokenError` before any statement is sent.

    ``SQLFence(conn)`` without a resource is the 0.2 form (deprecated): it returns an
    :class:`~etcdfence.fence.sql.legacy.UnboundSQLFence`, whose methods take the
    resource per call.
    """

    @overload
    def __new__(
        cls,
        connection: Any,
        resource: str,
        *,
        table: str = ...,
        data_table: str = ...,
        dialect: DialectLike = ...,
        lock: str | None = ...,
        verify: Any = ...,
    ) -> SQLFence: ...

    @overload
    def __new__(  # type: ignore[misc]  # the 0.2 form returns the unbound fence
        cls,
        connection: Any,
        resource: None = None,
        *,
        table: str = ...,
        dialect: DialectLike = ...,
    ) -> UnboundSQLFence: ...

    def __new__(cls, connection: Any, resource: str | None = None, **kwargs: Any) -> Any:
        if resource is not None:
            return super().__new__(cls)
        from .legacy import DEPRECATION, UnboundSQLFence

        warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
        bound_only = sorted(k for k in ("lock", "verify") if kwargs.pop(k, None) is not None)
        if bound_only:
            raise InvalidArgumentError(
                f"SQLFence: {' and '.join(f'{k}=' for k in bound_only)} bind one resource: "
                "use the bound form SQLFence(connection, resource, ...) (the 0.2 form "
                "without a resource takes neither)"
            )
        return UnboundSQLFence._made(connection, **kwargs)

    def __init__(
        self,
        connection: Any,
        resource: str | None = None,
        *,
        table: str = DEFAULT_TABLE,
        data_table: str = DEFAULT_DATA_TABLE,
        dialect: DialectLike = None,
        lock: str | None = None,
        verify: Any = None,
    ) -> None:
        session = Session(connection, table=table, data_table=data_table, dialect=dialect)
        self._bind(session, validate_resource(resource), lock, verify)

    @classmethod
    def _over(
        cls, session: Session, resource: str, lock: str | None = None, verify: Any = None
    ) -> SQLFence:
        """A fence of ``resource`` sharing ``session`` (the 0.2 form's per-resource fences)."""
        fence = object.__new__(cls)
        fence._bind(session, resource, lock, verify)
        return fence

    def for_resource(
        self, resource: str, *, lock: str | None = None, verify: Any = None
    ) -> SQLFence:
        """A fence of another resource over the same connection and tables.

        Use it to fence several resources through one connection: fences made this way
        share the connection's lock, so threads take turns on it and a fenced
        operation inside another one's guarded block is refused
        (:class:`~etcdfence.errors.TransactionInProgressError`) instead of nesting.
        ``lock`` / ``verify`` bind it as in the constructor (not inherited)."""
        return SQLFence._over(self._session, validate_resource(resource), lock, verify)

    def _bind(self, session: Session, resource: str, lock: Any, verify: Any) -> None:
        self._admission = Admission(resource, lock=lock, verify=verify)
        self._session = session
        self._resource = resource
        self._store = SQLStore(session, resource)
        self._writer = Writer(self._store, durable_replies=False)

    @property
    def lock(self) -> str | None:
        """The lock this resource is bound to (``lock=``), ``None`` when unbound."""
        return self._admission.lock

    # -- properties ---------------------------------------------------------------

    @property
    def resource(self) -> str:
        """The resource this fence orders writes of."""
        return self._resource

    def __repr__(self) -> str:
        return (
            f"SQLFence({self._resource!r}, dialect={self.dialect!r}, table={self.table!r}, "
            f"data_table={self.data_table!r})"
        )

    # -- schema and reads -----------------------------------------------------------

    def current(self) -> int:
        """The highest token the resource accepted so far; 0 if none. For monitoring;
        :meth:`guarded` decides whether to write, atomically. Inside your own open
        transaction it reads there and leaves the transaction open."""
        return self.current_mark()[0]

    def current_mark(self) -> tuple[int, int]:
        """The mark ``(token, epoch)``; ``(0, 0)`` if none."""
        row = self._session.read(self._session.sql.select, (self._resource,))
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def version(self) -> int:
        """The resource's version: what the last :meth:`put`/:meth:`delete`/:meth:`txn`
        returned (0 if none)."""
        row = self._session.read(self._session.sql.select_version, (self._resource,))
        return 0 if row is None else int(row[0])

    def get(self, key: str | bytes) -> bytes | None:
        """The value :meth:`put` last wrote at ``key`` (``None``: none). Not fenced."""
        row = self._session.read(self._session.sql.get, (self._resource, _key(key)))
        return None if row is None else bytes(row[0])

    def epoch(self, token: FencingToken | int) -> int:
        """The epoch this fence claimed last for ``token`` (0 if none); diagnostics."""
        return self._writer.epoch(validate_token(token))

    # -- fenced writes ----------------------------------------------------------------

    def put(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` = ``value`` in the data table if ``token`` is not stale;
        returns the resource's version after the write."""
        return self.txn(token, [Put(key, value)])

    def delete(self, token: FencingToken | int, key: str | bytes) -> int:
        """Delete ``key`` from the data table if ``token`` is not stale; the version."""
        return self.txn(token, [Delete(key)])

    def create(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` = ``value`` if ``token`` is not stale and ``key`` has no row
        yet; the version. :class:`~etcdfence.errors.KeyExistsError` when it has one
        (nothing written). For an id whose effect must apply once (see :meth:`txn`)."""
        return self.txn(token, [Create(key, value)])

    def txn(self, token: FencingToken | int, ops: Sequence[Op]) -> int:
        """Apply ``ops`` to the data table in one transaction with the check of
        ``token``; returns the resource's version after them (one more than before).

        A :class:`~etcdfence.fence.ops.Create` whose key has a row raises
        :class:`~etcdfence.errors.KeyExistsError`: the transaction rolls back whole,
        the mark included (a stale token raises :class:`StaleTokenError` first). A value
        above what the database takes (:meth:`SQLDialect.value_limit
        <etcdfence.fence.sql.dialect.SQLDialect.value_limit>`: on MySQL half of
        ``max_allowed_packet`` less 8 KiB, read once per connection (drivers send values
        as hex); SQLite's length limit less 4 KiB; PostgreSQL's 1 GB) raises
        :class:`~etcdfence.errors.InvalidArgumentError` before anything is sent."""
        rows = _rows(ops)
        value = self._admission.admit(token)
        self._session.check_values(v for verb, _, v in rows if verb in ("put", "create") and v)
        try:
            with self._fenced(value, rows, cursor=False) as (reply, _):
                pass
        except KeyExistsError as exc:  # the store names the key as stored: name the Create
            found = exc.value if isinstance(exc.value, bytes) else None
            created = next(op for op in ops if isinstance(op, Create) and _key(op.key) == exc.key)
            raise key_exists(self._resource, created, found) from None
        return reply.version

    def advance(self, token: FencingToken | int) -> None:
        """Raise the mark to ``token`` without writing anything else (a new leader
        shuts its predecessors out at once). :class:`StaleTokenError` when it is
        higher already; an equal mark is fine."""
        with self.guarded(token):
            pass

    def fence_off(self, token: FencingToken | int, *, timeout: float | None = None) -> int:
        """Return only once no earlier attempt with ``token`` — of any writer of the
        term — can apply any more; returns the epoch claimed (committed).

        Use it after :class:`~etcdfence.errors.OutcomeUnknownError` with ``fenced_off``
        False: fence off, re-read, then decide. It waits for the mark's row lock, i.e.
        until a transaction still in flight on the server has committed or rolled back;
        ``timeout`` (seconds; ``None``: as long as the server lets a lock wait) bounds
        that. :class:`StaleTokenError` when a higher token holds the mark.
        """
        if timeout is not None:  # refused before a verifier reads anything
            timeout = check_fence_off_timeout(timeout)
        value = self._admission.admit(token)
        with self._session.exclusive():
            return self._writer.fence_off(value, timeout)

    def repair(self, etcd: RevisionSource) -> Repaired:
        """Lower a *forged* mark — one whose token is above the current revision of the
        etcd cluster ``etcd`` (a :class:`~etcdfence.Client` of the cluster whose locks
        issue this resource's tokens), so no lock or election issued it — to
        ``(revision, MAX_EPOCH)``; returns what it did.

        Use it when every holder is refused by a mark from the future. One ``UPDATE``
        compares the exact mark judged, so a write in between is never undone; the
        version and the data rows are not touched. The new mark refuses every token up
        to the revision, with any epoch: a live holder is refused too and must
        re-acquire. Raises :class:`~etcdfence.errors.RepairRefusedError`, changing
        nothing, when the mark is not above the revision (it may be real) or moved
        meanwhile.
        """
        return repair(self._store, etcd)

    @contextmanager
    def guarded(self, token: FencingToken | int) -> Iterator[Any]:
        """Run a block of writes fenced by ``token``; yields a DB-API cursor.

        On entry it opens a transaction and atomically checks ``token`` against the
        mark, advancing it; the block's statements on the yielded cursor join that
        transaction, which commits when the block ends normally.

        * Stale token: :class:`StaleTokenError` before the block runs.
        * Exception in the block: rolls everything back, the mark included; re-raised.
        * A statement on the cursor failed, even if the block caught it: nothing is
          committed, further statements are refused and
          :class:`~etcdfence.errors.TransactionAbortedError` is raised at the end.
        * The transaction was ended inside the block (``COMMIT``/``ROLLBACK`` are
          refused; ``conn.commit()`` or MySQL's implicitly committing DDL are detected
          where the driver tells): :class:`~etcdfence.errors.OutcomeUnknownError`.
        * The COMMIT failed: a definite answer is re-raised (nothing committed); a lost
          answer raises :class:`~etcdfence.errors.OutcomeUnknownError` (after trying to
          fence the attempt off: see its ``fenced_off``).

        Statements on *other* cursors of the connection join the transaction too, but
        only PostgreSQL lets the fence notice one failing: use the yielded cursor.
        """
        value = self._admission.admit(token)
        with self._fenced(value, None, cursor=True) as (_, user):
            yield user

    @contextmanager
    def _fenced(
        self, token: int, ops: Sequence[Row] | None, *, cursor: bool
    ) -> Iterator[tuple[Reply, GuardedCursor | None]]:
        """The guarded transaction: the check (and ``ops``), the block, the COMMIT;
        then the writer learns the claim is durable."""
        session = self._session
        with session.exclusive():
            with session.translated():
                ctl = session.conn.cursor()  # ours: BEGIN, the check, COMMIT / ROLLBACK
            user: GuardedCursor | None = None
            try:
                started = time.perf_counter()
                with self._store.holding(ctl):
                    reply = self._writer.accept(token, ops)
                kind = self._store.kind
                if cursor:
                    user = GuardedCursor(session.conn.cursor(), session.txn_state)
                try:
                    yield reply, user
                except BaseException:
                    session.rollback_quietly(ctl, kind)
                    raise
                if user is not None:
                    user.closed_by_fence = True
                self._finish(ctl, kind, user, token, reply)
                # counted as accepted now, committed (the block's time included)
                self._writer.acknowledged(token, reply, time.perf_counter() - started)
            finally:
                if user is not None:
                    user.close()
                close_quietly(ctl)

    def _finish(
        self, ctl: Any, kind: int, user: GuardedCursor | None, token: int, reply: Reply
    ) -> None:
        """Commit the block's transaction, or refuse to when it cannot commit whole."""
        session, r = self._session, self._resource
        if user is not None and user.ended is not None:
            session.rollback_quietly(ctl, kind)
            raise self._lost(
                token,
                reply,
                f"the transaction was ended inside the guarded block for {r!r} "
                f"({user.ended}); what ran before that may have been committed",
            )
        state = session.txn_state()
        if (user is not None and user.failure is not None) or state == TXN_FAILED:
            session.rollback_quietly(ctl, kind)
            raise TransactionAborted(
                f"a statement failed inside the guarded block for {r!r}; "
                "nothing was committed and the mark did not move"
            ) from (None if user is None else user.failure)
        if state == TXN_NONE:
            session.rollback_quietly(ctl, kind)
            raise self._lost(
                token,
                reply,
                f"the transaction was ended inside the guarded block for {r!r}; "
                "what ran in it may have been committed",
            )
        try:
            session.end(ctl, kind, commit=True)
        except BaseException as exc:
            if session.dialect.not_committed(session.conn, exc):
                session.rollback_quietly(ctl, kind)  # e.g. a serialization failure
                raise
            # The COMMIT may have reached the server: give the epoch up before anything
            # else can happen (the next write claims afresh).
            self._writer.epochs.give_up(token, reply.epoch)
            session.rollback_quietly(ctl, kind)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: never swallowed
            raise self._lost(
                token,
                reply,
                f"COMMIT of the guarded block for {r!r} failed without an answer "
                f"({exc!r}): it may or may not have been committed",
            ) from exc
        if session.dialect.rolled_back_at_commit(ctl, kind):
            raise TransactionAborted(
                f"the database rolled back the guarded block for {r!r} at COMMIT; "
                "nothing was committed and the mark did not move"
            )

    def _lost(self, token: int, reply: Reply, cause: str) -> OutcomeUnknownError:
        """The error for a block whose outcome is unknown: the writer gives the epoch
        up and fences the attempt off at once where the connection still works."""
        if self._session.dialect.usable(self._session.conn):
            return self._writer.lost(token, reply.epoch, cause)
        self._writer.epochs.give_up(token, reply.epoch)
        return lost_attempt(self._resource, token, reply.epoch, None, False, cause)


# -- validation ---------------------------------------------------------------------------


def validate_token(token: object) -> int:
    """A fencing token as an int that fits the BIGINT columns."""
    value = coerce_token(token)
    if value > MAX_TOKEN:
        raise InvalidTokenError(f"a fencing token must fit in a signed 64-bit integer, got {value}")
    return value


def validate_resource(resource: object) -> str:
    """A resource name that fits the ``VARCHAR(255)`` column."""
    name = validate_name(resource, "resource")
    if len(name) > MAX_RESOURCE_LENGTH:
        raise InvalidArgumentError(
            f"resource must be at most {MAX_RESOURCE_LENGTH} characters, got {len(name)}"
        )
    return name


def _key(key: object, *, empty: bool = False) -> bytes:
    data = to_bytes(key, "key")
    if not data and not empty:
        raise InvalidArgumentError("key must not be empty")
    if len(data) > MAX_KEY_BYTES:
        raise InvalidArgumentError(f"key must be at most {MAX_KEY_BYTES} bytes, got {len(data)}")
    return data


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    return None if not stripped else stripped[:-1] + bytes([stripped[-1] + 1])


def _rows(ops: Sequence[Op]) -> list[Row]:
    """``ops`` as data-table writes, validated before any I/O."""
    if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
        raise InvalidTypeError(
            f"ops must be a sequence of Put/Delete/Create, got {type(ops).__name__}"
        )
    rows: list[Row] = []
    for op in ops:
        if isinstance(op, Create):
            rows.append(("create", _key(op.key), to_bytes(op.value, "value")))
        elif isinstance(op, Put):
            if op.lease_id:
                raise InvalidArgumentError("an SQL fence has no leases: Put(lease_id=0) only")
            rows.append(("put", _key(op.key), to_bytes(op.value, "value")))
        elif isinstance(op, Delete) and op.prefix:
            low = _key(op.key, empty=True)
            rows.append(("range", low, _prefix_end(low)))
        elif isinstance(op, Delete):
            rows.append(("delete", _key(op.key), None))
        else:
            raise InvalidTypeError(f"ops must be Put, Delete or Create, got {type(op).__name__}")
    check_creates(ops, [row[1] for row in rows])
    return rows

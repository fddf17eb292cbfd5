"""What differs between SQL databases, behind one interface: :class:`SQLDialect`.

Use it to teach :class:`~etcdfence.fence.sql.SQLFence` a new database: subclass
:class:`SQLDialect` (or the built-in dialect it resembles), set :attr:`~SQLDialect.name`
and :attr:`~SQLDialect.modules`, override what differs, and :func:`register_dialect` it.
The fence dispatches every database-specific step — the statements, how a transaction is
begun and ended, which errors are transient, what the driver says about the open
transaction, whether a failed COMMIT is a definite "not committed", how long a lock
wait may take — through the dialect object; it never compares dialect names.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from ...errors import (
    EtcdfenceError,
    InvalidArgumentError,
    RequestError,
    TransactionInProgressError,
    UnavailableError,
)

__all__ = [
    "EXPLICIT",
    "IMPLICIT",
    "NONE",
    "TXN_FAILED",
    "TXN_NONE",
    "TXN_OPEN",
    "TXN_UNKNOWN",
    "OnConflictDialect",
    "SQLDialect",
    "Statements",
    "ValueLimit",
    "dialect_for",
    "dialects",
    "register_dialect",
]

# How a transaction was opened, which decides how it is ended.
NONE = 0  # no transaction of ours: a single autocommitted read, or inside the caller's
EXPLICIT = 1  # we sent BEGIN: end with COMMIT / ROLLBACK statements
IMPLICIT = 2  # the driver opens transactions itself: end with conn.commit() / rollback()

# What a driver says about the connection's transaction (no round trip).
TXN_UNKNOWN = 0  # the driver cannot tell
TXN_NONE = 1  # no transaction open
TXN_OPEN = 2
TXN_FAILED = 3  # PostgreSQL: a statement failed; COMMIT would roll back


@dataclass(frozen=True)
class Statements:
    """The SQL of one dialect, fences table, data table and placeholder style."""

    p: str  # the placeholder (``?`` or ``%s``)
    create: str  # the fences table
    create_data: str  # the key/value data table
    add_epoch: str  # 0.1 tables: the epoch column
    add_version: str  # 0.2 tables: the version column
    probe: str  # ``WHERE 1 = 0`` selects: does the table / column exist?
    probe_epoch: str
    probe_version: str
    probe_data: str
    select: str  # token, epoch of a resource
    select_version: str
    bump_version: str  # version := version + 1
    advance: str  # mark := max(mark, (token, epoch)) under a row lock
    put: str  # upsert one (resource, k, v) row
    get: str
    delete: str
    delete_range: str  # resource, low key (incl.), high key (excl.)
    delete_from: str  # resource, low key (incl.): a prefix of all-0xff bytes
    lower: str  # a repair: mark := (token, epoch) where the mark is exactly (token, epoch)


class ValueLimit(NamedTuple):
    """The largest value a fenced put may send on one connection (as
    :meth:`SQLDialect.value_size` measures it), and where that limit comes from."""

    size: int
    source: str


class SQLDialect(ABC):
    """One SQL database's way of doing what :class:`SQLFence` needs.

    Subclass it (or a built-in dialect) for a database the fence does not know yet;
    only what differs needs overriding. Instances are stateless and shared.
    """

    #: The dialect's name (``SQLFence.dialect``, the metrics' backend label).
    name: ClassVar[str]
    #: Top-level driver modules whose connections speak this dialect.
    modules: ClassVar[tuple[str, ...]] = ()
    #: The DB-API paramstyle assumed when the driver module does not say.
    paramstyle: ClassVar[str] = "format"
    #: How identifiers are quoted.
    quote: ClassVar[str] = '"'

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- statements ------------------------------------------------------------------

    def table(self, name: str) -> str:
        """``name`` (``schema.table`` or ``table``) quoted as an identifier."""
        q = self.quote
        return ".".join(f"{q}{part}{q}" for part in name.split("."))

    def statements(self, table: str, data_table: str, p: str) -> Statements:
        """All statements the fence runs, for these tables and placeholder ``p``."""
        t, d = self.table(table), self.table(data_table)
        return Statements(
            p=p,
            create=self.create_fences(t),
            create_data=self.create_data(d),
            add_epoch=f"ALTER TABLE {t} ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0",
            add_version=f"ALTER TABLE {t} ADD COLUMN version BIGINT NOT NULL DEFAULT 0",
            probe=f"SELECT resource FROM {t} WHERE 1 = 0",
            probe_epoch=f"SELECT epoch FROM {t} WHERE 1 = 0",
            probe_version=f"SELECT version FROM {t} WHERE 1 = 0",
            probe_data=f"SELECT resource, k, v FROM {d} WHERE 1 = 0",
            select=f"SELECT token, epoch FROM {t} WHERE resource = {p}",
            select_version=f"SELECT version FROM {t} WHERE resource = {p}",
            bump_version=f"UPDATE {t} SET version = version + 1 WHERE resource = {p}",
            advance=self.advance(t, p),
            put=self.upsert_data(d, p),
            get=f"SELECT v FROM {d} WHERE resource = {p} AND k = {p}",
            delete=f"DELETE FROM {d} WHERE resource = {p} AND k = {p}",
            delete_range=f"DELETE FROM {d} WHERE resource = {p} AND k >= {p} AND k < {p}",
            delete_from=f"DELETE FROM {d} WHERE resource = {p} AND k >= {p}",
            lower=f"UPDATE {t} SET token = {p}, epoch = {p} "
            f"WHERE resource = {p} AND token = {p} AND epoch = {p}",
        )

    @abstractmethod
    def create_fences(self, t: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` of the fences table ``t`` (quoted):
        ``resource`` (key), ``token``, ``epoch``, ``version``, ``updated_at``."""

    @abstractmethod
    def create_data(self, d: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` of the data table ``d`` (quoted):
        ``resource``, ``k`` (bytes), ``v`` (bytes), keyed by ``(resource, k)``."""

    @abstractmethod
    def advance(self, t: str, p: str) -> str:
        """The upsert moving the mark to ``max(mark, (token, epoch))`` and locking its
        row until the transaction ends; its parameters come from :meth:`advance_params`."""

    def advance_params(self, resource: str, token: int, epoch: int) -> tuple[Any, ...]:
        """The parameters of :meth:`advance`."""
        return (resource, token, epoch)

    @abstractmethod
    def upsert_data(self, d: str, p: str) -> str:
        """Insert or replace one ``(resource, k, v)`` row of the data table ``d``."""

    def check_and_advance(
        self, cur: Any, sql: Statements, resource: str, token: int, epoch: int
    ) -> tuple[int, int] | None:
        """Run :attr:`Statements.advance` and return the mark afterwards, or ``None``
        when a ``SELECT`` must read it (the fence then runs :attr:`Statements.select`)."""
        cur.execute(sql.advance, self.advance_params(resource, token, epoch))
        return (token, epoch) if cur.rowcount == 1 else None

    # -- value sizes -------------------------------------------------------------------

    def value_limit(self, conn: Any) -> ValueLimit | None:
        """The largest value a fenced put or create may send on ``conn``, or ``None``
        when the database sets no limit below what memory allows.

        Override it for a database that refuses larger values in a way the fence cannot
        tell from a lost connection (MySQL drops it). Called once per connection, before
        its first put; it may run a read on ``conn``, outside any transaction of the
        fence's. A larger value is refused with
        :class:`~etcdfence.errors.InvalidArgumentError` before anything is sent."""
        return None

    def value_size(self, value: bytes) -> int:
        """How much of :meth:`value_limit` ``value`` takes: its length, unless the
        driver sends it escaped inside the statement text."""
        return len(value)

    # -- the driver ------------------------------------------------------------------

    def check_driver(self, driver: Any) -> None:
        """Refuse a driver module too old for this dialect (raise an etcdfence error)."""
        return None

    def begin(self, conn: Any, cur: Any, *, write: bool) -> int:
        """Start a transaction of ours (or find the one a read joins); return its kind
        (:data:`NONE`, :data:`EXPLICIT`, :data:`IMPLICIT`). Writes refuse a connection
        with uncommitted work, since our COMMIT or ROLLBACK would take it along."""
        if in_transaction(conn):
            if write:
                raise in_progress()
            return NONE
        autocommit = is_autocommit(conn)
        if autocommit and not write:
            return NONE  # one SELECT is its own transaction
        if autocommit:
            cur.execute("BEGIN")
            return EXPLICIT
        return IMPLICIT

    def rolled_back_at_commit(self, cur: Any, kind: int) -> bool:
        """Whether a COMMIT that raised nothing rolled back after all."""
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """A deadlock or serialization failure: the transaction may simply be retried."""
        return False

    @abstractmethod
    def txn_state(self, conn: Any) -> int:
        """What the driver says about the connection's transaction, without a round
        trip: one of :data:`TXN_UNKNOWN`, :data:`TXN_NONE`, :data:`TXN_OPEN`,
        :data:`TXN_FAILED`."""

    @abstractmethod
    def not_committed(self, conn: Any, exc: BaseException) -> bool:
        """Whether a failed COMMIT is a definite "not committed" from the database (as
        opposed to a lost connection or an interruption, after which nobody knows)."""

    def usable(self, conn: Any) -> bool:
        """Whether the connection looks alive and idle (worth a quick fence-off)."""
        if self.gone(conn):
            return False
        return self.txn_state(conn) in (TXN_NONE, TXN_UNKNOWN)

    def gone(self, conn: Any) -> bool:
        """Whether the driver says the connection is closed or broken."""
        if getattr(conn, "broken", False):  # psycopg 3
            return True
        closed = getattr(conn, "closed", False)  # psycopg: bool / int
        if closed is True or (isinstance(closed, int) and closed != 0):
            return True
        if getattr(conn, "open", True) is False:  # PyMySQL
            return True
        try:
            self.txn_state(conn)
        except Exception:  # e.g. sqlite3 on a closed connection
            return True
        return False

    def translate(self, conn: Any, exc: Exception) -> EtcdfenceError:
        """The etcdfence error for a driver error raised by the fence's own statements
        (its transaction was rolled back: nothing applied). :class:`UnavailableError`
        when the connection is gone or the server did not answer in time (DB-API
        ``OperationalError`` / ``InterfaceError``: lost connections, timeouts, a busy
        SQLite file), :class:`RequestError` for anything else the database refused (a
        missing table, a value it does not take, missing privileges)."""
        names = {cls.__name__ for cls in type(exc).__mro__}
        what = f"{self.name}: {type(exc).__name__}: {str(exc).strip()}"
        if names & {"OperationalError", "InterfaceError"} or self.gone(conn):
            return UnavailableError(
                f"{what} — the database is unreachable or did not answer; nothing was applied"
            )
        return RequestError(
            f"{what} — the database refused the fence's statement; nothing was applied"
        )

    @contextmanager
    def lock_wait(self, cur: Any, seconds: float | None) -> Iterator[None]:
        """Bound the wait for the mark's lock to ``seconds`` (``None``: the server's
        own setting) around the transactions run inside; see :meth:`in_transaction_lock_wait`."""
        yield

    def in_transaction_lock_wait(self, cur: Any, seconds: float) -> None:
        """Bound the lock wait from inside a just-begun transaction (PostgreSQL's
        ``SET LOCAL``); dialects bounding it per session do it in :meth:`lock_wait`."""
        return None


class OnConflictDialect(SQLDialect):
    """A dialect with ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE`` and row-value
    comparison (SQLite >= 3.24, PostgreSQL >= 9.5): the upsert checks and advances the
    mark in one statement; one row affected means accepted."""

    now: ClassVar[str] = "CURRENT_TIMESTAMP"
    timestamp: ClassVar[str] = "TIMESTAMP"
    binary: ClassVar[str] = "BLOB"

    def create_fences(self, t: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {t} ("
            "resource VARCHAR(255) NOT NULL PRIMARY KEY,"
            " token BIGINT NOT NULL,"
            " epoch BIGINT NOT NULL DEFAULT 0,"
            " version BIGINT NOT NULL DEFAULT 0,"
            f" updated_at {self.timestamp} NOT NULL DEFAULT {self.now})"
        )

    def create_data(self, d: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {d} ("
            "resource VARCHAR(255) NOT NULL,"
            f" k {self.binary} NOT NULL,"
            f" v {self.binary} NOT NULL,"
            " PRIMARY KEY (resource, k))"
        )

    def advance(self, t: str, p: str) -> str:
        # Row-value comparison: lexicographic (token, epoch) order.
        return (
            f"INSERT INTO {t} AS f (resource, token, epoch, updated_at)"
            f" VALUES ({p}, {p}, {p}, {self.now})"
            " ON CONFLICT (resource) DO UPDATE"
            " SET token = excluded.token, epoch = excluded.epoch,"
            " updated_at = excluded.updated_at"
            " WHERE (f.token, f.epoch) <= (excluded.token, excluded.epoch)"
        )

    def upsert_data(self, d: str, p: str) -> str:
        return (
            f"INSERT INTO {d} (resource, k, v) VALUES ({p}, {p}, {p})"
            " ON CONFLICT (resource, k) DO UPDATE SET v = excluded.v"
        )


# -- shared driver probes ----------------------------------------------------------------


def in_progress() -> TransactionInProgressError:
    """The error for a write started while the caller's transaction holds work."""
    return TransactionInProgressError(
        "the connection has an open transaction with uncommitted work; commit or roll "
        "it back before a fenced write (SQLFence runs its own transaction)"
    )


def in_transaction(conn: Any) -> bool:
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


def is_autocommit(conn: Any) -> bool:
    """Whether the driver commits every statement by itself."""
    get = getattr(conn, "get_autocommit", None)  # PyMySQL, MySQLdb (autocommit is a method)
    if callable(get):
        return bool(get())
    return getattr(conn, "autocommit", False) is True  # psycopg, psycopg2, mariadb, ...


@contextmanager
def restoring(cur: Any, restore: str) -> Iterator[None]:
    """Run ``restore`` on ``cur`` when the block ends, quietly."""
    try:
        yield
    finally:
        with suppress(Exception):
            cur.execute(restore)


# -- the registry ------------------------------------------------------------------------

_BY_NAME: dict[str, SQLDialect] = {}
_BY_MODULE: dict[str, SQLDialect] = {}


def register_dialect(dialect: SQLDialect | type[SQLDialect]) -> SQLDialect:
    """Make ``dialect`` known by its :attr:`~SQLDialect.name` (``SQLFence(...,
    dialect=name)``) and detected for connections of its :attr:`~SQLDialect.modules`.
    Returns the registered instance; a later registration of a name or module wins."""
    instance = dialect() if isinstance(dialect, type) else dialect
    if not isinstance(instance, SQLDialect):
        raise InvalidArgumentError(f"not an SQLDialect: {dialect!r}")
    _BY_NAME[instance.name] = instance
    for module in instance.modules:
        _BY_MODULE[module] = instance
    return instance


def dialects() -> tuple[str, ...]:
    """The names of the registered dialects."""
    return tuple(_BY_NAME)


def dialect_for(connection: Any, dialect: str | SQLDialect | type[SQLDialect] | None) -> SQLDialect:
    """The dialect of ``connection``: ``dialect`` when given (a registered name, an
    :class:`SQLDialect` or its class), else detected from the driver module."""
    if isinstance(dialect, SQLDialect):
        return dialect
    if isinstance(dialect, type) and issubclass(dialect, SQLDialect):
        return dialect()
    if dialect is None:
        module = type(connection).__module__.split(".")[0]
        found = _BY_MODULE.get(module)
        if found is None:
            raise InvalidArgumentError(
                f"cannot tell the SQL dialect of a {type(connection).__module__}."
                f"{type(connection).__qualname__} connection; pass "
                f"dialect= one of {', '.join(_BY_NAME)}"
            )
        return found
    found = _BY_NAME.get(dialect) if isinstance(dialect, str) else None
    if found is None:
        raise InvalidArgumentError(f"dialect must be one of {', '.join(_BY_NAME)}: {dialect!r}")
    return found


def placeholder(connection: Any, dialect: SQLDialect) -> str:
    """The placeholder of the connection's driver (its DB-API ``paramstyle``)."""
    module = type(connection).__module__.split(".")[0]
    driver = sys.modules.get(module)
    dialect.check_driver(driver)
    paramstyle = getattr(driver, "paramstyle", None) or dialect.paramstyle
    if paramstyle == "qmark":
        return "?"
    if paramstyle in ("format", "pyformat"):
        return "%s"
    raise InvalidArgumentError(f"unsupported DB-API paramstyle {paramstyle!r} of {module}")

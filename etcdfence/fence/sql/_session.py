"""One DB-API connection as the SQL fence uses it: its dialect and statements, and the
fence's own transactions on it (begin, commit, quiet rollback, schema changes).

Shared by every :class:`~etcdfence.fence.sql.SQLFence` made over it by the 0.2 form
(one connection, many resources), so that a fenced transaction on the connection
refuses to nest another one.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ... import metrics
from ...errors import EtcdfenceError, InvalidArgumentError, TransactionInProgressError
from .._sync.engine import Lost
from .dialect import (
    EXPLICIT,
    IMPLICIT,
    NONE,
    TXN_NONE,
    TXN_UNKNOWN,
    SQLDialect,
    ValueLimit,
    dialect_for,
    placeholder,
)

__all__ = ["DEFAULT_DATA_TABLE", "DEFAULT_TABLE", "OnSession", "Session", "close_quietly"]

#: The fences table used when none is given.
DEFAULT_TABLE = "etcdfence_fences"
#: The key/value table of ``SQLFence.put`` & co. when none is given.
DEFAULT_DATA_TABLE = "etcdfence_data"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE_RE = re.compile(rf"(?:{_IDENT}\.)?{_IDENT}")


def check_table(table: object, what: str) -> str:
    """``table`` if it is an identifier, optionally schema-qualified."""
    if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
        raise InvalidArgumentError(
            f"{what} must be an identifier (letters, digits, '_'; at most 63 characters), "
            f"optionally schema-qualified: {table!r}"
        )
    return table


class Session:
    """A connection, its dialect, and the fence's transactions on it."""

    def __init__(
        self,
        connection: Any,
        *,
        table: str = DEFAULT_TABLE,
        data_table: str = DEFAULT_DATA_TABLE,
        dialect: str | SQLDialect | type[SQLDialect] | None = None,
    ) -> None:
        self.table = check_table(table, "table")
        self.data_table = check_table(data_table, "data_table")
        self.dialect = dialect_for(connection, dialect)
        self.conn = connection
        self.sql = self.dialect.statements(table, data_table, placeholder(connection, self.dialect))
        self._lock = threading.RLock()
        self._busy = False
        self._value_limit: ValueLimit | None = None
        self._value_limit_read = False

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """One fenced operation at a time on the connection; nesting is refused."""
        with self._lock:
            if self._busy:
                raise TransactionInProgressError(
                    "SQLFence operation started inside a guarded() block on the same "
                    "connection; nested fenced transactions are not supported"
                )
            self._busy = True
            try:
                yield
            finally:
                self._busy = False

    def check_values(self, values: Iterable[bytes]) -> None:
        """Refuse (:class:`InvalidArgumentError`, nothing sent) a value above the
        dialect's :meth:`~SQLDialect.value_limit` for this connection, read once, at the
        first put or create."""
        values = list(values)
        if not values:
            return
        if not self._value_limit_read:
            with self.exclusive(), self.translated():
                self._value_limit = self.dialect.value_limit(self.conn)
            self._value_limit_read = True
        limit = self._value_limit
        if limit is None:
            return
        for value in values:
            size = self.dialect.value_size(value)
            if size > limit.size:
                sent = f" ({size} as sent)" if size != len(value) else ""
                raise InvalidArgumentError(
                    f"a value of {len(value)} bytes{sent} exceeds the {self.dialect.name} "
                    f"limit of {limit.size} bytes per value ({limit.source}); "
                    "nothing was sent"
                )

    def txn_state(self) -> int:
        """What the driver says about the connection's transaction, without a round trip."""
        try:
            return self.dialect.txn_state(self.conn)
        except Exception:  # e.g. sqlite3 on a closed connection
            return TXN_UNKNOWN

    def begin(self, cur: Any, *, write: bool) -> int:
        """Start a transaction of ours (see :meth:`SQLDialect.begin`); its kind."""
        return self.dialect.begin(self.conn, cur, write=write)

    def end(self, cur: Any, kind: int, *, commit: bool) -> None:
        """Commit or roll back a transaction :meth:`begin` opened."""
        if kind == EXPLICIT:
            cur.execute("COMMIT" if commit else "ROLLBACK")
        elif kind == IMPLICIT:
            if commit:
                self.conn.commit()
            else:
                self.conn.rollback()

    def rollback_quietly(self, cur: Any, kind: int) -> None:
        """Roll back while another exception is on its way; never mask it."""
        if kind != NONE and self.txn_state() == TXN_NONE:
            return  # already ended (the server rolled back, or the block ended it)
        try:
            if kind == EXPLICIT:
                # A failed statement may already have ended the transaction (MySQL
                # deadlocks roll back on the server); ROLLBACK is then a no-op.
                cur.execute("ROLLBACK")
            elif kind == IMPLICIT:
                self.conn.rollback()
        except Exception as exc:
            # The transaction may still be open on a live connection, where a later
            # commit() by the application would commit it after all: close the
            # connection, so the server aborts it.
            metrics.log.warning(
                "etcdfence.sql_rollback_failed",
                dialect=self.dialect.name,
                error=repr(exc),
                action="connection closed",
            )
            with suppress(Exception):
                self.conn.close()

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Driver errors of the fence's own statements as etcdfence errors
        (:meth:`SQLDialect.translate`); etcdfence's own errors pass unchanged."""
        try:
            yield
        except (EtcdfenceError, Lost):
            raise
        except Exception as exc:
            raise self.dialect.translate(self.conn, exc) from exc

    def read(self, statement: str, params: tuple[Any, ...]) -> Any:
        """The first row of a read (joins the caller's open transaction, if any)."""
        with self.exclusive(), self.translated():
            cur = self.conn.cursor()
            try:
                kind = self.begin(cur, write=False)
                try:
                    cur.execute(statement, params)
                    row = cur.fetchone()
                    self.end(cur, kind, commit=True)
                except BaseException:
                    self.rollback_quietly(cur, kind)
                    raise
            finally:
                close_quietly(cur)
        return row

    def ensure_schema(self, *, data: bool = True) -> None:
        """Create the tables / add the columns missing (see ``SQLFence.ensure_schema``);
        ``data``: the data table too (the 0.2 form, which has no put, does not)."""
        sql = self.sql
        with self.exclusive(), self.translated():
            cur = self.conn.cursor()
            try:
                self._ddl(cur, sql.create, sql.probe)
                if not self._probe(cur, sql.probe_epoch):
                    self._ddl(cur, sql.add_epoch, sql.probe_epoch)
                if not self._probe(cur, sql.probe_version):
                    self._ddl(cur, sql.add_version, sql.probe_version)
                if data:
                    self._ddl(cur, sql.create_data, sql.probe_data)
            finally:
                close_quietly(cur)

    def _ddl(self, cur: Any, statement: str, probe: str) -> None:
        """Run one idempotent schema change in a transaction of its own."""
        kind = self.begin(cur, write=True)
        try:
            cur.execute(statement)
            self.end(cur, kind, commit=True)
        except Exception:
            self.rollback_quietly(cur, kind)
            # Two processes racing the same DDL can collide (PostgreSQL's catalog, a
            # duplicate column); the change being there afterwards is success.
            if self._probe(cur, probe):
                return
            raise

    def _probe(self, cur: Any, statement: str) -> bool:
        """Whether ``statement`` (a ``WHERE 1 = 0`` select) runs: table/column exists."""
        kind = NONE
        try:
            kind = self.begin(cur, write=False)
            cur.execute(statement)
            cur.fetchall()
            self.end(cur, kind, commit=True)
        except Exception:
            self.rollback_quietly(cur, kind)
            return False
        return True


class OnSession:
    """What every SQL fence object says about its connection and tables."""

    _session: Session

    @property
    def connection(self) -> Any:
        """The DB-API connection this fence runs its transactions on."""
        return self._session.conn

    @property
    def dialect(self) -> str:
        """The dialect's name: ``"sqlite"``, ``"postgresql"``, ``"mysql"``, ..."""
        return self._session.dialect.name

    @property
    def sql_dialect(self) -> SQLDialect:
        """The :class:`SQLDialect` object the fence dispatches to."""
        return self._session.dialect

    @property
    def table(self) -> str:
        """The fences table (``resource``, ``token``, ``epoch``, ``version``, ...)."""
        return self._session.table

    @property
    def data_table(self) -> str:
        """The key/value table of ``put``, ``delete`` and ``txn``."""
        return self._session.data_table

    def ensure_schema(self) -> None:
        """Create the fences and data tables if they do not exist (or add the columns
        a table made by an older etcdfence lacks: ``epoch`` (0.1), ``version`` (0.2)),
        and commit.

        Idempotent and safe to run from several processes at once; existing marks are
        kept (a missing epoch or version reads as 0). Run it at deploy time or
        start-up, and once after upgrading. On MySQL the DDL commits implicitly.
        """
        self._session.ensure_schema()


def close_quietly(cur: Any) -> None:
    """Close a cursor, ignoring a connection that already went away."""
    with suppress(Exception):
        cur.close()

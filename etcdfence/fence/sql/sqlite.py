"""SQLite (``sqlite3``, ``pysqlite2``, ``pysqlite3``): the conditional upsert inside
``BEGIN IMMEDIATE``, which takes the database write lock before anything is read, so
concurrent writers (threads or processes) serialize on the lock (waiting up to the
connection's ``timeout``) instead of failing with a stale snapshot. Needs SQLite >= 3.24.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from ...errors import UnsupportedError
from .dialect import (
    EXPLICIT,
    IMPLICIT,
    NONE,
    TXN_NONE,
    TXN_OPEN,
    TXN_UNKNOWN,
    OnConflictDialect,
    ValueLimit,
    in_progress,
    restoring,
)

__all__ = ["SQLiteDialect"]

#: ``SQLITE_LIMIT_LENGTH``: the run-time limit of a string or BLOB, and of a whole row.
_LIMIT_LENGTH = 0
#: SQLite's compile-time default of that limit (``SQLITE_MAX_LENGTH``), for a driver
#: that cannot read the run-time one (Python < 3.11).
DEFAULT_MAX_LENGTH = 1_000_000_000
#: What else a data row holds besides the value: the resource (at most 255 characters),
#: the key (at most 1,024 bytes) and the record header, with room to spare.
ROW_OVERHEAD = 4096


class SQLiteDialect(OnConflictDialect):
    """SQLite >= 3.24; row-value comparison orders the mark ``(token, epoch)``."""

    name: ClassVar[str] = "sqlite"
    modules: ClassVar[tuple[str, ...]] = ("sqlite3", "pysqlite2", "pysqlite3")
    paramstyle: ClassVar[str] = "qmark"

    def check_driver(self, driver: Any) -> None:
        version = getattr(driver, "sqlite_version_info", None)
        if version is not None and tuple(version) < (3, 24, 0):
            raise UnsupportedError(
                "SQLFence needs SQLite >= 3.24 (upsert); this Python links "
                + ".".join(map(str, version))
            )

    def begin(self, conn: Any, cur: Any, *, write: bool) -> int:
        mode = getattr(conn, "autocommit", None)  # Python >= 3.12
        if mode is False:
            # PEP 249 mode: sqlite3 always keeps a (deferred) transaction open and
            # reopens one on every commit. It is ours; the first statement in it is the
            # upsert (a write), which takes the write lock through the busy handler
            # just as BEGIN IMMEDIATE would.
            return IMPLICIT
        # Legacy mode (any isolation_level, also None) or autocommit=True: sqlite3 never
        # interferes with an explicit BEGIN, and we end it with COMMIT or ROLLBACK
        # statements (conn.commit() is a no-op when autocommit=True).
        if conn.in_transaction:
            if write:
                raise in_progress()
            return NONE
        if not write:
            return NONE
        cur.execute("BEGIN IMMEDIATE")
        return EXPLICIT

    def value_limit(self, conn: Any) -> ValueLimit | None:
        # The row limit applies to the whole record: value, key and resource together.
        getlimit = getattr(conn, "getlimit", None)  # Python >= 3.11
        length = int(getlimit(_LIMIT_LENGTH)) if callable(getlimit) else DEFAULT_MAX_LENGTH
        return ValueLimit(
            length - ROW_OVERHEAD,
            f"SQLite's length limit of {length} bytes per row (SQLITE_LIMIT_LENGTH) "
            f"less {ROW_OVERHEAD} for the key and resource",
        )

    def txn_state(self, conn: Any) -> int:
        if getattr(conn, "autocommit", None) is False:
            return TXN_UNKNOWN  # PEP 249 mode: always in a transaction
        flag = getattr(conn, "in_transaction", None)
        return TXN_UNKNOWN if flag is None else (TXN_OPEN if flag else TXN_NONE)

    def not_committed(self, conn: Any, exc: BaseException) -> bool:
        # A busy or locked database leaves the transaction open, uncommitted (we roll it
        # back); an I/O error may strike after the commit point.
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt & co. may have cut the exchange anywhere
        code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
        if isinstance(code, int):
            return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
        return "locked" in str(exc) or "busy" in str(exc)

    @contextmanager
    def lock_wait(self, cur: Any, seconds: float | None) -> Iterator[None]:
        if seconds is None:
            yield
            return
        cur.execute("PRAGMA busy_timeout")
        restore = f"PRAGMA busy_timeout = {int(cur.fetchone()[0])}"
        cur.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")
        with restoring(cur, restore):
            yield

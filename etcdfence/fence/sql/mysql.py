"""MySQL and MariaDB (InnoDB; ``pymysql``, ``MySQLdb``, ``mariadb``, ``mysql.connector``).

``INSERT ... ON DUPLICATE KEY UPDATE epoch = IF((token, epoch) <= (%s, %s), ...), token
= IF(...)`` (the lexicographic ``max(mark, (token, epoch))``) followed by ``SELECT token,
epoch ... FOR UPDATE``. The upsert creates the row or takes an exclusive lock on the
existing one (avoiding the gap-lock deadlock of a ``SELECT ... FOR UPDATE`` on a missing
row) and moves the mark to ``max(mark, (token, epoch))``; the locking read then returns
the newest committed value, not a snapshot. The write is accepted exactly when that value
equals ``(token, epoch)``. This avoids affected-row counts, which for ``ON DUPLICATE KEY
UPDATE`` depend on ``CLIENT_FOUND_ROWS`` and report 0 for an update to an equal value. A
deadlock (1213) is retried in a fresh transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from .dialect import (
    EXPLICIT,
    NONE,
    TXN_NONE,
    TXN_OPEN,
    TXN_UNKNOWN,
    SQLDialect,
    Statements,
    ValueLimit,
    in_progress,
    in_transaction,
    is_autocommit,
    restoring,
)

__all__ = ["SENT_PER_BYTE", "STATEMENT_OVERHEAD", "MySQLDialect"]

#: What an upsert of the data table holds besides its value, at most: the statement's
#: text, the resource (255 characters) and the key (1,024 bytes), escaped; a value may
#: take ``max_allowed_packet`` less this.
STATEMENT_OVERHEAD = 8192
#: How many bytes of statement text a value takes per byte, at most: PyMySQL (>= 1.1)
#: sends bytes as hex (``_binary X'...'``), MySQLdb and mysql.connector escape NUL,
#: quotes, backslashes and line breaks with a backslash.
SENT_PER_BYTE = 2

# Server errors that do not prove a COMMIT was not applied (the connection or the server
# went away while it ran): ER_SERVER_SHUTDOWN, ER_ABORTING_CONNECTION, ER_NET_*,
# ER_QUERY_INTERRUPTED, ER_CONNECTION_KILLED.
_UNKNOWN = frozenset({1053, 1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161})
_UNKNOWN |= {1317, 1927}


def _errno(exc: BaseException) -> object:
    code = getattr(exc, "errno", None)
    if code is None and exc.args and isinstance(exc.args[0], int):
        code = exc.args[0]
    return code


class MySQLDialect(SQLDialect):
    """MySQL / MariaDB with InnoDB."""

    name: ClassVar[str] = "mysql"
    modules: ClassVar[tuple[str, ...]] = ("pymysql", "MySQLdb", "mariadb", "mysql")
    quote: ClassVar[str] = "`"

    def create_fences(self, t: str) -> str:
        # utf8mb4_bin: resource names compare byte for byte, as in etcd (the default
        # collation would make 'Orders' and 'orders' one fence).
        return (
            f"CREATE TABLE IF NOT EXISTS {t} ("
            "resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " token BIGINT NOT NULL,"
            " epoch BIGINT NOT NULL DEFAULT 0,"
            " version BIGINT NOT NULL DEFAULT 0,"
            " updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
            " PRIMARY KEY (resource)"
            ") ENGINE=InnoDB"
        )

    def create_data(self, d: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {d} ("
            "resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " k VARBINARY(1024) NOT NULL,"
            " v LONGBLOB NOT NULL,"
            " PRIMARY KEY (resource, k)"
            ") ENGINE=InnoDB"
        )

    def advance(self, t: str, p: str) -> str:
        # mark := max(mark, (token, epoch)). Assignments run left to right and see
        # earlier ones: epoch first, then token under the same condition, which (after
        # epoch moved) reduces to token <= new token, true exactly when the first one
        # was. Params: resource, T, E, T, E, E, T, E, T.
        return (
            f"INSERT INTO {t} (resource, token, epoch, updated_at)"
            f" VALUES ({p}, {p}, {p}, UTC_TIMESTAMP(6))"
            f" ON DUPLICATE KEY UPDATE"
            f" epoch = IF((token, epoch) <= ({p}, {p}), {p}, epoch),"
            f" token = IF((token, epoch) <= ({p}, {p}), {p}, token),"
            " updated_at = UTC_TIMESTAMP(6)"
        )

    def advance_params(self, resource: str, token: int, epoch: int) -> tuple[Any, ...]:
        return (resource, token, epoch, token, epoch, epoch, token, epoch, token)

    def upsert_data(self, d: str, p: str) -> str:
        return (
            f"INSERT INTO {d} (resource, k, v) VALUES ({p}, {p}, {p})"
            " ON DUPLICATE KEY UPDATE v = VALUES(v)"
        )

    def check_and_advance(
        self, cur: Any, sql: Statements, resource: str, token: int, epoch: int
    ) -> tuple[int, int] | None:
        cur.execute(sql.advance, self.advance_params(resource, token, epoch))
        cur.execute(sql.select + " FOR UPDATE", (resource,))
        row = cur.fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def value_limit(self, conn: Any) -> ValueLimit | None:
        # A larger statement makes the server drop the connection, mid-transaction, as
        # if it were unreachable. The session's value is fixed when the connection opens.
        cur = conn.cursor()
        try:
            cur.execute("SELECT @@SESSION.max_allowed_packet")
            packet = int(cur.fetchone()[0])
        finally:
            cur.close()
        return ValueLimit(
            packet - STATEMENT_OVERHEAD,
            f"the server's max_allowed_packet of {packet} bytes less "
            f"{STATEMENT_OVERHEAD} for the rest of the statement",
        )

    def value_size(self, value: bytes) -> int:
        # the drivers put the value into the statement's text, hex or escaped: count the
        # longer (a driver with server-side parameters sends less)
        return SENT_PER_BYTE * len(value)

    def begin(self, conn: Any, cur: Any, *, write: bool) -> int:
        if in_transaction(conn):
            if write:
                raise in_progress()
            return NONE
        if is_autocommit(conn) and not write:
            return NONE
        # Always explicit: the server reports IN_TRANS only for transactions that wrote,
        # so a read-only one (with its REPEATABLE READ snapshot) may still be open;
        # START TRANSACTION ends it and gives the caller's block a fresh snapshot.
        cur.execute("START TRANSACTION")
        return EXPLICIT

    def is_transient(self, exc: BaseException) -> bool:
        return _errno(exc) == 1213  # ER_LOCK_DEADLOCK

    def txn_state(self, conn: Any) -> int:
        flag = getattr(conn, "in_transaction", None)  # mysql.connector
        if isinstance(flag, bool):
            return TXN_OPEN if flag else TXN_NONE
        server_status = getattr(conn, "server_status", None)  # PyMySQL: SERVER_STATUS_IN_TRANS
        if isinstance(server_status, int):
            return TXN_OPEN if server_status & 1 else TXN_NONE
        return TXN_UNKNOWN

    def not_committed(self, conn: Any, exc: BaseException) -> bool:
        if not isinstance(exc, Exception):
            return False
        code = _errno(exc)
        # 1000-1999 are server errors; 2000+ are the client's (lost connection, ...).
        return isinstance(code, int) and 1000 <= code < 2000 and code not in _UNKNOWN

    @contextmanager
    def lock_wait(self, cur: Any, seconds: float | None) -> Iterator[None]:
        if seconds is None:
            yield
            return
        cur.execute(
            "SET @etcdfence_lock_wait = @@SESSION.innodb_lock_wait_timeout,"
            f" SESSION innodb_lock_wait_timeout = {max(1, round(seconds))}"
        )
        with restoring(cur, "SET SESSION innodb_lock_wait_timeout = @etcdfence_lock_wait"):
            yield

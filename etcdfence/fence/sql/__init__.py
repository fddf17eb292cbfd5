"""Fencing for SQL databases: the check and the write in one transaction.

Use :class:`SQLFence` when the resource a leader protects lives in SQLite, PostgreSQL
or MySQL/MariaDB. A small table (``etcdfence_fences`` by default) holds each
resource's mark: the highest fencing token it accepted, with the epoch of the writer
of that term (``(token, epoch)``) and a version counting the fence's data writes. A
fence is bound to one resource; it checks the caller's token against the mark and
advances it in the same transaction as the caller's writes, so a paused or partitioned
ex-leader can never overwrite the work of its successor::

    fence = SQLFence(conn, "orders")
    fence.ensure_schema()                     # once, at deploy or start-up
    with fence.guarded(token) as cur:         # your own tables
        cur.execute("UPDATE orders SET state = 'shipped' WHERE id = %s", (order_id,))
    version = fence.put(token, "config", "v2")  # key/value rows of etcdfence_data

Rules for the connection: the fence uses the DB-API connection you give it and runs
its own transactions on it. Commit or roll back your own work before a fenced write
(:class:`TransactionInProgress` otherwise, where the driver lets us tell), and do not
commit or roll back inside a ``guarded`` block. Works in autocommit mode or not. One
connection serves one thread at a time, as DB-API connections do.

Within a term the writes are ordered by the protocol every fence shares
(:mod:`etcdfence.fence.epochs`, run by the engine :mod:`etcdfence.fence._sync.engine`):
a fence writes only at an epoch it claimed at the mark, inside its own transaction
under the mark's row lock, and owns it once that commits; a COMMIT whose answer was
lost gives the epoch up and is fenced off with a fresh claim before the error is
raised. SQL itself does not reorder a guarded transaction: its first statement takes
the mark's row lock until COMMIT or ROLLBACK, and the client waits for every answer
before it sends the next statement, so a later guarded write is never acknowledged
before an earlier one's COMMIT has been resolved (``tests/test_sql_ordering.py``).
The epoch matters for a write that carries its check and its commit in one request.
A held COMMIT stalls the resource until the server ends its session or the bytes
arrive; a lock timeout turns the wait into an error.

Each database is a :class:`SQLDialect` (:class:`SQLiteDialect`,
:class:`PostgreSQLDialect`, :class:`MySQLDialect`); a new one is one subclass and a
:func:`register_dialect` call. sqlite3 with ``autocommit=False`` (Python 3.12+) always
has a transaction open, so there the fence uses (and commits) it: commit first. A MySQL
server reports open transactions only once they have written, so a pending read-only
transaction is ended, not refused.
"""

from __future__ import annotations

from typing import Literal

from ...errors import TransactionAbortedError, TransactionInProgressError
from .dialect import OnConflictDialect, SQLDialect, dialect_for, dialects, register_dialect
from .fence import (
    DEFAULT_DATA_TABLE,
    DEFAULT_TABLE,
    MAX_KEY_BYTES,
    MAX_RESOURCE_LENGTH,
    SQLFence,
)
from .legacy import UnboundSQLFence
from .mysql import MySQLDialect
from .postgresql import PostgreSQLDialect
from .sqlite import SQLiteDialect

__all__ = [
    "DEFAULT_DATA_TABLE",
    "DEFAULT_TABLE",
    "DIALECTS",
    "MAX_KEY_BYTES",
    "MAX_RESOURCE_LENGTH",
    "Dialect",
    "MySQLDialect",
    "OnConflictDialect",
    "PostgreSQLDialect",
    "SQLDialect",
    "SQLFence",
    "SQLiteDialect",
    "TransactionAborted",
    "TransactionInProgress",
    "UnboundSQLFence",
    "dialect_for",
    "dialects",
    "register_dialect",
]

for _dialect in (SQLiteDialect, PostgreSQLDialect, MySQLDialect):
    register_dialect(_dialect)

#: The names of the built-in dialects (``SQLFence(..., dialect=name)``).
Dialect = Literal["sqlite", "postgresql", "mysql"]
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql", "mysql")

# Defined in etcdfence.errors (one hierarchy); importable from here as in 0.1.
TransactionInProgress = TransactionInProgressError
TransactionAborted = TransactionAbortedError

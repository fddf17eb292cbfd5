"""PostgreSQL (``psycopg``, ``psycopg2``), any isolation level.

One statement checks and advances the mark: ``INSERT ... ON CONFLICT (resource) DO
UPDATE SET token = excluded.token, epoch = excluded.epoch WHERE (f.token, f.epoch) <=
(excluded.token, excluded.epoch)``. The upsert locks the conflicting row and evaluates
the ``WHERE`` on its newest committed version (a concurrent writer makes it wait for
that writer's commit), so the comparison cannot interleave with another writer. One row
affected means accepted; zero means refused, and a ``SELECT`` in the same transaction,
still holding the row lock, reads the mark. Under REPEATABLE READ / SERIALIZABLE a
concurrent update surfaces as a serialization failure instead; the check is retried in
a fresh transaction (the caller's block has not run yet).
"""

from __future__ import annotations

from typing import Any, ClassVar

from .dialect import (
    EXPLICIT,
    TXN_FAILED,
    TXN_NONE,
    TXN_OPEN,
    TXN_UNKNOWN,
    OnConflictDialect,
    ValueLimit,
)

__all__ = ["MAX_BYTEA_BYTES", "PostgreSQLDialect"]

#: The largest ``bytea`` value PostgreSQL stores: a field is at most 1 GB (``MaxAllocSize``,
#: 2**30 - 1 bytes) including its 4-byte length header.
MAX_BYTEA_BYTES = 2**30 - 1 - 4


class PostgreSQLDialect(OnConflictDialect):
    """PostgreSQL: the ON CONFLICT upsert with PostgreSQL's types, transaction probes
    and error classes (SQLSTATE); the lock wait is bounded with ``SET LOCAL``."""

    name: ClassVar[str] = "postgresql"
    modules: ClassVar[tuple[str, ...]] = ("psycopg", "psycopg2")
    paramstyle: ClassVar[str] = "format"
    now: ClassVar[str] = "now()"
    timestamp: ClassVar[str] = "TIMESTAMPTZ"
    binary: ClassVar[str] = "BYTEA"

    def value_limit(self, conn: Any) -> ValueLimit | None:
        return ValueLimit(MAX_BYTEA_BYTES, "PostgreSQL's 1 GB limit of a bytea value")

    def rolled_back_at_commit(self, cur: Any, kind: int) -> bool:
        # A COMMIT of a failed transaction "succeeds" with the tag ROLLBACK.
        tag = getattr(cur, "statusmessage", None)
        return kind == EXPLICIT and isinstance(tag, str) and tag.upper().startswith("ROLLBACK")

    def is_transient(self, exc: BaseException) -> bool:
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        return state in ("40001", "40P01")

    def txn_state(self, conn: Any) -> int:
        info = getattr(conn, "info", None)  # psycopg 3
        status = getattr(info, "transaction_status", None)
        if status is None:
            get_status = getattr(conn, "get_transaction_status", None)  # psycopg2
            status = get_status() if callable(get_status) else None
        if status is None:
            return TXN_UNKNOWN
        # libpq: IDLE 0, ACTIVE 1, INTRANS 2, INERROR 3, UNKNOWN 4
        return {0: TXN_NONE, 2: TXN_OPEN, 3: TXN_FAILED}.get(int(status), TXN_UNKNOWN)

    def not_committed(self, conn: Any, exc: BaseException) -> bool:
        if not isinstance(exc, Exception):
            return False
        if getattr(conn, "broken", False) or getattr(conn, "closed", False):
            return False
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        # An answer from the server, and not "connection exception" (08),
        # "operator intervention" (57: shutdown, cancel) or "internal error" (XX).
        return isinstance(state, str) and state[:2] not in ("08", "57", "XX")

    def in_transaction_lock_wait(self, cur: Any, seconds: float) -> None:
        cur.execute(f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'")

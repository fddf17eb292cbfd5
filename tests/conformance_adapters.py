"""Adapter factories the conformance tests run the kit on, importable by the kit's
writer processes (``conformance_adapters:unfenced``; tests/ is on their path).

Where the store lives comes from the environment, which writer processes inherit:
``CONFORMANCE_TOY_DB`` (a SQLite file for the toy stores), ``CONFORMANCE_SQL``
(``dialect:fences_table:data_table[:sqlite path]``) for SQLFence.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from etcdfence import StaleTokenError
from etcdfence.conformance import Adapter
from etcdfence.conformance.adapters import fence_guard_adapter, sql_fence_adapter
from etcdfence.token import coerce_token


class ToyStore:
    """A key-value store in one SQLite file with a fencing mark per key.

    ``fenced=False``: writes without looking at the token (the control that must fail).
    ``durable_mark=False``: checks the token, but ``restart()`` forgets every mark, as
    a store keeping its marks in memory (or a Redis without persistence) would.
    """

    def __init__(self, path: str, *, fenced: bool = True, durable_mark: bool = True) -> None:
        self.path, self.fenced, self.durable_mark = path, fenced, durable_mark
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS data (k TEXT PRIMARY KEY, v TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS marks (k TEXT PRIMARY KEY, token INTEGER)")
        return db

    def write(self, token: Any, key: str, value: str) -> None:
        if not self.fenced:
            self.db.execute("INSERT OR REPLACE INTO data VALUES (?, ?)", (key, value))
            return
        token = coerce_token(token)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute("SELECT token FROM marks WHERE k = ?", (key,)).fetchone()
            if row is not None and row[0] > token:
                raise StaleTokenError(key, token, row[0])
            self.db.execute("INSERT OR REPLACE INTO marks VALUES (?, ?)", (key, token))
            self.db.execute("INSERT OR REPLACE INTO data VALUES (?, ?)", (key, value))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def read(self, key: str) -> str | None:
        row = self.db.execute("SELECT v FROM data WHERE k = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def restart(self) -> None:
        self.db.close()
        self.db = self._open()
        if not self.durable_mark:
            self.db.execute("DELETE FROM marks")  # the marks were only in memory

    def close(self) -> None:
        self.db.close()


def _toy(**kwargs: Any) -> ToyStore:
    return ToyStore(os.environ["CONFORMANCE_TOY_DB"], **kwargs)


def unfenced() -> ToyStore:
    """Writes whatever comes: must fail every scenario with a stale or malformed token."""
    return _toy(fenced=False)


def naive() -> ToyStore:
    """Checks tokens, but forgets its marks on restart: fails only the restart scenario."""
    return _toy(durable_mark=False)


def toy() -> ToyStore:
    """Checks tokens with a durable mark: passes everything."""
    return _toy()


def fence_guard(endpoints: list[str]) -> Adapter:
    """FenceGuard on the kit's etcd."""
    return fence_guard_adapter(endpoints)


def sql() -> Adapter:
    """SQLFence on the database named by ``CONFORMANCE_SQL``."""
    dialect, fences, data, *rest = os.environ["CONFORMANCE_SQL"].split(":", 3)
    return sql_fence_adapter(connector(dialect, *rest), data_table=data, fences_table=fences)


def connector(dialect: str, path: str = "") -> Any:
    """A function opening a new connection to the test database of ``dialect``."""
    if dialect == "sqlite":
        return lambda: sqlite3.connect(path, timeout=30)
    if dialect == "postgresql":
        import psycopg

        dsn = os.environ.get(
            "ETCDFENCE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
        )
        return lambda: psycopg.connect(dsn, connect_timeout=5)
    import pymysql

    return lambda: pymysql.connect(
        host="127.0.0.1", port=3306, user="root", password="", database="test", connect_timeout=5
    )

"""Adapter factories the conformance tests run the kit on, importable by the kit's
writer processes (``conformance_adapters:unfenced``; tests/ is on their path).

Where the store lives comes from the environment, which writer processes inherit:
``CONFORMANCE_TOY_DB`` (a SQLite file for the toy stores), ``CONFORMANCE_SQL``
(``dialect:fences_table:data_table[:sqlite path]``) for SQLFence.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

from etcdfence import Client, EtcdUnavailable, StaleTokenError, _txn
from etcdfence.conformance import Adapter
from etcdfence.conformance.adapters import fence_guard_adapter, sql_fence_adapter
from etcdfence.testing import FaultProxy
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


class HeldFenceGuard:
    """FenceGuard whose client reaches etcd through a FaultProxy, so that one write can
    be held in the network (``delay``) and delivered after later writes.

    ``epochs=False`` is the control: the guarded txn the 0.1 way, whose epoch never
    moves, so a held write of the current term lands late (issue #17).
    """

    rejections = (StaleTokenError,)

    def __init__(self, endpoints: list[str], *, epochs: bool = True) -> None:
        self.proxy = FaultProxy(endpoints[0])
        self.client = Client([self.proxy.endpoint], timeout=5.0)
        self.epochs = epochs
        self.guards: dict[str, Any] = {}
        self.lock = threading.Lock()

    def guard(self, key: str) -> Any:
        with self.lock:
            return self.guards.setdefault(key, self.client.fence(key))

    def _txn(self, token: int, key: str, value: str, epoch: int) -> Any:
        return _txn.fence_txn(
            self.guard(key).key, token, [_txn.op_put(key.encode(), value.encode())], epoch=epoch
        )

    def write(self, token: Any, key: str, value: str) -> None:
        if self.epochs:
            self.guard(key).put(token, key, value)
            return
        value_ = coerce_token(token)
        if self.client.txn_raw(self._txn(value_, key, value, 0)).succeeded:  # stale branch
            raise StaleTokenError(key, value_, self.guard(key).current())

    def read(self, key: str) -> bytes | None:
        kv = self.client.get(key)
        return None if kv is None else bytes(kv.value)

    def delay(self, token: Any, key: str, value: str) -> Any:
        value_ = coerce_token(token)
        epoch = self.guard(key).epoch(value_) if self.epochs else 0
        size = len(self._txn(value_, key, value, epoch).SerializeToString()) + 9 + 5
        self.client.get(key)  # the connection through the proxy is up
        self.proxy.hold()
        outcome: list[BaseException] = []

        def send() -> None:
            try:
                self.write(token, key, value)
            except BaseException as err:
                outcome.append(err)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        self.proxy.wait_held(size)  # the whole request is in the network
        self.proxy.sever_held()  # the client gives up; its bytes stay held
        sender.join(15)
        assert outcome and isinstance(outcome[0], EtcdUnavailable), outcome
        self.client.get(key)  # an idempotent read: the channel reconnects first

        def release() -> None:
            self.proxy.release()
            deadline = time.monotonic() + 10
            while self.proxy.held_bytes and time.monotonic() < deadline:
                time.sleep(0.01)
            # etcd handles the delivered request or not: a rejected one changes nothing
            # a watch could report, so give it the proxy's linger (1 s) and a margin
            time.sleep(1.5)

        return release

    def close(self) -> None:
        self.client.close()
        self.proxy.close()


def held_fence_guard(endpoints: list[str]) -> HeldFenceGuard:
    """FenceGuard with a delay(): passes the late-landing scenario too."""
    return HeldFenceGuard(endpoints)


def epochless_fence_guard(endpoints: list[str]) -> HeldFenceGuard:
    """The control: token checks only, so a held write of the term lands late."""
    return HeldFenceGuard(endpoints, epochs=False)

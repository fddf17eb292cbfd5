"""Ready-made adapters for etcdfence's own guards, so the kit can vouch for a deployment.

Use them to check a guard *as you deployed it* (your etcd, your database, its
isolation level and replication), or as a model for an adapter of your own: each is
a handful of lines around the guard's ``put``/``guarded`` call. A guard for another
resource needs only the same three callables (``dict(write=, read=, restart=)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import Client
from .._keys import DEFAULT_FENCE_PREFIX
from ..errors import InvalidArgumentError
from ..sql import SQLFence
from ._adapter import Adapter

__all__ = ["fence_guard_adapter", "sql_fence_adapter"]


def fence_guard_adapter(
    endpoints: list[str], *, prefix: str = DEFAULT_FENCE_PREFIX, timeout: float = 5.0
) -> Adapter:
    """An adapter writing etcd keys through :class:`~etcdfence.FenceGuard` (one guard,
    i.e. one mark, per key). ``restart()`` reconnects: the mark lives in etcd."""
    state: dict[str, Any] = {"client": Client(endpoints, timeout=timeout), "guards": {}}
    lock = threading.Lock()

    def guard(key: str) -> Any:
        with lock:
            guards = state["guards"]
            if key not in guards:
                guards[key] = state["client"].fence(key, prefix=prefix)
            return guards[key]

    def write(token: Any, key: str, value: str) -> None:
        guard(key).put(token, key, value)

    def read(key: str) -> bytes | None:
        kv = state["client"].get(key)
        return None if kv is None else bytes(kv.value)

    def restart() -> None:
        with lock:
            state["client"].close()
            state["client"], state["guards"] = Client(endpoints, timeout=timeout), {}

    return Adapter(write, read, restart, lambda: state["client"].close(), name="FenceGuard")


def sql_fence_adapter(
    connect: Callable[[], Any], *, data_table: str, fences_table: str | None = None
) -> Adapter:
    """An adapter writing rows ``(k, v)`` of ``data_table`` through
    :meth:`~etcdfence.sql.SQLFence.guarded` (the key is the fenced resource).
    ``connect()`` returns a new DB-API connection (sqlite3, psycopg, PyMySQL);
    ``restart()`` closes it and connects again — for SQLite that is the resource's
    restart; for a server, the client's. Create the tables first
    (``SQLFence.ensure_schema()`` and ``k VARCHAR(255) PRIMARY KEY, v TEXT``)."""
    if not data_table.replace("_", "").isalnum():
        raise InvalidArgumentError(f"data_table must be an identifier: {data_table!r}")
    kwargs = {} if fences_table is None else {"table": fences_table}
    state: dict[str, Any] = {}

    def open_() -> None:
        state["conn"] = connect()
        state["fence"] = SQLFence(state["conn"], **kwargs)

    open_()
    upsert = {
        "mysql": "INSERT INTO {t} (k, v) VALUES ({p}, {p}) ON DUPLICATE KEY UPDATE v = VALUES(v)",
    }.get(state["fence"].dialect, "INSERT INTO {t} (k, v) VALUES ({p}, {p}) "
          "ON CONFLICT (k) DO UPDATE SET v = excluded.v")  # fmt: skip
    p = "?" if state["fence"].dialect == "sqlite" else "%s"

    def write(token: Any, key: str, value: str) -> None:
        with state["fence"].guarded(key, token) as cur:
            cur.execute(upsert.format(t=data_table, p=p), (key, value))

    def read(key: str) -> str | None:
        cur = state["conn"].cursor()
        try:
            cur.execute(f"SELECT v FROM {data_table} WHERE k = {p}", (key,))
            row = cur.fetchone()
        finally:
            cur.close()
            state["conn"].rollback()  # end the read's transaction before the next guarded()
        return None if row is None else str(row[0])

    def restart() -> None:
        state["conn"].close()
        open_()

    return Adapter(write, read, restart, lambda: state["conn"].close(), name="SQLFence")

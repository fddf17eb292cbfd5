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
from ..sql import SQLFence
from ._adapter import Adapter

__all__ = ["fence_guard_adapter", "sql_fence_adapter"]


def fence_guard_adapter(
    endpoints: list[str],
    *,
    prefix: str = DEFAULT_FENCE_PREFIX,
    timeout: float = 5.0,
    lock: str | None = None,
) -> Adapter:
    """An adapter writing etcd keys through :class:`~etcdfence.FenceGuard` (one guard,
    i.e. one mark, per key). ``restart()`` reconnects: the mark lives in etcd.
    ``lock``: every guard is bound to that lock (``client.fence(key, lock=...)``), and
    the adapter declares it, so the kit runs its bound-resource scenarios too."""
    state: dict[str, Any] = {"client": Client(endpoints, timeout=timeout), "guards": {}}
    mutex = threading.Lock()

    def guard(key: str) -> Any:
        with mutex:
            guards = state["guards"]
            if key not in guards:
                guards[key] = state["client"].fence(key, prefix=prefix, lock=lock)
            return guards[key]

    def write(token: Any, key: str, value: str) -> None:
        guard(key).put(token, key, value)

    def read(key: str) -> bytes | None:
        kv = state["client"].get(key)
        return None if kv is None else bytes(kv.value)

    def restart() -> None:
        with mutex:
            state["client"].close()
            state["client"], state["guards"] = Client(endpoints, timeout=timeout), {}

    return Adapter(
        write,
        read,
        restart,
        lambda: state["client"].close(),
        name="FenceGuard" if lock is None else "BoundFenceGuard",
        bound_lock=lock,
        refuses_future=True,
    )


def sql_fence_adapter(
    connect: Callable[[], Any], *, data_table: str, fences_table: str | None = None
) -> Adapter:
    """An adapter writing key/value rows of ``data_table`` through
    :meth:`~etcdfence.sql.SQLFence.put` — one fence bound per key, the key being the
    fenced resource. ``connect()`` returns a new DB-API connection (sqlite3, psycopg,
    PyMySQL); ``restart()`` closes it and connects again — for SQLite that is the
    resource's restart; for a server, the client's. Create the tables first
    (``SQLFence(conn, resource, table=..., data_table=...).ensure_schema()``)."""
    tables = {"data_table": data_table}
    if fences_table is not None:
        tables["table"] = fences_table
    state: dict[str, Any] = {}
    lock = threading.Lock()

    def open_() -> None:
        state["conn"], state["fences"] = connect(), {}

    def fence(key: str) -> SQLFence:
        with lock:
            fences: dict[str, SQLFence] = state["fences"]
            if key not in fences:
                # one connection: the fences of all keys share it (and take turns on it)
                first = next(iter(fences.values()), None)
                fences[key] = (
                    SQLFence(state["conn"], key, **tables)
                    if first is None
                    else first.for_resource(key)
                )
            return fences[key]

    open_()

    def write(token: Any, key: str, value: str) -> None:
        fence(key).put(token, key, value)

    def read(key: str) -> str | None:
        value = fence(key).get(key)
        return None if value is None else value.decode()

    def restart() -> None:
        with lock:
            state["conn"].close()
            open_()

    return Adapter(write, read, restart, lambda: state["conn"].close(), name="SQLFence")

"""Contender drivers for the integration tests: one test body, both twins (sync and asyncio).

Imported by the test modules (``from _contender_proc import ...``):

- :class:`Api` runs one test body against either the threaded API (``ef.Client``) or the
  asyncio API (``ef.AsyncClient``): blocking sync calls go to worker threads, so one
  ``async def`` test exercises both twins without mocks;
- :func:`api_fixture` builds the parametrized ``api`` fixture each module declares (both
  twins; ``ETCDFENCE_TEST_TWINS=async`` keeps one, for the passes on other etcd versions
  and topologies: see the Makefile);
- :func:`revoke_lease` and :func:`lease_ttl` (raw lease calls behind a session's back);
- ``poll``, ``LineReader`` and ``stop_process``: re-exported from
  :mod:`etcdfence.testing.procs` (``await_until``, ``LineReader``, ``stop``).

A contender *process* for cross-process fault tests is ``python -m
etcdfence.testing.contender`` (history events on stdout).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import inspect
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import etcdfence as ef
from etcdfence.testing.procs import LineReader, stop
from etcdfence.testing.procs import await_until as poll

__all__ = [
    "Api",
    "LineReader",
    "api_fixture",
    "keys_under",
    "lease_ttl",
    "poll",
    "revoke_lease",
    "stop_process",
    "twins",
]

#: Signal (default: terminate) and reap a child we started, killing it if it lingers.
stop_process = stop

# ----------------------------------------------------------------------------- in-process


class Api:
    """One test body, two twins: ``await api(obj.method, *args)`` calls a method of the
    sync twin in a worker thread or awaits the asyncio twin's coroutine."""

    def __init__(
        self, kind: str, client: Any, endpoints: list[str], executor: Any, owned: list[Any]
    ) -> None:
        self.kind = kind
        self.is_async = kind == "async"
        self.client = client
        self.endpoints = endpoints
        self._executor = executor
        self._owned = owned  # clients made by new_client(), closed at teardown
        self.Elector: Any = ef.AsyncLeaderElector if self.is_async else ef.LeaderElector

    def __repr__(self) -> str:
        return f"<Api {self.kind}>"

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            result = fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def spawn(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Task[Any]:
        """Start ``fn(*args)`` in the background (a task; a worker thread for sync)."""
        return asyncio.ensure_future(self(fn, *args, **kwargs))

    async def close(self, obj: Any) -> None:
        """``aclose()`` on the asyncio twin, ``close()`` on the sync twin."""
        await self(obj.aclose if self.is_async else obj.close)

    async def new_client(self, endpoints: list[str] | str | None = None, **kw: Any) -> Any:
        cls = ef.AsyncClient if self.is_async else ef.Client
        client = cls(endpoints or self.endpoints, **kw)
        self._owned.append(client)
        return client

    async def open_session(self, ttl: int = 2, *, client: Any = None, **kw: Any) -> Any:
        session = (client or self.client).session(ttl, **kw)
        await self(session.open)
        return session

    @contextlib.asynccontextmanager
    async def session(self, ttl: int = 2, *, client: Any = None, **kw: Any) -> AsyncIterator[Any]:
        """``with client.session(ttl)`` for either twin."""
        session = await self.open_session(ttl, client=client, **kw)
        try:
            yield session
        finally:
            await self.close(session)

    async def next(self, iterator: Any, timeout: float = 5.0) -> Any:
        """The next item of a (sync or async) iterator such as ``client.observe()``."""
        if self.is_async:
            return await asyncio.wait_for(iterator.__anext__(), timeout)
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._executor, next, iterator), timeout)

    async def close_iterator(self, iterator: Any) -> None:
        if self.is_async:
            await iterator.aclose()
        else:
            iterator.close()

    def count_calls(self, client: Any) -> collections.Counter[str]:
        """Count the requests (by method; retries included) and stream opens
        (``stream:<name>``) of a client from now on, through its public ``on_call``."""
        counter: collections.Counter[str] = collections.Counter()
        client.on_call(lambda record: counter.update([record.method]))
        return counter


#: The twins the ``api`` fixture runs (comma-separated; default both).
TWINS_ENV = "ETCDFENCE_TEST_TWINS"


def twins() -> list[str]:
    """The twins named by ``ETCDFENCE_TEST_TWINS`` (default ``sync,async``).

    ``make test`` runs both on etcd 3.5. The etcd 3.4 and Docker-cluster passes keep the
    asyncio twin only: what they add is another server (version, topology), and the sync
    twin is generated from the asyncio source (``tools/async_to_sync.py --check`` in
    ``make lint``, tests/test_twin.py), so it sends the same requests and reads the
    replies with the same code."""
    chosen = [
        t.strip() for t in (os.environ.get(TWINS_ENV) or "sync,async").split(",") if t.strip()
    ]
    if not chosen or set(chosen) - {"sync", "async"}:
        raise ValueError(f"{TWINS_ENV}={os.environ[TWINS_ENV]!r}: name sync, async or both")
    return chosen


def api_fixture() -> Any:
    """The ``api`` fixture: every test that takes it runs once per twin (:func:`twins`)."""
    import pytest_asyncio

    @pytest_asyncio.fixture(params=twins())
    async def api(
        request: Any, etcd_endpoints: list[str], etcd_client: Any, async_etcd_client: Any
    ) -> AsyncIterator[Api]:
        owned: list[Any] = []
        executor = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="test-sync")
        client = async_etcd_client if request.param == "async" else etcd_client
        api = Api(request.param, client, list(etcd_endpoints), executor, owned)
        try:
            yield api
        finally:
            for extra in owned:
                await api.close(extra)
            executor.shutdown(wait=False, cancel_futures=True)

    return api


async def revoke_lease(api: Api, lease_id: int, client: Any = None) -> None:
    """Revoke a lease behind its session's back (what an operator or etcd itself does)."""
    client = client or api.client
    await api(client.lease_revoke, lease_id)


async def lease_ttl(api: Api, lease_id: int, client: Any = None) -> int:
    """The server's remaining TTL of a lease (-1 once it is gone)."""
    client = client or api.client
    return int(await api(client.lease_time_to_live, lease_id))


async def keys_under(api: Api, prefix: str, client: Any = None) -> list[Any]:
    """The contenders' keys under ``prefix/`` (KeyValue list, key order)."""
    return list(await api((client or api.client).get_prefix, prefix + "/"))

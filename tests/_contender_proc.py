"""Contender drivers for the integration tests: in-process (sync or asyncio) and as a process.

Imported by the test modules (``from _contender_proc import ...``):

- :class:`Api` runs one test body against either the threaded API (``ef.Client``) or the
  asyncio API (``ef.AsyncClient``): blocking sync calls go to worker threads, so one
  ``async def`` test exercises both twins without mocks;
- :func:`api_fixture` builds the parametrized ``api`` fixture each module declares;
- :func:`revoke_lease` and :func:`lease_ttl` (raw lease calls behind a session's back);
- ``poll``, ``LineReader`` and ``stop_process``: re-exported from
  :mod:`etcdfence.testing.procs` (``await_until``, ``LineReader``, ``stop``).

Run as a script it is a contender *process* for cross-process fault tests (SIGSTOP):

    python tests/_contender_proc.py --endpoints URL --name NAME --resource RES [--ttl 1]
                                    [--api sync|async] [--identity ID]

It campaigns for NAME, then writes ``<RES>/data`` through ``FenceGuard(RES)`` with its
token every 50 ms and prints one JSON object per line: ``elected`` (token, key, lease),
``write`` (ok, current; ``deadline``, the session's local deadline as
``time.monotonic()``, when accepted), ``lost`` (when the session expires), and a final
``zombie_write`` (one more write attempted with the old token after the loss), then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import inspect
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog

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


def api_fixture() -> Any:
    """The ``api`` fixture: every test that takes it runs once per twin."""
    import pytest_asyncio

    @pytest_asyncio.fixture(params=["sync", "async"])
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


# ----------------------------------------------------------------------------- process


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


def _write(put: Callable[[], Any], event: str, token: ef.FencingToken, session: Any) -> None:
    try:
        put()
        _emit(event, ok=True, token=token.value, deadline=session.deadline)
    except ef.StaleTokenError as err:
        _emit(event, ok=False, token=token.value, current=err.current)


async def _awrite(
    put: Callable[[], Awaitable[Any]], event: str, token: ef.FencingToken, session: Any
) -> None:
    try:
        await put()
        _emit(event, ok=True, token=token.value, deadline=session.deadline)
    except ef.StaleTokenError as err:
        _emit(event, ok=False, token=token.value, current=err.current)


def _run_sync(args: argparse.Namespace) -> None:
    with ef.Client(args.endpoints, timeout=2.0) as client:
        guard = client.fence(args.resource)
        session = client.session(args.ttl)
        session.open()
        session.on_expired(lambda: _emit("lost", expired=session.expired))
        token = session.election(args.name).campaign(args.identity)
        _emit("elected", token=token.value, key=token.key, lease=session.lease_id)

        def put() -> Any:
            return guard.put(token, args.resource + "/data", args.identity)

        while not session.expired:
            _write(put, "write", token, session)
            time.sleep(0.05)
        _write(put, "zombie_write", token, session)  # a paused leader's late write: must bounce
        session.close()


async def _run_async(args: argparse.Namespace) -> None:
    async with ef.AsyncClient(args.endpoints, timeout=2.0) as client:
        guard = client.fence(args.resource)
        session = client.session(args.ttl)
        await session.open()
        session.on_expired(lambda: _emit("lost", expired=session.expired))
        token = await session.election(args.name).campaign(args.identity)
        _emit("elected", token=token.value, key=token.key, lease=session.lease_id)

        def put() -> Awaitable[Any]:
            return guard.put(token, args.resource + "/data", args.identity)

        while not session.expired:
            await _awrite(put, "write", token, session)
            await asyncio.sleep(0.05)
        await _awrite(put, "zombie_write", token, session)
        await session.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="an etcdfence contender process for tests")
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--resource", required=True)
    parser.add_argument("--identity", default="proc")
    parser.add_argument("--ttl", type=int, default=1)
    parser.add_argument("--api", choices=["sync", "async"], default="sync")
    args = parser.parse_args(argv)
    args.endpoints = args.endpoints.split(",")
    # stdout carries the JSON protocol: send the library's log lines to stderr
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if args.api == "sync":
        _run_sync(args)
    else:
        asyncio.run(_run_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The httpx transports of :mod:`etcdfence.http` (imported only when first used).

Where the holder's liveness is checked, each time from local state only (no I/O):

1. when the request enters the transport — a lost holder raises before anything;
2. just before the request line and headers are written to the socket (httpcore's
   ``trace`` hook ``*.send_request_headers.started``), i.e. after waiting for a pooled
   connection, connecting and TLS, which can take long — with the default inner
   transport (or any httpcore-based one);
3. before each chunk of the body is written — a long upload that outlives the lock is
   cut off mid-body, so the server sees a truncated request, never a complete one.

What no client-side check can prevent: a request whose last byte left before the loss
(or was in the socket buffer) still arrives afterwards. That is the case the token in the
header exists for; the resource's guard refuses it once a newer holder wrote.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from .http import _Gate
from .token import HEADER, FencingToken

__all__ = ["AsyncFencingTransport", "FencingTransport"]

_HEADERS_EVENT = "send_request_headers.started"


def _stamp(gate: _Gate, request: httpx.Request) -> tuple[FencingToken | int, str, Any]:
    """Check the holder (raises: nothing sent) and put its token in the header; return
    the token, the request's name for errors, and the caller's own ``trace`` hook."""
    doing = f"{request.method} {request.url}"
    token = gate.current(doing)
    request.headers[HEADER] = str(int(token))
    return token, doing, request.extensions.get("trace")


class _CheckedStream(httpx.SyncByteStream):
    """The request body, the holder re-checked before each chunk goes out."""

    def __init__(self, inner: Any, gate: _Gate, token: FencingToken | int, doing: str) -> None:
        self._inner = inner
        self._gate = gate
        self._token = token
        self._doing = doing

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            if chunk:  # an empty chunk sends nothing: with no body, the headers end the request
                self._gate.still(self._token, self._doing)
            yield chunk

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class _AsyncCheckedStream(httpx.AsyncByteStream):
    """The asyncio twin of :class:`_CheckedStream`."""

    def __init__(self, inner: Any, gate: _Gate, token: FencingToken | int, doing: str) -> None:
        self._inner = inner
        self._gate = gate
        self._token = token
        self._doing = doing

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if chunk:  # an empty chunk sends nothing: with no body, the headers end the request
                self._gate.still(self._token, self._doing)
            yield chunk

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


class FencingTransport(httpx.BaseTransport):
    """An httpx transport that sends every request with the holder's ``Fencing-Token``
    and refuses to send once the holder lost its lock or leadership.

    Use it for the HTTP writes a lock or a leadership term protects::

        lock = session.lock("writers/orders"); lock.acquire()
        http = httpx.Client(transport=FencingTransport(lock))

    ``holder`` is a ``Lock``, ``Election`` or ``LeaderElector`` (sync or asyncio), or
    any :class:`~etcdfence.http.TokenHolder`. The token is read at send time, so one
    client follows a re-acquired lock or the elector's next term; a ``Fencing-Token``
    the caller set is replaced. When the holder is not held (never acquired, released,
    resigned, between terms) the request raises :class:`~etcdfence.NotOwnerError`
    (:class:`~etcdfence.NotLeaderError` for elections); when its session's local
    deadline passed, or less than ``reserve`` seconds of it are left,
    :class:`~etcdfence.SessionExpiredError` — and nothing of that request is sent (see
    the module docstring for where the checks run, and what they cannot cover).

    ``transport`` is the transport that does the I/O (default ``httpx.HTTPTransport()``),
    closed with this one. Thread-safe as far as the inner transport is (httpx's is): the
    checks only read the holder's state.
    """

    def __init__(
        self,
        holder: Any,
        *,
        transport: httpx.BaseTransport | None = None,
        reserve: float = 0.0,
    ) -> None:
        self._gate = _Gate(holder, reserve)
        self._inner = httpx.HTTPTransport() if transport is None else transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        gate = self._gate
        token, doing, user_trace = _stamp(gate, request)
        request.stream = _CheckedStream(request.stream, gate, token, doing)

        def trace(event: str, info: dict[str, Any]) -> None:
            if user_trace is not None:
                user_trace(event, info)
            if event.endswith(_HEADERS_EVENT):
                gate.still(token, doing)

        request.extensions = {**request.extensions, "trace": trace}
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


class AsyncFencingTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`FencingTransport`, for ``httpx.AsyncClient``::

        http = httpx.AsyncClient(transport=AsyncFencingTransport(elector))

    Same holders (an asyncio or a sync one: the checks read local state only), same
    errors, same guarantee; ``transport`` defaults to ``httpx.AsyncHTTPTransport()``.
    """

    def __init__(
        self,
        holder: Any,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        reserve: float = 0.0,
    ) -> None:
        self._gate = _Gate(holder, reserve)
        self._inner = httpx.AsyncHTTPTransport() if transport is None else transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        gate = self._gate
        token, doing, user_trace = _stamp(gate, request)
        request.stream = _AsyncCheckedStream(request.stream, gate, token, doing)

        async def trace(event: str, info: dict[str, Any]) -> None:
            if user_trace is not None:
                await user_trace(event, info)
            if event.endswith(_HEADERS_EVENT):
                gate.still(token, doing)

        request.extensions = {**request.extensions, "trace": trace}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()

"""The httpx transports of :mod:`etcdfence.http` (the code: :mod:`etcdfence.fence.http`),
imported only when first used.

Where the holder's liveness is checked, each time from local state only (no I/O):

1. when the request enters the transport — a lost holder raises before anything;
2. just before the request line and headers are written to the socket (httpcore's
   ``trace`` hook ``*.send_request_headers.started``), i.e. after waiting for a pooled
   connection, connecting and TLS, which can take long — with the default inner
   transport (or any httpcore-based one);
3. before each piece of the body is written — a long upload that outlives the lock is
   cut off mid-body, so the server sees a truncated request, never a complete one. The
   body is cut into pieces of at most :data:`MAX_PIECE` bytes whatever its shape: httpx
   hands ``content=b"..."`` over as one chunk, an iterator's chunks are the caller's,
   multipart yields each field whole; a check per *chunk* would let one long write of a
   big chunk outlive the holder.

4. before **every socket send** of the request — request line, headers, each body piece,
   the chunked terminator — made by a network stream installed in the inner transport's
   httpcore connection pool (``writes_gated``: the default transport, or any
   ``httpx.HTTPTransport``/``AsyncHTTPTransport`` given; another transport gets 1-3).

And a bound on each send, computed when the send is made: a holder with a session (a
lock, an election, an elector) waits for the socket at most until the session's local
deadline *as it is then* (less ``reserve``), or the caller's own write timeout if that
ends first (httpcore's meaning: per send). A renewal during a wait moves the bound on; a
send cut by the deadline is the holder's loss (:class:`~etcdfence.SessionExpiredError`),
one cut by the caller's timeout stays ``httpx.WriteTimeout``. On a loss the connection is
reset (``SO_LINGER`` 0, asyncio's transport aborted), dropping what asyncio and the
kernel had not sent yet; asyncio's own buffer is kept empty between sends (high-water
mark 0), so nothing it holds goes out on its own after the deadline.

The guarantee, then: **no byte of the request is handed to the kernel after the
deadline less** ``reserve`` (to the precision of the thread or event loop being
scheduled on time: ``reserve`` is the margin for that). Bytes handed over before it may
still reach the server after it — what had already arrived in the server's receive
buffer is read whenever the server reads — so a request whose last byte was handed over
in time still arrives complete, later. That is the case the token in the header exists
for: the resource must check it (its guard refuses the token once a newer holder wrote);
the transport's cut-off is defence in depth, never the fence. HTTP/2 (``http2=True``)
multiplexes several requests' frames in one send: their bound is the sender's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any

import anyio
import httpcore
import httpx
from httpcore._backends.sync import SyncStream

from ..errors import EtcdfenceError, SessionExpiredError
from ..token import HEADER, FencingToken
from .http import _Gate

__all__ = ["AsyncFencingTransport", "FencingTransport"]

_HEADERS_EVENT = "send_request_headers.started"
#: The largest piece of a request body written between two checks of the holder.
MAX_PIECE = 64 * 1024


def _pieces(chunk: bytes) -> Iterator[bytes]:
    """``chunk`` in pieces of at most :data:`MAX_PIECE` bytes (empty: nothing)."""
    if len(chunk) <= MAX_PIECE:
        if chunk:
            yield chunk
        return
    view = memoryview(chunk)
    for start in range(0, len(view), MAX_PIECE):
        yield bytes(view[start : start + MAX_PIECE])


class _Sending:
    """One request's holder check, shared by every place that checks it (the trace hook,
    the body's pieces, each socket write), and whether one of them found the holder
    lost (then the connection is reset on close, see :func:`_reset`)."""

    __slots__ = ("doing", "gate", "lost", "token")

    def __init__(self, gate: _Gate, token: FencingToken | int, doing: str) -> None:
        self.gate = gate
        self.token = token
        self.doing = doing
        self.lost = False

    def check(self) -> None:
        """Raise unless the token is still the holder's current, usable one."""
        try:
            self.gate.still(self.token, self.doing)
        except BaseException:
            self.lost = True
            raise

    def limit(self, user: float | None, started: float) -> tuple[float | None, bool]:
        """Check the holder, then the timeout for one socket write starting now: the
        user's write timeout (counted from ``started``) or the time left until the
        session's deadline less ``reserve``, whichever ends first; and whether the
        deadline is the one that ends first. Raises when either has run out."""
        self.check()
        left = self.gate.remaining()
        if left is not None and left <= 0:
            self.lost = True
            raise SessionExpiredError(
                f"{self.gate.what}: the session's local deadline passed while "
                f"{self.doing} was being sent"
            )
        mine = None if user is None else user - (time.monotonic() - started)
        if mine is not None and mine <= 0:
            raise httpcore.WriteTimeout(f"write timed out after {user:g}s")
        if left is None:
            return mine, False
        if mine is None or left < mine:
            return left, True
        return mine, False


#: The request being sent in this thread / task, if it goes through a fencing transport.
_SENDING: ContextVar[_Sending | None] = ContextVar("etcdfence_http_sending", default=None)


def _reset(sock: Any) -> None:
    """Make closing ``sock`` reset the connection (``SO_LINGER`` 0): the kernel drops
    what it had not sent yet instead of delivering it after the holder was lost."""
    with contextlib.suppress(Exception):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _GatedStream(httpcore.NetworkStream):
    """An httpcore connection stream whose writes check the holder and are bounded by
    its session's deadline at each socket send (see the module docstring)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        sock = inner.get_extra_info("socket")
        # httpcore's own stream: this class makes the socket sends itself (httpcore's
        # loop restarts the timeout at each send); another one is written through.
        own = isinstance(inner, SyncStream) and isinstance(sock, socket.socket)
        self._sock = sock if own else None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        sending = _SENDING.get()
        if sending is None:
            self._inner.write(buffer, timeout)
            return
        view = memoryview(buffer)
        while view:
            view = view[self._send(sending, view[:MAX_PIECE], timeout) :]

    def _send(self, sending: _Sending, piece: memoryview, timeout: float | None) -> int:
        """Send (some of) ``piece``; return how many bytes the kernel took."""
        started = time.monotonic()
        while True:
            limit, by_deadline = sending.limit(timeout, started)
            try:
                if self._sock is None:
                    self._inner.write(bytes(piece), limit)
                    return len(piece)
                self._sock.settimeout(limit)
                return int(self._sock.send(piece))
            except (TimeoutError, httpcore.WriteTimeout) as exc:
                if not by_deadline or self._sock is None:
                    sending.check()  # the holder lost meanwhile: say so
                    raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
                # the deadline bounded the wait: lost (limit() raises) or renewed
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        sending = _SENDING.get()
        if sending is not None and sending.lost:
            _reset(self._inner.get_extra_info("socket"))
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _GatedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _GatedBackend(httpcore.NetworkBackend):
    """The pool's network backend, its connections' streams wrapped in
    :class:`_GatedStream`."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _GatedStream(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _GatedStream(self._inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _asyncio_transport(stream: Any) -> tuple[Any, Any]:
    """The anyio socket stream under httpcore's asyncio stream and its asyncio
    transport, or ``(None, None)`` (trio, another backend)."""
    inner: Any = getattr(stream, "_stream", None)
    while hasattr(inner, "transport_stream"):  # TLS over the socket stream
        inner = inner.transport_stream
    transport = getattr(inner, "_transport", None)
    if not isinstance(transport, asyncio.WriteTransport):
        return None, None
    return inner, transport


class _AsyncGatedStream(httpcore.AsyncNetworkStream):
    """The asyncio twin of :class:`_GatedStream`. asyncio buffers what the socket does
    not take at once and sends it later, on its own: the transport's high-water mark
    is set to 0, so each write returns only once asyncio handed all of it to the
    kernel, and when the deadline cuts a write the transport is aborted, dropping what
    asyncio still held."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._raw, self._transport = _asyncio_transport(inner)
        if self._transport is not None:
            self._transport.set_write_buffer_limits(high=0)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        sending = _SENDING.get()
        if sending is None:
            await self._inner.write(buffer, timeout)
            return
        view = memoryview(buffer)
        try:
            for start in range(0, len(view), MAX_PIECE):
                await self._send(sending, bytes(view[start : start + MAX_PIECE]), timeout)
        except EtcdfenceError:
            self._abort()
            raise

    async def _send(self, sending: _Sending, piece: bytes, timeout: float | None) -> None:
        """Write ``piece`` and wait until asyncio handed all of it to the kernel."""
        started = time.monotonic()
        limit, by_deadline = sending.limit(timeout, started)
        try:
            await self._inner.write(piece, limit)
            return
        except httpcore.WriteTimeout:
            if not by_deadline or self._raw is None:
                sending.check()
                raise
        # The deadline bounded the wait; the piece is in asyncio's buffer (the last
        # write drained, so this one did not wait before it). Lost: limit() raises and
        # write() aborts; renewed meanwhile: wait for the drain again.
        while True:
            limit, by_deadline = sending.limit(timeout, started)
            try:
                with anyio.fail_after(limit):
                    await self._raw.send(b"")  # returns once the buffer is drained
                return
            except TimeoutError:
                if not by_deadline:
                    sending.check()
                    raise httpcore.WriteTimeout("write timed out") from None

    def _abort(self) -> None:
        """Reset the connection now, dropping what asyncio and the kernel still hold."""
        _reset(self._inner.get_extra_info("socket"))
        if self._transport is not None:
            self._transport.abort()

    async def aclose(self) -> None:
        sending = _SENDING.get()
        if sending is not None and sending.lost:
            self._abort()
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _AsyncGatedStream(stream)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _AsyncGatedBackend(httpcore.AsyncNetworkBackend):
    """The asyncio twin of :class:`_GatedBackend`."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _AsyncGatedStream(await self._inner.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _AsyncGatedStream(await self._inner.connect_unix_socket(*args, **kwargs))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _gate_writes(transport: Any, backend_type: type) -> bool:
    """Install the gated network backend in an httpx transport's httpcore pool (once);
    False when the transport has none (another transport: body pieces checked only)."""
    pool: Any = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:
        return False
    if not isinstance(backend, backend_type):
        pool._network_backend = backend_type(backend)
    return True


def _stamp(gate: _Gate, request: httpx.Request) -> tuple[_Sending, Any]:
    """Check the holder (raises: nothing sent) and put its token in the header; return
    the request's check and the caller's own ``trace`` hook."""
    doing = f"{request.method} {request.url}"
    token = gate.current(doing)
    # The full form (lock, cluster, key, ...) of a FencingToken: a bound resource checks
    # it; a holder's plain int (a TokenHolder of another lock service) goes bare.
    request.headers[HEADER] = (
        token.to_text() if isinstance(token, FencingToken) else str(int(token))
    )
    return _Sending(gate, token, doing), request.extensions.get("trace")


class _CheckedStream(httpx.SyncByteStream):
    """The request body, the holder re-checked before each chunk goes out."""

    def __init__(self, inner: Any, sending: _Sending) -> None:
        self._inner = inner
        self._sending = sending

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            # an empty chunk sends nothing: with no body, the headers end the request
            for piece in _pieces(chunk):
                self._sending.check()
                yield piece

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class _AsyncCheckedStream(httpx.AsyncByteStream):
    """The asyncio twin of :class:`_CheckedStream`."""

    def __init__(self, inner: Any, sending: _Sending) -> None:
        self._inner = inner
        self._sending = sending

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            # an empty chunk sends nothing: with no body, the headers end the request
            for piece in _pieces(chunk):
                self._sending.check()
                yield piece

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
        #: whether each socket write is checked and bounded (an httpx/httpcore transport)
        self.writes_gated = _gate_writes(self._inner, _GatedBackend)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sending, user_trace = _stamp(self._gate, request)
        request.stream = _CheckedStream(request.stream, sending)

        def trace(event: str, info: dict[str, Any]) -> None:
            if user_trace is not None:
                user_trace(event, info)
            if event.endswith(_HEADERS_EVENT):
                sending.check()

        request.extensions = {**request.extensions, "trace": trace}
        context = _SENDING.set(sending)
        try:
            return self._inner.handle_request(request)
        except httpx.WriteTimeout:
            sending.check()  # the holder was lost meanwhile: say so
            raise
        finally:
            _SENDING.reset(context)

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
        #: whether each socket write is checked and bounded (an httpx/httpcore transport)
        self.writes_gated = _gate_writes(self._inner, _AsyncGatedBackend)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sending, user_trace = _stamp(self._gate, request)
        request.stream = _AsyncCheckedStream(request.stream, sending)

        async def trace(event: str, info: dict[str, Any]) -> None:
            if user_trace is not None:
                await user_trace(event, info)
            if event.endswith(_HEADERS_EVENT):
                sending.check()

        request.extensions = {**request.extensions, "trace": trace}
        context = _SENDING.set(sending)
        try:
            return await self._inner.handle_async_request(request)
        except httpx.WriteTimeout:
            sending.check()  # the holder was lost meanwhile: say so
            raise
        finally:
            _SENDING.reset(context)

    async def aclose(self) -> None:
        await self._inner.aclose()

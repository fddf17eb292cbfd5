"""A TCP proxy that injects network faults between a client and etcd.

Use :class:`FaultProxy` when a test needs a *network* fault rather than a process fault:
a partition that leaves connections open but silent (:meth:`FaultProxy.blackhole`),
added latency (:meth:`FaultProxy.delay`), or a broken stream (:meth:`FaultProxy.reset`).
Point the client at :attr:`FaultProxy.endpoint` instead of the server. The proxy
forwards raw bytes, so it works for gRPC (HTTP/2), TLS and plain HTTP alike, and needs
no privileges. It runs an asyncio event loop in a daemon thread of its own; every
control method is synchronous, thread-safe and in effect when it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

__all__ = ["Direction", "FaultProxy"]

Direction = Literal["both", "upstream", "downstream"]
"""``upstream`` is client → server, ``downstream`` server → client."""

_T = TypeVar("_T")
_CHUNK = 64 * 1024
_QUEUE_CHUNKS = 64


def _split_target(target: str) -> tuple[str, str, int]:
    """``"https://host:port"`` / ``"host:port"`` → ``(scheme, host, port)``."""
    if "://" in target:
        parts = urlsplit(target)
        scheme = parts.scheme
        host, port = parts.hostname, parts.port
    else:
        scheme = ""
        parts = urlsplit("//" + target)
        host, port = parts.hostname, parts.port
    if not host or port is None:
        raise ValueError(f"target must look like [scheme://]host:port, got {target!r}")
    return scheme, host, port


def _directions(direction: Direction) -> tuple[str, ...]:
    if direction == "both":
        return ("upstream", "downstream")
    if direction in ("upstream", "downstream"):
        return (direction,)
    raise ValueError(f"direction must be 'both', 'upstream' or 'downstream', not {direction!r}")


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One proxied client connection and its upstream twin."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Future[str]] = []

    def abort(self) -> None:
        for task in self.tasks:
            task.cancel()
        _abort(self.client)
        _abort(self.upstream)


class FaultProxy:
    """A fault-injecting TCP proxy in front of ``target`` (``[scheme://]host:port``).

    The proxy listens as soon as it is constructed; use it as a context manager or call
    :meth:`close`. :attr:`endpoint` keeps the target's scheme (``http://`` when the target
    had none), so a TLS etcd stays ``https://``; use a server certificate valid for
    ``listen_host``.

    - :meth:`blackhole` — bytes in the chosen direction are silently dropped; connections
      stay open and nothing is reset, new connections are accepted but nothing gets
      through (a partition). With ``hold=True`` bytes are held back instead and delivered
      on :meth:`heal` (a partition that heals before TCP gives up).
    - :meth:`delay` — latency added to every chunk, order preserved.
    - :meth:`reset` — abort every current connection with a TCP RST.
    """

    def __init__(self, target: str, *, listen_host: str = "127.0.0.1", listen_port: int = 0):
        scheme, host, port = _split_target(target)
        self._target = target
        self._scheme = scheme or "http"
        self._target_host = host
        self._target_port = port
        self._listen_host = listen_host
        self._blackholed = {"upstream": False, "downstream": False}
        self._delays = {"upstream": 0.0, "downstream": 0.0}
        self._hold = False
        self._connections_total = 0
        self._conns: set[_Connection] = set()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._healed: dict[str, asyncio.Event] = {}
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(
            target=self._run_loop, name=f"FaultProxy({target})", daemon=True
        )
        self._thread.start()
        try:
            self._port = self._call(self._listen(listen_host, listen_port))
        except BaseException:
            self._stop_loop()
            raise

    # ------------------------------------------------------------ public API

    @property
    def target(self) -> str:
        """The address the proxy forwards to, as given."""
        return self._target

    @property
    def port(self) -> int:
        """The local port the proxy listens on."""
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` the proxy listens on (for clients that take no scheme)."""
        return f"{self._listen_host}:{self._port}"

    @property
    def endpoint(self) -> str:
        """``scheme://host:port`` of the proxy, with the target's scheme."""
        return f"{self._scheme}://{self.address}"

    @property
    def connections(self) -> int:
        """Number of client connections accepted so far (total, open or not)."""
        return self._connections_total

    @property
    def active_connections(self) -> int:
        """Number of currently open proxied connections."""
        return len(self._conns)

    @property
    def blackholed(self) -> tuple[str, ...]:
        """The directions currently blackholed (empty when healthy)."""
        return tuple(d for d, on in self._blackholed.items() if on)

    def blackhole(self, direction: Direction = "both", *, hold: bool = False) -> None:
        """Silently drop (or with ``hold=True``, hold back) bytes in ``direction``.

        Nothing is closed or reset, on either side: a client sees its requests time out,
        as in a network partition. Lasts until :meth:`heal`.
        """
        chosen = _directions(direction)

        async def apply() -> None:
            self._hold = hold
            for name in chosen:
                self._blackholed[name] = True
                self._healed[name].clear()

        self._call(apply())

    def heal(self) -> None:
        """End every blackhole: traffic flows again (held bytes are delivered)."""

        async def apply() -> None:
            for name in self._blackholed:
                self._blackholed[name] = False
                self._healed[name].set()

        self._call(apply())

    def delay(self, seconds: float, direction: Direction = "both") -> None:
        """Add ``seconds`` of latency to every chunk in ``direction`` (0 removes it).

        Applies to bytes read from now on; order is preserved.
        """
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        chosen = _directions(direction)

        async def apply() -> None:
            for name in chosen:
                self._delays[name] = float(seconds)

        self._call(apply())

    def reset(self) -> int:
        """Abort every open connection with a TCP RST (both sides); returns how many.

        The listener stays up: clients that reconnect get through (subject to any
        blackhole or delay still in force).
        """

        async def apply() -> int:
            conns = list(self._conns)
            self._conns.clear()
            for conn in conns:
                conn.abort()
            return len(conns)

        return self._call(apply())

    def close(self) -> None:
        """Stop listening, abort all connections and stop the proxy thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self._call(self._shutdown())
        self._stop_loop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        faults = []
        if self.blackholed:
            faults.append("blackhole=" + ",".join(self.blackholed))
        if any(self._delays.values()):
            faults.append(f"delay={self._delays}")
        return f"<FaultProxy {self.endpoint} -> {self._target} {' '.join(faults) or 'ok'}>"

    # ------------------------------------------------------------ loop plumbing

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(self._loop)
                for task in pending:
                    task.cancel()
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("FaultProxy is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _listen(self, host: str, port: int) -> int:
        self._healed = {name: asyncio.Event() for name in self._blackholed}
        for event in self._healed.values():
            event.set()
        self._server = await asyncio.start_server(self._handle, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()

    # ------------------------------------------------------------ forwarding

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self._connections_total += 1
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(self._target_host, self._target_port), timeout=10
            )
        except (OSError, asyncio.TimeoutError):
            # The target is down: pass that on as a reset, like a refused connection
            # (but a partitioned client learns nothing until the partition heals).
            await self._healed["downstream"].wait()
            _abort(client_writer)
            return
        conn = _Connection(client_writer, upstream_writer)
        self._conns.add(conn)
        conn.tasks = [
            asyncio.ensure_future(self._pump(client_reader, upstream_writer, "upstream")),
            asyncio.ensure_future(self._pump(upstream_reader, client_writer, "downstream")),
        ]
        try:
            for next_done in asyncio.as_completed(conn.tasks):
                if await next_done == "reset":
                    conn.abort()  # one side broke: break the other side too
                    break
        except asyncio.CancelledError:
            pass
        finally:
            if conn in self._conns:
                self._conns.discard(conn)
                client_writer.close()
                upstream_writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str
    ) -> str:
        """Move bytes one way, applying delay and blackhole at delivery time.

        Returns ``"eof"`` after a clean end of stream, ``"reset"`` when either side broke.
        """
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(_QUEUE_CHUNKS)
        loop = asyncio.get_running_loop()

        async def read() -> None:
            while True:
                try:
                    data: bytes | None = await reader.read(_CHUNK)
                except OSError:
                    data = None  # reset by peer
                await queue.put((loop.time() + self._delays[direction], data))
                if not data:
                    return

        reader_task = asyncio.ensure_future(read())
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    # A partition swallows FIN and RST too: pass the end on once healed.
                    await self._healed[direction].wait()
                    if data is None:
                        return "reset"
                    with contextlib.suppress(OSError, RuntimeError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return "eof"
                while self._blackholed[direction] and self._hold:
                    await self._healed[direction].wait()
                if self._blackholed[direction]:
                    continue  # dropped on the floor
                writer.write(data)
                try:
                    await writer.drain()
                except OSError:
                    return "reset"
        finally:
            reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader_task

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
import time
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
        # hold(): bytes in a held direction wait for release(); severed: the client side
        # is gone, but bytes already sent still reach the server.
        self.held = {"upstream": False, "downstream": False}
        self.released = {"upstream": asyncio.Event(), "downstream": asyncio.Event()}
        self.severed = False
        # the directions in which a blackhole dropped bytes of it: nothing after them
        # may get through there (TCP delivers in order or not at all); heal() resets it
        self.lost: set[str] = set()
        # bytes read from one side and not yet delivered to (or dropped for) the other
        self.pending = {"upstream": 0, "downstream": 0}

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
      through (a partition). A connection that lost bytes never delivers anything after
      them: :meth:`heal` resets it (a partition that outlasted TCP's retransmissions),
      while a connection that lost nothing carries on. With ``hold=True`` bytes are held
      back instead and delivered on :meth:`heal` (a partition that heals before TCP gives
      up).
    - :meth:`delay` — latency added to every chunk, order preserved.
    - :meth:`reset` — abort every current connection with a TCP RST.
    - :meth:`hold` / :meth:`release` — hold back the bytes of the connections open
      *now* (a request stuck in the network) while connections made later pass
      normally; :meth:`release` delivers the held bytes in order. :meth:`sever_held`
      makes the held clients give up while their bytes stay in flight.
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
        self._sever_linger = 1.0
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

        TCP never skips bytes: a real connection delivers in order or breaks. So a
        connection that had bytes dropped stays silent until :meth:`heal` resets it (as
        a connection whose retransmissions timed out); it is never resumed with a gap,
        which would lose whole messages of a protocol (say gRPC responses on an HTTP/2
        stream) without either side noticing.
        """
        chosen = _directions(direction)

        async def apply() -> None:
            self._hold = hold
            for name in chosen:
                self._blackholed[name] = True
                self._healed[name].clear()

        self._call(apply())

    def heal(self) -> None:
        """End every blackhole: traffic flows again (held bytes are delivered); the
        connections that lost bytes to it are reset (see :meth:`blackhole`)."""

        async def apply() -> None:
            # before anything flows again, so no byte after a lost one gets through
            for conn in [c for c in self._conns if c.lost]:
                self._conns.discard(conn)
                conn.abort()
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

    def hold(self, direction: Direction = "upstream") -> int:
        """Hold back, from now on, the bytes of every connection open *now*.

        Use it to keep one request "in the network": send it on a connection, call
        ``hold()`` before (or while) its bytes go out, do later work on a *new*
        connection (through the proxy or not; connections accepted after ``hold()``
        pass normally), then :meth:`release` the held bytes and see what they do.
        Bytes already delivered are not recalled. "Open now" means set up by the
        proxy: a connection that has completed a round trip through it certainly is
        (one merely accepted by the kernel a moment ago may not be yet). Returns how
        many connections are held. Default direction ``upstream`` (client → server):
        the server does not see the request; ``downstream`` holds the answers instead.
        """
        chosen = _directions(direction)

        async def apply() -> int:
            for conn in self._conns:
                for name in chosen:
                    conn.held[name] = True
                    conn.released[name].clear()
            return len(self._conns)

        return self._call(apply())

    @property
    def held_bytes(self) -> int:
        """Bytes currently held back by :meth:`hold` (0 when nothing is waiting): every
        byte a held connection received and has not delivered, however it was chunked."""
        return sum(
            conn.pending[name]
            for conn in list(self._conns)
            for name in ("upstream", "downstream")
            if conn.held[name]
        )

    def wait_held(self, minimum: int = 1, timeout: float = 10.0) -> int:
        """Wait until at least ``minimum`` bytes are held; return how many are.

        Use it after sending the request to be held, instead of a sleep. Raises
        ``TimeoutError`` when fewer arrive within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while self.held_bytes < minimum:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.held_bytes} bytes held, wanted {minimum}")
            time.sleep(0.01)
        return self.held_bytes

    def sever_held(self, linger: float = 1.0) -> int:
        """Make the clients of held connections give up: their sockets are reset (as a
        client timeout or crash would end them), but the bytes they already sent stay
        held and still reach the server on :meth:`release`, followed — ``linger``
        seconds later — by a clean end of stream (FIN, never a reset that could discard
        them). Answers the server sends are dropped. Returns how many connections were
        severed."""
        self._sever_linger = float(linger)

        async def apply() -> int:
            count = 0
            for conn in self._conns:
                if any(conn.held.values()) and not conn.severed:
                    conn.severed = True
                    _abort(conn.client)
                    count += 1
            return count

        return self._call(apply())

    def release(self) -> None:
        """End :meth:`hold`: deliver every held byte, in order, and pass traffic again."""

        async def apply() -> None:
            for conn in self._conns:
                for name in ("upstream", "downstream"):
                    conn.held[name] = False
                    conn.released[name].set()

        self._call(apply())

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
            asyncio.ensure_future(self._pump(client_reader, upstream_writer, "upstream", conn)),
            asyncio.ensure_future(self._pump(upstream_reader, client_writer, "downstream", conn)),
        ]
        try:
            for next_done in asyncio.as_completed(conn.tasks):
                if await next_done == "reset" and not conn.severed:
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
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
        conn: _Connection,
    ) -> str:
        """Move bytes one way, applying delay and blackhole at delivery time.

        Returns ``"eof"`` after a clean end of stream, ``"reset"`` when either side broke.
        """
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(_QUEUE_CHUNKS)
        loop = asyncio.get_running_loop()
        reader_task = asyncio.ensure_future(self._read(reader, queue, direction, conn))
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if conn.held[direction]:
                    await self._wait_released(conn, direction, data)
                if not data:
                    return await self._end_stream(writer, direction, conn, reset=data is None)
                conn.pending[direction] -= len(data)
                if await self._dropped(direction, conn):
                    continue
                writer.write(data)
                try:
                    await writer.drain()
                except OSError:
                    return "reset"
        finally:
            reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader_task

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes | None]],
        direction: str,
        conn: _Connection,
    ) -> None:
        """Queue what arrives with the time it is due (now + the delay); ``b""`` at the
        end of the stream, ``None`` when the peer reset it."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                data: bytes | None = await reader.read(_CHUNK)
            except OSError:
                data = None  # reset by peer
            conn.pending[direction] += len(data or b"")
            await queue.put((loop.time() + self._delays[direction], data))
            if not data:
                return

    async def _wait_released(self, conn: _Connection, direction: str, data: bytes | None) -> None:
        """hold(): this connection's bytes (and its end) wait for release()."""
        await conn.released[direction].wait()

    async def _end_stream(
        self, writer: asyncio.StreamWriter, direction: str, conn: _Connection, *, reset: bool
    ) -> str:
        """Pass the end of the stream on: ``"reset"``, or a FIN and ``"eof"``."""
        # A partition swallows FIN and RST too: pass the end on once healed.
        await self._healed[direction].wait()
        severed_client = conn.severed and direction == "upstream"
        if reset and not severed_client:
            return "reset"  # a severed client's bytes end with a clean FIN
        if severed_client:
            # like a slow network, the end of the stream arrives after the
            # bytes: the server handles the request before it sees the close
            await asyncio.sleep(self._sever_linger)
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
        return "eof"

    async def _dropped(self, direction: str, conn: _Connection) -> bool:
        """Whether the next bytes go nowhere: blackholed (or, holding, wait for the
        heal), or answers to a client that was severed."""
        while self._blackholed[direction] and self._hold:
            await self._healed[direction].wait()
        if self._blackholed[direction] or direction in conn.lost:
            conn.lost.add(direction)  # dropped on the floor: nothing after it may pass
            return True
        return conn.severed and direction == "downstream"  # the client is gone

"""A watch on one key or prefix that survives broken streams.

Used internally by locks (waiting for the key ahead to go), elections
(``observe``) and the leader elector. Each watch keeps the revision it has
delivered up to; when the stream breaks (endpoint down, proxy reset, auth token
expired) it reopens, on the next endpoint if needed, from that revision + 1, so
no event is lost or repeated. If etcd has compacted the revisions it needs, the
consumer gets :class:`CompactedError` — never a silent gap.
"""

from __future__ import annotations

from typing import Any

from .._wire import messages as m
from ..errors import AuthError, CompactedError, EtcdfenceError, EtcdUnavailableError, TLSError
from ..types import KeyValue, WatchBatch, WatchEvent
from . import _compat
from .connection import AsyncConnection, EtcdStream

_CLOSED = object()
#: Cancel reasons of a watch etcd refused: no permission, or an expired auth token.
_AUTH_CANCEL = ("permission denied", "invalid auth token", "revision in header is old")


def _batch(response: Any) -> WatchBatch:
    events = tuple(
        WatchEvent(
            "delete" if ev.type == m.EventType.DELETE else "put",
            KeyValue.from_wire(ev.kv),
            KeyValue.from_wire(ev.prev_kv) if ev.HasField("prev_kv") else None,
        )
        for ev in response.events
    )
    return WatchBatch(response.header.revision, events)


class AsyncWatch:
    """Iterate :class:`WatchBatch` es for a key (``range_end`` empty) or a range.

    Create it with :meth:`AsyncClient.watch`; ``aclose()`` it (or use it as a
    context manager) when done. ``get(timeout)`` waits for the next batch.
    """

    def __init__(
        self,
        conn: AsyncConnection,
        key: bytes,
        *,
        range_end: bytes = b"",
        start_revision: int = 0,
        prev_kv: bool = False,
    ) -> None:
        self._conn = conn
        self._key = key
        self._range_end = range_end
        self._next_revision = start_revision
        self._prev_kv = prev_kv
        self._queue: _compat.Queue[Any] = _compat.Queue()
        self._closed = False
        self._stop = _compat.Event()  # set by close(): the stream loop ends
        self._auth_retried = False
        self._token: str | None = None
        self._stream: EtcdStream | None = None
        self._worker: _compat.Background | None = None
        self._created = _compat.Event()
        self._created_revision = 0

    async def start(self, timeout: float | None = None) -> AsyncWatch:
        """Open the watch and return once etcd confirmed it: every change after
        ``start()`` returns is delivered (and, with ``start_revision``, every change
        from that revision on).

        Raises :class:`EtcdUnavailableError` (and closes the watch) if etcd did not confirm
        it within ``timeout`` (default: the client's timeout).
        """
        if self._worker is None:
            self._worker = _compat.Background(self._run, name=f"etcdfence-watch-{self._key!r}")
        wait = self._conn.timeout if timeout is None else timeout
        if not await _compat.wait_event(self._created, wait):
            await self.aclose()
            raise EtcdUnavailableError(
                f"watch on {self._key!r} was not confirmed by etcd within {wait:g}s"
            )
        return self

    @property
    def created_revision(self) -> int:
        """The revision etcd created the watch at (0 before confirmation)."""
        return self._created_revision

    @property
    def next_revision(self) -> int:
        """The revision this watch resumes from after a broken stream."""
        return self._next_revision

    def interrupt(self, error: BaseException) -> None:
        """Make the consumer's pending or next ``get`` raise ``error`` (and end a
        pending ``start`` at once)."""
        _compat.queue_put(self._queue, error)
        self._created.set()

    async def _run(self) -> None:
        try:
            await self._conn.keep_stream("Watch", self._follow, stop=self._stop, fatal=self._fatal)
        except EtcdfenceError as err:
            _compat.queue_put(self._queue, err)

    async def _follow(self, stream: EtcdStream) -> None:
        """Create the watch on ``stream`` (from where it left off) and deliver events
        until the stream breaks (raises) or the watch is closed."""
        self._stream = stream
        self._token = self._conn.token
        try:
            create = m.WatchCreateRequest(
                key=self._key,
                range_end=self._range_end,
                start_revision=self._next_revision,
                prev_kv=self._prev_kv,
                progress_notify=True,
            )
            await stream.write(m.WatchRequest(create_request=create))
            while not self._stop.is_set():
                response = await stream.read()
                if response is None:
                    raise EtcdUnavailableError("etcd ended the watch stream")
                self._handle(response)
        finally:
            self._stream = None

    def _handle(self, response: Any) -> None:
        if response.compact_revision:
            raise CompactedError(
                f"watch on {self._key!r} needs revision {self._next_revision}, "
                f"compacted up to {response.compact_revision}",
                response.compact_revision,
            )
        if response.canceled:
            reason = response.cancel_reason or "watch canceled by etcd"
            if any(hint in reason for hint in _AUTH_CANCEL):
                raise AuthError(f"watch on {self._key!r} refused: {reason}")
            raise EtcdUnavailableError(f"watch on {self._key!r} canceled: {reason}")
        if response.created:
            self._auth_retried = False
            if not self._created.is_set():
                self._created_revision = response.header.revision
                self._created.set()
            if self._next_revision == 0:
                self._next_revision = response.header.revision + 1
            return
        if response.events:
            self._next_revision = response.events[-1].kv.mod_revision + 1
            _compat.queue_put(self._queue, _batch(response))
        else:  # progress notification: everything up to header.revision is delivered
            self._next_revision = max(self._next_revision, response.header.revision + 1)

    async def _fatal(self, error: EtcdfenceError) -> bool:
        """Whether ``error`` ends the watch (it is then delivered to the consumer)."""
        if isinstance(error, AuthError) and not isinstance(error, TLSError):
            if not self._auth_retried:
                # etcd checks the token when a watch is created and reports an expired
                # one as "invalid auth token" (3.4) or "permission denied" (3.5): get a
                # fresh token and try once more before calling it a denial.
                self._auth_retried = True
                try:
                    if await self._conn.reauthenticate(self._token):
                        return False
                except AuthError:
                    return True
                except EtcdfenceError:
                    self._auth_retried = False
                    return False
            return True
        if self._conn.closed:  # nothing reconnects: end instead of waiting forever
            raise EtcdUnavailableError(f"watch on {self._key!r} ended: the client is closed")
        return isinstance(error, CompactedError)

    async def get(self, timeout: float | None = None) -> WatchBatch:
        """The next batch; raises :class:`TimeoutError` after ``timeout`` seconds,
        :class:`CompactedError` if history is gone, :class:`StopAsyncIteration` once closed."""
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await _compat.queue_get(self._queue, timeout)
        if item is _CLOSED:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        batch: WatchBatch = item
        return batch

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> WatchBatch:
        return await self.get()

    async def aclose(self) -> None:
        """Stop watching (cancels the stream)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        _compat.queue_put(self._queue, _CLOSED)
        if self._worker is not None:
            self._worker.cancel()
            await self._worker.join(1.0)

    async def __aenter__(self) -> AsyncWatch:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

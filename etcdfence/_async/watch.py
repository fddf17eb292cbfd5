"""Watches on keys and prefixes, all of one client on one stream, surviving breaks.

Used by locks (waiting for the key ahead to go), elections (``observe``), the leader
elector and users (``client.watch``). Every watch of a client shares one ``Watch``
stream (:class:`AsyncWatchHub`), the way Go's clientv3 multiplexes them: each is
created on it with its own id (etcd 3.4+ takes a client-chosen ``watch_id``), its
events are routed by that id, and it is cancelled by id. Each watch keeps the
revision it has delivered up to; when the stream breaks (endpoint down, proxy reset,
auth token expired) the hub reopens it, on the next endpoint if needed, and every
watch resumes from its own revision + 1, so no event is lost or repeated. If etcd has
compacted the revisions one watch needs, that watch's consumer gets
:class:`CompactedError` — never a silent gap — and the others go on.

Watches are created with ``fragment`` set: etcd splits a response larger than its
request limit (a catch-up of many large values) into fragments, each well below the
client's receive limit. Each fragment's whole revisions are delivered at once; the
events of its last revision wait for the next fragment (a break in between resumes from
that revision, which etcd then sends whole). A response that still exceeds the receive
limit breaks the shared stream, and gRPC does not say for which watch. The hub then
probes: every watch becomes a suspect, and suspects are created again one at a time;
one that kept the stream up for :data:`PROBE_WINDOW` after etcd confirmed it is
cleared and stays on the stream. While probing, the stream carries only cleared
watches and the one probe: anything else that wants to be created (a new watch, a
paused one resuming) becomes a suspect and waits its turn. A probe is blamed only when
it was alone on the stream (nothing else could have sent the response): its consumer
gets an :class:`RequestError` ("cannot resume") while the others go on — an error,
never a stream reopening in a loop, and never an error for a watch that did not cause
it. A probe that breaks the stream beside cleared watches (one of them may have got a
large event since) is tried again alone, the cleared ones held back meanwhile: blamed
if it breaks it again, else it is cleared and the held ones become suspects again.

A slow consumer never stalls the others: each watch buffers at most ``buffer`` batches.
When its buffer is full the hub cancels that watch at etcd (pauses it) and drops what
was in flight for it; once the consumer has drained the buffer to half, the watch is
created again from the revision after the last buffered batch. Nothing is lost or
repeated (etcd replays the history), nothing grows without bound, and a consumer that
falls so far behind that etcd compacted the history gets :class:`CompactedError`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
from typing import Any

from .._log import log
from .._raise import own_copy
from .._wire import messages as m
from ..errors import (
    AuthError,
    AuthTokenExpiredError,
    CompactedError,
    EtcdfenceError,
    InvalidArgumentError,
    RequestError,
    TLSError,
    UnavailableError,
)
from ..types import KeyValue, WatchBatch, WatchEvent
from . import _compat
from .connection import AsyncConnection, EtcdStream

_CLOSED = object()
#: Batches a watch buffers for its consumer before it is paused at etcd.
DEFAULT_BUFFER = 1024
#: Cancel reasons of a watch etcd refused: no permission, or an expired auth token.
_AUTH_CANCEL = ("permission denied", "invalid auth token", "revision in header is old")
#: Seconds a watch created alone after an oversized response must keep the stream up
#: before the next suspect is created (etcd replays history every 100 ms).
PROBE_WINDOW = 1.0


def _too_large(error: EtcdfenceError) -> bool:
    """Whether the stream broke on a response above the client's receive limit."""
    return isinstance(error, RequestError) and "larger than max" in str(error)


def _events(response: Any) -> tuple[WatchEvent, ...]:
    return tuple(
        WatchEvent(
            "delete" if ev.type == m.EventType.DELETE else "put",
            KeyValue.from_wire(ev.kv),
            KeyValue.from_wire(ev.prev_kv) if ev.HasField("prev_kv") else None,
        )
        for ev in response.events
    )


class AsyncWatchHub:
    """One ``Watch`` stream for every watch of a client (see the module docstring).

    The client creates it; watches register on ``start`` and leave on ``aclose``.
    """

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        conn.watches = self
        self._ids = itertools.count(1)
        self._guard = threading.Lock()
        self._active: dict[int, AsyncWatch] = {}  # watch id on the current stream -> watch
        self._watches: set[AsyncWatch] = set()  # every registered watch
        self._outbox: _compat.Queue[Any] = _compat.Queue()
        self._stop = _compat.Event()
        self._worker: _compat.Background | None = None
        self._stream_number = 0  # counts the streams opened (one per _serve)
        self._creating: collections.deque[AsyncWatch] = collections.deque()  # unconfirmed
        self._reauth_stream = -1  # the stream on which a re-authentication was asked for
        self._token: str | None = None
        # After a response above the receive limit broke the stream (see the module
        # docstring): the watches waiting to be probed; the probe on the stream and when
        # etcd confirmed it; the watches cleared since probing began; the cleared ones
        # held off the stream while the probe is tried alone; every watch created on
        # the current stream (anything it carried may have sent the response).
        self._suspects: list[AsyncWatch] = []
        self._probe: AsyncWatch | None = None
        self._probe_since: float | None = None
        self._cleared: set[AsyncWatch] = set()
        self._held: list[AsyncWatch] = []
        self._on_stream: set[AsyncWatch] = set()

    def register(self, watch: AsyncWatch) -> None:
        """Create ``watch`` on the shared stream (opening it on first use)."""
        with self._guard:
            self._watches.add(watch)
            if self._worker is None:
                self._worker = _compat.Background(self._run, name="etcdfence-watches")
        _compat.queue_put(self._outbox, ("create", watch))

    def unregister(self, watch: AsyncWatch) -> None:
        """Cancel ``watch`` at etcd and forget it."""
        with self._guard:
            self._watches.discard(watch)
            wid = watch.hub_id
            known = self._active.pop(wid, None) is watch
        if known:
            _compat.queue_put(self._outbox, ("cancel", wid))

    def pause(self, watch: AsyncWatch) -> None:
        """Cancel ``watch`` at etcd while its consumer's buffer is full (see the module
        docstring); events in flight for it are dropped and replayed on :meth:`resume`."""
        with self._guard:
            wid = watch.hub_id
            if watch.paused or self._active.get(wid) is not watch:
                return
            del self._active[wid]
            watch.paused = True
            self._cleared.discard(watch)  # it resumes from a revision not yet probed
        log.debug("etcdfence.watch_paused", key=watch.key, next_revision=watch.next_revision)
        _compat.queue_put(self._outbox, ("cancel", wid))

    def resume(self, watch: AsyncWatch) -> None:
        """Create a paused ``watch`` again from the revision after its last buffered batch."""
        with self._guard:
            if not watch.paused:
                return
            watch.paused = False
            if watch not in self._watches:
                return
        _compat.queue_put(self._outbox, ("create", watch))

    def __len__(self) -> int:
        return len(self._watches)

    async def aclose(self) -> None:
        """Stop the stream; every watch still open ends with an error."""
        self._stop.set()
        _compat.queue_put(self._outbox, ("stop", None))
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            await worker.join(2.0)
        closed = UnavailableError("watch ended: the client is closed")
        for watch in list(self._watches):
            watch.interrupt(closed)

    # -- the stream -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._conn.keep_stream("Watch", self._serve, stop=self._stop, fatal=self._fatal)
        except EtcdfenceError as err:
            for watch in list(self._watches):
                watch.interrupt(err)

    async def _serve(self, stream: EtcdStream) -> None:
        """(Re)create every registered watch from its own revision, then send creates
        and cancels as they come while a reader routes the answers."""
        with self._guard:
            self._stream_number += 1
            self._active.clear()
            self._creating.clear()
            self._on_stream = set()
            if self._probe is not None:  # another break cut its window: probe it again
                self._suspects.insert(0, self._probe)
                self._probe = None
            if self._probing():  # only the cleared ones; the suspects wait their turn
                resume = [w for w in self._cleared if self._alive(w)]
            else:
                resume = [w for w in self._watches if not w.paused]
        self._token = self._conn.token
        for watch in resume:
            await self._create(stream, watch)
        broken: list[BaseException] = []
        reader = _compat.Background(self._read, stream, broken, name="etcdfence-watch-read")
        try:
            while not self._stop.is_set():
                if broken:
                    raise broken[0]
                await self._next_probe(stream)
                try:
                    wait = PROBE_WINDOW / 4 if self._probing() else 0.5
                    kind, item = await _compat.queue_get(self._outbox, wait)
                except TimeoutError:
                    continue
                if kind == "create" and self._wanted(item):
                    await self._create(stream, item)
                elif kind == "cancel":
                    request = m.WatchRequest(cancel_request=m.WatchCancelRequest(watch_id=item))
                    await stream.write(request)
                elif kind == "reauth":  # reopen the stream with a fresh token
                    raise AuthTokenExpiredError("a watch was refused with an expired token")
        finally:
            stream.cancel()
            reader.cancel()

    def _probing(self) -> bool:
        """Whether an oversized response is being traced (see the module docstring)."""
        return bool(self._suspects or self._probe is not None or self._held)

    def _alive(self, watch: AsyncWatch) -> bool:
        """Registered and not paused (the guard is held)."""
        return watch in self._watches and not watch.paused

    def _wanted(self, watch: AsyncWatch) -> bool:
        """Whether a queued create is to be sent now: the watch is not closed, paused or
        created since, and, while probing, it is cleared — else it joins the suspects
        and waits for its turn (it may be the one whose responses are too large)."""
        with self._guard:
            if not self._alive(watch) or watch.hub_id in self._active:
                return False
            if not self._probing() or watch in self._cleared:
                return True
            if watch is not self._probe and watch not in self._suspects:
                self._suspects.append(watch)
            return False

    async def _next_probe(self, stream: EtcdStream) -> None:
        """Clear the probe once it kept the stream up for :data:`PROBE_WINDOW` after
        etcd confirmed it, then create the next suspect (see :meth:`_oversized`)."""
        with self._guard:
            probe = self._probe
            if probe is not None and self._alive(probe):
                since = self._probe_since
                if since is None or _compat.monotonic() - since < PROBE_WINDOW:
                    return
                self._cleared.add(probe)
            self._probe = None
            if probe is not None and self._held:
                # it was tried alone and is innocent: the break it was tried for came
                # from one of the cleared watches held back (a large event since)
                self._suspects.extend(w for w in self._held if w not in self._suspects)
                self._held = []
            while True:
                if not self._suspects and self._held:  # the one tried alone is gone
                    self._suspects, self._held = self._held, []
                if not self._suspects:
                    self._cleared.clear()  # every suspect cleared or gone: probing is over
                    return
                watch = self._suspects.pop(0)
                if self._alive(watch) and watch.hub_id not in self._active:
                    self._probe, self._probe_since = watch, None
                    break
        await self._create(stream, watch)

    def _oversized(self, error: EtcdfenceError) -> None:
        """A response above the client's receive limit broke the stream. gRPC does not
        say for which watch. If the probe was alone on the stream, it is that one: it
        cannot resume and its consumer gets the error. If cleared watches were on the
        stream beside it, any of them may have got a large event since: the probe is
        tried again alone, the cleared ones held back. Without a probe, every watch
        becomes a suspect, created again one at a time."""
        with self._guard:
            probe, self._probe = self._probe, None
            if probe is not None and self._on_stream == {probe}:
                self._watches.discard(probe)
                self._cleared.update(self._held)
                self._held = []
            elif probe is not None:
                self._held.extend(self._cleared)
                self._cleared.clear()
                self._suspects.insert(0, probe)
                probe = None
            else:
                queued = set(self._suspects)
                self._suspects.extend(w for w in self._watches if not w.paused and w not in queued)
                self._cleared.clear()
        if probe is None:
            log.warning("etcdfence.watch_response_too_large", error=str(error))
            return
        probe.interrupt(
            RequestError(
                f"watch on {probe.key!r} cannot resume from revision {probe.next_revision}:"
                f" etcd's response exceeds the client's receive limit ({error})"
            )
        )

    async def _create(self, stream: EtcdStream, watch: AsyncWatch) -> None:
        watch_id = next(self._ids)
        with self._guard:
            self._active[watch_id] = watch
            watch.hub_id = watch_id
            self._creating.append(watch)
            self._on_stream.add(watch)
        await stream.write(m.WatchRequest(create_request=watch.create_request(watch_id)))

    async def _read(self, stream: EtcdStream, broken: list[BaseException]) -> None:
        try:
            while True:
                response = await stream.read()
                if response is None:
                    raise UnavailableError("etcd ended the watch stream")
                self._route(response)
        except BaseException as err:  # the writer raises it; keep_stream reopens
            broken.append(err)
            _compat.queue_put(self._outbox, ("wake", None))

    def _route(self, response: Any) -> None:
        with self._guard:
            watch = self._active.get(response.watch_id)
            if watch is None and response.watch_id == -1 and response.canceled and self._creating:
                # etcd 3.4 refuses a create without echoing its id (watch_id -1): creates
                # are answered in order, so it is the oldest one not yet confirmed
                watch = self._creating.popleft()
                self._active.pop(watch.hub_id, None)
            elif watch is not None and (response.canceled or response.compact_revision):
                del self._active[response.watch_id]
            if watch is not None and (response.created or response.canceled):
                with contextlib.suppress(ValueError):
                    self._creating.remove(watch)
            if response.created and watch is self._probe and self._probe_since is None:
                self._probe_since = _compat.monotonic()  # its probe window starts now
        if watch is None:
            return  # cancelled by us, or a whole-stream progress notification
        if response.compact_revision or response.canceled:
            self._ended(watch, response)
        elif response.created:
            watch.auth_retried = False
            watch.confirmed(response.header.revision)
        elif response.events or response.fragment:
            watch.receive(response.header.revision, _events(response), response.fragment)
        else:  # progress notification: everything up to header.revision is delivered
            watch.progress(response.header.revision)

    def _ended(self, watch: AsyncWatch, response: Any) -> None:
        """etcd cancelled one watch: compaction or a refusal reach only its consumer."""
        if response.compact_revision:
            error: EtcdfenceError = CompactedError(
                f"watch on {watch.key!r} needs revision {watch.next_revision}, "
                f"compacted up to {response.compact_revision}",
                response.compact_revision,
            )
        else:
            reason = response.cancel_reason or "watch canceled by etcd"
            if any(hint in reason for hint in _AUTH_CANCEL):
                error = AuthError(f"watch on {watch.key!r} refused: {reason}")
                if not watch.auth_retried:
                    # etcd checks the token when a watch is created and reports an
                    # expired one as "invalid auth token" (3.4) or "permission denied"
                    # (3.5): reopen the stream with a fresh token (once per stream, however
                    # many watches were refused) and create this watch again, once.
                    watch.auth_retried = True
                    if self._reauth_stream != self._stream_number:
                        self._reauth_stream = self._stream_number
                        _compat.queue_put(self._outbox, ("reauth", None))
                    return
            else:
                error = UnavailableError(f"watch on {watch.key!r} canceled: {reason}")
        with self._guard:
            self._watches.discard(watch)
        watch.interrupt(error)

    async def _fatal(self, error: EtcdfenceError) -> bool:
        """Whether ``error`` ends every watch (it is then delivered to each)."""
        if _too_large(error):
            self._oversized(error)
            return False
        if isinstance(error, AuthError) and not isinstance(error, TLSError):
            try:
                return not await self._conn.reauthenticate(self._token)
            except AuthError:
                return True
            except EtcdfenceError:
                return False
        if self._conn.closed:
            raise UnavailableError("watches ended: the client is closed")
        log.debug("etcdfence.watch_stream_retry", error=str(error))
        return False


class AsyncWatch:
    """Iterate :class:`WatchBatch` es for a key (``range_end`` empty) or a range.

    Create it with :meth:`AsyncClient.watch`; ``aclose()`` it (or use it as a
    context manager) when done. ``get(timeout)`` waits for the next batch. At most
    ``buffer`` batches wait for the consumer; a full buffer pauses the watch at etcd
    until the consumer catches up (no event is lost; see the module docstring).
    """

    def __init__(
        self,
        conn: AsyncConnection,
        key: bytes,
        *,
        range_end: bytes = b"",
        start_revision: int = 0,
        prev_kv: bool = False,
        buffer: int = DEFAULT_BUFFER,
    ) -> None:
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 2:
            raise InvalidArgumentError(f"watch buffer must be an int >= 2 batches, not {buffer!r}")
        self._conn = conn
        self._buffer = buffer
        self._key = key
        self._range_end = range_end
        self._next_revision = start_revision
        self._prev_kv = prev_kv
        self._queue: _compat.Queue[Any] = _compat.Queue()
        self._closed = False
        self._started = False
        self._created = _compat.Event()
        self._created_revision = 0
        self.hub_id = 0  # its id on the hub's current stream (0: not created there)
        self.auth_retried = False  # refused for auth once: created again after a new token
        self.paused = False  # cancelled at etcd while the buffer is full (the hub's guard)
        self._partial: tuple[WatchEvent, ...] = ()  # a revision split across fragments

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self, timeout: float | None = None) -> AsyncWatch:
        """Open the watch and return once etcd confirmed it: every change after
        ``start()`` returns is delivered (and, with ``start_revision``, every change
        from that revision on).

        Raises :class:`UnavailableError` (and closes the watch) if etcd did not confirm
        it within ``timeout`` (default: the client's timeout).
        """
        if not self._started:
            self._started = True
            if self._closed:  # closed before it started: nothing to create at etcd
                return self
            hub: AsyncWatchHub = self._conn.watches
            hub.register(self)
        wait = self._conn.timeout if timeout is None else timeout
        if not await _compat.wait_event(self._created, wait):
            await self.aclose()
            raise UnavailableError(
                f"watch on {self._key!r} was not confirmed by etcd within {wait:g}s"
            )
        return self

    @property
    def created_revision(self) -> int:
        """The revision etcd created the watch at (0 before confirmation)."""
        return self._created_revision

    @property
    def pending(self) -> int:
        """Batches delivered by etcd and not yet taken by the consumer."""
        return self._queue.qsize()

    @property
    def next_revision(self) -> int:
        """The revision this watch resumes from after a broken stream."""
        return self._next_revision

    def interrupt(self, error: BaseException) -> None:
        """Make the consumer's pending or next ``get`` raise ``error`` (and end a
        pending ``start`` at once). Each watch raises its own copy (``_raise.py``)."""
        _compat.queue_put(self._queue, own_copy(error))
        self._created.set()

    # -- what the hub calls ------------------------------------------------------------------

    def create_request(self, watch_id: int) -> Any:
        """The create request that (re)starts this watch where it left off."""
        self._partial = ()  # etcd sends that revision again, whole
        return m.WatchCreateRequest(
            key=self._key,
            range_end=self._range_end,
            start_revision=self._next_revision,
            prev_kv=self._prev_kv,
            progress_notify=True,
            watch_id=watch_id,
            fragment=True,
        )

    def confirmed(self, revision: int) -> None:
        if not self._created.is_set():
            self._created_revision = revision
            self._created.set()
        if self._next_revision == 0:
            self._next_revision = revision + 1

    def receive(self, revision: int, events: tuple[WatchEvent, ...], more: bool) -> None:
        """Events of one response, or of one fragment of it (``more``: others follow).
        Whole revisions are delivered; the last revision of a fragment may go on in the
        next one, so its events wait for it."""
        events = self._partial + events
        self._partial = ()
        if more and events:
            last = events[-1].kv.mod_revision
            cut = len(events)
            while cut and events[cut - 1].kv.mod_revision == last:
                cut -= 1
            events, self._partial = events[:cut], events[cut:]
        if events:
            self.deliver(WatchBatch(revision, events))

    def deliver(self, batch: WatchBatch) -> None:
        self._next_revision = batch.events[-1].kv.mod_revision + 1
        _compat.queue_put(self._queue, batch)
        if self._queue.qsize() >= self._buffer:
            hub: AsyncWatchHub = self._conn.watches
            hub.pause(self)

    def progress(self, revision: int) -> None:
        self._next_revision = max(self._next_revision, revision + 1)

    # -- the consumer's side -------------------------------------------------------------------

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
        if self.paused and self._queue.qsize() <= self._buffer // 2:
            hub: AsyncWatchHub = self._conn.watches
            hub.resume(self)
        batch: WatchBatch = item
        return batch

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> WatchBatch:
        return await self.get()

    async def aclose(self) -> None:
        """Stop watching (cancels it at etcd)."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            hub: AsyncWatchHub = self._conn.watches
            hub.unregister(self)
        _compat.queue_put(self._queue, _CLOSED)
        self._created.set()  # a start() still waiting for etcd returns now: iteration ends

    async def __aenter__(self) -> AsyncWatch:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

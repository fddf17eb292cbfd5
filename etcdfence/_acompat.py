"""The few real differences between the asyncio and the threaded implementation.

Everything in ``etcdfence/_async`` is written once and turned into ``etcdfence/_sync``
by ``tools/async_to_sync.py``. What cannot be written once lives here, each primitive
with its two forms side by side: the async form first, named with an ``A``/``a``
prefix (``AEvent``, ``asleep``), then the sync form under the plain name (``Event``,
``sleep``). Events, queues, sleeping, background work, gRPC channels and
bidirectional streams, and how a leader's ``work`` is run and stopped.

The async modules reach these through ``_async/_compat.py``, a table that binds each
async form to the plain name; the generator's names map turns that table into
``_sync/_compat.py``, which binds the sync forms. ``tests/test_twin.py`` checks that
every pair exists and that the two forms take the same arguments.

Add a primitive here as a pair, then one line in ``_async/_compat.py`` and one entry
in ``COMPAT_NAMES`` in ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import queue as _queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
import grpc.aio

from . import _primitives
from .errors import InvalidTypeError

T = TypeVar("T")

# --- shared by both sides -------------------------------------------------------------

monotonic = time.monotonic

# Sleeping and locks live in _primitives.py (no gRPC there: the fence engine uses them).
asleep = _primitives.asleep
sleep = _primitives.sleep

# --- plain types --------------------------------------------------------------------

AIS_ASYNC = True
IS_ASYNC = False

AEvent = asyncio.Event
Event = threading.Event

ALock = _primitives.ALock
Lock = _primitives.Lock

AQueue = asyncio.Queue
Queue = _queue.Queue


AChannel = grpc.aio.Channel
Channel = grpc.Channel


class ASignal:
    """A flag set once that tasks wait for: ``asyncio.Event`` without its eager deque
    (624 bytes), for what every session and queued waiter holds (10,000 of them)."""

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        """Whether :meth:`set` was called."""
        return self._value

    def set(self) -> None:
        """Set the flag and wake every waiter (once; later calls do nothing)."""
        if self._value:
            return
        self._value = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or ``timeout`` passes; return whether it is set."""
        if self._value:
            return True
        if timeout is not None and timeout <= 0:
            return False
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            return self._value
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


class Signal:
    """A flag set once that threads wait for (a ``threading.Event``; the async twin's is
    lighter than ``asyncio.Event``)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def is_set(self) -> bool:
        """Whether :meth:`set` was called."""
        return self._event.is_set()

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or ``timeout`` passes; return whether it is set."""
        if timeout is not None and timeout <= 0:
            return self._event.is_set()
        return self._event.wait(timeout)


class ASlots:
    """At most ``n`` holders at once (an asyncio semaphore; a thread one in the sync twin)."""

    def __init__(self, n: int) -> None:
        self._semaphore = asyncio.Semaphore(n)

    async def take(self, timeout: float) -> bool:
        """Take a slot within ``timeout`` seconds; return whether it was taken."""
        if not self._semaphore.locked():
            await self._semaphore.acquire()  # free: returns at once
            return True
        try:
            await asyncio.wait_for(self._semaphore.acquire(), max(timeout, 0.0))
        except asyncio.TimeoutError:
            return False
        return True

    def release(self) -> None:
        """Give a taken slot back."""
        self._semaphore.release()


class Slots:
    """At most ``n`` holders at once (a thread semaphore; an asyncio one in the async twin)."""

    def __init__(self, n: int) -> None:
        self._semaphore = threading.Semaphore(n)

    def take(self, timeout: float) -> bool:
        """Take a slot within ``timeout`` seconds; return whether it was taken."""
        return self._semaphore.acquire(timeout=max(timeout, 0.0))

    def release(self) -> None:
        """Give a taken slot back."""
        self._semaphore.release()


#: What awaiting a gRPC call raises when its channel was closed under it (fail-over).
AAborted = asyncio.CancelledError


class Aborted(Exception):
    """Never raised here: a closed channel fails blocking calls with CANCELLED."""


# --- cancellation -------------------------------------------------------------------


def astill_wanted() -> bool:
    """False if the current task is being cancelled (so a CancelledError is its own)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return not (cancelling is not None and cancelling())


def still_wanted() -> bool:
    """Threads are not cancelled."""
    return True


async def auncancellable(work: Coroutine[Any, Any, T]) -> T:
    """Run cleanup ``work`` to its end even if the calling task is cancelled meanwhile.

    A second cancellation (``wait_for`` timing out during cleanup, a task group
    shutting down) still reaches the caller, but the cleanup goes on in the
    background instead of being abandoned half-way.
    """
    return await asyncio.shield(asyncio.ensure_future(work))


def uncancellable(work: T) -> T:
    """Threads are not cancelled: the cleanup ``work`` already ran when this is called
    (``work`` is its result)."""
    return work


# --- waiting ------------------------------------------------------------------------


async def await_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` passes; return whether it is set."""
    if event.is_set():
        return True
    if timeout is not None and timeout <= 0:
        return False
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return event.is_set()
    return True


def wait_event(event: threading.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` passes; return whether it is set."""
    if timeout is not None and timeout <= 0:
        return event.is_set()
    return event.wait(timeout)


async def aqueue_get(queue: asyncio.Queue[T], timeout: float | None) -> T:
    """Next item of ``queue``; raises :class:`TimeoutError` after ``timeout``."""
    if timeout is None:
        return await queue.get()
    if timeout <= 0:
        try:
            return queue.get_nowait()
        except asyncio.QueueEmpty:
            raise TimeoutError from None
    try:
        return await asyncio.wait_for(queue.get(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError from None


def queue_get(queue: _queue.Queue[T], timeout: float | None) -> T:
    """Next item of ``queue``; raises :class:`TimeoutError` after ``timeout``."""
    try:
        if timeout is not None and timeout <= 0:
            return queue.get_nowait()
        return queue.get(timeout=timeout)
    except _queue.Empty:
        raise TimeoutError from None


def aqueue_put(queue: asyncio.Queue[T], item: T) -> None:
    """Put without blocking (queues here are unbounded)."""
    queue.put_nowait(item)


def queue_put(queue: _queue.Queue[T], item: T) -> None:
    """Put without blocking (queues here are unbounded)."""
    queue.put_nowait(item)


# --- running work -------------------------------------------------------------------


async def arun_blocking(func: Callable[..., T], *args: Any) -> T:
    """Run a short blocking call (a socket probe) off the event loop."""
    return await asyncio.to_thread(func, *args)


def run_blocking(func: Callable[..., T], *args: Any) -> T:
    """Run a short blocking call (a socket probe) right here."""
    return func(*args)


def aspawn(work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Start ``work`` now as its own task (the sync twin just runs it)."""
    return asyncio.ensure_future(work)


def spawn(work: T) -> T:
    """The request already ran (threads block in the call itself): ``work`` is its result."""
    return work


async def asettle(future: asyncio.Future[T]) -> T:
    """Await a :func:`spawn` ed request without cancelling it when the caller is
    cancelled: a request that may already be at the server runs to its reply, so
    :func:`outcome` can still learn what it did."""
    return await asyncio.shield(future)


def settle(future: T) -> T:
    """The result of a :func:`spawn` ed request (it already ran)."""
    return future


async def aoutcome(future: asyncio.Future[T]) -> T | None:
    """The result of a :func:`spawn` ed request once it finished, ``None`` if it failed."""
    try:
        return await future
    except BaseException:
        return None


def outcome(future: T) -> T | None:
    """The result of a :func:`spawn` ed request (it already ran)."""
    return future


def aowner_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running now (captured by objects that other threads may poke)."""
    return asyncio.get_running_loop()


def owner_loop() -> Any:
    """No event loop in the threaded twin (always ``None``)."""
    return None


def acall_threadsafe(loop: asyncio.AbstractEventLoop | None, func: Callable[[], Any]) -> None:
    """Run ``func()`` on ``loop``: at once when called on that loop's thread (or when
    there is no loop yet), else scheduled with ``call_soon_threadsafe`` so the loop
    wakes up now instead of at its next timer."""
    if loop is None or loop.is_closed():
        func()
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        func()
    else:
        loop.call_soon_threadsafe(func)


def call_threadsafe(loop: Any, func: Callable[[], Any]) -> None:
    """Threading primitives are thread-safe: call ``func()`` at once."""
    func()


class ABackground:
    """A piece of background work (an asyncio task; a daemon thread in the sync twin)."""

    def __init__(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> None:
        self._task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(
            func(*args), name=name
        )

    def cancel(self) -> None:
        """Cancel the task."""
        self._task.cancel()

    def done(self) -> bool:
        """Whether the work has ended."""
        return self._task.done()

    async def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for the work to end (never from the work itself)."""
        if self._task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            pass
        except Exception:  # the task logs its own failures
            pass


class Background:
    """A piece of background work (a daemon thread; an asyncio task in the async twin)."""

    def __init__(self, func: Callable[..., Any], *args: Any, name: str) -> None:
        self._thread = threading.Thread(target=func, args=args, name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Threads cannot be cancelled: the owner stops them by closing what they wait on."""

    def done(self) -> bool:
        """Whether the work has ended."""
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for the work to end (never from the work itself)."""
        if self._thread is threading.current_thread():
            return
        self._thread.join(timeout)


def _refuse_awaitable(result: object, what: str) -> None:
    """A sync twin got an awaitable back: close it (no 'never awaited' warning) and say
    which class to use instead of silently dropping the coroutine."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise InvalidTypeError(
            f"{what} returned an awaitable (an async function?); the sync LeaderElector "
            "never awaits: use AsyncLeaderElector, or pass a plain function"
        )


async def arun_callback(callback: Callable[..., Any], *args: Any) -> None:
    """Call an elector callback; await what it returns if it is awaitable (a coroutine
    function's result), so ``async def on_elected(token)`` runs to its end."""
    result = callback(*args)
    if inspect.isawaitable(result):
        await result


def run_callback(callback: Callable[..., Any], *args: Any) -> None:
    """Call an elector callback; an awaitable result is refused (never awaited here)."""
    _refuse_awaitable(callback(*args), "a callback")


async def arun_term(
    work: Callable[[Any, asyncio.Event], Awaitable[Any]], token: Any, stop: asyncio.Event
) -> bool:
    """Run a leader's ``work(token, stop)`` until it returns or ``stop`` is set.

    The coroutine is cancelled the moment ``stop`` is set. Returns ``True`` if the
    work finished on its own. A ``work`` that returns no awaitable (a plain function:
    it already ran, blocking the event loop) is refused with
    :class:`~etcdfence.errors.InvalidTypeError`.
    """
    coroutine = work(token, stop)
    if not inspect.isawaitable(coroutine):
        raise InvalidTypeError(
            "AsyncLeaderElector.run(work) needs a coroutine function (async def work(token,"
            " stop)); a plain function blocks the event loop and cannot be cancelled on "
            "loss: use LeaderElector for it"
        )
    task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(_awaited(coroutine))
    stopper = asyncio.get_running_loop().create_task(stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task in done:
        task.result()  # re-raise the work's exception
        return True
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return False


def run_term(
    work: Callable[[Any, threading.Event], Any], token: Any, stop: threading.Event
) -> bool:
    """Run a leader's ``work(token, stop)`` in this thread; ``stop`` is set on loss.

    Threads cannot be cancelled, so ``work`` must check ``stop`` (or wait on it).
    Returns ``True`` if the work returned before ``stop`` was set. An awaitable
    result (an ``async def`` work) is refused, not dropped.
    """
    _refuse_awaitable(work(token, stop), "work")
    return not stop.is_set()


async def _awaited(awaitable: Any) -> Any:
    """A coroutine for ``create_task`` from any awaitable."""
    return await awaitable


# --- gRPC ---------------------------------------------------------------------------


def anew_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> grpc.aio.Channel:
    """An asyncio gRPC channel to ``target`` (TLS when ``credentials`` are given)."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def new_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> grpc.Channel:
    """A blocking gRPC channel to ``target`` (TLS when ``credentials`` are given)."""
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


async def aclose_channel(channel: grpc.aio.Channel) -> None:
    """Close ``channel``; calls in flight on it fail."""
    await channel.close()


def close_channel(channel: grpc.Channel) -> None:
    """Close ``channel``; calls in flight on it fail."""
    channel.close()


def aunary(channel: grpc.aio.Channel, path: str, request_cls: Any, response_cls: Any) -> Any:
    """A unary-unary callable for the RPC at ``path``."""
    return channel.unary_unary(
        path,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


def unary(channel: grpc.Channel, path: str, request_cls: Any, response_cls: Any) -> Any:
    """A unary-unary callable for the RPC at ``path``."""
    return channel.unary_unary(
        path,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


class AStream:
    """A bidirectional gRPC stream: ``write`` requests, ``read`` responses, ``cancel``.

    ``read`` returns ``None`` when the server ended the stream cleanly and raises
    ``grpc.RpcError`` when it broke.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        path: str,
        request_cls: Any,
        response_cls: Any,
        metadata: tuple[tuple[str, str], ...] | None,
    ) -> None:
        method = channel.stream_stream(
            path,
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        self._call = method(metadata=metadata)
        self._cancelled = False
        self.endpoint = 0  # the connection's index of the endpoint it was opened on

    async def write(self, request: Any) -> None:
        """Send ``request``; ``grpc.RpcError`` if the stream already ended."""
        try:
            await self._call.write(request)
        except asyncio.InvalidStateError:
            # The RPC already ended (e.g. the etcd member died between two keepalives):
            # grpc.aio reports that as InvalidStateError, not as the RpcError callers
            # handle by reconnecting. Surface the call's real status instead.
            code = await self._call.code()
            raise grpc.aio.AioRpcError(
                code if code != grpc.StatusCode.OK else grpc.StatusCode.UNAVAILABLE,
                await self._call.initial_metadata(),
                await self._call.trailing_metadata(),
                (await self._call.details()) or "the stream ended",
            ) from None

    async def read(self, timeout: float | None = None) -> Any:
        """The next response; :class:`TimeoutError` (and the stream cancelled) if none
        arrives within ``timeout`` seconds."""
        try:
            if timeout is None:
                response = await self._call.read()
            else:
                response = await asyncio.wait_for(self._call.read(), timeout)
        except asyncio.TimeoutError:  # from wait_for only (a distinct class on 3.10)
            self.cancel()
            raise TimeoutError from None
        except asyncio.CancelledError:
            if self._cancelled or not self._call.cancelled():
                raise  # our own cancel(), or the reading task itself was cancelled
            # The channel was closed under the stream (the client was closed): report it
            # like any broken stream instead of silently ending the reading task.
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.CANCELLED, None, None, "the channel was closed"
            ) from None
        if response is grpc.aio.EOF:
            return None
        return response

    def cancel(self) -> None:
        """End the stream from this side."""
        self._cancelled = True
        self._call.cancel()


_CLOSE = object()


class Stream:
    """A bidirectional gRPC stream fed from a queue: ``write``, ``read``, ``cancel``.

    ``read`` returns ``None`` when the server ended the stream cleanly and raises
    ``grpc.RpcError`` when it broke.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        path: str,
        request_cls: Any,
        response_cls: Any,
        metadata: tuple[tuple[str, str], ...] | None,
    ) -> None:
        self._requests: _queue.Queue[Any] = _queue.Queue()
        method = channel.stream_stream(
            path,
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        self._call: Any = method(self._request_iter(), metadata=metadata)
        self.endpoint = 0  # the connection's index of the endpoint it was opened on

    def _request_iter(self) -> Any:
        while True:
            item = self._requests.get()
            if item is _CLOSE:
                return
            yield item

    def write(self, request: Any) -> None:
        """Send ``request`` (queued for gRPC's sending thread)."""
        self._requests.put(request)

    def read(self, timeout: float | None = None) -> Any:
        """The next response; :class:`TimeoutError` (and the stream cancelled) if none
        arrives within ``timeout`` seconds."""
        call = self._call
        if call is None:
            raise _CancelledHere()
        timer = None
        gave_up = threading.Event()
        if timeout is not None:

            def give_up() -> None:
                gave_up.set()
                self.cancel()

            timer = threading.Timer(timeout, give_up)
            timer.daemon = True
            timer.start()
        try:
            return next(call)
        except StopIteration:
            return None
        except grpc.RpcError:
            if gave_up.is_set():
                raise TimeoutError from None
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def cancel(self) -> None:
        """End the stream from this side, and drop the gRPC call object now.

        Dropped here, not at interpreter exit: a call object collected during the
        interpreter's finalization takes its state's lock in ``__del__``, and a gRPC
        daemon thread that the finalization froze may hold that lock — the process then
        hangs at exit (seen once in ~60 runs of five holder processes)."""
        self._requests.put(_CLOSE)
        call, self._call = self._call, None
        if call is not None:
            call.cancel()


class _CancelledHere(grpc.RpcError):  # type: ignore[misc]
    """What :meth:`Stream.read` raises once this side cancelled the stream."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return "the stream was cancelled by this client"

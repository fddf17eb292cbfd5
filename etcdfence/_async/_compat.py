"""The few real differences between the asyncio and the threaded implementation.

Everything else in ``etcdfence/_async`` is written once and turned into
``etcdfence/_sync`` by ``tools/async_to_sync.py``; this module (and its
hand-written twin ``_sync/_compat.py``) is the only place where the two differ:
events, queues, sleeping, background work, gRPC channels and bidirectional
streams, and how a leader's ``work`` is run and stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
import grpc.aio

T = TypeVar("T")

Event = asyncio.Event
Lock = asyncio.Lock
Queue = asyncio.Queue
Channel = grpc.aio.Channel
monotonic = time.monotonic
IS_ASYNC = True

#: What awaiting a gRPC call raises when its channel was closed under it (fail-over).
Aborted = asyncio.CancelledError


def still_wanted() -> bool:
    """False if the current task is being cancelled (so a CancelledError is its own)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return not (cancelling is not None and cancelling())


async def sleep(seconds: float) -> None:
    await asyncio.sleep(max(0.0, seconds))


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
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


async def queue_get(queue: asyncio.Queue[T], timeout: float | None) -> T:
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


async def uncancellable(work: Coroutine[Any, Any, T]) -> T:
    """Run cleanup ``work`` to its end even if the calling task is cancelled meanwhile.

    A second cancellation (``wait_for`` timing out during cleanup, a task group
    shutting down) still reaches the caller, but the cleanup goes on in the
    background instead of being abandoned half-way.
    """
    return await asyncio.shield(asyncio.ensure_future(work))


async def run_blocking(func: Callable[..., T], *args: Any) -> T:
    """Run a short blocking call (a socket probe) off the event loop."""
    return await asyncio.to_thread(func, *args)


def spawn(work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Start ``work`` now as its own task (the sync twin just runs it)."""
    return asyncio.ensure_future(work)


async def settle(future: asyncio.Future[T]) -> T:
    """Await a :func:`spawn` ed request without cancelling it when the caller is
    cancelled: a request that may already be at the server runs to its reply, so
    :func:`outcome` can still learn what it did."""
    return await asyncio.shield(future)


async def outcome(future: asyncio.Future[T]) -> T | None:
    """The result of a :func:`spawn` ed request once it finished, ``None`` if it failed."""
    try:
        return await future
    except BaseException:
        return None


def owner_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running now (captured by objects that other threads may poke)."""
    return asyncio.get_running_loop()


def call_threadsafe(loop: asyncio.AbstractEventLoop | None, func: Callable[[], Any]) -> None:
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


def queue_put(queue: asyncio.Queue[T], item: T) -> None:
    """Put without blocking (queues here are unbounded)."""
    queue.put_nowait(item)


class Background:
    """A piece of background work (an asyncio task; a daemon thread in the sync twin)."""

    def __init__(
        self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str
    ) -> None:
        self._task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(
            func(*args), name=name
        )

    def cancel(self) -> None:
        self._task.cancel()

    def done(self) -> bool:
        return self._task.done()

    async def join(self, timeout: float | None = None) -> None:
        if self._task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except (asyncio.CancelledError, asyncio.TimeoutError):
            pass
        except Exception:  # the task logs its own failures
            pass


def new_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> grpc.aio.Channel:
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


async def close_channel(channel: grpc.aio.Channel) -> None:
    await channel.close()


def unary(channel: grpc.aio.Channel, path: str, request_cls: Any, response_cls: Any) -> Any:
    return channel.unary_unary(
        path,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


class Stream:
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
        self._cancelled = True
        self._call.cancel()


async def run_term(
    work: Callable[[Any, asyncio.Event], Coroutine[Any, Any, Any]], token: Any, stop: asyncio.Event
) -> bool:
    """Run a leader's ``work(token, stop)`` until it returns or ``stop`` is set.

    The coroutine is cancelled the moment ``stop`` is set. Returns ``True`` if the
    work finished on its own.
    """
    task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(work(token, stop))
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

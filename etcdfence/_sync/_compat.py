"""Threaded counterpart of ``etcdfence/_async/_compat.py`` (hand-written, not generated)."""

from __future__ import annotations

import queue as _queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

T = TypeVar("T")

Event = threading.Event
Lock = threading.Lock
Queue = _queue.Queue
Channel = grpc.Channel
monotonic = time.monotonic
IS_ASYNC = False


class Aborted(Exception):
    """Never raised here: a closed channel fails blocking calls with CANCELLED."""


def still_wanted() -> bool:
    """Threads are not cancelled."""
    return True


def sleep(seconds: float) -> None:
    time.sleep(max(0.0, seconds))


def wait_event(event: threading.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` passes; return whether it is set."""
    if timeout is not None and timeout <= 0:
        return event.is_set()
    return event.wait(timeout)


def queue_get(queue: _queue.Queue[T], timeout: float | None) -> T:
    """Next item of ``queue``; raises :class:`TimeoutError` after ``timeout``."""
    try:
        if timeout is not None and timeout <= 0:
            return queue.get_nowait()
        return queue.get(timeout=timeout)
    except _queue.Empty:
        raise TimeoutError from None


def uncancellable(result: T) -> T:
    """Threads are not cancelled: the cleanup already ran when this is called."""
    return result


def run_blocking(func: Callable[..., T], *args: Any) -> T:
    """Run a short blocking call (a socket probe) right here."""
    return func(*args)


def spawn(result: T) -> T:
    """The request already ran (threads block in the call itself)."""
    return result


def settle(result: T) -> T:
    return result


def outcome(result: T) -> T | None:
    return result


def owner_loop() -> Any:
    """No event loop in the threaded twin (always ``None``)."""
    return None


def call_threadsafe(loop: Any, func: Callable[[], Any]) -> None:
    """Threading primitives are thread-safe: call ``func()`` at once."""
    func()


def queue_put(queue: _queue.Queue[T], item: T) -> None:
    """Put without blocking (queues here are unbounded)."""
    queue.put_nowait(item)


class Background:
    """A piece of background work (a daemon thread; an asyncio task in the async twin)."""

    def __init__(self, func: Callable[..., Any], *args: Any, name: str) -> None:
        self._thread = threading.Thread(target=func, args=args, name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Threads cannot be cancelled: the owner stops them by closing what they wait on."""

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is threading.current_thread():
            return
        self._thread.join(timeout)


def new_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)


def close_channel(channel: grpc.Channel) -> None:
    channel.close()


def unary(channel: grpc.Channel, path: str, request_cls: Any, response_cls: Any) -> Any:
    return channel.unary_unary(
        path,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


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
        self._call = method(self._request_iter(), metadata=metadata)
        self.endpoint = 0  # the connection's index of the endpoint it was opened on

    def _request_iter(self) -> Any:
        while True:
            item = self._requests.get()
            if item is _CLOSE:
                return
            yield item

    def write(self, request: Any) -> None:
        self._requests.put(request)

    def read(self, timeout: float | None = None) -> Any:
        """The next response; :class:`TimeoutError` (and the stream cancelled) if none
        arrives within ``timeout`` seconds."""
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
            return next(self._call)
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
        self._requests.put(_CLOSE)
        self._call.cancel()


def run_term(
    work: Callable[[Any, threading.Event], Any], token: Any, stop: threading.Event
) -> bool:
    """Run a leader's ``work(token, stop)`` in this thread; ``stop`` is set on loss.

    Threads cannot be cancelled, so ``work`` must check ``stop`` (or wait on it).
    Returns ``True`` if the work returned before ``stop`` was set.
    """
    work(token, stop)
    return not stop.is_set()

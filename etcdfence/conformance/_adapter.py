"""The adapter: how the conformance kit writes to and reads from the user's resource."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from .._keys import validate_name
from ..errors import InvalidArgumentError, InvalidTokenError, NotOwnerError, StaleTokenError

__all__ = ["Adapter", "AdapterRaised", "as_adapter", "build", "describe", "load_factory"]

#: Exceptions that mean "the resource refused the write" unless an adapter says otherwise.
DEFAULT_REJECTIONS: tuple[type[BaseException], ...] = (StaleTokenError, NotOwnerError)
#: The default of an adapter that declares a binding: a bound resource refuses a token of
#: another lock, from the future or without a lock with an InvalidTokenError (etcdfence's
#: ForeignTokenError is one).
BOUND_REJECTIONS: tuple[type[BaseException], ...] = (*DEFAULT_REJECTIONS, InvalidTokenError)


class AdapterRaised(Exception):
    """Adapter code raised a :class:`BaseException` that is not an :class:`Exception`
    (``SystemExit``, ``KeyboardInterrupt``, ...): the kit catches it where the adapter
    ran and carries it as this ordinary exception, so it becomes a finding instead of
    ending the kit (or the process, with exit status 0 and no verdict)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(f"{describe(error)} (a BaseException raised by the adapter's code)")


def describe(error: BaseException) -> str:
    """``"Type: message"`` of an exception, even one whose ``str()`` raises."""
    try:
        text = str(error)
    except Exception:  # an exception class of the user's with a broken __str__
        text = f"<{type(error).__name__} whose str() raised>"
    return f"{type(error).__name__}: {text}"


def carried(error: BaseException) -> Exception:
    """``error`` as an :class:`Exception` (wrapped in :class:`AdapterRaised` if it is not)."""
    return error if isinstance(error, Exception) else AdapterRaised(error)


@dataclass
class Adapter:
    """How the kit reaches *your* resource: give it one to ask "does it really fence?".

    - ``write(token, key, value)`` stores ``value`` (a ``str``) under ``key`` guarded
      by ``token`` (a :class:`~etcdfence.FencingToken` — an ``int`` to your code via
      ``int(token)`` — or, in the malformed-token scenario, anything at all). It
      returns normally when the resource **accepted** the write and raises one of
      ``rejections`` (default :class:`~etcdfence.StaleTokenError`,
      :class:`~etcdfence.NotOwnerError`) — or returns ``False`` — when it **refused**
      it. Any other exception is taken as an unknown outcome and fails the scenario
      (an ``adapter-error`` finding: an error of the adapter or store, which the kit
      cannot judge — not proof of a fencing violation; retry transient errors inside
      ``write`` if they are known not to have written anything). So does a
      ``BaseException`` such as ``SystemExit``: the kit catches it too.
    - ``read(key)`` returns the value stored under ``key`` (``str`` or ``bytes``), or
      ``None`` if there is none. Read the resource itself, not a cache of the writer.
    - ``restart()`` (optional) restarts the resource — or, for a server you cannot
      restart, at least the adapter's connection to it — so the kit can check that
      the fencing mark survives. Without it the restart scenario is skipped.
    - ``close()`` (optional) is called once the kit is done with the adapter.
    - ``delay(token, key, value)`` (optional) starts a write whose bytes your
      transport holds back (a fault proxy, a paused connection) and returns once the
      writer gave up on it as your client does when no reply comes (say after
      :class:`~etcdfence.OutcomeUnknownError`); it returns a callable that delivers
      the held bytes and returns once the resource has handled them. The
      late-landing scenario then checks that the attempt, arriving after later
      acknowledged writes of the same term, changes nothing (within-term ordering).

    - ``bound_lock`` (optional): the name of the lock the resource is *bound* to — it
      refuses, writing nothing, a token of another lock or another etcd cluster, a
      token from the future (above etcd's current revision) and a bare number with no
      lock (etcdfence's fences with ``lock=``). The kit's terms then all use that lock
      (of the etcd the kit is given), ``write`` gets full
      :class:`~etcdfence.FencingToken` sequencers (``token.lock``,
      ``token.cluster_id``), the scenarios "token of another lock", "token from the
      future" and "bare number on a bound resource" run, the scenarios that write
      made-up bare numbers are skipped, and ``rejections`` defaults to
      :data:`BOUND_REJECTIONS` (an :class:`~etcdfence.errors.InvalidTokenError` is a
      refusal too).
    - ``refuses_future`` (default ``False``): the resource refuses a token above etcd's
      current revision (:class:`~etcdfence.FutureTokenError`: every etcd fence, and the
      others with ``verify=``). The scenarios that can only write such tokens
      (token-digits and large-tokens: tokens up to int64's edge, far above any real
      revision) are then skipped, saying so: they cannot reach its comparison.

    The callables may also be ``async def`` functions; the kit then runs them on one
    event loop of its own (in a background thread), one call at a time.

    Keys the kit uses look like ``etcdfence-conformance/<run>/data/<scenario>``: map
    them onto your resource as you like (a row, a Redis key, a path of your API), but
    keep the fencing mark at least per key — marks shared by all keys work too.
    """

    write: Callable[..., Any]
    read: Callable[[str], Any]
    restart: Callable[[], Any] | None = None
    close: Callable[[], Any] | None = None
    delay: Callable[..., Any] | None = None
    rejections: tuple[type[BaseException], ...] = DEFAULT_REJECTIONS
    name: str = ""
    bound_lock: str | None = None
    refuses_future: bool = False
    _loop: _LoopThread | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.write) or not callable(self.read):
            raise InvalidArgumentError("an Adapter needs callable write and read")
        for name in ("restart", "close", "delay"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InvalidArgumentError(f"Adapter.{name} must be callable or None")
        if self.bound_lock is not None:
            self.bound_lock = validate_name(self.bound_lock, "Adapter.bound_lock")
        if self.bound_lock is not None and self.rejections is DEFAULT_REJECTIONS:
            self.rejections = BOUND_REJECTIONS
        rejections = (self.rejections,) if isinstance(self.rejections, type) else self.rejections
        try:
            self.rejections = tuple(rejections)
        except TypeError:
            self.rejections = (rejections,)  # type: ignore[assignment]
        if not all(isinstance(r, type) and issubclass(r, BaseException) for r in self.rejections):
            raise InvalidArgumentError(
                f"Adapter.rejections must be exception classes, got {rejections!r}"
            )

    def call(self, name: str, *args: Any) -> Any:
        """Call the adapter's ``name`` callable; awaitables run on the kit's loop."""
        return self.resolve(getattr(self, name)(*args))

    def resolve(self, result: Any) -> Any:
        """``result``, or what it resolves to when it is an awaitable."""
        if not inspect.isawaitable(result):
            return result
        if self._loop is None:
            self._loop = _LoopThread()
        return self._loop.run(result)

    def refused(self, error: BaseException) -> bool:
        """Whether ``error`` raised by ``write`` means the resource refused the write."""
        return isinstance(error, self.rejections)

    def attempt(self, token: Any, key: str, value: str) -> tuple[str, str | None]:
        """Write once and classify: ``("accepted", None)``, ``("rejected", why)`` or
        ``("unknown", error)`` (an exception that is not one of ``rejections``)."""
        try:
            result = self.call("write", token, key, value)
        except BaseException as err:  # the adapter's exception is the answer we classify
            error = err.error if isinstance(err, AdapterRaised) else err
            if self.refused(error):
                return "rejected", describe(error)
            if not isinstance(error, Exception):
                return "unknown", f"{describe(error)} (a BaseException, caught by the kit)"
            return "unknown", describe(error)
        if result is False:
            return "rejected", "write returned False"
        return "accepted", None

    def read_text(self, key: str) -> str | None:
        """``read(key)`` as text (bytes are decoded as UTF-8)."""
        value = self.call("read", key)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).decode("utf-8", "replace")
        return None if value is None else str(value)

    def shutdown(self) -> None:
        """Run ``close()`` (if given) and stop the kit's event loop (if one started)."""
        try:
            if self.close is not None:
                self.call("close")
        finally:
            if self._loop is not None:
                self._loop.stop()
                self._loop = None


class _LoopThread:
    """One asyncio loop in a daemon thread, so async adapters keep one loop for life."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="etcdfence-conformance-loop", daemon=True
        )
        self._thread.start()

    def run(self, awaitable: Any) -> Any:
        async def wrap() -> Any:
            try:
                return await awaitable
            except Exception:
                raise
            except BaseException as err:  # SystemExit in a task would stop the loop
                raise AdapterRaised(err) from None

        future: Future[Any] = asyncio.run_coroutine_threadsafe(wrap(), self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self.loop.close()


def as_adapter(obj: Any) -> Adapter:
    """An :class:`Adapter` from an Adapter, a mapping (``dict(write=, read=, ...)``) or
    any object with ``write``/``read`` (and optionally ``restart``/``close``) methods."""
    if isinstance(obj, Adapter):
        return obj
    if isinstance(obj, Mapping):
        known = {"write", "read", "restart", "close", "delay", "rejections", "name", "bound_lock"}
        known.add("refuses_future")
        unknown = set(obj) - known
        if unknown:
            raise InvalidArgumentError(f"unknown adapter fields: {sorted(unknown)}")
        return Adapter(**dict(obj))
    if callable(getattr(obj, "write", None)) and callable(getattr(obj, "read", None)):
        return Adapter(
            write=obj.write,
            read=obj.read,
            restart=getattr(obj, "restart", None),
            close=getattr(obj, "close", None),
            delay=getattr(obj, "delay", None),
            rejections=getattr(obj, "rejections", DEFAULT_REJECTIONS),
            name=getattr(obj, "name", "") or type(obj).__name__,
            bound_lock=getattr(obj, "bound_lock", None),
            refuses_future=bool(getattr(obj, "refuses_future", False)),
        )
    raise InvalidArgumentError(
        f"not an adapter: {type(obj).__name__} (need write(token, key, value) and read(key))"
    )


def load_factory(spec: str) -> Callable[[], Any]:
    """The factory named by ``"package.module:function"`` (what the CLI and the kit's
    writer processes call to build an adapter of their own)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise InvalidArgumentError(f"adapter factory must be 'module:function', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InvalidArgumentError(f"adapter factory must be 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InvalidArgumentError(f"cannot import {module_name!r}: {err}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)  # type: ignore[assignment]
        if factory is None:
            raise InvalidArgumentError(f"{module_name!r} has no {attr!r}")
    if not callable(factory):
        raise InvalidArgumentError(f"{spec!r} is not callable")
    return factory  # type: ignore[return-value]


def build(factory: Callable[..., Any], endpoints: list[str]) -> Adapter:
    """Call an adapter factory: with ``endpoints=`` (the etcd the kit uses) when it takes
    that keyword — handy when the resource is etcd itself — else with no arguments."""
    try:
        takes = "endpoints" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes = False
    return as_adapter(factory(endpoints=list(endpoints)) if takes else factory())

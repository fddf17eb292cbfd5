"""Channels, failover, authentication and retries for one client.

A :class:`AsyncConnection` holds one gRPC channel per endpoint (created lazily)
and a pointer to the endpoint in use. Every unary call goes through
:meth:`AsyncConnection.call`, the single place where gRPC errors are translated
(``etcdfence._wire.errors``) and where retries are decided:

* a call that never reached a server (connection refused, no route) is retried
  on the next endpoint, reads and writes alike;
* an idempotent call (reads, the lease-keyed acquire txn, guarded deletes,
  keepalive) is retried with tenacity until the timeout;
* a request etcd refused before applying it (its "too many requests" backpressure)
  is retried with backoff, writes included;
* a write whose outcome is unknown is never resent: it raises
  :class:`UnavailableError` and the caller resolves it by re-reading;
* an expired auth token is refreshed and the call repeated (etcd rejected it
  before applying anything).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import grpc
import tenacity
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from .. import metrics
from .._backoff import jittered
from .._endpoints import Endpoint, parse_endpoints, speaks_tls
from .._log import log
from .._wire import messages as m
from .._wire.errors import (
    describe_client_cert,
    never_sent,
    plaintext_refused,
    refused_unapplied,
    translate,
)
from ..errors import (
    AuthTokenExpiredError,
    EtcdfenceError,
    InvalidArgumentError,
    InvalidTypeError,
    TLSError,
    UnavailableError,
)
from ..types import CallRecord
from . import _compat

#: Unary requests one client keeps in flight at most; more wait (within their timeout)
#: for a free slot before they are sent. A burst of thousands (10,000 sessions granted
#: at once) then reaches etcd at the rate it applies them instead of all at once: each
#: request answers in tens of milliseconds instead of seconds (a lease is not born
#: near its deadline), and etcd's "too many requests" backpressure is not hit.
MAX_IN_FLIGHT = 256

#: etcd's default --max-request-bytes is 1.5 MiB; allow large responses (ranges).
_MAX_RECEIVE = 64 * 1024 * 1024


def _capped_backoff(deadline: float) -> Callable[[tenacity.RetryCallState], float]:
    """Exponential backoff with full jitter (a random wait up to 50 ms doubling to 1 s,
    so clients that failed together do not retry together) that never sleeps past
    ``deadline``."""
    backoff = wait_random_exponential(multiplier=0.05, max=1.0)

    def wait(state: tenacity.RetryCallState) -> float:
        return max(0.0, min(backoff(state), deadline - _compat.monotonic()))

    return wait


def _status_name(error: object) -> str:
    """The gRPC status name of a failed call (``UNKNOWN`` when it has none)."""
    code = getattr(error, "code", None)
    try:
        status = code() if callable(code) else None
    except Exception:
        status = None
    name = getattr(status, "name", None)
    return name if isinstance(name, str) else "UNKNOWN"


class _Retry(Exception):
    """Internal: the attempt failed in a way that is safe to repeat."""

    def __init__(self, error: EtcdfenceError) -> None:
        super().__init__(str(error))
        self.error = error


def _read_file(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {what} {path!r}: {exc.strerror}") from None


class AsyncConnection:
    """Endpoint list, channels and the call path shared by a client's operations."""

    def __init__(
        self,
        endpoints: str | list[str] | tuple[str, ...] | None,
        *,
        timeout: float,
        username: str | None,
        password: str | None,
        ca_file: str | None,
        cert_file: str | None,
        key_file: str | None,
        server_name: str | None,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise InvalidTypeError(f"timeout must be a number of seconds, got {timeout!r}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise InvalidArgumentError(
                f"timeout must be a positive, finite number of seconds, got {timeout!r}"
            )
        if (username is None) != (password is None):
            raise InvalidArgumentError("username and password must be given together")
        if username is not None and (not isinstance(username, str) or not username):
            raise InvalidTypeError("username must be a non-empty str")
        if (cert_file is None) != (key_file is None):
            raise InvalidArgumentError("cert_file and key_file must be given together")
        self.endpoints: list[Endpoint] = parse_endpoints(endpoints)
        self.timeout = float(timeout)
        self._username = username
        self._password = password
        tls = self.endpoints[0].tls or ca_file is not None or cert_file is not None
        self._cert_file = cert_file
        self._cert_pem = _read_file(cert_file, "certificate file")
        self._credentials = (
            grpc.ssl_channel_credentials(
                root_certificates=_read_file(ca_file, "CA file"),
                private_key=_read_file(key_file, "key file"),
                certificate_chain=self._cert_pem,
            )
            if tls
            else None
        )
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", _MAX_RECEIVE),
            # etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time)
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.enable_retries", 1),
        ]
        if server_name:
            self._options.append(("grpc.ssl_target_name_override", server_name))
        self._channels: dict[int, Any] = {}
        self._stubs: dict[tuple[int, str], Any] = {}
        self._current = 0
        self._token: str | None = None
        self._auth_lock = _compat.Lock()
        self._closed = False
        self._probed: set[int] = set()  # plaintext endpoints already probed for TLS
        self._observers: tuple[Callable[[CallRecord], Any], ...] = ()
        self._heard: dict[int, float] = {}  # endpoint index -> when it last answered anything
        self._slots = _compat.Slots(MAX_IN_FLIGHT)
        #: The highest header revision any answer of this connection carried (0: none
        #: yet): a lower bound of etcd's current revision, free to keep (every unary
        #: answer passes :meth:`_send`). Fences refuse tokens above it (after one read).
        self.revision = 0
        #: The cluster id of the last answer's header (``None``: no answer yet).
        self.cluster_id: int | None = None
        #: The client's watch hub (``AsyncWatchHub``), which attaches itself here.
        self.watches: Any = None
        #: The client's queue views (``AsyncQueueViews``), which attach themselves here.
        self.queues: Any = None

    # -- channels ------------------------------------------------------------

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint calls go to now."""
        return self.endpoints[self._current]

    @property
    def closed(self) -> bool:
        """Whether the client was closed (nothing will reconnect)."""
        return self._closed

    def _channel(self, index: int) -> Any:
        channel = self._channels.get(index)
        if channel is None:
            if self._closed:
                raise UnavailableError("the client is closed")
            target = self.endpoints[index].target
            channel = _compat.new_channel(target, self._credentials, self._options)
            self._channels[index] = channel
        return channel

    def _stub(self, index: int, method: str) -> Any:
        stub = self._stubs.get((index, method))
        if stub is None:
            path, req_cls, resp_cls = m.METHODS[method]
            stub = _compat.unary(self._channel(index), path, req_cls, resp_cls)
            self._stubs[(index, method)] = stub
        return stub

    def rotate(self, failed: int | None = None) -> None:
        """Move to the next endpoint (if ``failed`` is still the current one)."""
        if failed is None or failed == self._current:
            self._current = (self._current + 1) % len(self.endpoints)

    # -- observing calls ------------------------------------------------------------------

    def add_observer(self, observer: Callable[[CallRecord], Any]) -> Callable[[], None]:
        """Call ``observer`` after every attempt and stream open; returns a remover."""
        self._observers = (*self._observers, observer)

        def remove() -> None:
            self._observers = tuple(o for o in self._observers if o is not observer)

        return remove

    @property
    def observed(self) -> bool:
        """Whether calls are reported: observers registered, or metrics on."""
        return bool(self._observers) or metrics.metrics_enabled()

    def _notify(self, method: str, index: int, duration: float, error: object) -> None:
        if error is None:
            outcome, code = "ok", "OK"
        elif isinstance(error, (_compat.Aborted, KeyboardInterrupt)):
            outcome, code = "cancelled", "CANCELLED"
        else:
            outcome, code = "error", _status_name(error)
        record = CallRecord(method, str(self.endpoints[index]), duration, outcome, code)
        metrics.record_call(record)
        for observer in self._observers:
            observer(record)  # an observer's exception is the call's: see AsyncClient.on_call

    def heard_from(self, index: int) -> float:
        """When endpoint ``index`` last answered anything (a call, a stream message),
        on the monotonic clock; 0.0 if never. A member that answers slowly under a
        burst is still heard; a frozen or cut-off one is not."""
        return self._heard.get(index, 0.0)

    async def fail_over(self, failed: int) -> None:
        """Endpoint ``failed`` stopped answering (a keepalive went unanswered): move to
        the next one and close its channel, so calls still waiting on it end now — as
        outcome unknown, or retried elsewhere if idempotent — instead of at their
        timeout. The next use of that endpoint opens a fresh channel."""
        self.rotate(failed)
        channel = self._channels.pop(failed, None)
        for key in [key for key in self._stubs if key[0] == failed]:
            del self._stubs[key]
        if channel is not None:
            await _compat.close_channel(channel)

    async def aclose(self) -> None:
        """Close every channel; nothing reconnects afterwards."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await _compat.close_channel(channel)

    def _translate(self, err: grpc.RpcError, endpoint: object) -> EtcdfenceError:
        """:func:`translate`, telling from our own certificate why etcd refused it."""
        return translate(err, str(endpoint), self.timeout, describe_cert=self._describe_cert)

    def _describe_cert(self) -> str:
        return describe_client_cert(self._cert_file, self._cert_pem)

    # -- authentication --------------------------------------------------------

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return None if self._token is None else (("token", self._token),)

    @property
    def token(self) -> str | None:
        """The auth token requests carry now (``None`` without password auth)."""
        return self._token

    async def reauthenticate(self, stale: str | None) -> bool:
        """Replace the auth token ``stale`` (the one a stream was opened with) by a fresh
        one, unless another caller already did. Returns ``False`` when this connection
        does not authenticate with a password (nothing to refresh)."""
        if self._username is None:
            return False
        await self._authenticate(stale)
        return True

    async def _authenticate(self, stale: str | None) -> None:
        """Get a fresh auth token (once, even if many callers found it stale)."""
        if self._username is None:
            return
        async with self._auth_lock:
            if self._token is not None and self._token != stale:
                return
            index = self._current
            request = m.AuthenticateRequest(name=self._username, password=self._password)
            try:
                response = await self._stub(index, "Authenticate")(request, timeout=self.timeout)
            except grpc.RpcError as err:
                self.rotate(index)
                raise self._translate(err, self.endpoints[index]) from None
            self._token = response.token

    # -- calls -------------------------------------------------------------------

    async def call(
        self,
        method: str,
        request: Any,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
        on_send: Callable[[float], object] | None = None,
    ) -> Any:
        """Send one unary request; see the module docstring for the retry rules.

        ``on_send`` gets the monotonic time each attempt leaves for etcd (after any wait
        for one of the client's :data:`MAX_IN_FLIGHT` slots): a lease's local deadline
        counts from the send of the attempt that was answered.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = _compat.monotonic() + timeout
        try:
            return await self._attempt(method, request, deadline, idempotent, on_send=on_send)
        except _Retry as first:
            last: EtcdfenceError = first.error
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(max(0.0, deadline - _compat.monotonic())),
                wait=_capped_backoff(deadline),
                retry=retry_if_exception_type(_Retry),
                reraise=True,
            ):
                with attempt:
                    try:
                        return await self._attempt(
                            method, request, deadline, idempotent, last, on_send=on_send
                        )
                    except _Retry as retry:
                        last = retry.error
                        raise
        except _Retry as retry:
            last = retry.error
        raise last

    async def _attempt(
        self,
        method: str,
        request: Any,
        deadline: float,
        idempotent: bool,
        last: EtcdfenceError | None = None,
        *,
        on_send: Callable[[float], object] | None = None,
    ) -> Any:
        remaining = deadline - _compat.monotonic()
        index = self._current
        if remaining <= 0:
            raise UnavailableError(
                f"no etcd endpoint answered within {self.timeout}s "
                f"(tried {', '.join(map(str, self.endpoints))})"
                + ("" if last is None else f"; last error: {last}")
            )
        if self._username is not None and self._token is None:
            await self._authenticate(None)
        token = self._token
        channel = self._channel(index)
        try:
            return await self._send(method, request, index, deadline, on_send)
        except _compat.Aborted:
            if self._channels.get(index) is channel or not _compat.still_wanted():
                raise  # the caller itself was cancelled
            # fail_over() closed the channel under this call: the endpoint stopped answering
            abandoned = UnavailableError(
                f"etcd at {self.endpoints[index]} stopped answering (failed over)"
            )
            if idempotent:
                raise _Retry(abandoned) from None
            raise UnavailableError(
                f"{abandoned} — the {method} may or may not have been applied; "
                "re-read before retrying"
            ) from None
        except grpc.RpcError as err:
            error = self._translate(err, self.endpoints[index])
            if isinstance(error, AuthTokenExpiredError) and self._username is not None:
                await self._authenticate(token)
                raise _Retry(error) from None
            if isinstance(error, TLSError):
                raise error from None
            if isinstance(error, UnavailableError):
                await self._explain_plaintext(err, index)
                self.rotate(index)
                if idempotent or never_sent(err) or refused_unapplied(err):
                    raise _Retry(error) from None
                raise UnavailableError(
                    f"{error} — the {method} may or may not have been applied; "
                    "re-read before retrying"
                ) from None
            raise error from None

    async def _send(
        self,
        method: str,
        request: Any,
        index: int,
        deadline: float,
        on_send: Callable[[float], object] | None,
    ) -> Any:
        """One attempt on endpoint ``index``, in one of the client's in-flight slots."""
        if not await self._slots.take(deadline - _compat.monotonic()):
            raise UnavailableError(
                f"the {method} was not sent: {MAX_IN_FLIGHT} requests of this client stayed "
                f"in flight until its timeout (etcd at {self.endpoints[index]} is slow)"
            )
        started = _compat.monotonic()
        try:
            if on_send is not None:
                on_send(started)
            response = await self._stub(index, method)(
                request, timeout=deadline - started, metadata=self.metadata()
            )
            self._heard[index] = _compat.monotonic()
            header = getattr(response, "header", None)
            if header is not None:
                self.saw(header)
            return response
        finally:
            self._slots.release()
            if self.observed:
                self._notify(method, index, _compat.monotonic() - started, sys.exc_info()[1])

    def saw(self, header: Any) -> None:
        """Learn etcd's revision and cluster id from a response ``header``. Threads may
        race here: a lost update only leaves :attr:`revision` lower (one extra read for
        a token above it later), never higher than etcd's."""
        if header.revision > self.revision:
            self.revision = header.revision
        if header.cluster_id:
            self.cluster_id = header.cluster_id

    async def _explain_plaintext(self, err: grpc.RpcError, index: int) -> None:
        """Raise :class:`TLSError` at once if an ``http://`` endpoint turns out to be a
        TLS server (probed once per endpoint), instead of retrying until the timeout."""
        endpoint = self.endpoints[index]
        if endpoint.tls or not plaintext_refused(err) or index in self._probed:
            return
        self._probed.add(index)
        if await _compat.run_blocking(speaks_tls, endpoint, min(1.0, self.timeout)):
            raise TLSError(
                f"etcd at {endpoint} speaks TLS but the client connected in plaintext: "
                f"use https://{endpoint.target} and pass ca_file="
            )

    async def open_stream(self, name: str) -> EtcdStream:
        """Open a bidirectional stream (``LeaseKeepAlive`` or ``Watch``) on the current
        endpoint. Prefer :meth:`keep_stream`, which also reopens it when it breaks."""
        if self._username is not None and self._token is None:
            await self._authenticate(None)
        path, req_cls, resp_cls = m.STREAMS[name]
        index = self._current
        raw = _compat.Stream(self._channel(index), path, req_cls, resp_cls, self.metadata())
        endpoint = self.endpoints[index]
        if self.observed:
            self._notify("stream:" + name, index, 0.0, None)
        return EtcdStream(raw, index, lambda err: self._translate(err, endpoint), self._heard)

    async def keep_stream(
        self,
        name: str,
        run: Callable[[EtcdStream], Any],
        *,
        stop: Any,
        fatal: Callable[[EtcdfenceError], Any] | None = None,
        max_backoff: float = 1.0,
    ) -> None:
        """The one reconnecting-stream loop: open a ``name`` stream and run
        ``run(stream)`` on it until ``run`` returns or ``stop`` (an event) is set.

        When the stream breaks (``run`` raises an :class:`EtcdfenceError`), the
        connection re-authenticates or moves to the next endpoint, then — unless
        ``fatal(error)`` says the error ends it (it is then raised) — reopens the
        stream after a backoff of 50 ms doubling to ``max_backoff`` (each wait drawn
        from its upper half: jitter), reset whenever the broken stream had delivered
        something.
        """
        backoff = 0.05
        while not stop.is_set():
            stream: EtcdStream | None = None
            try:
                stream = await self.open_stream(name)
                if not stop.is_set():
                    await run(stream)
                return
            except EtcdfenceError as err:
                if stop.is_set():
                    return
                if stream is not None and stream.responses:
                    backoff = 0.05
                error = await self.stream_failed(err, None if stream is None else stream.endpoint)
                if fatal is not None and await fatal(error):
                    raise error from None
                log.debug("etcdfence.stream_retry", stream=name, error=str(error))
                await _compat.wait_event(stop, jittered(backoff))
                backoff = min(backoff * 2, max_backoff)
            finally:
                if stream is not None:
                    stream.cancel()

    async def stream_failed(
        self, error: EtcdfenceError, endpoint: int | None = None
    ) -> EtcdfenceError:
        """Bookkeeping after a stream broke: re-authenticate or fail over; returns the
        error to report. ``endpoint`` is the index the stream was opened on
        (:attr:`EtcdStream.endpoint`): only that endpoint is left, never a healthy one
        another caller already moved to."""
        if isinstance(error, AuthTokenExpiredError) and self._username is not None:
            try:
                await self._authenticate(self._token)
            except EtcdfenceError as auth_err:
                return auth_err
        if isinstance(error, UnavailableError) and not isinstance(error, TLSError):
            self.rotate(endpoint)
        return error


class EtcdStream:
    """A bidirectional stream whose failures are etcdfence errors, never gRPC's.

    ``read(timeout)`` returns the next response, ``None`` when etcd ended the stream,
    and raises :class:`TimeoutError` (the stream is then cancelled) when nothing came
    within ``timeout``. ``endpoint`` is the connection's index of its endpoint and
    ``responses`` how many responses it delivered.
    """

    def __init__(
        self,
        raw: _compat.Stream,
        endpoint: int,
        translate: Callable[[grpc.RpcError], EtcdfenceError],
        heard: dict[int, float],
    ) -> None:
        self._raw = raw
        self._translate = translate
        self._heard = heard
        self.endpoint = endpoint
        self.responses = 0

    async def write(self, request: Any) -> None:
        try:
            await self._raw.write(request)
        except grpc.RpcError as err:
            raise self._translate(err) from None

    async def read(self, timeout: float | None = None) -> Any:
        try:
            response = await self._raw.read(timeout)
        except grpc.RpcError as err:
            raise self._translate(err) from None
        if response is not None:
            self.responses += 1
            self._heard[self.endpoint] = _compat.monotonic()
        return response

    def cancel(self) -> None:
        self._raw.cancel()

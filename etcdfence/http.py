"""HTTP write gates: carry a fencing token to an HTTP service, and check it there.

Two halves, used together:

* **Client side** — :class:`FencingTransport` / :class:`AsyncFencingTransport` (httpx,
  extra ``http``): every request carries the holder's ``Fencing-Token``, and once the
  holder has lost its lock or leadership the transport raises instead of sending::

      with client.session(ttl=10) as session:
          lock = session.lock("writers/orders")
          lock.acquire()
          http = httpx.Client(transport=FencingTransport(lock))
          http.put("http://orders/kv/latest", content=b"...")   # Fencing-Token: <token>

* **Server side** — :class:`FencingMiddleware` (ASGI: Starlette, FastAPI, any ASGI
  app) and :class:`WSGIFencingMiddleware` (Flask, Django, any WSGI app) parse the header
  (``400`` when it is missing or malformed), hand the token to the handler
  (:func:`fencing_token`), and answer ``409`` with a JSON body when the handler's guarded
  write raises :class:`~etcdfence.StaleTokenError` (or
  :class:`~etcdfence.NotOwnerError`).

Neither half makes a write safe by itself. The transport's check runs in the client, before
bytes leave it: a request already on the wire when the session is lost still arrives (the
``Fencing-Token`` is why that is harmless). The middleware only reads the header: checking
the token and writing the data must be **one atomic step at the resource**, so the handler
writes through a guard — :class:`~etcdfence.FenceGuard` (data in etcd),
:class:`~etcdfence.sql.SQLFence` (same database transaction as the data) or
:class:`~etcdfence.redis.RedisFence` — never "compare, then write" in two steps.
``examples/fenced_http_service.py`` shows the whole path.

Importing this module needs no httpx (the middleware has no dependency at all); the
transports import it when first used and raise :class:`ImportError` naming the extra
when it is missing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload, runtime_checkable

from .errors import (
    InvalidArgumentError,
    InvalidTokenError,
    InvalidTypeError,
    NotLeaderError,
    NotOwnerError,
    SessionExpiredError,
    StaleTokenError,
)
from .token import HEADER, FencingToken, coerce_token

if TYPE_CHECKING:
    from ._httpx import AsyncFencingTransport, FencingTransport

__all__ = [
    "ENVIRON_KEY",
    "STATE_KEY",
    "UNSAFE_METHODS",
    "AsyncFencingTransport",
    "FencingMiddleware",
    "FencingTransport",
    "TokenHolder",
    "WSGIFencingMiddleware",
    "conflict_body",
    "fencing_token",
]

#: Methods that need a token by default: the ones that change state (RFC 9110 §9.2.1).
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Where :class:`FencingMiddleware` puts the token: ``scope["state"][STATE_KEY]``
#: (Starlette: ``request.state.fencing_token``).
STATE_KEY = "fencing_token"
#: Where :class:`WSGIFencingMiddleware` puts the token in the WSGI environ.
ENVIRON_KEY = "etcdfence.fencing_token"

_HEADER_LOWER = HEADER.lower().encode("ascii")
_WSGI_HEADER = "HTTP_" + HEADER.upper().replace("-", "_")


# ============================================================================ client side


@runtime_checkable
class TokenHolder(Protocol):
    """Anything that holds a fencing token and can tell whether it may still use it.

    Implement it to put your own ownership (another lock service, a token handed down
    by a supervisor) behind :class:`FencingTransport`: ``check()`` raises an
    :class:`~etcdfence.EtcdfenceError` once the token must no longer be used, ``token``
    is the token to send (``None``: not held). etcdfence's own ``Lock``, ``Election``
    and ``LeaderElector`` (sync and asyncio) are accepted as they are.
    """

    @property
    def token(self) -> FencingToken | int | None: ...

    def check(self) -> None: ...


class _Gate:
    """The send-time question "may this holder still use its token?", asked of a lock,
    an election, a leader elector (through its session's local deadline) or a
    :class:`TokenHolder`. Reads only local state: no I/O, safe from any thread."""

    __slots__ = ("_error", "_holder", "_reserve", "_via_session", "what")

    def __init__(self, holder: object, reserve: float) -> None:
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)):
            raise InvalidTypeError(f"reserve must be a number of seconds, got {reserve!r}")
        if not 0 <= reserve < float("inf"):  # NaN fails this too
            raise InvalidArgumentError(f"reserve must be finite and >= 0, got {reserve!r}")
        if not hasattr(holder, "token"):
            raise InvalidTypeError(
                "holder must be a Lock, Election, LeaderElector (sync or asyncio) or a "
                f"TokenHolder (token + check()), got {type(holder).__name__}"
            )
        self._via_session = hasattr(holder, "session") and not hasattr(holder, "check")
        if not self._via_session and not callable(getattr(holder, "check", None)):
            raise InvalidTypeError(
                f"{type(holder).__name__} has a token but neither a session nor check()"
            )
        self._holder = holder
        self._reserve = float(reserve)
        # Elections and electors lose *leadership*; locks (and the rest) *ownership*.
        self._error = NotLeaderError if hasattr(holder, "is_leader") else NotOwnerError
        name = getattr(holder, "name", None)
        self.what = f"{type(holder).__name__} {name!r}" if name else type(holder).__name__

    def current(self, doing: str) -> FencingToken | int:
        """The token to send now; raises (and so nothing is sent) when the holder has
        lost it. ``doing`` names the request for the error message."""
        holder: Any = self._holder
        if not self._via_session:
            holder.check()
            token = holder.token
            if token is None:
                raise self._error(f"{self.what} holds no token: {doing} was not sent")
            coerce_token(token)
            return token  # type: ignore[no-any-return]
        # The session first, then the token: a token read after its session can only be
        # that session's or a later one's, and a later term closed the earlier session,
        # so check() below then refuses (an elector swaps sessions between terms). The
        # token names its lease too: a mismatch is refused all the same.
        session = holder.session
        token = holder.token
        if token is None or session is None:
            raise self._error(f"{self.what} is not held: {doing} was not sent")
        try:
            session.check()
        except SessionExpiredError as exc:
            raise SessionExpiredError(f"{self.what}: {exc}; {doing} was not sent") from None
        if getattr(token, "lease_id", None) not in (None, session.lease_id):
            raise self._error(
                f"{self.what}: token {token} is not its session's: {doing} was not sent"
            )
        if self._reserve and time.monotonic() + self._reserve >= session.deadline:
            raise SessionExpiredError(
                f"{self.what}: less than {self._reserve:g}s left before the session's "
                f"local deadline; {doing} was not sent"
            )
        return token  # type: ignore[no-any-return]

    def still(self, token: FencingToken | int, doing: str) -> None:
        """Raise unless ``token`` is still the holder's current, usable token."""
        now = self.current(doing)
        if int(now) != int(token):
            raise self._error(
                f"{self.what} moved on from token {int(token)} to {int(now)} while "
                f"{doing} was being sent"
            )


_LAZY = {"FencingTransport", "AsyncFencingTransport"}


def __getattr__(name: str) -> Any:
    """The transports import httpx when first asked for, so the middleware (and
    ``import etcdfence.http``) works without it."""
    if name in _LAZY:
        try:
            from . import _httpx
        except ImportError as exc:
            if getattr(exc, "name", None) not in ("httpx", "httpcore"):
                raise
            raise ImportError(
                f"etcdfence.http.{name} needs httpx: pip install 'etcdfence[http]'",
                name="httpx",
            ) from exc
        return getattr(_httpx, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ============================================================================ server side


def conflict_body(exc: BaseException, token: FencingToken | None) -> dict[str, Any]:
    """The JSON body of a ``409``: ``{"error", "resource", "token", "current"}``.

    From a :class:`~etcdfence.StaleTokenError` all four are known; for a
    :class:`~etcdfence.NotOwnerError` ``resource``/``current`` are ``None`` and
    ``token`` is the request's."""
    if isinstance(exc, StaleTokenError):
        return {
            "error": "stale fencing token",
            "resource": exc.resource,
            "token": exc.token,
            "current": exc.current,
        }
    return {
        "error": str(exc) or "not the owner",
        "resource": getattr(exc, "resource", None),
        "token": None if token is None else token.value,
        "current": getattr(exc, "current", None),
    }


def _bad_request(exc: InvalidTokenError) -> dict[str, Any]:
    return {"error": str(exc), "header": HEADER}


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode() + b"\n"


_TOKENS: dict[bytes | str, FencingToken] = {}  # header value -> token (few writers, few terms)
_TOKENS_MAX = 4096


def _header_token(raw: bytes | str) -> FencingToken:
    """``FencingToken.from_header(raw)``, remembered: a token is immutable, the same
    few values arrive over and over, and parsing one costs a few µs per request."""
    token = _TOKENS.get(raw)
    if token is None:
        token = FencingToken.from_header(raw)  # InvalidTokenError for a bad one
        if len(_TOKENS) >= _TOKENS_MAX:
            _TOKENS.clear()
        _TOKENS[raw] = token
    return token


class _Policy:
    """Which requests need a token; the parse of the header's values into one token."""

    __slots__ = ("methods", "required")

    def __init__(self, methods: Iterable[str], required: bool) -> None:
        if isinstance(methods, (str, bytes)):
            raise InvalidTypeError("methods must be a collection of method names, not a str")
        self.methods = frozenset(str(m).upper() for m in methods)
        if not isinstance(required, bool):
            raise InvalidTypeError(f"required must be a bool, got {type(required).__name__}")
        self.required = required

    def token(self, method: str, raw: bytes | str | None, count: int) -> FencingToken | None:
        """The request's token from the ``count`` header fields it came in (``raw``: the
        last one's value); :class:`InvalidTokenError` for a missing one where it is
        needed, and for a malformed or repeated one on *any* method (a token a client
        bothered to send is never silently ignored)."""
        if count > 1:
            raise InvalidTokenError(f"{HEADER} header given {count} times")
        if raw is not None:
            return _header_token(raw)
        if self.required and method.upper() in self.methods:
            raise InvalidTokenError(f"missing {HEADER} header (needed for {method.upper()})")
        return None


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class FencingMiddleware:
    """ASGI middleware: parse ``Fencing-Token``, give it to the handler, map a refused
    guarded write to ``409``. Use it in front of every handler that writes to a fenced
    resource, so bad tokens are refused uniformly and a stale writer learns why.

    * a request whose method is in ``methods`` (default: POST, PUT, PATCH, DELETE) and
      that carries no token gets ``400`` ``{"error", "header"}`` without reaching the
      app, unless ``required=False`` (then the handler sees ``None``); a malformed token
      (``abc``, ``0``, ``-1``, beyond int64, two headers) gets ``400`` on every method;
    * the handler reads the token with :func:`fencing_token` (``scope["state"]
      ["fencing_token"]``, Starlette's ``request.state.fencing_token``);
    * a :class:`~etcdfence.StaleTokenError` or :class:`~etcdfence.NotOwnerError` that
      escapes the handler before it started its response becomes ``409`` with
      :func:`conflict_body` (``error``, ``resource``, ``token``, ``current``).

    It does not make anything atomic: the handler must write through a guard
    (``FenceGuard``, ``SQLFence``, ``RedisFence``) whose check and write are one step.
    In Starlette/FastAPI add it with ``app.add_middleware(FencingMiddleware)`` (or
    ``Middleware(FencingMiddleware)``): wrapped *around* a Starlette app, the app's own
    error middleware would answer 500 first.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        methods: Iterable[str] = UNSAFE_METHODS,
        required: bool = True,
    ) -> None:
        self.app = app
        self._policy = _Policy(methods, required)

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # ASGI header names are lowercase (servers lowercase them; Starlette's Headers
        # relies on it too). The common case — one known token — is one dict lookup.
        raw, count = None, 0
        for name, value in scope["headers"]:
            if name == _HEADER_LOWER:
                raw, count = value, count + 1
        token = _TOKENS.get(raw) if count == 1 else None  # type: ignore[arg-type]
        if token is None:
            try:
                token = self._policy.token(scope["method"], raw, count)
            except InvalidTokenError as exc:
                await _asgi_json(send, 400, _bad_request(exc))
                return
        # Into this request's own state dict, as Starlette's ``request.state`` does: ASGI
        # servers give each request a shallow copy of the lifespan state.
        state = scope.get("state")
        if state is None:
            scope["state"] = {STATE_KEY: token}
        else:
            state[STATE_KEY] = token
        started = False

        def tracked(message: Any) -> Awaitable[None]:
            # plain function handing back the server's awaitable: no coroutine per message
            nonlocal started
            started = True
            return send(message)

        try:
            await self.app(scope, receive, tracked)
        except (StaleTokenError, NotOwnerError) as exc:
            if started:  # too late to change the status: let the server deal with it
                raise
            await _asgi_json(send, 409, conflict_body(exc, token))


async def _asgi_json(
    send: Callable[[Any], Awaitable[None]], status: int, body: dict[str, Any]
) -> None:
    data = _json(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


_STATUS = {400: "400 Bad Request", 409: "409 Conflict"}

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WSGIFencingMiddleware:
    """The WSGI twin of :class:`FencingMiddleware` (Flask, Django, any WSGI app): the
    same options and answers; the token is in ``environ["etcdfence.fencing_token"]``
    (:func:`fencing_token` reads it). A refused guarded write raised while the app is
    called, or while its body is produced before the first byte of it, becomes ``409``.

    Wrap the WSGI callable itself (``app.wsgi_app = WSGIFencingMiddleware(app.wsgi_app)``
    in Flask), so framework error pages do not answer first. Servers join repeated
    headers with a comma, which makes two tokens a malformed one: ``400``.
    """

    def __init__(
        self, app: WSGIApp, *, methods: Iterable[str] = UNSAFE_METHODS, required: bool = True
    ) -> None:
        self.app = app
        self._policy = _Policy(methods, required)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        raw = environ.get(_WSGI_HEADER)
        try:
            token = self._policy.token(
                environ.get("REQUEST_METHOD", "GET"), raw, 0 if raw is None else 1
            )
        except InvalidTokenError as exc:
            return _wsgi_json(start_response, 400, _bad_request(exc))
        environ[ENVIRON_KEY] = token
        try:
            result = self.app(environ, start_response)
        except (StaleTokenError, NotOwnerError) as exc:
            return _wsgi_json(start_response, 409, conflict_body(exc, token), sys.exc_info())
        return _FirstChunk(result, start_response, token)


def _wsgi_json(
    start_response: Callable[..., Any], status: int, body: dict[str, Any], exc_info: Any = None
) -> list[bytes]:
    data = _json(body)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    if exc_info is None:
        start_response(_STATUS[status], headers)
    else:  # replaces a status the app may have set already (PEP 3333)
        start_response(_STATUS[status], headers, exc_info)
    return [data]


class _FirstChunk:
    """The app's body, with a refused write raised before its first non-empty chunk
    (headers not yet sent) turned into the 409 (PEP 3333 lets ``start_response`` be
    called again with ``exc_info`` until then)."""

    def __init__(
        self, result: Iterable[bytes], start_response: Callable[..., Any], token: Any
    ) -> None:
        self._result = result
        self._start_response = start_response
        self._token = token

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._result)
        try:
            chunk = next(chunks)
            while not chunk:  # held back: some servers send the headers on any chunk
                chunk = next(chunks)
        except StopIteration:
            return
        except (StaleTokenError, NotOwnerError) as exc:
            body = conflict_body(exc, self._token)
            yield from _wsgi_json(self._start_response, 409, body, sys.exc_info())
            return
        yield chunk
        yield from chunks

    def close(self) -> None:
        close = getattr(self._result, "close", None)
        if close is not None:
            close()


@overload
def fencing_token(request: Any, *, required: Literal[True] = True) -> FencingToken: ...
@overload
def fencing_token(request: Any, *, required: bool) -> FencingToken | None: ...


def fencing_token(request: Any, *, required: bool = True) -> FencingToken | None:
    """The token the middleware parsed for this request, for the handler's guarded write.

    ``request`` is a Starlette/FastAPI ``Request`` (anything with ``.scope``), an ASGI
    scope, or a WSGI environ (a Flask/Werkzeug request's ``.environ`` is found too).
    Raises :class:`~etcdfence.InvalidTokenError` when there is none and ``required``
    (the middleware is missing, or it let a request without a token through).
    """
    if hasattr(request, "scope"):
        request = request.scope
    elif hasattr(request, "environ"):
        request = request.environ
    if not isinstance(request, MutableMapping):
        raise InvalidTypeError(
            f"expected a request, ASGI scope or WSGI environ, got {type(request).__name__}"
        )
    if ENVIRON_KEY in request:
        token = request[ENVIRON_KEY]
    else:
        token = (request.get("state") or {}).get(STATE_KEY)
    if token is None and required:
        raise InvalidTokenError(
            f"no {HEADER} on this request (is FencingMiddleware installed in front of it?)"
        )
    return token  # type: ignore[no-any-return]

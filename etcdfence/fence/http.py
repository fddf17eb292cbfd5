"""HTTP write gates: carry a fencing token to an HTTP service, and check it there.

The HTTP member of the fence package (one module per backend: etcd, SQL, Redis, HTTP);
import it as :mod:`etcdfence.http`, the public face re-exporting the names below.

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

from .._log import log
from ..errors import (
    EtcdfenceError,
    ForeignTokenError,
    FutureTokenError,
    InvalidArgumentError,
    InvalidTokenError,
    InvalidTypeError,
    NotLeaderError,
    NotOwnerError,
    SessionExpiredError,
    StaleTokenError,
)
from ..token import HEADER, FencingToken, _is_metadata_key, coerce_token
from ._async.admit import AsyncAdmission
from ._sync.admit import Admission

if TYPE_CHECKING:
    from ._httpx import AsyncFencingTransport, FencingTransport

__all__ = [
    "ENVIRON_KEY",
    "STATE_KEY",
    "UNSAFE_METHODS",
    "WEBSOCKET",
    "AsyncFencingTransport",
    "FencingMiddleware",
    "FencingTransport",
    "TokenHolder",
    "WSGIFencingMiddleware",
    "conflict_body",
    "fencing_token",
    "request_token",
]

#: Methods that need a token by default: the ones that change state (RFC 9110 §9.2.1).
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The pseudo-method :class:`FencingMiddleware` judges a WebSocket handshake as:
#: ``methods=UNSAFE_METHODS | {WEBSOCKET}`` makes its token required.
WEBSOCKET = "WEBSOCKET"
#: Where :class:`FencingMiddleware` puts the token: ``scope["state"][STATE_KEY]``
#: (Starlette: ``request.state.fencing_token``).
STATE_KEY = "fencing_token"
#: Where :class:`WSGIFencingMiddleware` puts the token in the WSGI environ.
ENVIRON_KEY = "etcdfence.fencing_token"

_HEADER_LOWER = HEADER.lower().encode("ascii")
_HEADER_LEN = len(HEADER)
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
        if token is None and session is not None and session.expired:
            # A holder reads no token once its session expired: say why, unless the
            # session was closed on purpose (that released the hold: "not held").
            reason = session.expiry_reason
            if reason != "session closed":
                raise SessionExpiredError(
                    f"{self.what}: session expired: {reason}; {doing} was not sent"
                )
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

    def remaining(self) -> float | None:
        """Seconds until the holder's session's local deadline (less ``reserve``), for
        holders that have one; ``None`` for a :class:`TokenHolder`. May be <= 0."""
        if not self._via_session:
            return None
        session = getattr(self._holder, "session", None)
        deadline = getattr(session, "deadline", None)
        if not isinstance(deadline, (int, float)):
            return None
        return float(deadline) - self._reserve - time.monotonic()

    def still(self, token: FencingToken | int, doing: str) -> None:
        """Raise unless ``token`` is still the holder's current, usable token."""
        now = self.current(doing)
        if int(now) != int(token):
            raise self._error(
                f"{self.what} moved on from token {int(token)} to {int(now)} while "
                f"{doing} was being sent"
            )


_LAZY = {"FencingTransport", "AsyncFencingTransport"}


def transport(name: str, module: str) -> Any:
    """The transport class ``name`` (importing httpx now), for a module's ``__getattr__``:
    this one's and the :mod:`etcdfence.http` face's. Raises :class:`ImportError` naming
    the extra when httpx is missing, :class:`AttributeError` (naming ``module``) for any
    other name."""
    if name not in _LAZY:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
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


def __getattr__(name: str) -> Any:
    """The transports import httpx when first asked for, so the middleware (and
    ``import etcdfence.http``) works without it."""
    return transport(name, __name__)


# ============================================================================ server side


def conflict_body(exc: BaseException, token: FencingToken | None) -> dict[str, Any]:
    """The JSON body of a ``409``: ``{"error", "resource", "token", "current"}``.

    From a :class:`~etcdfence.StaleTokenError` all four are known; for a
    :class:`~etcdfence.NotOwnerError` ``resource``/``current`` are ``None`` and
    ``token`` is the request's."""
    if isinstance(exc, (ForeignTokenError, FutureTokenError)):
        return {
            "error": str(exc),
            "reason": "foreign" if isinstance(exc, ForeignTokenError) else "future",
            "resource": None,
            "token": None if token is None else token.value,
            "current": None,
        }
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


#: What a refused admission answers: a token of another lock or from the future is
#: well-formed but may not write here, as a stale one (409 Conflict, the status a
#: fenced-off client already stops on). A verifier that cannot answer — etcd
#: unreachable, or any other etcdfence error on the way (its etcd user may not read the
#: lock's keys: :class:`~etcdfence.errors.AuthError`; a request etcd refused) — is 503
#: with a JSON body naming the cause: the service cannot take fenced writes until its
#: verifier works, and the client did nothing wrong. The app never runs in either case.
_REFUSED = (ForeignTokenError, FutureTokenError)
#: The name gate admissions use in their messages.
_GATE = "HTTP service"


def _refusal(exc: BaseException, token: FencingToken) -> tuple[int, dict[str, Any]]:
    """The status and JSON body for a token the gate's admission refused."""
    if isinstance(exc, _REFUSED):
        return 409, conflict_body(exc, token)
    if isinstance(exc, InvalidTokenError):
        return 400, _bad_request(exc)
    return 503, {"error": f"cannot verify the fencing token: {exc}", "header": HEADER}


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode() + b"\n"


_TOKENS: dict[bytes | str, FencingToken] = {}  # header value -> token (few writers, few terms)
_TOKENS_MAX = 4096
# A full token (lock, cluster, key, crev, lease) of an ordinary lock name is well under
# this; longer raw values (a very long name, OWS padding) are parsed but not kept.
_TOKENS_KEY_MAX = 512


def _header_token(raw: bytes | str) -> FencingToken:
    """``FencingToken.from_header(raw)``, remembered: a token is immutable, the same
    few values arrive over and over, and parsing one costs a few µs per request."""
    token = _TOKENS.get(raw)
    if token is None:
        # InvalidTokenError for a bad one: parse_token's rule, the same for the ASGI
        # bytes and the WSGI latin-1 str of one header value.
        token = FencingToken.from_header(raw)
        if len(raw) <= _TOKENS_KEY_MAX:  # valid, but padded with OWS: not worth keeping
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


def _token_fields(
    fields: Iterable[tuple[bytes | str, bytes | str]],
) -> tuple[bytes | str | None, int]:
    """``(value, count)`` of the ``Fencing-Token`` fields among a request's ``(name,
    value)`` header fields: the last one's value and how many there were. Names compare
    ASCII case-insensitively (ASGI servers lowercase them: one ``==`` in the common case)."""
    raw, count = None, 0
    for name, value in fields:
        if name == _HEADER_LOWER or (len(name) == _HEADER_LEN and _is_metadata_key(name)):
            raw, count = value, count + 1
    return raw, count


def request_token(
    method: str,
    fields: Iterable[tuple[bytes | str, bytes | str]],
    *,
    methods: Iterable[str] = UNSAFE_METHODS,
    required: bool = True,
) -> FencingToken | None:
    """The middleware's rule, for a server that is neither ASGI nor WSGI (``http.server``,
    a raw socket loop): the token of a request from its method and all its header fields
    as ``(name, value)`` pairs, repeats included (``BaseHTTPRequestHandler``'s
    ``self.headers.items()``).

    Raises :class:`~etcdfence.InvalidTokenError` (answer ``400``) for a repeated or
    malformed ``Fencing-Token`` on any method, and for a missing one when ``required`` and
    ``method`` is in ``methods``; returns ``None`` when there is none and none is needed.
    The fields must be the bytes the client sent: a server whose parser rewrites header
    lines (``http.server`` splits them on a bare CR) must refuse such requests itself
    first — ``examples/http_service.py`` shows how.
    """
    raw, count = _token_fields(fields)
    return _Policy(methods, required).token(method, raw, count)


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
      :func:`conflict_body` (``error``, ``resource``, ``token``, ``current``);
    * a WebSocket handshake is judged as the method ``WEBSOCKET`` (add it to ``methods``
      to require a token; a bad, foreign or future one is always refused — with the
      status and body where the server supports the denial-response extension, else
      403), and a stale write after ``accept`` closes the connection with code 1008.

    * with ``lock="jobs/nightly"`` the service is *bound*: a token of another lock, or a
      bare number, gets ``409`` (``reason: "foreign"``) before the app runs; with
      ``verify=`` (an etcdfence ``AsyncClient``, an
      :class:`~etcdfence.fence._async.admit.AsyncVerifier` or a callable) a token above
      etcd's revision (``reason: "future"``) or whose sequencer etcd does not confirm
      gets ``409`` too, and ``503`` when etcd cannot be asked. A malformed token stays a
      ``400``: the client's bug; a foreign or future one is refused like a stale one.

    It does not make anything atomic: the handler must write through a guard
    (``FenceGuard``, ``SQLFence``, ``RedisFence``) whose check and write are one step.
    Nor does it authenticate: fencing stops zombies (holders that lost their lock), not
    attackers; a client that can send any header can send any token.
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
        lock: str | None = None,
        verify: Any = None,
    ) -> None:
        self.app = app
        self._policy = _Policy(methods, required)
        self._admission = AsyncAdmission(_GATE, lock=lock, verify=verify)
        self._admits = lock is not None or verify is not None

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw, count = _token_fields(scope["headers"])
        # The common case — one known token — is one dict lookup.
        token = _TOKENS.get(raw) if count == 1 else None  # type: ignore[arg-type]
        if token is None:
            try:
                token = self._policy.token(scope["method"], raw, count)
            except InvalidTokenError as exc:
                await _asgi_json(send, 400, _bad_request(exc))
                return
        if self._admits and token is not None:
            try:
                await self._admission.admit(token)
            except EtcdfenceError as exc:
                await _asgi_json(send, *_refusal(exc, token))
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

    async def _websocket(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        """A WebSocket handshake passes the same gate as a request whose method is
        ``WEBSOCKET``: a malformed, repeated, foreign or future token is refused before
        the app runs, a missing one only when ``"WEBSOCKET"`` is in ``methods`` (a
        connection that writes to a fenced resource; the default lets read-only
        subscriptions through without one). A stale write escaping the app before it
        accepted is refused like an HTTP one; after it accepted, the connection is closed
        with code 1008 (policy violation) and the reason."""
        raw, count = _token_fields(scope["headers"])
        try:
            token = self._policy.token(WEBSOCKET, raw, count)
        except InvalidTokenError as exc:
            await _websocket_deny(scope, send, 400, _bad_request(exc))
            return
        if self._admits and token is not None:
            try:
                await self._admission.admit(token)
            except EtcdfenceError as exc:
                await _websocket_deny(scope, send, *_refusal(exc, token))
                return
        scope.setdefault("state", {})[STATE_KEY] = token
        opened = False

        def tracked(message: Any) -> Awaitable[None]:
            nonlocal opened
            opened = opened or message.get("type") != "websocket.close"
            return send(message)

        try:
            await self.app(scope, receive, tracked)
        except (StaleTokenError, NotOwnerError) as exc:
            if not opened:
                await _websocket_deny(scope, send, 409, conflict_body(exc, token))
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": str(exc)[:120]})


async def _websocket_deny(
    scope: MutableMapping[str, Any],
    send: Callable[[Any], Awaitable[None]],
    status: int,
    body: dict[str, Any],
) -> None:
    """Refuse a WebSocket handshake: with the HTTP status and JSON body where the server
    offers the ASGI denial-response extension, else by closing before accepting (the
    server answers 403)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await _asgi_json(send, status, body, kind="websocket.http.response")
    else:
        await send({"type": "websocket.close", "code": 1008})


async def _asgi_json(
    send: Callable[[Any], Awaitable[None]],
    status: int,
    body: dict[str, Any],
    *,
    kind: str = "http.response",
) -> None:
    """Answer ``status`` with ``body`` as JSON: an HTTP response, or (``kind=
    "websocket.http.response"``) a WebSocket handshake's denial response."""
    data = _json(body)
    await send(
        {
            "type": f"{kind}.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": f"{kind}.body", "body": data})


_STATUS = {400: "400 Bad Request", 409: "409 Conflict", 503: "503 Service Unavailable"}

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WSGIFencingMiddleware:
    """The WSGI twin of :class:`FencingMiddleware` (Flask, Django, any WSGI app): the
    same options and answers; the token is in ``environ["etcdfence.fencing_token"]``
    (:func:`fencing_token` reads it). A refused guarded write raised while the app is
    called, or while its body is produced before the first byte of it, becomes ``409``.

    Wrap the WSGI callable itself (``app.wsgi_app = WSGIFencingMiddleware(app.wsgi_app)``
    in Flask), so framework error pages do not answer first. Servers join repeated
    headers with a comma, which makes two tokens a malformed one: ``400``.

    A WSGI app sees header values only as its server hands them over, so the token rule
    holds only on a server that passes them **unmodified**: tested are gunicorn and
    waitress (and, for :class:`FencingMiddleware`, uvicorn with h11 or httptools, and
    hypercorn). The stdlib's ``wsgiref`` is a development server that rewrites headers
    before any app sees them: it strips values with ``str.strip()`` (so ``\\xa0 7``,
    ``7\\x1c`` arrive as ``7``), starts a new header at a bare CR inside another header's
    value, and maps ``Fencing_Token`` to the same key as ``Fencing-Token``. Under it the
    middleware logs the warning ``etcdfence.wsgiref_rewrites_headers`` once per process;
    never serve fenced writes with it.
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        methods: Iterable[str] = UNSAFE_METHODS,
        required: bool = True,
        lock: str | None = None,
        verify: Any = None,
    ) -> None:
        self.app = app
        self._policy = _Policy(methods, required)
        self._admission = Admission(_GATE, lock=lock, verify=verify)
        self._admits = lock is not None or verify is not None

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        if not _warned_wsgiref and str(environ.get("SERVER_SOFTWARE", "")).startswith(
            "WSGIServer/"
        ):
            _warn_wsgiref(environ)
        raw = environ.get(_WSGI_HEADER)
        try:
            token = self._policy.token(
                environ.get("REQUEST_METHOD", "GET"), raw, 0 if raw is None else 1
            )
        except InvalidTokenError as exc:
            return _wsgi_json(start_response, 400, _bad_request(exc))
        if self._admits and token is not None:
            try:
                self._admission.admit(token)
            except EtcdfenceError as exc:
                return _wsgi_json(start_response, *_refusal(exc, token))
        environ[ENVIRON_KEY] = token
        try:
            result = self.app(environ, start_response)
        except (StaleTokenError, NotOwnerError) as exc:
            return _wsgi_json(start_response, 409, conflict_body(exc, token), sys.exc_info())
        return _FirstChunk(result, start_response, token)


_warned_wsgiref = False


def _warn_wsgiref(environ: dict[str, Any]) -> None:
    """Log, once per process, that wsgiref rewrites header values (see
    :class:`WSGIFencingMiddleware`)."""
    global _warned_wsgiref
    _warned_wsgiref = True
    log.warning(
        "etcdfence.wsgiref_rewrites_headers",
        server=environ.get("SERVER_SOFTWARE"),
        detail="wsgiref strips and splits header values before the app sees them; "
        "Fencing-Token is checked as rewritten. Use gunicorn or waitress for fenced writes",
    )


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

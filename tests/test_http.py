"""HTTP write gates (etcdfence.http): the httpx transports against real locks, elections
and electors on real etcd; the ASGI middleware under a real uvicorn and the WSGI twin
under a real wsgiref server, both on loopback; the Starlette example end to end; and the
chaos case — a holder cut off from etcd by the fault proxy sends nothing after its
session is lost, while a naive client with the same token keeps reaching the server."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etcdfence as ef
from etcdfence.http import (
    ENVIRON_KEY,
    FencingMiddleware,
    WSGIFencingMiddleware,
    conflict_body,
    fencing_token,
)
from etcdfence.testing.proxy import FaultProxy
from etcdfence.token import MAX_TOKEN

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
example: Any = importlib.import_module("fenced_http_service")

FencingTransport = ef.http.FencingTransport  # type: ignore[attr-defined]
AsyncFencingTransport = ef.http.AsyncFencingTransport  # type: ignore[attr-defined]


# ------------------------------------------------------------------ real servers on loopback


def serve_asgi(app: Any) -> Any:
    """A real uvicorn on 127.0.0.1 (its own thread and loop); ``with`` yields the base URL."""
    return example.ServiceThread(app)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_wsgi(app: Any) -> Iterator[str]:
    """A real threaded wsgiref server on 127.0.0.1; yields the base URL."""
    server = make_server("127.0.0.1", 0, app, _ThreadingWSGIServer, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class Arrivals:
    """Requests as the server saw them, counted before any middleware: (monotonic time,
    method, path, Fencing-Token, X-Seq)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[float, str, str, str | None, int | None]] = []

    def record(self, method: str, path: str, token: str | None, seq: str | None) -> None:
        with self.lock:
            self.seen.append(
                (time.monotonic(), method, path, token, None if seq is None else int(seq))
            )

    def asgi(self, app: Any) -> Any:
        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                self.record(
                    scope["method"], scope["path"], headers.get("fencing-token"),
                    headers.get("x-seq"),
                )  # fmt: skip
            await app(scope, receive, send)

        return counted

    def seqs(self) -> set[int]:
        with self.lock:
            return {s for *_, s in self.seen if s is not None}

    def tokens(self) -> list[str | None]:
        with self.lock:
            return [t for _, _, _, t, _ in self.seen]


# ------------------------------------------------------------------ a small ASGI app


def probe_asgi(**options: Any) -> Any:
    """Echoes the token the middleware handed over; /stale and /notowner raise what a
    guard would; /late raises after the response started."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        token = fencing_token(scope, required=False)
        path = scope["path"]
        if path == "/stale":
            raise ef.StaleTokenError("orders", int(token or 1), 99)
        if path == "/notowner":
            raise ef.NotOwnerError("the writer no longer holds orders")
        if path == "/slow":
            await asyncio.sleep(5)
        body = json.dumps({"token": None if token is None else token.value}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        if path == "/late":
            raise ef.StaleTokenError("orders", 1, 2)
        await send({"type": "http.response.body", "body": body})

    return FencingMiddleware(app, **options)


def probe_wsgi(**options: Any) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        token = fencing_token(environ, required=False)
        path = environ["PATH_INFO"]
        if path == "/stale":
            raise ef.StaleTokenError("orders", int(token or 1), 99)
        if path == "/notowner":
            raise ef.NotOwnerError("the writer no longer holds orders")
        start_response("200 OK", [("Content-Type", "application/json")])
        if path == "/lazy-stale":  # raised while the body is produced, before its first byte

            def body() -> Iterator[bytes]:
                yield b""
                raise ef.StaleTokenError("orders", int(token or 1), 77)

            return body()
        return [json.dumps({"token": None if token is None else token.value}).encode()]

    return WSGIFencingMiddleware(app, **options)


@pytest.fixture(scope="module")
def asgi_url() -> Iterator[str]:
    with serve_asgi(probe_asgi()) as url:
        yield url


@pytest.fixture(scope="module")
def wsgi_url() -> Iterator[str]:
    with serve_wsgi(probe_wsgi()) as url:
        yield url


@pytest.fixture(params=["asgi", "wsgi"])
def server_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


BAD_HEADERS: dict[str, Any] = {
    "missing": [],
    "abc": [("Fencing-Token", "abc")],
    "zero": [("Fencing-Token", "0")],
    "negative": [("Fencing-Token", "-1")],
    "beyond int64": [("Fencing-Token", str(MAX_TOKEN + 1))],
    "two headers": [("Fencing-Token", "5"), ("Fencing-Token", "6")],
    "comma list": [("Fencing-Token", "5, 6")],
    "float": [("Fencing-Token", "1.5")],
    "empty": [("Fencing-Token", "")],
    "non-ascii digits": [("Fencing-Token", "١٢".encode())],  # type: ignore[list-item]
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_a_write_without_a_valid_token_gets_400_and_never_reaches_the_app(
    server_url: str, case: str
) -> None:
    with httpx.Client(base_url=server_url) as http:
        answer = http.put("/stale", content=b"x", headers=BAD_HEADERS[case])
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["header"] == "Fencing-Token" and "token" in body["error"].lower()
    assert answer.headers["content-type"] == "application/json"


def test_the_handler_gets_the_token_and_safe_methods_need_none(server_url: str) -> None:
    with httpx.Client(base_url=server_url) as http:
        assert http.put("/echo", headers={"Fencing-Token": "42"}).json() == {"token": 42}
        assert http.post("/echo", headers={"Fencing-Token": str(MAX_TOKEN)}).json() == {
            "token": MAX_TOKEN
        }
        assert http.get("/echo").json() == {"token": None}
        assert http.get("/echo", headers={"Fencing-Token": "7"}).json() == {"token": 7}
        # a token a client did send is never ignored, even where none is needed
        assert http.get("/echo", headers={"Fencing-Token": "abc"}).status_code == 400


def test_a_stale_write_becomes_409_with_resource_token_and_current(server_url: str) -> None:
    with httpx.Client(base_url=server_url) as http:
        stale = http.put("/stale", headers={"Fencing-Token": "33"})
        assert stale.status_code == 409
        assert stale.json() == {
            "error": "stale fencing token", "resource": "orders", "token": 33, "current": 99,
        }  # fmt: skip
        other = http.delete("/notowner", headers={"Fencing-Token": "34"})
        assert other.status_code == 409
        assert other.json() == {
            "error": "the writer no longer holds orders",
            "resource": None, "token": 34, "current": None,
        }  # fmt: skip


def test_wsgi_refusal_raised_inside_the_body_before_its_first_byte_is_409(wsgi_url: str) -> None:
    answer = httpx.put(f"{wsgi_url}/lazy-stale", headers={"Fencing-Token": "5"})
    assert answer.status_code == 409
    assert answer.json()["current"] == 77


def test_asgi_refusal_after_the_response_started_is_not_rewritten(asgi_url: str) -> None:
    """Once the status went out the middleware cannot change it: the error reaches the
    server (which cuts the response short) instead of a second, contradictory answer."""
    with httpx.Client(base_url=asgi_url) as http:
        try:
            answer = http.put("/late", headers={"Fencing-Token": "5"})
        except httpx.RemoteProtocolError:
            return  # the server aborted the half-sent response
        assert answer.status_code == 200 and answer.content == b""


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_options_optional_token_and_own_methods(kind: str) -> None:
    serve, probe = (serve_asgi, probe_asgi) if kind == "asgi" else (serve_wsgi, probe_wsgi)
    with serve(probe(required=False)) as url:
        assert httpx.put(f"{url}/echo").json() == {"token": None}
        assert httpx.put(f"{url}/echo", headers={"Fencing-Token": "0"}).status_code == 400
    with serve(probe(methods=["POST", "get"])) as url:
        assert httpx.put(f"{url}/echo").json() == {"token": None}
        assert httpx.get(f"{url}/echo").status_code == 400
        assert httpx.post(f"{url}/echo").status_code == 400


def test_options_are_validated() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    with pytest.raises(ef.InvalidTypeError):
        FencingMiddleware(app, methods="POST")
    with pytest.raises(ef.InvalidTypeError):
        WSGIFencingMiddleware(lambda e, s: [], required="yes")  # type: ignore[arg-type]


def test_fencing_token_helper() -> None:
    from starlette.requests import Request

    token = ef.FencingToken(8)
    assert fencing_token({"type": "http", "state": {"fencing_token": token}}) == token
    assert fencing_token(Request({"type": "http", "state": {"fencing_token": token}})) == token
    assert fencing_token({ENVIRON_KEY: token, "REQUEST_METHOD": "PUT"}) == token
    assert fencing_token({"type": "http"}, required=False) is None
    with pytest.raises(ef.InvalidTokenError, match="FencingMiddleware"):
        fencing_token({"type": "http", "state": {}})
    with pytest.raises(ef.InvalidTypeError):
        fencing_token(42)
    assert conflict_body(ef.StaleTokenError("r", 1, 2), None)["current"] == 2


def test_the_token_never_leaks_into_lifespan_state_or_the_next_request() -> None:
    """The token goes into the request's own state (ASGI servers hand each request a
    shallow copy of the lifespan state), like Starlette's ``request.state``."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield {"db": "pool"}

    async def echo(request: Request) -> JSONResponse:
        token = fencing_token(request, required=False)
        return JSONResponse({"db": request.state.db, "token": token and token.value})

    app = Starlette(routes=[Route("/", echo, methods=["GET", "PUT"])], lifespan=lifespan,
                    middleware=[Middleware(FencingMiddleware)])  # fmt: skip
    with serve_asgi(app) as url, httpx.Client(base_url=url) as http:
        assert http.put("/", headers={"Fencing-Token": "12"}).json() == {"db": "pool", "token": 12}
        assert http.get("/").json() == {"db": "pool", "token": None}
    scope: dict[str, Any] = {"type": "http", "method": "PUT", "headers": [(b"fencing-token", b"9")]}
    seen: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(fencing_token(scope))

    asyncio.run(FencingMiddleware(inner)(scope, None, None))  # type: ignore[arg-type]
    assert seen == [ef.FencingToken(9)]  # a scope without state gets its own


def test_importing_needs_no_httpx_and_the_transport_names_the_extra() -> None:
    code = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("httpx", "httpcore"):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import etcdfence, etcdfence.http
assert "httpx" not in sys.modules
from etcdfence.http import FencingMiddleware, WSGIFencingMiddleware, fencing_token
FencingMiddleware(lambda s, r, w: None)
try:
    from etcdfence.http import FencingTransport
except ImportError as exc:
    print("ImportError:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ImportError: etcdfence.http.FencingTransport needs httpx" in out.stdout
    assert "etcdfence[http]" in out.stdout
    plain = subprocess.run([sys.executable, "-c", "import sys, etcdfence; "
                            "print('httpx' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert plain.stdout.strip() == "False", plain.stderr


def test_transport_refuses_bad_holders_and_reserves() -> None:
    with pytest.raises(ef.InvalidTypeError):
        FencingTransport(object())
    with pytest.raises(ef.InvalidTypeError):
        FencingTransport(ef.FencingToken(5))  # a bare token cannot tell it was lost
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ef.InvalidArgumentError):
            FencingTransport(_Holder(5), reserve=bad)
    with pytest.raises(ef.InvalidTypeError):
        FencingTransport(_Holder(5), reserve=True)


class _Holder:
    """A TokenHolder of our own: a token and a flag that says it was lost."""

    def __init__(self, token: object) -> None:
        self.token = token
        self.lost = False

    def check(self) -> None:
        if self.lost:
            raise ef.SessionExpiredError("lost")


def test_a_token_holder_of_your_own(asgi_url: str) -> None:
    arrivals = Arrivals()
    with serve_asgi(arrivals.asgi(probe_asgi())) as url:
        holder = _Holder(ef.FencingToken(21))
        assert isinstance(holder, ef.http.TokenHolder)  # type: ignore[attr-defined]
        with httpx.Client(base_url=url, transport=FencingTransport(holder)) as http:
            # a Fencing-Token the caller set is replaced by the holder's
            answer = http.put("/echo", headers={"Fencing-Token": "3"})
            assert answer.json() == {"token": 21}
            holder.token = 0  # a broken holder: refused before sending
            with pytest.raises(ef.InvalidTokenError):
                http.put("/echo")
            holder.token = None
            with pytest.raises(ef.NotOwnerError, match="PUT http"):
                http.put("/echo")
            holder.token, holder.lost = 22, True
            with pytest.raises(ef.SessionExpiredError):
                http.put("/echo")
        assert arrivals.tokens() == ["21"]


def test_a_holder_lost_while_connecting_sends_nothing() -> None:
    """Lost after the request entered the transport (here: while the connection was being
    made, as it would be during a slow connect or a wait for a pooled connection): the
    check just before the request line goes out refuses it. The caller's own ``trace``
    hook is still called."""
    arrivals = Arrivals()
    with serve_asgi(arrivals.asgi(probe_asgi())) as url:
        holder = _Holder(5)
        events: list[str] = []

        def trace(event: str, info: Any) -> None:
            events.append(event)
            if event.endswith("connect_tcp.complete"):
                holder.lost = True

        with httpx.Client(base_url=url, transport=FencingTransport(holder)) as http:
            with pytest.raises(ef.SessionExpiredError):
                http.put("/echo", content=b"x", extensions={"trace": trace})
            assert "connection.connect_tcp.complete" in events
            assert "http11.send_request_headers.started" in events
            assert "http11.send_request_headers.complete" not in events
            holder.lost = False
            assert http.put("/echo").json() == {"token": 5}

        async def async_case() -> None:
            async def atrace(event: str, info: Any) -> None:
                trace(event, info)

            holder.lost = False
            async with httpx.AsyncClient(
                base_url=url, transport=AsyncFencingTransport(holder)
            ) as ahttp:
                with pytest.raises(ef.SessionExpiredError):
                    await ahttp.put("/echo", content=b"x", extensions={"trace": atrace})

        asyncio.run(async_case())
    assert arrivals.tokens() == ["5"]


async def test_async_transport_survives_a_cancelled_request(asgi_url: str) -> None:
    """A request cancelled while waiting for its answer leaves the transport usable."""
    holder = _Holder(ef.FencingToken(8))
    async with httpx.AsyncClient(base_url=asgi_url, transport=AsyncFencingTransport(holder)) as h:
        slow = asyncio.create_task(h.put("/slow"))
        await asyncio.sleep(0.3)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert (await h.put("/echo")).json() == {"token": 8}
        holder.lost = True
        with pytest.raises(ef.SessionExpiredError):
            await h.put("/echo")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=st.one_of(
        st.binary(max_size=30),
        st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
        st.text(alphabet="0123456789 +-_.,\t", max_size=25).map(str.encode),
    ),
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
)
def test_any_header_value_is_a_token_or_a_400(raw: bytes, method: str) -> None:
    """Hostile header values never reach the app as anything but a valid token, and
    never raise out of the middleware."""
    answers: list[Any] = []
    reached: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(fencing_token(scope, required=False))
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: Any) -> None:
        answers.append(message)

    scope = {"type": "http", "method": method, "path": "/", "headers": [(b"fencing-token", raw)]}
    asyncio.run(FencingMiddleware(app)(scope, None, send))  # type: ignore[arg-type]
    text = raw.decode("latin-1").strip(" \t")  # RFC 9110 OWS only (issue #21.12)
    valid = text.isascii() and text.isdigit() and len(text) <= 19 and 0 < int(text) <= MAX_TOKEN
    if valid:
        assert reached == [ef.FencingToken(int(text))]
    else:
        assert reached == []
        assert answers[0]["status"] == 400
        assert "error" in json.loads(answers[1]["body"])


# ------------------------------------------------------------------ transports on real etcd


@pytest.fixture
def probe_url() -> Iterator[tuple[str, Arrivals]]:
    arrivals = Arrivals()
    with serve_asgi(arrivals.asgi(probe_asgi())) as url:
        yield url, arrivals


@pytest.mark.integration
def test_lock_transport_stamps_follows_and_stops(
    etcd_client: ef.Client, etcd_namespace: str, probe_url: tuple[str, Arrivals]
) -> None:
    url, arrivals = probe_url
    with etcd_client.session(ttl=10) as session:
        lock = session.lock(etcd_namespace + "/w")
        with httpx.Client(base_url=url, transport=FencingTransport(lock)) as http:
            with pytest.raises(ef.NotOwnerError, match="not held"):
                http.put("/echo")  # not acquired yet
            first = lock.acquire()
            assert http.put("/echo").json() == {"token": first.value}
            lock.release()
            with pytest.raises(ef.NotOwnerError):
                http.post("/echo", content=b"after release")
            second = lock.acquire()  # the same client follows the next hold
            assert second > first
            assert http.put("/echo").json() == {"token": second.value}
            # a token that names another lease than the session's is refused
            mixed = types.SimpleNamespace(
                session=session, token=ef.FencingToken(second.value, lease_id=1)
            )
            with pytest.raises(ef.NotOwnerError, match="not its session's"):
                FencingTransport(mixed).handle_request(httpx.Request("PUT", url + "/echo"))
            # a reserve larger than what is left of the session refuses at once
            strict = FencingTransport(lock, reserve=session.ttl)
            with (
                httpx.Client(base_url=url, transport=strict) as tight,
                pytest.raises(ef.SessionExpiredError, match="less than"),
            ):
                tight.put("/echo")
    with (
        httpx.Client(base_url=url, transport=FencingTransport(lock)) as http,
        pytest.raises(ef.NotOwnerError, match="not held"),  # closing the session released it
    ):
        http.put("/echo")
    assert arrivals.tokens() == [first.to_text(), second.to_text()]  # the full form


@pytest.mark.integration
def test_transport_is_thread_safe(
    etcd_client: ef.Client, etcd_namespace: str, probe_url: tuple[str, Arrivals]
) -> None:
    """Eight threads share one transport; each request carries the hold's token; once
    the lock is released no thread gets a request through."""
    url, arrivals = probe_url
    with etcd_client.session(ttl=10) as session:
        lock = session.lock(etcd_namespace + "/w")
        token = lock.acquire()
        released = threading.Event()
        results: list[str] = []
        with httpx.Client(base_url=url, transport=FencingTransport(lock)) as http:

            def worker() -> None:
                for _ in range(200):
                    try:
                        http.put("/echo")
                        results.append("sent-after" if released.is_set() else "sent")
                    except ef.NotOwnerError:
                        results.append("refused")
                        if not released.is_set():
                            results.append("refused-early")

            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            while results.count("sent") < 80:
                time.sleep(0.005)
            released.set()  # before: a refusal seen before this point is a bug
            lock.release()
            for t in threads:
                t.join(60)
    assert "refused-early" not in results
    assert results.count("refused") > 0
    assert set(arrivals.tokens()) == {token.to_text()}
    # requests that passed the gate just before release may land after it (why the
    # server checks); none may have *started* after it: arrivals <= requests let through
    assert len(arrivals.tokens()) == results.count("sent") + results.count("sent-after")


@pytest.mark.integration
def test_a_body_upload_that_outlives_the_hold_is_cut_off(
    etcd_client: ef.Client, etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """Headers out while the lock is held, the lock released mid-body: the transport
    stops before the next chunk, the server never sees a complete request."""
    resource = etcd_namespace + "/store"
    with serve_asgi(example.make_app(etcd_endpoints, resource)) as url:
        with etcd_client.session(ttl=10) as session:
            lock = session.lock(etcd_namespace + "/w")
            lock.acquire()

            def body() -> Iterator[bytes]:
                yield b"first half, "
                lock.release()
                yield b"second half"

            with (
                httpx.Client(base_url=url, transport=FencingTransport(lock)) as http,
                pytest.raises(ef.NotOwnerError, match="not held"),
            ):
                http.put("/kv/upload", content=body())
        assert httpx.get(f"{url}/kv/upload").status_code == 404
        assert httpx.get(f"{url}/fence").json()["mark"] == 0


@pytest.mark.integration
async def test_async_transport_with_a_lock_and_an_elector(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str, probe_url: tuple[str, Arrivals]
) -> None:
    url, arrivals = probe_url
    async with async_etcd_client.session(ttl=10) as session:
        lock = session.lock(etcd_namespace + "/w")
        async with httpx.AsyncClient(base_url=url, transport=AsyncFencingTransport(lock)) as h:
            token = await lock.acquire()
            assert (await h.put("/echo")).json() == {"token": token.value}
            await lock.release()
            with pytest.raises(ef.NotOwnerError):
                await h.put("/echo")
    elector = ef.AsyncLeaderElector(async_etcd_client, etcd_namespace + "/svc", identity="a")
    transport = AsyncFencingTransport(elector)
    async with httpx.AsyncClient(base_url=url, transport=transport) as http:
        with pytest.raises(ef.NotLeaderError):
            await http.put("/echo")  # no term yet
        elected = asyncio.Event()
        answers: list[Any] = []

        async def work(term: ef.FencingToken, stop: asyncio.Event) -> None:
            answers.append((term, (await http.put("/echo")).json()))
            elected.set()
            await stop.wait()

        runner = asyncio.create_task(elector.run(work))
        await asyncio.wait_for(elected.wait(), 20)
        elector.stop()
        await asyncio.wait_for(runner, 20)
        with pytest.raises(ef.NotLeaderError):
            await http.put("/echo")  # resigned
    ((term, echoed),) = answers
    assert echoed == {"token": term.value}
    assert arrivals.tokens() == [token.to_text(), term.to_text()]


@pytest.mark.integration
def test_sync_elector_and_election_holders(
    etcd_client: ef.Client, etcd_namespace: str, probe_url: tuple[str, Arrivals]
) -> None:
    url, _ = probe_url
    with etcd_client.session(ttl=10) as session:
        election = session.election(etcd_namespace + "/e")
        with httpx.Client(base_url=url, transport=FencingTransport(election)) as http:
            with pytest.raises(ef.NotLeaderError):
                http.put("/echo")
            term = election.campaign("me")
            assert http.put("/echo").json() == {"token": term.value}
            election.resign()
            with pytest.raises(ef.NotLeaderError):
                http.put("/echo")
    elector = ef.LeaderElector(etcd_client, etcd_namespace + "/svc", identity="a")
    seen: list[Any] = []

    def work(term: ef.FencingToken, stop: threading.Event) -> None:
        with httpx.Client(base_url=url, transport=FencingTransport(elector)) as http:
            seen.append((term.value, http.put("/echo").json()["token"]))
        stop.wait(30)

    runner = threading.Thread(target=elector.run, args=(work,))
    runner.start()
    deadline = time.monotonic() + 20
    while not seen:
        assert time.monotonic() < deadline, "never elected"
        time.sleep(0.01)
    elector.stop()
    runner.join(20)
    assert seen[0][0] == seen[0][1]
    with pytest.raises(ef.NotLeaderError):
        FencingTransport(elector).handle_request(httpx.Request("PUT", url + "/echo"))


# ------------------------------------------------------------------ the example, end to end


@pytest.mark.integration
def test_example_service_fences_by_header_with_a_409_body(
    etcd_client: ef.Client, etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    resource = etcd_namespace + "/store"
    with serve_asgi(example.make_app(etcd_endpoints, resource)) as url:
        holds = []
        for _ in range(2):
            with etcd_client.session(ttl=10) as session:
                lock = session.lock(etcd_namespace + "/w")
                token = lock.acquire()
                with httpx.Client(base_url=url, transport=FencingTransport(lock)) as http:
                    answer = http.put("/kv/greeting", content=f"v{token.value}".encode())
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["token"] == token.value
                holds.append(token)
                lock.release()
        old, new = holds
        zombie = httpx.put(f"{url}/kv/greeting", content=b"zombie",
                           headers={"Fencing-Token": str(old)})  # fmt: skip
        assert zombie.status_code == 409
        assert zombie.json() == {"error": "stale fencing token", "resource": resource,
                                 "token": old.value, "current": new.value}  # fmt: skip
        assert httpx.get(f"{url}/kv/greeting").content == f"v{new.value}".encode()
        assert httpx.put(f"{url}/kv/greeting", content=b"anon").status_code == 400
        gone = httpx.delete(f"{url}/kv/greeting", headers={"Fencing-Token": str(old)})
        assert gone.status_code == 409
        assert httpx.get(f"{url}/fence").json() == {"resource": resource, "mark": new.value}


@pytest.mark.integration
def test_http_conformance_parts(etcd_namespace: str, etcd_endpoints: list[str]) -> None:
    resource = etcd_namespace + "/store"
    with serve_asgi(example.make_app(etcd_endpoints, resource)) as url:
        parts = example.http_conformance_parts(url)
        write, read = parts["write"], parts["read"]
        assert read("k/1") is None
        write(10, "k/1", b"ten")
        write(ef.FencingToken(10), "k/1", "ten again")
        assert read("k/1") == b"ten again"
        with pytest.raises(ef.StaleTokenError) as info:
            write(9, "k/1", b"nine")
        assert (info.value.resource, info.value.token, info.value.current) == (resource, 9, 10)
        for bad in (0, -1, True, "10", MAX_TOKEN + 1):
            with pytest.raises(ef.InvalidTokenError):
                write(bad, "k/1", b"bad")
        assert read("k/1") == b"ten again"


@pytest.mark.integration
def test_the_service_keeps_its_mark_across_a_restart(
    etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """The mark lives in etcd, not in the process: a restarted service still refuses
    the token it refused before (the conformance kit's restart scenario)."""
    service = example.ServiceThread(example.make_app(etcd_endpoints, etcd_namespace + "/s"))
    parts = example.http_conformance_parts(service.start(), restart=service.restart)
    try:
        parts["write"](20, "k", b"twenty")
        parts["restart"]()
        with pytest.raises(ef.StaleTokenError):
            parts["write"](19, "k", b"nineteen")
        assert parts["read"]("k") == b"twenty"
    finally:
        service.stop()


@pytest.mark.integration
def test_example_serves_on_uvicorn_and_its_client_writes_under_the_lock(
    env: dict[str, str], etcd_namespace: str
) -> None:
    script = str(ROOT / "examples" / "fenced_http_service.py")
    resource = etcd_namespace + "/store"
    server = subprocess.Popen([sys.executable, script, "serve", "--port", "0",
                               "--resource", resource],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)  # fmt: skip
    try:
        assert server.stdout is not None
        match = re.match(r"listening on (http://127\.0\.0\.1:\d+)", server.stdout.readline())
        assert match
        url = match.group(1)
        put = subprocess.run([sys.executable, script, "put", "--url", url, "--resource",
                              resource, "--key", "greeting", "--value", "hello"],
                             capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
        assert put.returncode == 0, put.stdout + put.stderr
        assert put.stdout.startswith("200")
        assert httpx.get(f"{url}/kv/greeting").content == b"hello"
    finally:
        server.terminate()
        _, err = server.communicate(timeout=20)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err, err


def test_wsgi_twin_in_front_of_a_sqlfence_write(tmp_path: Path) -> None:
    """A WSGI service whose handler writes through SQLFence (SQLite): the mark and the row
    commit together; a stale token becomes the middleware's 409 and changes nothing."""
    import sqlite3

    from etcdfence.sql import SQLFence

    db = str(tmp_path / "orders.db")
    with sqlite3.connect(db) as conn:
        SQLFence(conn, "orders").ensure_schema()
        conn.execute("CREATE TABLE orders (k TEXT PRIMARY KEY, v BLOB)")

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        token = fencing_token(environ)
        value = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        conn = sqlite3.connect(db, timeout=30)
        try:
            with SQLFence(conn, "orders").guarded(token) as cur:  # StaleTokenError -> 409
                cur.execute("INSERT OR REPLACE INTO orders VALUES ('latest', ?)", (value,))
        finally:
            conn.close()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"written"]

    with serve_wsgi(WSGIFencingMiddleware(app)) as url, httpx.Client(base_url=url) as http:
        assert http.put("/", content=b"v7", headers={"Fencing-Token": "7"}).text == "written"
        stale = http.put("/", content=b"v6", headers={"Fencing-Token": "6"})
        assert stale.status_code == 409
        assert stale.json() == {"error": "stale fencing token", "resource": "orders",
                                "token": 6, "current": 7}  # fmt: skip
        assert http.put("/", content=b"v").status_code == 400
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT v FROM orders").fetchall() == [(b"v7",)]


@pytest.mark.integration
def test_the_readme_http_snippets_run(
    etcd_endpoints: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's "HTTP write gates" client and server, as written, against real etcd
    (found through $ETCDFENCE_ENDPOINTS, as a user's would be) and a real uvicorn."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("### HTTP write gates")
    section = readme[start : readme.index("\n### ", start)]
    client_code, server_code = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.setenv("ETCDFENCE_ENDPOINTS", etcd_endpoints[0])
    server_ns: dict[str, Any] = {}
    exec(server_code, server_ns)
    arrivals = Arrivals()
    with serve_asgi(arrivals.asgi(server_ns["app"])) as url:
        client_code = client_code.replace("http://127.0.0.1:8000", url)
        client_code = client_code.replace("http.put(", "answer = http.put(")
        client_ns: dict[str, Any] = {}
        exec(client_code, client_ns)
        assert client_ns["answer"].status_code == 200, client_ns["answer"].text
        stale = httpx.put(f"{url}/orders/latest", headers={"Fencing-Token": "1"})
        assert stale.status_code == 409 and stale.json()["resource"] == "orders"
        assert httpx.put(f"{url}/orders/latest").status_code == 400
    sent = arrivals.tokens()
    assert sent[1:] == ["1", None]
    assert sent[0] is not None  # the lock's token, in the full form
    assert stale.json()["current"] == ef.FencingToken.from_header(sent[0]).value


# ------------------------------------------------------------------ chaos: the cut-off holder


@pytest.mark.integration
@pytest.mark.chaos
def test_cut_off_holder_sends_nothing_after_its_session_is_lost(
    etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """The holder reaches etcd only through a fault proxy; the proxy blackholes it.

    Two clients write for the holder with the same token, concurrently: one through
    FencingTransport, one a naive httpx client that just sets the header. After the
    session's local deadline passes, the fenced one raises SessionExpiredError on every
    request and the server sees none of them; the naive one keeps reaching the server
    (and, as nobody took the lock over yet, is even accepted) — which is what the
    transport is for, and what this test would report if the gate were gone."""
    resource = etcd_namespace + "/store"
    arrivals = Arrivals()
    app = arrivals.asgi(example.make_app(etcd_endpoints, resource))
    with (
        serve_asgi(app) as url,
        FaultProxy(etcd_endpoints[0]) as proxy,
        ef.Client(proxy.endpoint, timeout=2.0) as cut_off,
    ):
        session = cut_off.session(ttl=2)
        session.open()
        expired_at: list[float] = []
        session.on_expired(lambda: expired_at.append(time.monotonic()))
        lock = session.lock(etcd_namespace + "/w")
        token = lock.acquire()
        log: dict[str, list[tuple[int, float, str]]] = {"fenced": [], "naive": []}
        stop = threading.Event()

        headers_out: dict[int, float] = {}  # seq -> when its request line started out

        def writer(name: str, http: httpx.Client, first_seq: int) -> None:
            seq = first_seq
            while not stop.is_set():
                started = time.monotonic()

                def trace(event: str, info: Any, seq: int = seq) -> None:
                    # our hook runs before the transport's own check at this point
                    if event.endswith("send_request_headers.started"):
                        headers_out[seq] = time.monotonic()

                try:
                    answer = http.put("/kv/x", content=b"v", headers={"X-Seq": str(seq)},
                                      extensions={"trace": trace})  # fmt: skip
                    outcome = str(answer.status_code)
                except ef.SessionExpiredError:
                    outcome = "refused"
                log[name].append((seq, started, outcome))
                seq += 1
                time.sleep(0.01)

        fenced = httpx.Client(base_url=url, transport=FencingTransport(lock))
        naive = httpx.Client(base_url=url, headers={"Fencing-Token": str(token)})
        threads = [
            threading.Thread(target=writer, args=("fenced", fenced, 0)),
            threading.Thread(target=writer, args=("naive", naive, 1_000_000)),
        ]
        for t in threads:
            t.start()
        time.sleep(0.5)
        proxy.blackhole()
        deadline = time.monotonic() + 15
        while not expired_at:
            assert time.monotonic() < deadline, "the session never expired locally"
            time.sleep(0.01)
        time.sleep(1.0)  # keep both writers going well past the loss
        stop.set()
        for t in threads:
            t.join(20)
        fenced.close()
        naive.close()
        proxy.heal()
    lost = expired_at[0]
    received = arrivals.seqs()
    fenced_received = {s for s in received if s < 1_000_000}
    written = {s for s, started, outcome in log["fenced"] if outcome == "200"}
    refused = {s for s, started, outcome in log["fenced"] if outcome == "refused"}
    assert written and refused, log["fenced"]
    # every request started after the loss was refused, and none of them reached the server
    late = {s for s, started, _ in log["fenced"] if started > lost}
    assert late and late <= refused, log["fenced"]
    assert not fenced_received & late, "a request started after the loss reached the server"
    # whatever reached the server started sending before the loss; a refused one among
    # them was cut off mid-body (its write never completed), the rest were written
    assert all(headers_out[s] < lost for s in fenced_received)
    assert written <= fenced_received
    assert all(s in refused for s in fenced_received - written)
    # the naive control: requests *started* after the loss still reached the server
    naive_late = {s for s, started, _ in log["naive"] if started > lost}
    print(
        f"fenced: {len(written)} sent before the loss, {len(refused)} refused; naive: "
        f"{len(naive_late & received)} reached the server after it"
    )
    assert naive_late & received, "the control never reached the server after the loss"


# ------------------------------------------- issue #21.4: an upload outlives its session


class _Chunked:
    """An exact parser of a chunked request body, fed the bytes as they arrive: counts
    the data bytes (``size``) and says when the body is whole (``done``: the zero-size
    last chunk and the blank line after it, in their place in the framing). A body cut
    off by a reset or an EOF is never whole, whatever its last bytes look like; a framing
    error (``bad``) is not whole either."""

    def __init__(self) -> None:
        self.size = 0
        self.done = False
        self.bad = False
        self._buf = b""
        self._left = 0  # data bytes left in the current chunk, then its CRLF
        self._state = "size"  # size -> data -> crlf -> size ... -> trailer

    def feed(self, data: bytes) -> None:
        self._buf += data
        while not (self.done or self.bad) and self._step():
            pass

    def _step(self) -> bool:
        """Consume one framing element if it arrived whole; False to wait for more."""
        if self._state == "data":
            take = min(self._left, len(self._buf))
            self.size, self._left, self._buf = self.size + take, self._left - take, self._buf[take:]
            if self._left:
                return False
            self._state = "crlf"
            return True
        line, sep, rest = self._buf.partition(b"\r\n")
        if not sep:
            self.bad = len(self._buf) > 1024
            return False
        self._buf = rest
        if self._state == "crlf":
            self.bad, self._state = line != b"", "size"
        elif self._state == "trailer":
            self.done = line == b""  # trailer fields end at a blank line
        else:
            try:
                self._left = int(line.split(b";")[0], 16)
            except ValueError:
                self.bad = True
            self._state = "data" if self._left else "trailer"
        return True


class SlowSink:
    """A real HTTP server on loopback that reads request bodies slowly (a small receive
    buffer, ``rate`` bytes a second) and counts what arrived; answers 200 once a body is
    complete. ``received`` lists the bytes that arrived on each connection (the body's
    framing included), ``complete`` the data sizes of the bodies it received whole: as
    many bytes as Content-Length says, or a chunked body parsed to its last chunk
    (:class:`_Chunked`) — a reset or an EOF ends a body, never completes it."""

    def __init__(self, rate: int = 2 * 1024 * 1024) -> None:
        import socket

        self.rate = rate
        self.received: list[int] = []
        self.complete: list[int] = []
        self.ended = threading.Event()  # a connection's handler is done with it
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: Any) -> None:
        try:
            self._read(conn)
        finally:
            self.ended.set()

    def _read(self, conn: Any) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            head, _, body = head.partition(b"\r\n\r\n")
            match = re.search(rb"(?i)content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else None
            chunked = _Chunked() if length is None else None
            got, index = len(body), len(self.received)
            self.received.append(got)
            step = 16 * 1024
            while True:
                if chunked is not None:
                    chunked.feed(body)
                    whole, size = chunked.done, chunked.size
                else:
                    whole, size = got >= (length or 0), got
                if whole or (chunked is not None and chunked.bad):
                    break
                time.sleep(step / self.rate)
                try:
                    body = conn.recv(step)
                except OSError:  # a reset ends the body, never completes it
                    break
                if not body:
                    break
                got += len(body)
                self.received[index] = got
            if whole:
                self.complete.append(size)
                with contextlib.suppress(OSError):
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )

    def close(self) -> None:
        self._sock.close()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@pytest.mark.parametrize(
    ("sends", "reset", "whole"),
    [
        # the CI failure: 105 whole chunks of 64 KiB, then the client resets the connection
        ([_chunk(b"u" * 65536) * 105], True, None),
        # the same cut by an EOF, its last bytes looking like a last chunk (mid-chunk)
        ([_chunk(b"u" * 100)[:50], b"0\r\n\r\n"], False, None),
        # a whole body, its last chunk split across two sends (and two of the sink's reads)
        ([_chunk(b"u" * 100), b"0\r", b"\n\r\n"], False, 100),
        ([_chunk(b"u" * 65536) * 3 + b"0\r\nX-Trailer: 1\r\n\r\n"], False, 3 * 65536),
    ],
    ids=["reset-at-a-chunk-boundary", "eof-after-lookalike", "split-last-chunk", "trailer"],
)
@pytest.mark.serial  # cut off within 1.5 s of the session deadline
def test_the_slow_sink_knows_a_whole_chunked_body(
    sends: list[bytes], reset: bool, whole: int | None
) -> None:
    """The sink behind the cut-off tests parses chunked framing: a reset or an EOF never
    completes a body (the sink once counted any end of a chunked body as complete, so a
    reset after 105 whole chunks read as "the server received a complete body"), bytes
    that merely end like a last chunk do not either, and a whole body is seen whole
    however its last chunk is split (a test that could not fail otherwise)."""
    import socket
    import struct

    sink = SlowSink(rate=256 * 1024 * 1024)
    try:
        with socket.create_connection(sink._sock.getsockname()) as conn:
            conn.sendall(b"PUT /u HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            for data in sends:
                conn.sendall(data)
                time.sleep(0.2)  # each send its own read
            if whole is not None:
                conn.settimeout(10)
                assert conn.recv(100).startswith(b"HTTP/1.1 200"), sink.received
            elif reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert sink.ended.wait(10), "the sink never finished reading the body"
        assert sink.complete == ([] if whole is None else [whole]), sink.received
    finally:
        sink.close()


# 16 MB at the sink's 2 MB/s: ~8 s to upload whole, the session is lost after < 2 s.
_UPLOAD = b"u" * (16 * 1024 * 1024)


def _body(shape: str, tmp_path: Path) -> dict[str, Any]:
    if shape == "bytes":
        return {"content": _UPLOAD}
    if shape == "iterator":  # one big chunk, as a caller's generator may yield
        return {"content": iter([_UPLOAD])}
    if shape == "async-iterator":

        async def chunks() -> Any:
            yield _UPLOAD

        return {"content": chunks()}
    if shape == "file":
        path = tmp_path / "upload.bin"
        path.write_bytes(_UPLOAD)
        return {"content": path.open("rb")}
    assert shape == "multipart"
    return {"files": {"f": ("upload.bin", _UPLOAD)}}


@contextlib.contextmanager
def _expiring_lock(
    etcd_namespace: str, etcd_endpoints: list[str], ttl: int = 2
) -> Iterator[tuple[Any, Any]]:
    """A lock on a session whose keepalives are cut once the caller starts uploading:
    yields (lock, cut) where ``cut()`` blackholes the session's etcd and returns its
    local deadline (it no longer moves)."""
    with (
        FaultProxy(etcd_endpoints[0]) as proxy,
        ef.Client(proxy.endpoint, timeout=2.0) as client,
    ):
        session = client.session(ttl=ttl)
        session.open()
        lock = session.lock(etcd_namespace + "/w")
        lock.acquire()

        def cut() -> float:
            proxy.blackhole()
            time.sleep(0.3)  # a keepalive answered just now moved the deadline last
            return float(session.deadline)

        try:
            yield lock, cut
        finally:
            proxy.heal()
            with contextlib.suppress(ef.EtcdfenceError):
                session.close()


def _check_cut_off(sink: SlowSink, raised_at: float, deadline: float) -> None:
    time.sleep(0.5)  # what was in the sockets' buffers arrives
    assert sink.received, "the request never reached the server"
    assert not sink.complete, f"the server received a complete body: {sink.received}"
    assert max(sink.received) < len(_UPLOAD)
    # cut off at the session's deadline, not when the upload happened to end
    assert raised_at - deadline < 1.5, (raised_at, deadline)


@pytest.mark.serial  # cut off within 1.5 s of the session deadline
@pytest.mark.integration
@pytest.mark.parametrize("shape", ["bytes", "iterator", "file", "multipart"])
def test_an_upload_of_any_shape_is_cut_off_at_the_session_deadline(
    shape: str, etcd_namespace: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """Issue #21 item 4: httpx sends ``content=bytes`` (and a generator's big chunk, a
    multipart field) as one chunk, so a per-chunk check never ran and the upload outlived
    the session. The body is cut into bounded pieces, each checked."""
    sink = SlowSink()
    try:
        with (
            _expiring_lock(etcd_namespace, etcd_endpoints) as (lock, cut),
            httpx.Client(transport=FencingTransport(lock), timeout=30) as http,
        ):
            deadline = cut()
            with pytest.raises(ef.SessionExpiredError):
                http.put(sink.url + "/upload", **_body(shape, tmp_path))
            raised_at = time.monotonic()
        _check_cut_off(sink, raised_at, deadline)
    finally:
        sink.close()


@pytest.mark.serial  # cut off within 1.5 s of the session deadline
@pytest.mark.integration
@pytest.mark.parametrize("shape", ["bytes", "async-iterator", "multipart"])
async def test_async_upload_of_any_shape_is_cut_off_at_the_session_deadline(
    shape: str, etcd_namespace: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """The asyncio twin of the test above."""
    sink = SlowSink()
    try:
        with _expiring_lock(etcd_namespace, etcd_endpoints) as (lock, cut):
            async with httpx.AsyncClient(transport=AsyncFencingTransport(lock), timeout=30) as http:
                deadline = await asyncio.to_thread(cut)
                with pytest.raises(ef.SessionExpiredError):
                    await http.put(sink.url + "/upload", **_body(shape, tmp_path))
                raised_at = time.monotonic()
        await asyncio.to_thread(_check_cut_off, sink, raised_at, deadline)
    finally:
        sink.close()


@pytest.mark.serial  # cut off within 1.5 s of the session deadline
@pytest.mark.integration
def test_a_stalled_upload_is_cut_off_at_the_session_deadline(
    etcd_namespace: str, etcd_endpoints: list[str]
) -> None:
    """A server that stops reading altogether: no piece boundary comes, the write
    timeout bounded by the session's deadline ends the send."""
    sink = SlowSink(rate=1)  # reads 16 KB every 4.5 hours
    try:
        with (
            _expiring_lock(etcd_namespace, etcd_endpoints) as (lock, cut),
            httpx.Client(transport=FencingTransport(lock), timeout=60) as http,
        ):
            deadline = cut()
            with pytest.raises(ef.SessionExpiredError):
                http.put(sink.url + "/upload", content=_UPLOAD)
            raised_at = time.monotonic()
        assert raised_at - deadline < 1.5, (raised_at, deadline)
        assert not sink.complete
    finally:
        sink.close()


# ------------------- issue #21.4 again: each socket write bounded when it is made (H1, H2)


class HeldSink:
    """A real HTTP server on loopback that reads a request's headers, then nothing until
    ``resume_at`` (monotonic), then ``rate`` bytes a second (all at once: None). Records
    when a request's body arrived complete (``done``) and how much arrived (``got``);
    answers 200 to a complete body. ``drop()`` closes its connections."""

    def __init__(self, resume_at: float = 0.0, rate: int | None = None) -> None:
        import socket

        self.resume_at, self.rate = resume_at, rate
        self.done: float | None = None
        self.got = 0
        self.token: bytes | None = None
        self._dropped = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(4)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self._sock.accept()
            with conn:
                self._handle(conn)

    def _handle(self, conn: Any) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(65536)
        head, _, body = head.partition(b"\r\n\r\n")
        match = re.search(rb"(?i)fencing-token:\s*(\d+)", head)
        self.token = match.group(1) if match else None
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        while time.monotonic() < self.resume_at and not self._dropped.is_set():
            time.sleep(0.01)
        conn.settimeout(0.2)
        while not self._dropped.is_set():
            if self.rate:
                time.sleep(1024 / self.rate)
            try:
                data = conn.recv(1024 if self.rate else 1 << 20)
            except TimeoutError:
                continue
            if not data:
                return
            body += data
            self.got = len(body)
            whole = len(body) >= int(length.group(1)) if length else body.endswith(b"0\r\n\r\n")
            if whole:
                self.done = time.monotonic()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                return

    def drop(self) -> None:
        self._dropped.set()
        self._sock.close()


def _until(deadline: float, chunk: bytes = b"x" * 65536) -> Iterator[bytes]:
    """A producer slow to start that streams until ``deadline`` (the attack on #21.4:
    its last pieces go out just before the session's deadline)."""
    while time.monotonic() < deadline - 0.5:
        time.sleep(0.01)
    while time.monotonic() < deadline:
        yield chunk


def _held_body(shape: str, deadline: float, tmp_path: Path) -> dict[str, Any]:
    if shape == "generator":
        return {"content": _until(deadline)}
    if shape == "async-generator":

        async def chunks() -> Any:
            for chunk in _until(deadline):
                yield chunk

        return {"content": chunks()}
    return _body(shape, tmp_path)


def _take_over(etcd_endpoints: list[str], name: str, at: float) -> threading.Thread:
    """Another client acquires the lock ``name`` at ``at`` (monotonic)."""

    def run() -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        with ef.Client(etcd_endpoints[0]) as client, client.session(ttl=5) as session:
            assert session.lock(name).acquire(timeout=10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _check_nothing_after(sink: HeldSink, raised_at: float, deadline: float) -> None:
    time.sleep(1.0)  # the sink resumed reading: whatever was in the buffers arrived
    assert sink.token is not None, "the request never reached the server"
    assert sink.done is None, f"the server got the whole body ({sink.got} B) after the loss"
    assert raised_at - deadline < 1.0, (raised_at, deadline)


@pytest.mark.integration
@pytest.mark.parametrize("shape", ["generator", "bytes", "file", "multipart"])
def test_a_write_started_before_the_deadline_does_not_outlive_it(
    shape: str, etcd_namespace: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """H2: the write timeout was the time left at the request's *start*, and httpcore
    restarts it at every socket send, so a send made just before the deadline could run
    (and finish the body) long after it, once the server read again. Each send is now
    bounded by the deadline as it is when the send is made, and the connection is reset
    when it passes: the server, reading nothing until 3 s after the deadline while
    another client took the lock, never gets the whole body. (A TTL of 6 s: the time
    left at the start outlasts the server's pause, as in the attack.)"""
    with (
        _expiring_lock(etcd_namespace, etcd_endpoints, ttl=6) as (lock, cut),
        httpx.Client(transport=FencingTransport(lock), timeout=60) as http,
    ):
        deadline = cut()
        sink = HeldSink(resume_at=deadline + 3.0)
        taker = _take_over(etcd_endpoints, lock.name, deadline + 2.0)
        try:
            with pytest.raises(ef.SessionExpiredError):
                http.put(sink.url + "/upload", **_held_body(shape, deadline, tmp_path))
            raised_at = time.monotonic()
            taker.join(15)
            _check_nothing_after(sink, raised_at, deadline)
        finally:
            sink.drop()


@pytest.mark.integration
@pytest.mark.parametrize("shape", ["async-generator", "bytes", "multipart"])
async def test_async_write_started_before_the_deadline_does_not_outlive_it(
    shape: str, etcd_namespace: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """The asyncio twin of the test above (asyncio also buffers what the socket does not
    take and sends it on its own: the transport is aborted on the cut)."""
    with _expiring_lock(etcd_namespace, etcd_endpoints, ttl=6) as (lock, cut):
        async with httpx.AsyncClient(transport=AsyncFencingTransport(lock), timeout=60) as http:
            deadline = await asyncio.to_thread(cut)
            sink = HeldSink(resume_at=deadline + 3.0)
            taker = _take_over(etcd_endpoints, lock.name, deadline + 2.0)
            try:
                with pytest.raises(ef.SessionExpiredError):
                    await http.put(sink.url + "/upload", **_held_body(shape, deadline, tmp_path))
                raised_at = time.monotonic()
                await asyncio.to_thread(taker.join, 15)
                await asyncio.to_thread(_check_nothing_after, sink, raised_at, deadline)
            finally:
                sink.drop()


def _slow_upload(shape: str, tmp_path: Path) -> dict[str, Any]:
    if shape == "generator":
        return {"content": (b"y" * 65536 for _ in range(256))}
    if shape == "async-generator":

        async def chunks() -> Any:
            for _ in range(256):
                yield b"y" * 65536

        return {"content": chunks()}
    return _body(shape, tmp_path)


def _check_still_uploading(session: Any, sink: HeldSink, outcome: list[Any]) -> None:
    """After 3 session TTLs of a healthy session, the upload to the slow reader is
    still going (no error), and moving."""
    time.sleep(2.0)
    got = sink.got
    time.sleep(4.0)
    assert not outcome, f"the upload ended: {outcome}"
    assert not session.expired
    assert sink.got > got, "the upload stalled"


@pytest.mark.integration
@pytest.mark.parametrize("shape", ["generator", "bytes", "file", "multipart"])
def test_a_long_upload_to_a_slow_reader_under_a_live_session_goes_on(
    shape: str, etcd_namespace: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """H1: the write timeout was fixed to the time left at the request's start and
    replaced the caller's: a healthy, renewing session's upload to a slow reader (4 KB/s)
    failed with WriteTimeout after one TTL. The caller's timeout (60 s) is kept; the
    deadline, read at each send, follows the renewals."""
    sink = HeldSink(rate=4096)
    outcome: list[Any] = []
    with ef.Client(etcd_endpoints[0]) as client, client.session(ttl=2) as session:
        lock = session.lock(etcd_namespace + "/w")
        lock.acquire()
        http = httpx.Client(transport=FencingTransport(lock), timeout=60)

        def upload() -> None:
            try:
                outcome.append(http.put(sink.url + "/up", **_slow_upload(shape, tmp_path)))
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=upload, daemon=True)
        thread.start()
        try:
            _check_still_uploading(session, sink, outcome)
        finally:
            sink.drop()
            thread.join(10)
            http.close()
        assert not isinstance(outcome[0], (httpx.WriteTimeout, ef.EtcdfenceError)), outcome


@pytest.mark.integration
@pytest.mark.parametrize("shape", ["async-generator", "bytes", "multipart"])
async def test_async_long_upload_to_a_slow_reader_under_a_live_session_goes_on(
    shape: str, etcd_namespace: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """The asyncio twin of the test above."""
    sink = HeldSink(rate=4096)
    outcome: list[Any] = []
    async with ef.AsyncClient(etcd_endpoints[0]) as client, client.session(ttl=2) as session:
        lock = session.lock(etcd_namespace + "/w")
        await lock.acquire()
        async with httpx.AsyncClient(transport=AsyncFencingTransport(lock), timeout=60) as http:

            async def upload() -> None:
                try:
                    outcome.append(
                        await http.put(sink.url + "/up", **_slow_upload(shape, tmp_path))
                    )
                except Exception as exc:
                    outcome.append(exc)

            task = asyncio.create_task(upload())
            try:
                await asyncio.to_thread(_check_still_uploading, session, sink, outcome)
            finally:
                sink.drop()
                await asyncio.wait_for(task, 10)
        assert not isinstance(outcome[0], (httpx.WriteTimeout, ef.EtcdfenceError)), outcome

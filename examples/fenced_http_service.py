"""An ASGI (Starlette) service and its client, fenced end to end through HTTP.

Server: :class:`etcdfence.http.FencingMiddleware` parses ``Fencing-Token`` (400 when a
write has none or a malformed one); the handler writes through an
:class:`etcdfence.AsyncFenceGuard` — the token check and the data write are one etcd
transaction — and a stale token becomes ``409 {"error", "resource", "token",
"current"}``. The middleware alone would not be enough: only the guard makes the check
atomic with the write.

Client: :class:`etcdfence.http.FencingTransport` stamps every request with the lock's
token and refuses to send once the lock's session is lost.

Serve with uvicorn (prints ``listening on http://127.0.0.1:PORT`` once ready)::

    python examples/fenced_http_service.py serve --port 8080 --resource store

    PUT    /kv/<key>  body = value, Fencing-Token: N  -> 200 {"key", "token", "revision"}
    DELETE /kv/<key>  Fencing-Token: N                -> 200 {"key", "token", "revision"}
    GET    /kv/<key>  -> 200 value | 404;   GET /fence -> 200 {"resource", "mark"}

Write while holding the lock ``writers/<resource>`` (exit 0 written, 4 refused as
stale, 1 anything else)::

    python examples/fenced_http_service.py put --url http://127.0.0.1:8080 \\
        --resource store --key greeting --value hello

``http_conformance_parts(base_url, restart)`` returns the ``write``/``read`` (and
``restart``) the conformance kit drives this service with; ``ServiceThread`` runs it on
uvicorn in a background thread::

    service = ServiceThread(make_app(endpoints, "store"))
    parts = http_conformance_parts(service.start(), restart=service.restart)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import etcdfence as ef
from etcdfence.http import FencingMiddleware, FencingTransport, fencing_token
from etcdfence.token import HEADER, coerce_token

EXIT_OK, EXIT_ERROR, EXIT_STALE = 0, 1, 4
ENDPOINTS = os.environ.get("ETCDFENCE_ENDPOINTS", "http://127.0.0.1:2379")


def make_app(endpoints: str | list[str], resource: str) -> Starlette:
    """The service: one etcd client (opened in the lifespan), one guard, four routes."""
    prefix = f"store/{resource}/"

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with ef.AsyncClient(endpoints, timeout=5.0) as client:
            app.state.client = client
            app.state.guard = client.fence(resource)
            yield

    async def put(request: Request) -> Response:
        token = fencing_token(request)  # parsed and validated by the middleware
        try:
            value = await request.body()
        except ClientDisconnect:  # the writer stopped mid-body (e.g. it lost the lock)
            return Response(status_code=400)  # nobody reads it; nothing was written
        guard: ef.AsyncFenceGuard = request.app.state.guard
        # check + write in one etcd txn; StaleTokenError -> the middleware's 409
        revision = await guard.put(token, prefix + request.path_params["key"], value)
        return JSONResponse(
            {"key": request.path_params["key"], "token": token.value, "revision": revision}
        )

    async def delete(request: Request) -> Response:
        token = fencing_token(request)
        revision = await request.app.state.guard.delete(token, prefix + request.path_params["key"])
        return JSONResponse(
            {"key": request.path_params["key"], "token": token.value, "revision": revision}
        )

    async def get(request: Request) -> Response:
        kv = await request.app.state.client.get(prefix + request.path_params["key"])
        if kv is None:
            return JSONResponse({"error": "no such key"}, status_code=404)
        return Response(kv.value, media_type="application/octet-stream")

    async def fence(request: Request) -> Response:
        mark = await request.app.state.guard.current()
        return JSONResponse({"resource": resource, "mark": mark})

    return Starlette(
        routes=[
            Route("/kv/{key:path}", put, methods=["PUT"]),
            Route("/kv/{key:path}", delete, methods=["DELETE"]),
            Route("/kv/{key:path}", get, methods=["GET"]),
            Route("/fence", fence, methods=["GET"]),
        ],
        middleware=[Middleware(FencingMiddleware)],
        lifespan=lifespan,
    )


class ServiceThread:
    """An ASGI app on a real uvicorn, on loopback, in a background thread: for tests and
    the conformance kit. ``start()`` returns the base URL; ``restart()`` stops the
    server (its lifespan closes the etcd client) and starts it again on the same port."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app, self.host, self.port = app, host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    def start(self, timeout: float = 20.0) -> str:
        sock = socket.create_server((self.host, self.port))  # SO_REUSEADDR: same port again
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="auto"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        self._server, self._thread, self._sock = server, thread, sock
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self._server is not None and self._thread is not None and self._sock is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._sock.close()
            self._server = self._thread = self._sock = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http_conformance_parts(
    base_url: str, restart: Callable[[], None] | None = None
) -> dict[str, Callable[..., Any]]:
    """``write(token, key, value)`` and ``read(key)`` against a running service (and
    ``restart`` when given, e.g. ``ServiceThread.restart``), for
    :mod:`etcdfence.conformance`: the write sends the token in ``Fencing-Token`` and
    raises :class:`etcdfence.StaleTokenError` on 409, :class:`etcdfence.InvalidTokenError`
    on 400; the read returns the value's bytes or ``None``; ``close`` closes the HTTP
    client (the kit calls it when done)."""
    http = httpx.Client(base_url=base_url.rstrip("/"), timeout=10.0)

    def write(token: object, key: str, value: bytes | str) -> None:
        header = str(coerce_token(token))  # the kit's bad tokens raise here
        answer = http.put(f"/kv/{quote(key, safe='')}", content=value,
                          headers={HEADER: header})  # fmt: skip
        if answer.status_code == 409:
            body = answer.json()
            if body.get("current") is None:  # refused for not owning, not for staleness
                raise ef.NotOwnerError(body.get("error", "not the owner"))
            raise ef.StaleTokenError(str(body["resource"]), int(body["token"]),
                                     int(body["current"]))  # fmt: skip
        if answer.status_code == 400:
            raise ef.InvalidTokenError(answer.json()["error"])
        answer.raise_for_status()

    def read(key: str) -> bytes | None:
        answer = http.get(f"/kv/{quote(key, safe='')}")
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        return answer.content

    parts: dict[str, Callable[..., Any]] = {"write": write, "read": read, "close": http.close}
    if restart is not None:
        parts["restart"] = restart
    return parts


def serve(args: argparse.Namespace) -> int:
    """Run the service on uvicorn until SIGINT/SIGTERM."""
    sock = socket.create_server((args.host, args.port))  # listening: clients queue until
    port = sock.getsockname()[1]  # uvicorn accepts, so "listening" is true when printed
    print(f"listening on http://{args.host}:{port}", flush=True)
    app = make_app(args.endpoints.split(","), args.resource)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])
    return EXIT_OK


def put(args: argparse.Namespace) -> int:
    """Client mode: hold the lock ``writers/<resource>``, write through the transport."""
    with ef.Client(args.endpoints.split(","), timeout=5.0) as client, client.session(ttl=10) as s:
        lock = s.lock(f"writers/{args.resource}")
        lock.acquire(timeout=30)
        with httpx.Client(transport=FencingTransport(lock), timeout=10.0) as http:
            answer = http.put(f"{args.url.rstrip('/')}/kv/{quote(args.key, safe='')}",
                              content=args.value.encode())  # fmt: skip
        lock.release()
    print(answer.status_code, answer.text.strip())
    if answer.status_code == 409:
        return EXIT_STALE
    return EXIT_OK if answer.status_code == 200 else EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoints", default=ENDPOINTS,
                        help="etcd endpoints (default: $ETCDFENCE_ENDPOINTS or local)")  # fmt: skip
    common.add_argument("--resource", default="store", help="name of the fenced resource")
    modes = parser.add_subparsers(dest="mode", required=True)
    s = modes.add_parser("serve", parents=[common], help="run the service")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p = modes.add_parser("put", parents=[common], help="one write while holding the lock")
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--value", required=True)
    args = parser.parse_args(argv)
    return serve(args) if args.mode == "serve" else put(args)


if __name__ == "__main__":
    sys.exit(main())

"""An HTTP service that fences writes by the ``Fencing-Token`` header (stdlib only).

The *resource* decides, not the writer: every ``PUT`` must carry the token of the
writer's lock or leadership term in the ``Fencing-Token`` header. The service writes
through a :class:`etcdfence.FenceGuard` and answers ``409 Conflict`` when the token is
below the highest one it has already accepted — a paused, zombie writer is refused
even though it still believes it holds the lock.

Serve (prints ``listening on http://127.0.0.1:PORT`` once ready)::

    python examples/http_service.py serve --port 8080 --resource store

    PUT /kv/<key>   body = value (Content-Length), header Fencing-Token: N
                    200 {"key", "token", "revision"} | 409 {"error": "stale token",
                    "token", "current"} | 400 missing, malformed or repeated token,
                    a bare CR in the header block, a malformed Content-Length |
                    411 no Content-Length (or a Transfer-Encoding) | 413 body too large
    GET /kv/<key>   200 value | 404
    GET /fence      200 {"resource", "mark"}

Client mode — the token comes from ``--token`` or from the environment, so it can
run under a lock::

    etcdfence lock writers/store -- python examples/http_service.py put \\
        --url http://127.0.0.1:8080 --key greeting --value hello
    python examples/http_service.py put --url http://127.0.0.1:8080 \\
        --key greeting --value stale --token 1          # -> 409, exit 4

Client exit codes: 0 written, 2 no or malformed token (``--token`` or the environment),
4 rejected as stale (409), 1 anything else.

The token is read by the rule of etcdfence's HTTP middlewares
(:func:`etcdfence.http.request_token`: two ``Fencing-Token`` fields are a 400, not
first-one-wins). ``http.server`` parses the header block itself and starts a new header
at a bare CR (``X-Note: a\\rFencing-Token: 9`` would carry a token no proxy saw), so the
handler refuses a bare CR anywhere in the header block, as h11 and httptools do.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO
from urllib.parse import unquote

import etcdfence as ef
from etcdfence.http import request_token
from etcdfence.token import parse_token

EXIT_OK, EXIT_ERROR, EXIT_BAD_TOKEN, EXIT_STALE = 0, 1, 2, 4
MAX_BODY = 1 << 20  # etcd's default request limit is 1.5 MiB


class BadRequest(Exception):
    """A request the service refuses before it reads the body: ``status`` and ``error``."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status


class _LineRecorder:
    """``rfile`` while ``http.server`` reads the header block: keeps the raw lines."""

    def __init__(self, rfile: BinaryIO) -> None:
        self._rfile = rfile
        self.lines: list[bytes] = []

    def readline(self, limit: int = -1) -> bytes:
        line = self._rfile.readline(limit)
        self.lines.append(line)
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rfile, name)


def check_header_block(lines: list[bytes]) -> None:
    """Refuse a header block that ``http.server``'s parser would read differently from
    an HTTP/1.1 parser (h11, httptools): a CR not followed by LF starts a new header in
    the email parser, and would let a ``Fencing-Token`` hide inside another field."""
    for line in lines:
        if b"\r" in line.removesuffix(b"\n").removesuffix(b"\r"):
            raise BadRequest(400, "bare CR in the request header block")


def content_length(headers: Any) -> int:
    """The body length, by RFC 9110: exactly one ``Content-Length`` of ASCII digits and
    no ``Transfer-Encoding`` (``http.server`` does not decode chunked bodies)."""
    if headers.get("Transfer-Encoding") is not None:
        raise BadRequest(411, "Transfer-Encoding is not supported: send Content-Length")
    values = headers.get_all("Content-Length") or []
    if not values:
        raise BadRequest(411, "Content-Length is required")
    text = values[0].strip(" \t")
    if len(values) > 1 or not (text.isascii() and text.isdigit()) or len(text) > 19:
        shown = ", ".join(repr(v[:32]) for v in values)
        raise BadRequest(400, f"malformed Content-Length: {shown}")
    if int(text) > MAX_BODY:
        raise BadRequest(413, f"body of {int(text)} bytes; at most {MAX_BODY}")
    return int(text)


class FencedStore:
    """The service's state: one etcd client and the guard of one resource."""

    def __init__(self, client: ef.Client, resource: str) -> None:
        self.client = client
        self.guard = client.fence(resource)
        self.resource = resource
        self.prefix = f"store/{resource}/"


def make_handler(store: FencedStore) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``store``."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "fenced-store/1"

        def _reply(self, status: int, body: Any) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode() + b"\n"
            self.send_response(status)
            ctype = "application/octet-stream" if isinstance(body, bytes) else "application/json"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refuse(self, status: int, body: Any) -> None:
            """An error answered before the body was read: the connection is closed,
            as the unread body would otherwise be parsed as the next request."""
            self.close_connection = True
            self._reply(status, body)
            self.wfile.flush()

        def parse_request(self) -> bool:
            """``BaseHTTPRequestHandler.parse_request``, keeping the raw header lines
            in ``header_lines`` for :func:`check_header_block`."""
            rfile, recorder = self.rfile, _LineRecorder(self.rfile)
            self.rfile = recorder  # type: ignore[assignment]
            try:
                return super().parse_request()
            finally:
                self.rfile = rfile
                self.header_lines = [self.raw_requestline, *recorder.lines]

        def _key(self) -> str | None:
            if not self.path.startswith("/kv/") or len(self.path) <= 4:
                return None
            return unquote(self.path[4:])

        def do_GET(self) -> None:
            if self.path == "/fence":
                self._reply(200, {"resource": store.resource, "mark": store.guard.current()})
                return
            key = self._key()
            if key is None:
                self._reply(404, {"error": "not found"})
                return
            kv = store.client.get(store.prefix + key)
            if kv is None:
                self._reply(404, {"error": "no such key", "key": key})
            else:
                self._reply(200, kv.value)

        def do_PUT(self) -> None:
            key = self._key()
            if key is None:
                self._reply(404, {"error": "PUT /kv/<key>"})
                return
            try:
                check_header_block(self.header_lines)
                # the middleware's rule: one Fencing-Token field, by parse_token
                token = request_token("PUT", self.headers.items())
                length = content_length(self.headers)
            except ef.InvalidTokenError as exc:
                self._refuse(400, {"error": str(exc), "header": "Fencing-Token"})
                return
            except BadRequest as exc:
                self._refuse(exc.status, {"error": str(exc)})
                return
            assert token is not None  # required for PUT
            value = self.rfile.read(length)
            try:
                revision = store.guard.put(token, store.prefix + key, value)
            except ef.StaleTokenError as exc:
                self._reply(
                    409, {"error": "stale token", "token": exc.token, "current": exc.current}
                )
                return
            except ef.EtcdfenceError as exc:
                self._reply(503, {"error": str(exc)})
                return
            self._reply(200, {"key": key, "token": token.value, "revision": revision})

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    return Handler


def serve(args: argparse.Namespace) -> int:
    """Run the service until SIGINT/SIGTERM."""
    with ef.Client(args.endpoints, timeout=5.0) as client:
        store = FencedStore(client, args.resource)
        server = ThreadingHTTPServer((args.host, args.port), make_handler(store))
        port = server.server_address[1]
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        print(f"listening on http://{args.host}:{port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return EXIT_OK


def put(args: argparse.Namespace) -> int:
    """Client mode: one fenced PUT; the token from --token or the environment."""
    try:
        token = (
            ef.FencingToken.from_env()
            if args.token is None
            else ef.FencingToken(parse_token(args.token, source="--token"))
        )
    except ef.InvalidTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_TOKEN
    name, value = token.to_header()
    request = urllib.request.Request(
        f"{args.url.rstrip('/')}/kv/{args.key}",
        data=args.value.encode(),
        method="PUT",
        headers={name: value},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            print(response.status, response.read().decode().strip())
            return EXIT_OK
    except urllib.error.HTTPError as exc:
        print(exc.code, exc.read().decode().strip())
        return EXIT_STALE if exc.code == 409 else EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    s = modes.add_parser("serve", help="run the service")
    s.add_argument(
        "--endpoints",
        default=os.environ.get("ETCDFENCE_ENDPOINTS", "http://127.0.0.1:2379"),
        help="etcd endpoints (default: $ETCDFENCE_ENDPOINTS or http://127.0.0.1:2379)",
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    s.add_argument("--resource", default="store", help="name of the fenced resource")
    p = modes.add_parser("put", help="send one fenced write")
    p.add_argument("--url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--value", required=True)
    p.add_argument("--token", default=None, help="default: from the environment")
    args = parser.parse_args(argv)
    return serve(args) if args.mode == "serve" else put(args)


if __name__ == "__main__":
    raise SystemExit(main())

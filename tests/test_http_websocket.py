"""The ASGI gate on WebSocket connections: a handshake is judged like a request whose
method is ``WEBSOCKET`` — a bad, foreign or repeated token never reaches the app, a
missing one only where ``WEBSOCKET`` is among the methods — and a stale write after
``accept`` closes the connection with 1008. A real uvicorn, a real ``websockets``
client, a real etcd fence."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.http import UNSAFE_METHODS, WEBSOCKET, FencingMiddleware, fencing_token

websockets = pytest.importorskip("websockets")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
ServiceThread: Any = importlib.import_module("fenced_http_service").ServiceThread

pytestmark = pytest.mark.integration


def writer_app(endpoints: list[str], resource: str, reached: list[Any]) -> Any:
    """A WebSocket endpoint that accepts, then writes every message it receives through
    an etcd fence with the connection's token and echoes the revision."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        reached.append(fencing_token(scope, required=False))
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        async with ef.AsyncClient(endpoints) as client:
            fence = client.fence(resource)
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                token = fencing_token(scope)
                assert token is not None
                revision = await fence.put(token, f"{resource}/data", message["text"])
                await send({"type": "websocket.send", "text": str(revision)})

    return app


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Any] = []

    def start(app: Any) -> str:
        server = ServiceThread(app)
        servers.append(server)
        return str(server.start()).replace("http://", "ws://")

    yield start
    for server in servers:
        server.stop()


def _status(url: str, headers: dict[str, str]) -> int | None:
    """The HTTP status a refused handshake got (None when it was accepted)."""

    async def go() -> int | None:
        try:
            async with websockets.connect(url, additional_headers=headers):
                return None
        except InvalidStatus as exc:
            return int(exc.response.status_code)

    return asyncio.run(go())


def test_a_bad_or_missing_token_never_reaches_the_app(
    serve: Any, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    reached: list[Any] = []
    app = writer_app(etcd_endpoints, etcd_namespace + "/ws", reached)
    required = serve(FencingMiddleware(app, methods=UNSAFE_METHODS | {WEBSOCKET}))
    optional = serve(FencingMiddleware(app))
    for url in (required, optional):  # malformed and repeated: refused on every method
        for bad in ("abc", "0", "-1", "9" * 30, "1; lock=nope"):
            assert _status(url, {"Fencing-Token": bad}) == 400, bad
    assert _status(required, {}) == 400
    assert reached == []
    assert _status(optional, {}) is None  # a read-only subscription needs no token
    assert reached == [None]


def test_a_foreign_token_is_refused_when_bound(
    serve: Any, etcd_client: ef.Client, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    reached: list[Any] = []
    app = writer_app(etcd_endpoints, etcd_namespace + "/ws", reached)
    url = serve(FencingMiddleware(app, lock=etcd_namespace + "/mine"))
    with etcd_client.session(ttl=10) as session, session.lock(etcd_namespace + "/other") as other:
        assert _status(url, dict([other.to_header()])) == 409
        assert _status(url, {"Fencing-Token": str(other.value)}) == 409  # bare
    assert reached == []
    with etcd_client.session(ttl=10) as session, session.lock(etcd_namespace + "/mine") as mine:
        assert _status(url, dict([mine.to_header()])) is None
    assert [int(t) for t in reached] == [mine.value]


def test_a_stale_write_after_accept_closes_with_1008(
    serve: Any, etcd_client: ef.Client, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    resource = etcd_namespace + "/ws"
    url = serve(FencingMiddleware(writer_app(etcd_endpoints, resource, [])))
    name = etcd_namespace + "/lock"
    with etcd_client.session(ttl=10) as session:
        with session.lock(name) as old:
            pass
        with session.lock(name) as new:
            etcd_client.fence(resource).put(new, resource + "/data", b"new")

    async def go() -> tuple[int | None, str]:
        async with websockets.connect(url, additional_headers=dict([old.to_header()])) as ws:
            await ws.send("stale")
            try:
                await ws.recv()
            except ConnectionClosed as exc:
                assert exc.rcvd is not None
                return exc.rcvd.code, exc.rcvd.reason
            return None, ""

    code, reason = asyncio.run(go())
    assert code == 1008 and "stale" in reason, (code, reason)
    assert etcd_client.get(resource + "/data").value == b"new"  # type: ignore[union-attr]

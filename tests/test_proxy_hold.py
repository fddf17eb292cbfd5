"""FaultProxy's hold-and-release mode: one request held "in the network" while later
connections pass, then released. Against an echo server, a real etcd and PostgreSQL.

The etcd and PostgreSQL cases are also the *controls* for within-term ordering: a plain
write whose bytes were held really does land after a later, acknowledged write.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from etcdfence.testing import FaultProxy

PG_DSN = os.environ.get(
    "ETCDFENCE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)


class _EchoServer:
    """A TCP echo server that records what it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                self.received += data
                try:
                    conn.sendall(data)
                except OSError:
                    pass  # a severed client: keep recording what arrives

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    yield server
    server.close()


def _connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_hold_keeps_open_connections_and_passes_new_ones(echo: _EchoServer) -> None:
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy, _connect(proxy) as a:
        a.sendall(b"a0")
        assert a.recv(10) == b"a0"
        assert proxy.hold() == 1
        a.sendall(b"W1")
        assert proxy.wait_held(2) == 2
        with _connect(proxy) as b:  # a later connection passes, both ways
            b.sendall(b"W2")
            assert b.recv(10) == b"W2"
        assert b"W1" not in echo.received
        proxy.release()
        assert a.recv(10) == b"W1"  # delivered, and the connection lives on
        assert echo.received.index(b"W2") < echo.received.index(b"W1")
        assert proxy.held_bytes == 0
        a.sendall(b"a2")
        assert a.recv(10) == b"a2"


def test_hold_downstream_holds_the_answer(echo: _EchoServer) -> None:
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy, _connect(proxy) as a:
        a.sendall(b"0")
        assert a.recv(10) == b"0"  # the proxy has set the connection up
        proxy.hold("downstream")
        a.sendall(b"req")
        _until(lambda: b"req" in echo.received)  # the server got it ...
        proxy.wait_held(3)  # ... the answer is held
        proxy.release()
        assert a.recv(10) == b"req"


def test_sever_held_resets_the_client_and_still_delivers(echo: _EchoServer) -> None:
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy:
        a = _connect(proxy)
        a.sendall(b"x")
        assert a.recv(10) == b"x"
        proxy.hold()
        a.sendall(b"late")
        proxy.wait_held(4)
        assert proxy.sever_held() == 1
        with pytest.raises(ConnectionResetError):
            a.recv(10)  # the client sees its connection die ...
        a.close()
        assert b"late" not in echo.received
        proxy.release()
        _until(lambda: b"late" in echo.received)  # ... its bytes still arrive
        _until(lambda: proxy.active_connections == 0)  # then a clean end of stream


# -- a real etcd: a plain put held in the network lands after a later one ----------------


def _etcd_post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> Any:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return json.loads(response.read())


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_hold_with_a_real_etcd(etcd_endpoints: list[str]) -> None:
    key = f"t/hold/{uuid.uuid4().hex[:8]}"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        a = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
        _etcd_post(a, "/v3/kv/put", {"key": _b64(key), "value": _b64("v0")})  # connect
        proxy.hold()
        answers: list[Any] = []
        sender = threading.Thread(
            target=lambda: answers.append(
                _etcd_post(a, "/v3/kv/put", {"key": _b64(key), "value": _b64("W1")})
            )
        )
        sender.start()
        proxy.wait_held()
        b = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)  # passes
        later = _etcd_post(b, "/v3/kv/put", {"key": _b64(key), "value": _b64("W2")})
        assert int(later["header"]["revision"]) > 0  # W2 acknowledged
        got = _etcd_post(b, "/v3/kv/range", {"key": _b64(key)})
        assert base64.b64decode(got["kvs"][0]["value"]) == b"W2"
        proxy.release()
        sender.join(20)
        assert answers and int(answers[0]["header"]["revision"]) > int(later["header"]["revision"])
        got = _etcd_post(b, "/v3/kv/range", {"key": _b64(key)})
        # The control: without a within-term check the held write wins.
        assert base64.b64decode(got["kvs"][0]["value"]) == b"W1"
        a.close()
        b.close()


# -- PostgreSQL through the proxy -------------------------------------------------------------


def _pg(port: int | None = None, **kw: Any) -> Any:
    psycopg = pytest.importorskip("psycopg")
    dsn = PG_DSN if port is None else f"{PG_DSN} host=127.0.0.1 port={port}"
    try:
        return psycopg.connect(dsn, connect_timeout=5, **kw)
    except psycopg.OperationalError as exc:
        if os.environ.get("ETCDFENCE_REQUIRE_SQL") == "1":
            raise
        pytest.skip(f"postgresql not reachable: {exc!r}")


@pytest.mark.sql
def test_hold_with_postgresql() -> None:
    table = f"hold_{uuid.uuid4().hex[:8]}"
    admin = _pg(autocommit=True)
    admin.execute(f"CREATE TABLE {table} (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    admin.execute(f"INSERT INTO {table} VALUES ('k', 'v0')")
    try:
        with FaultProxy("127.0.0.1:5432") as proxy:
            a = _pg(proxy.port, autocommit=True)
            proxy.hold()
            errors: list[BaseException] = []

            def late_write() -> None:
                try:
                    a.execute(f"UPDATE {table} SET v = 'W1' WHERE k = 'k'")
                except BaseException as exc:
                    errors.append(exc)

            sender = threading.Thread(target=late_write)
            sender.start()
            proxy.wait_held()
            b = _pg(proxy.port, autocommit=True)  # a later connection passes
            b.execute(f"UPDATE {table} SET v = 'W2' WHERE k = 'k'")  # acknowledged
            assert b.execute(f"SELECT v FROM {table}").fetchone() == ("W2",)
            proxy.release()
            sender.join(20)
            assert errors == []
            # The control: an unfenced write held in the network lands after W2.
            assert admin.execute(f"SELECT v FROM {table}").fetchone() == ("W1",)
            a.close()
            b.close()
    finally:
        admin.execute(f"DROP TABLE {table}")
        admin.close()

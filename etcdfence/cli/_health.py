"""``etcdfence run --health HOST:PORT``: ``/healthz``, ``/readyz`` and ``/metrics``.

The endpoints are what a Kubernetes probe or a load balancer asks (stdlib
stdlib only: one selector thread, see :class:`HealthServer`):

* ``/healthz`` (also ``/livez``) — liveness: 200 unless this process is wedged, i.e. one
  of its loops (the main loop that takes signals; the loop supervising a running
  command) has not run for :data:`WEDGED_AFTER` seconds. 503 otherwise, with a JSON
  ``reason``. It never depends on etcd: an etcd outage is ridden out (the command is
  stopped in time, the supervisor campaigns again) and restarting every replica while
  etcd is away would only add a crash loop to the outage (client-go's health adaptor
  never fails a follower either). The body reports the session's keepalive age too.
* ``/readyz`` — 200 only while this process leads (its term is running and the session
  is live) and, with ``--ready-url``, the command answers there: route traffic to the
  leader only (a load balancer's per-backend check). It turns 503 the moment a loss
  is known — before the command is stopped, not after.
* ``/candidatez`` — 200 while this process takes part in the election: it leads, or it
  waits as a standby with a live session (etcd answered its keepalives). 503 before
  its first session, between sessions, and once it is shutting down. This is what a
  Kubernetes readinessProbe wants: every healthy replica is Ready, so a rolling update
  progresses and ``kubectl rollout status`` completes (leader-only readiness leaves
  standbys unready forever).
* ``/metrics`` — Prometheus text: the supervisor's own gauges (always), then the
  library's collectors from ``prometheus_client`` when it is installed (the
  ``metrics`` extra). Without it the page still answers 200 with our gauges and a
  comment naming the extra: a scrape should not fail because a library is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import http
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..token import FencingToken
from ._exits import EXIT_USAGE, CommandError
from ._output import debug

#: Seconds the elector waits before campaigning again (LeaderElector's retry_interval).
RETRY_INTERVAL = 1.0
#: Connections open at once; a new one closes the oldest (a probe sends its request
#: at once: only clients that do not are ever the oldest for long).
MAX_CONNECTIONS = 256
#: Connections the kernel queues before the serving loop accepts them.
LISTEN_BACKLOG = 1024
#: Request line and headers larger than this are refused (431).
MAX_HEADER_BYTES = 8192
#: Seconds from accept to answer at most: a slow client is cut off after that.
REQUEST_DEADLINE = 3.0
#: A loop of the supervisor that has not run for this long is wedged (``/healthz`` 503).
WEDGED_AFTER = 10.0

#: (HTTP status, content type, body) of one answer.
Answer = tuple[int, str, bytes]

_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_JSON = "application/json"


def listen_address(arg: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6; port 0 picks a free one) for ``--health``."""
    host, sep, port_text = arg.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT such as 127.0.0.1:8080 or [::1]:8080, got {arg!r}"
        )
    return host, int(port_text)


def _json(status: int, record: dict[str, Any]) -> Answer:
    return status, _JSON, (json.dumps(record) + "\n").encode()


class HealthServer:
    """An HTTP server on one thread that answers from ``routes`` (path -> a function
    returning an :data:`Answer`). Binds at construction: a port in use or an address
    that is not ours is a usage error (exit 2) before anything else starts.

    One selector loop, no thread per connection: it accepts every pending
    connection, reads what each sent and answers a request only once its headers are
    complete, so a client that trickles bytes, sends nothing or sends garbage costs a
    buffer, never a thread or a slot a real probe needs. At most
    :data:`MAX_CONNECTIONS` are open (the oldest is closed to make room for a new
    one), none for longer than :data:`REQUEST_DEADLINE` seconds, and headers larger
    than :data:`MAX_HEADER_BYTES` are refused."""

    def __init__(self, address: tuple[str, int], routes: dict[str, Callable[[], Answer]]) -> None:
        host, port = address
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (OSError, UnicodeError, ValueError) as exc:  # ValueError: e.g. a NUL
            raise CommandError(
                f"--health {host}:{port}: cannot resolve: {exc}", EXIT_USAGE
            ) from None
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
        except OSError as exc:
            listener.close()
            raise CommandError(
                f"--health {host}:{port}: cannot listen: {exc.strerror or exc}", EXIT_USAGE
            ) from None
        listener.setblocking(False)
        self._listener = listener
        self._routes = routes
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` it listens on (the real port when 0 was asked)."""
        host, port = self._listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        loop = _ServeLoop(self._listener, self._routes, self._closing)
        self._thread = threading.Thread(target=loop.run, name="etcdfence-health", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Stop serving and close the socket (and every open connection); waits up to
        ``timeout`` seconds for the serving thread (a stop budget's remainder)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(max(0.0, min(2.0, timeout)))
        self._listener.close()


class _Conn:
    """One client connection: what it sent so far, what is left to send back."""

    __slots__ = ("deadline", "inbuf", "outbuf", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock = sock
        self.peer = peer
        self.deadline = time.monotonic() + REQUEST_DEADLINE
        self.inbuf = b""
        self.outbuf = b""  # non-empty: the answer is being written


class _ServeLoop:
    """The selector loop behind :class:`HealthServer` (see there)."""

    def __init__(
        self,
        listener: socket.socket,
        routes: dict[str, Callable[[], Answer]],
        closing: threading.Event,
    ) -> None:
        self._listener = listener
        self._routes = routes
        self._closing = closing
        self._selector = selectors.DefaultSelector()
        self._conns: dict[socket.socket, _Conn] = {}  # in accept order: oldest first

    def run(self) -> None:
        """Serve until :class:`HealthServer` closes; one bad connection never ends it."""
        self._selector.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._closing.is_set():
                for key, _events in self._selector.select(0.2):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj in self._conns:
                        self._serve(self._conns[key.fileobj])  # type: ignore[index]
                self._expire()
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._selector.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: shed the oldest
                debug(f"health: accept failed: {exc!r}")
                if self._conns:
                    self._drop(next(iter(self._conns.values())))
                return
            while len(self._conns) >= MAX_CONNECTIONS:  # full: the oldest makes room
                self._drop(next(iter(self._conns.values())))
            sock.setblocking(False)
            conn = _Conn(sock, peer)
            self._conns[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ)

    def _serve(self, conn: _Conn) -> None:
        try:
            if conn.outbuf:
                self._write(conn)
            else:
                self._read(conn)
        except (ConnectionError, TimeoutError):
            self._drop(conn)
        except Exception as exc:  # a probe's bug must not end the loop
            debug(f"health request from {conn.peer[0]} failed: {exc!r}")
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._drop(conn)
            return
        conn.inbuf += data
        head, sep, _ = conn.inbuf.partition(b"\r\n\r\n")
        if not sep:
            head, sep, _ = conn.inbuf.partition(b"\n\n")
        if not sep:
            if len(conn.inbuf) > MAX_HEADER_BYTES:
                self._respond(conn, _json(431, {"error": "request headers too large"}), True)
            return
        if len(head) > MAX_HEADER_BYTES:
            self._respond(conn, _json(431, {"error": "request headers too large"}), True)
            return
        self._answer(conn, head)

    def _answer(self, conn: _Conn, head: bytes) -> None:
        parts = head.split(b"\n", 1)[0].strip().split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._respond(conn, _json(400, {"error": "bad request line"}), True)
            return
        method, target = parts[0], parts[1].decode("latin-1")
        if method not in (b"GET", b"HEAD"):
            self._respond(conn, _json(405, {"error": f"method not allowed: {method!r}"}), True)
            return
        route = self._routes.get(target.split("?", 1)[0])
        try:
            answer = route() if route else _json(404, {"error": f"no such path: {target}"})
        except Exception as exc:  # a probe must answer, even about its own bug
            answer = _json(500, {"error": repr(exc)})
        self._respond(conn, answer, method == b"GET")

    def _respond(self, conn: _Conn, answer: Answer, with_body: bool) -> None:
        status, content_type, body = answer
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        head = (
            f"HTTP/1.1 {status} {phrase}\r\n"
            f"Server: etcdfence\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        )
        conn.outbuf = head.encode("latin-1") + (body if with_body else b"")
        conn.deadline = max(conn.deadline, time.monotonic() + 1.0)  # time to read it
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        conn.outbuf = conn.outbuf[sent:]
        if not conn.outbuf:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._drop(conn)

    def _expire(self) -> None:
        """Close connections past their deadline (oldest first; most are in order)."""
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if now >= c.deadline]:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()


class RunProbe:
    """What ``run`` knows about its session and term, for the probes, ``/metrics`` and
    the systemd watchdog. The supervisor calls :meth:`elected` and :meth:`ended`; the
    session comes from the elector (``session()``)."""

    def __init__(self, name: str, identity: str, ttl: int, session: Callable[[], Any]) -> None:
        self.name = name
        self.identity = identity
        self.ttl = ttl
        self.session_of = session
        self._term_stop: threading.Event | None = None
        self.token: FencingToken | None = None
        self.elected_at = 0.0  # time.time() of the current term's start
        self.terms = 0
        self._started = time.monotonic()
        self._beats: dict[str, float] = {}  # loop name -> monotonic time it last ran
        self.stopping = False  # a stop was requested: no longer a candidate
        self.wants_command_ready = False  # --ready-url: leading needs the command's answer
        self.command_ready = threading.Event()  # the command answered (this term)

    def tick(self, loop: str) -> None:
        """``loop`` is running (it must tick again within :data:`WEDGED_AFTER`)."""
        self._beats[loop] = time.monotonic()

    def idle(self, loop: str) -> None:
        """``loop`` is not expected to run now (e.g. no command is supervised)."""
        self._beats.pop(loop, None)

    def elected(self, token: FencingToken, stop: threading.Event) -> None:
        """A term began (``stop`` is set when it ends)."""
        self.command_ready.clear()
        self.token = token
        self.elected_at = time.time()
        self.terms += 1
        self._term_stop = stop

    def ended(self) -> None:
        """The term is over (the command may still be stopping)."""
        self._term_stop = None
        self.token = None

    def _live_session(self) -> Any:
        session = self.session_of()
        return None if session is None or session.expired else session

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(alive, details): liveness, see the module docstring."""
        now = time.monotonic()
        record: dict[str, Any] = {"election": self.name, **self._etcd(now)}
        for loop, beat in list(self._beats.items()):
            if now - beat > WEDGED_AFTER:
                reason = f"the {loop} loop has not run for {now - beat:.1f}s (wedged)"
                return False, {**record, "status": "unhealthy", "reason": reason}
        return True, {**record, "status": "ok"}

    def _etcd(self, now: float) -> dict[str, Any]:
        """What the session says of etcd (information only: it is not liveness)."""
        session = self.session_of()
        if session is None:
            return {"session": None, "etcd": "no session granted yet"}
        # the send time of the last keepalive etcd acknowledged (the grant at first)
        age = now - (session.deadline - session.ttl + session.margin)
        limit = session.ttl / 3 + session.margin + (RETRY_INTERVAL if session.expired else 0)
        record: dict[str, Any] = {
            "session": None if session.expired else f"{session.lease_id:x}",
            "keepalive_age_seconds": round(age, 3),
            "etcd": "ok" if age <= limit else "no keepalive acknowledged lately",
        }
        return record

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(leading, details): 200 on ``/readyz`` only while leading."""
        record: dict[str, Any] = {"election": self.name, "identity": self.identity}
        stop, token = self._term_stop, self.token
        if stop is None or token is None:
            return False, {**record, "status": "not leader", "reason": "campaigning"}
        if stop.is_set():
            return False, {**record, "status": "not leader", "reason": "leadership lost"}
        session = self._live_session()
        if session is None or time.monotonic() >= session.deadline:
            return False, {**record, "status": "not leader", "reason": "session expired"}
        if self.wants_command_ready and not self.command_ready.is_set():
            reason = "the command does not answer on --ready-url yet"
            return False, {**record, "status": "leader, command not ready", "reason": reason}
        return True, {
            **record,
            "status": "leader",
            "token": token.value,
            "key": token.key,
            "leading_for_seconds": round(time.time() - self.elected_at, 3),
        }

    def candidacy(self) -> tuple[bool, dict[str, Any]]:
        """(candidate, details): 200 on ``/candidatez`` (see the module docstring)."""
        leading, record = self.readiness()
        if leading:
            return True, record
        record = {"election": self.name, "identity": self.identity}
        if self.stopping:
            return False, {**record, "status": "stopping", "reason": "shutting down"}
        session = self._live_session()
        if session is None or time.monotonic() >= session.deadline:
            reason = "no live session (etcd away, or between terms)"
            return False, {**record, "status": "not a candidate", "reason": reason}
        status = "leader, command not ready" if self._term_stop is not None else "standby"
        return True, {**record, "status": status, "session": f"{session.lease_id:x}"}

    # -- the HTTP routes ---------------------------------------------------------------------

    def candidatez(self) -> Answer:
        ok, record = self.candidacy()
        return _json(200 if ok else 503, record)

    def healthz(self) -> Answer:
        ok, record = self.health()
        return _json(200 if ok else 503, record)

    def readyz(self) -> Answer:
        ok, record = self.readiness()
        return _json(200 if ok else 503, record)

    def metrics(self) -> Answer:
        return 200, _TEXT, (self._own_metrics() + _library_metrics()).encode()

    def _own_metrics(self) -> str:
        healthy, details = self.health()
        leading, _ = self.readiness()
        label = f'{{election="{_escape(self.name)}"}}'
        gauges = [
            ("healthy", "gauge", "1 while /healthz answers 200 (not wedged).", int(healthy)),
            ("leading", "gauge", "1 while /readyz answers 200 (this process leads).", int(leading)),
            ("token", "gauge", "Fencing token of the current term (0 when not leading).",
             self.token.value if leading and self.token else 0),
            ("leading_since_seconds", "gauge",
             "Unix time the current term began (0 when not leading); etcd keeps no times.",
             round(self.elected_at, 3) if leading else 0),
            ("terms_total", "counter", "Terms this supervisor won.", self.terms),
            ("keepalive_age_seconds", "gauge",
             "Seconds since the send of the last keepalive etcd acknowledged (-1: no session).",
             details.get("keepalive_age_seconds", -1)),
        ]  # fmt: skip
        lines = []
        for suffix, kind, help_text, value in gauges:
            metric = f"etcdfence_supervisor_{suffix}"
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
            lines.append(f"{metric}{label} {value}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _library_metrics() -> str:
    """The library's collectors (prometheus_client's registry), or a note on how to get them."""
    try:
        import prometheus_client
    except ImportError:
        return (
            "# prometheus_client is not installed: only etcdfence_supervisor_* above; "
            "pip install 'etcdfence[metrics]' for the library's metrics\n"
        )
    text: str = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    return text


def enable_library_metrics() -> bool:
    """Record the library's metrics for ``/metrics`` (False without prometheus_client)."""
    from .. import metrics

    try:
        metrics.enable_metrics()
    except ImportError:
        return False
    return True

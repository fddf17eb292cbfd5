"""``examples/deploy/`` as an operator uses it: the command lines of the Kubernetes
Deployment and of the systemd unit run as written (only paths, endpoints and ports
swapped for this machine) against a real etcd, with a stand-in for the service that
answers on the ``--ready-url``; the probes are asked as the kubelet asks them, and
systemd's notify socket, reload and stop are played as systemd plays them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from test_cli_ops import DEPLOY, NotifySocket, _unit_keys, get, health_url, run_cli

from etcdfence.testing.procs import wait_until

PYTHON = sys.executable
BIN = Path(PYTHON).parent

#: The service behind the supervisor: answers GET /healthz on its port once started
#: (after a moment: leading is not serving), notes SIGHUP (a reload) in $RELOADS.
SERVICE = """\
import http.server, os, signal, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
def reload(*_):
    with open(os.environ["RELOADS"], "a") as fh:
        fh.write("hup\\n")
signal.signal(signal.SIGHUP, reload)
time.sleep(0.5)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Pod:
    """One replica of the Deployment: its container command, as written, run here."""

    def __init__(
        self, argv: list[str], name: str, env: dict[str, str], procs: list[Any], service: Path
    ) -> None:
        port = free_port()
        self.name = name
        argv = [a.replace("$(POD_NAME)", name) for a in argv]
        argv[argv.index("--health") + 1] = "127.0.0.1:0"  # the pod IP's port, here
        ready = argv.index("--ready-url") + 1
        argv[ready] = argv[ready].replace(":8080/", f":{port}/")
        cut = argv.index("--")
        argv = [*argv[1:cut], "--", PYTHON, str(service), "--port", str(port)]
        self.proc, _, self.err = run_cli(procs, *argv, env=env)
        self.url = health_url(self.err)

    def probe(self, path: str) -> int:
        try:
            return get(self.url + path)[0]
        except OSError:
            return 0


def _ready(pod: Pod, path: str) -> Any:
    return lambda: pod.probe(path) == 200


@pytest.mark.integration
def test_kubernetes_deployment_rolls_out_with_one_leader_throughout(
    etcd_endpoints: list[str], procs: list[Any], tmp_path: Path
) -> None:
    """Three replicas from the Deployment's container command: all become Ready on
    the readinessProbe's path (so a rollout can progress), exactly one answers /readyz
    — only once its service answers on --ready-url — and liveness holds everywhere.
    Then a rolling update as the strategy says (maxSurge 1, maxUnavailable 0): a new
    pod, Ready, then an old one terminated (exit 0), three times; it completes, and a
    leader is back within a TTL after each step."""
    yaml = pytest.importorskip("yaml")
    documents = list(yaml.safe_load_all((DEPLOY / "scheduler-deployment.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    argv: list[str] = container["command"]
    ready_path = container["readinessProbe"]["httpGet"]["path"]
    live_path = container["livenessProbe"]["httpGet"]["path"]
    env_vars = {e["name"]: e.get("value") for e in container["env"]}
    assert "ETCDCTL_ENDPOINTS" in env_vars and "ETCDCTL_DIAL_TIMEOUT" in env_vars
    env = clean_env(
        ETCDCTL_ENDPOINTS=etcd_endpoints[0],
        ETCDCTL_DIAL_TIMEOUT=env_vars["ETCDCTL_DIAL_TIMEOUT"],
        RELOADS=str(tmp_path / "reloads"),
    )
    service = tmp_path / "service.py"
    service.write_text(SERVICE)
    ttl = int(argv[argv.index("--ttl") + 1])
    name = argv[2] + "-" + os.urandom(4).hex()
    argv = [*argv[:2], name, *argv[3:]]

    def one_leader(pods: list[Pod]) -> bool:
        return [p.probe("/readyz") for p in pods].count(200) == 1

    pods = [Pod(argv, f"scheduler-old-{i}", env, procs, service) for i in range(3)]
    wait_until(lambda: all(p.probe(ready_path) == 200 for p in pods), 30, "all Ready")
    wait_until(lambda: one_leader(pods), 30, "one leader, its service answering")
    assert all(p.probe(live_path) == 200 for p in pods)
    for i, old in enumerate(list(pods)):
        new = Pod(argv, f"scheduler-new-{i}", env, procs, service)  # maxSurge 1
        wait_until(_ready(new, ready_path), 30, f"{new.name} Ready")
        old.proc.send_signal(signal.SIGTERM)  # the kubelet's stop
        assert old.proc.wait(deployment["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"]) == 0  # fmt: skip
        pods.remove(old)
        pods.append(new)
        wait_until(lambda: one_leader(pods), ttl + 10, "a leader after the step")
    assert all(p.name.startswith("scheduler-new") for p in pods)
    assert all(p.probe(ready_path) == 200 and p.probe(live_path) == 200 for p in pods)


@pytest.mark.integration
def test_systemd_unit_command_line_notify_reload_and_stop(
    etcd_endpoints: list[str], procs: list[Any], tmp_path: Path
) -> None:
    """The unit's ExecStart as written (binary paths, %H and the endpoints swapped),
    under a notify socket with the unit's WatchdogSec: READY=1 once leading,
    WATCHDOG=1 pings, ExecReload's SIGHUP reaches the service and stops nothing,
    systemd's SIGTERM stops it with exit 0 and STOPPING=1."""
    unit = _unit_keys(DEPLOY / "etcdfence-scheduler.service")["Service"]
    argv = unit["ExecStart"][0].replace("%H", "node-" + os.urandom(4).hex()).split()
    assert argv[0] == "/usr/local/bin/etcdfence"
    name = argv[2] + "-" + os.urandom(4).hex()
    port = free_port()
    cut = argv.index("--")
    health = argv.index("--health") + 1
    argv[health] = "127.0.0.1:0"
    argv = [*argv[1:2], name, *argv[3:cut], "--", PYTHON, str(tmp_path / "service.py"),
            "--port", str(port)]  # fmt: skip
    (tmp_path / "service.py").write_text(SERVICE)
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    listener = NotifySocket(tmp_path)
    watchdog_usec = int(unit["WatchdogSec"][0]) * 1_000_000
    env = clean_env(
        ETCDCTL_ENDPOINTS=etcd_endpoints[0],
        NOTIFY_SOCKET=listener.address,
        WATCHDOG_USEC=str(watchdog_usec),
        RELOADS=str(tmp_path / "reloads"),
    )
    try:
        proc, _, err = run_cli(procs, *argv, env=env)
        url = health_url(err)
        listener.wait_for("READY=1", 30)
        wait_until(lambda: get(url + "/readyz")[0] == 200, 20, "leading")
        main_pid = proc.pid
        time.sleep(1.0)  # the service has set its SIGHUP handler
        reload = unit["ExecReload"][0].replace("$MAINPID", str(main_pid)).split()
        subprocess.run(reload, check=True)
        reloads = tmp_path / "reloads"
        wait_until(lambda: reloads.exists() and "hup" in reloads.read_text(), 10, "reload")
        assert proc.poll() is None and get(url + "/readyz")[0] == 200
        listener.wait_for("WATCHDOG=1", watchdog_usec / 2e6 + 5)
        proc.send_signal(signal.SIGTERM)  # KillMode=mixed: SIGTERM to the main pid only
        assert proc.wait(float(unit["TimeoutStopSec"][0])) == 0
        listener.wait_for("STOPPING=1", 10)
    finally:
        listener.close()

"""The ``etcdfence`` CLI driven the way an operator drives it: as subprocesses against a
real etcd, checking stdout, stderr and exit codes (``etcdfence.cli.EXIT_*``)."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

import etcdfence as ef
from etcdfence import cli
from etcdfence.testing import procs as procs_
from etcdfence.testing.procs import LineReader, stop, wait_until

PYTHON = sys.executable

CONSOLE_SCRIPT = Path(sys.executable).parent / "etcdfence"


# -------------------------------------------------------------------------- helpers


def etcdfence(
    *args: str, env: dict[str, str], timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "etcdfence", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start(*args: str, env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    """``python -m etcdfence ARGS`` as a child (stdout and stderr piped)."""
    kwargs.setdefault("stderr", subprocess.PIPE)
    return procs_.start([PYTHON, "-m", "etcdfence", *args], env=env, new_group=False, **kwargs)


#: Lines of a stream collected by a thread (``.lines``, ``.wait_for``, ``.join``).
Lines = LineReader


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("etcdfence: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (Z: exited, not yet reaped) or a task being released (X) runs nothing; a
    # stat that vanished between the kill(0) and the open was reaped in between.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False


_RESERVED: list[socket.socket] = []


def free_port() -> int:
    """A port where nothing listens, for the rest of the session: the socket stays bound
    (without listening, so connections are refused) and no etcd or proxy of a test
    running beside us can take it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _RESERVED.append(sock)
    return int(sock.getsockname()[1])


# -------------------------------------------------------------------------- no etcd needed


def test_help_documents_commands_examples_and_exit_codes() -> None:
    result = etcdfence("--help", env=clean_env())
    assert result.returncode == 0
    for word in (
        "lock",
        "run",
        "leader",
        "observe",
        "status",
        "fence",
        "etcd",
        "demo",
        "examples:",
    ):
        assert word in result.stdout
    for code in (0, 1, 2, 3, 4, 5, 6, 124):
        assert re.search(rf"^\s+{code}\s", result.stdout, re.M), code
    for command in (
        ["lock"],
        ["run"],
        ["leader"],
        ["observe"],
        ["status"],
        ["fence"],
        ["fence", "show"],
        ["fence", "put"],
        ["fence", "off"],
        ["etcd"],
        ["demo"],
    ):
        sub = etcdfence(*command, "--help", env=clean_env())
        assert sub.returncode == 0, command
        assert "examples:" in sub.stdout and "exit codes:" in sub.stdout, command
        assert "--endpoints" in sub.stdout, command  # connection options everywhere


def test_exit_code_constants() -> None:
    assert (cli.EXIT_OK, cli.EXIT_ERROR, cli.EXIT_USAGE, cli.EXIT_UNAVAILABLE) == (0, 1, 2, 3)
    assert (cli.EXIT_STALE, cli.EXIT_AUTH, cli.EXIT_LOST, cli.EXIT_TIMEOUT) == (4, 5, 6, 124)
    assert cli.exit_code_for(ef.StaleTokenError("r", 1, 2)) == cli.EXIT_STALE
    assert cli.exit_code_for(ef.TLSError("x")) == cli.EXIT_AUTH
    assert cli.exit_code_for(ef.EtcdUnavailable("x")) == cli.EXIT_UNAVAILABLE
    assert cli.exit_code_for(ef.NotLeader("x")) == cli.EXIT_LOST
    assert cli.exit_code_for(ef.AcquireTimeout("x")) == cli.EXIT_TIMEOUT


def test_console_script_and_module_agree() -> None:
    script = subprocess.run(
        [str(CONSOLE_SCRIPT), "--version"], capture_output=True, text=True, env=clean_env()
    )
    module = etcdfence("--version", env=clean_env())
    assert script.returncode == module.returncode == 0
    assert script.stdout == module.stdout == f"etcdfence {ef.__version__}\n"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--bogus"],
        ["nosuchcommand"],
        ["lock"],
        ["lock", "x", "--ttl", "0"],
        ["lock", "x", "--timeout-acquire", "soon"],
        ["run", "x", "--", "true"],  # no --id
        ["run", "x", "--id", "a", "sleep", "1"],  # a command without '--'
        ["lock", "x", "ls", "-l"],  # a command without '--'
        ["run", "x", "--id", "a", "--health", "nohost"],  # no port
        ["status"],  # neither NAME nor --prefix
        ["leader", "x", "-w", "yaml"],
        ["fence", "put", "r", "k", "v", "--token", "abc"],
        ["fence", "put", "r", "k", "v", "--token", "0"],
        ["fence", "off", "r", "--token", "abc"],
        ["fence", "off", "r", "--token", "-3"],
        ["fence", "off", "r"],  # no token anywhere
        ["fence", "off", "--token", "5"],  # no resource
        ["fence", "off", "", "--token", "5"],  # empty resource
        ["fence"],
        ["etcd", "--members", "0"],
        ["--timeout", "-1", "leader", "x"],
        ["--endpoints", "ftp://127.0.0.1:2379", "leader", "x"],  # bad endpoint
        ["leader", ""],  # empty name
        ["leader", "x/"],  # trailing slash
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str]) -> None:
    result = etcdfence(*args, env=clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1"))
    assert result.returncode == cli.EXIT_USAGE, result
    one_error_line(result.stderr)


def test_fence_put_without_any_token_is_a_usage_error() -> None:
    result = etcdfence(
        "fence", "put", "r", "k", "v", env=clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1")
    )
    assert result.returncode == cli.EXIT_USAGE
    assert "no fencing token" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    "args", [["leader", "x"], ["fence", "show", "r"], ["lock", "x", "--", "true"]]
)
def test_unreachable_endpoint_exits_3_within_the_timeout(args: list[str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    # What starting the CLI costs on this machine right now (it is slow when the machine
    # is busy): a usage error after the same imports, without any request.
    started = time.monotonic()
    usage = etcdfence("--endpoints", endpoint, "fence", "put", "r", "k", "v", env=clean_env())
    start_up = time.monotonic() - started
    assert usage.returncode == cli.EXIT_USAGE, usage
    started = time.monotonic()
    result = etcdfence("--endpoints", endpoint, "--timeout", "1", *args, env=clean_env())
    elapsed = time.monotonic() - started
    assert result.returncode == cli.EXIT_UNAVAILABLE, result
    assert endpoint in one_error_line(result.stderr)
    # the 1 s timeout and one retry wait, well below the default timeout (5 s)
    assert elapsed - start_up < 1.0 + 2.5, (elapsed, start_up)


# -------------------------------------------------------------------------- against etcd


@pytest.mark.integration
def test_lock_runs_the_command_with_the_token_and_returns_its_code(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client
) -> None:
    name = f"{etcd_namespace}/lock"
    script = 'echo "$ETCDFENCE_TOKEN $ETCD_LOCK_REV $ETCD_LOCK_KEY $ETCDFENCE_KEY"; exit 7'
    result = etcdfence("lock", name, "--", "sh", "-c", script, env=env)
    assert result.returncode == 7, result
    token, lock_rev, key, fence_key = result.stdout.split()
    assert token == lock_rev and int(token) > 0
    assert key == fence_key and re.fullmatch(re.escape(name) + r"/[0-9a-f]+", key)
    assert etcd_client.get(key) is None, "the lock is released when the command exits"
    assert etcd_client.get_prefix(name + "/") == []

    # The token is usable by the child with the library (FencingToken.from_env).
    child = "import etcdfence as ef; t = ef.FencingToken.from_env(); print(t.value, t.key)"
    result = etcdfence("lock", name, "--", PYTHON, "-c", child, env=env)
    assert result.returncode == 0, result
    value, key2 = result.stdout.split()
    assert int(value) > int(token) and key2.startswith(name + "/")


@pytest.mark.integration
def test_lock_command_not_found_exits_127(env: dict[str, str], etcd_namespace: str) -> None:
    result = etcdfence("lock", f"{etcd_namespace}/l", "--", "/no/such/program", env=env)
    assert result.returncode == cli.EXIT_NOT_FOUND
    assert "command not found" in one_error_line(result.stderr)


@pytest.mark.integration
def test_lock_holds_until_signalled_and_queues_others(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any]
) -> None:
    name = f"{etcd_namespace}/held"
    holder = start("lock", name, env=env)
    procs.append(holder)
    out = Lines(holder.stdout)
    key, token = out.wait_for(lambda line: bool(line.strip())).split()
    assert key.startswith(name + "/") and int(token) > 0
    assert etcd_client.get(key) is not None

    waiter = etcdfence("lock", name, "--timeout-acquire", "0.5", "--", "true", env=env)
    assert waiter.returncode == cli.EXIT_TIMEOUT
    one_error_line(waiter.stderr)
    assert [kv.key.decode() for kv in etcd_client.get_prefix(name + "/")] == [key], (
        "the timed-out waiter left nothing behind"
    )

    second = start("lock", name, "--", "sh", "-c", "echo $ETCD_LOCK_REV", env=env)
    procs.append(second)
    wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, what="second queued")
    assert second.poll() is None, "second locker must wait for the holder"
    assert stop(holder, signal.SIGTERM) == 0
    assert second.wait(10) == 0
    assert second.stdout is not None
    assert int(second.stdout.read().strip()) > int(token)
    assert etcd_client.get_prefix(name + "/") == []


@pytest.mark.integration
def test_lock_waiting_is_abandoned_cleanly_on_sigint(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, procs: list[Any]
) -> None:
    name = f"{etcd_namespace}/wait"
    holder = start("lock", name, env=env)
    procs.append(holder)
    Lines(holder.stdout).wait_for(bool)
    waiter = start("lock", name, "--", "true", env=env)
    procs.append(waiter)
    wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, what="waiter queued")
    assert stop(waiter, signal.SIGINT) == 128 + signal.SIGINT
    assert len(etcd_client.get_prefix(name + "/")) == 1, "the waiter's key was removed"
    assert stop(holder) == 0


@pytest.mark.integration
def test_lock_stops_the_command_and_exits_6_when_the_session_expires(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    name = f"{etcd_namespace}/lost"
    pidfile = tmp_path / "child.pid"
    script = f"echo $$ > {pidfile}; exec sleep 60"
    proc = start("lock", name, "--ttl", "1", "--grace", "0.2", "--", "sh", "-c", script, env=env)
    try:
        wait_until(pidfile.exists, what="child started")
        child = int(wait_until(lambda: pidfile.read_text().strip(), what="child pid"))
        proc.send_signal(signal.SIGSTOP)  # frozen past its lease
        wait_until(lambda: etcd_client.get_prefix(name + "/") == [], what="lease expired")
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(10) == cli.EXIT_LOST
        assert not alive(child)
        assert proc.stderr is not None
        assert "lost the lock" in proc.stderr.read()
    finally:
        stop(proc, signal.SIGKILL)


def _leader_json(env: dict[str, str], name: str) -> dict[str, Any]:
    result = etcdfence("leader", name, env=env)
    assert result.returncode == 0, result
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    record: dict[str, Any] = json.loads(lines[0])
    return record


@pytest.mark.integration
def test_leader_and_observe_print_json_lines(
    env: dict[str, str], etcd_namespace: str, procs: list[Any]
) -> None:
    name = f"{etcd_namespace}/svc"
    nobody = _leader_json(env, name)
    assert nobody == {
        "name": name,
        "key": None,
        "value": None,
        "encoding": None,
        "create_revision": None,
        "lease_id": None,
        "revision": None,
    }
    observer = start("observe", name, env=env)
    procs.append(observer)
    seen = Lines(observer.stdout)
    seen.wait_for(lambda line: json.loads(line)["key"] is None)

    supervisor = start("run", name, "--id", "node-a", "--ttl", "2", "--", "sleep", "60", env=env)
    procs.append(supervisor)
    err = Lines(supervisor.stderr)
    wait_until(lambda: _leader_json(env, name)["value"] == "node-a", what="node-a leads")
    record = _leader_json(env, name)
    assert record["name"] == name and record["encoding"] == "utf-8"
    assert record["key"] == f"{name}/{record['lease_id']}"
    assert re.fullmatch(r"[0-9a-f]+", record["lease_id"])
    assert isinstance(record["create_revision"], int)
    assert record["revision"] >= record["create_revision"]
    seen.wait_for(lambda line: json.loads(line)["value"] == "node-a")

    child_pid = int(
        re.search(r"\(pid (\d+)", err.wait_for(lambda line: "started" in line)).group(1)  # type: ignore[union-attr]
    )
    assert stop(supervisor, signal.SIGTERM) == 0, "a requested shutdown exits 0"
    assert not alive(child_pid), "the command is stopped with the supervisor"
    assert _leader_json(env, name)["key"] is None, "the supervisor resigned"
    seen.wait_for(lambda line: json.loads(line)["key"] is None and len(seen.lines) > 2)

    assert stop(observer, signal.SIGINT) == 0
    records = [json.loads(line) for line in seen.join()]
    assert [r["value"] for r in records] == [None, "node-a", None]
    assert all(set(r) == set(nobody) for r in records)


@pytest.mark.integration
def test_leader_value_that_is_not_utf8_is_base64(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client
) -> None:
    name = f"{etcd_namespace}/binary"
    with etcd_client.session(ttl=5) as session:
        session.election(name).campaign(b"\xff\x00bin")
        record = _leader_json(env, name)
    assert record["encoding"] == "base64"
    assert base64.b64decode(record["value"]) == b"\xff\x00bin"


@pytest.mark.integration
def test_fence_put_show_and_stale_token_exits_4(
    env: dict[str, str],
    etcd_namespace: str,
    etcd_client: ef.Client,
    revision_past: Callable[[int], int],
) -> None:
    revision = revision_past(200)  # the tokens below are not from the future
    resource, key = f"{etcd_namespace}/res", f"{etcd_namespace}/data"
    for verb in (["put", resource, key, "vmax"], ["off", resource]):
        for ahead in (2**63 - 1, revision + 1000):  # a token from the future: exit 2
            future = etcdfence("fence", *verb, "--token", str(ahead), env=env)
            assert future.returncode == 2 and future.stdout == "", future
            assert "above etcd's current revision" in one_error_line(future.stderr)
    assert etcd_client.get(key) is None
    shown = json.loads(etcdfence("fence", "show", resource, env=env).stdout)
    assert shown == {"resource": resource, "key": f"/etcdfence/fence/{resource}", "mark": 0}

    ok = etcdfence("fence", "put", resource, key, "v100", "--token", "100", env=env)
    assert ok.returncode == 0, ok
    written = json.loads(ok.stdout)
    assert written["token"] == 100 and written["key"] == key and written["revision"] > 0
    assert json.loads(etcdfence("fence", "show", resource, env=env).stdout)["mark"] == 100

    stale = etcdfence("fence", "put", resource, key, "v50", "--token", "50", env=env)
    assert stale.returncode == cli.EXIT_STALE
    line = one_error_line(stale.stderr)
    assert "stale" in line and "50" in line and "100" in line
    assert stale.stdout == ""
    kv = etcd_client.get(key)
    assert kv is not None and kv.value == b"v100", "a stale write changes nothing"

    # The token can come from the environment, as under `etcdctl lock` / `etcdfence lock`.
    from_env = etcdfence("fence", "put", resource, key, "v200", env={**env, "ETCD_LOCK_REV": "200"})
    assert from_env.returncode == 0, from_env
    assert json.loads(etcdfence("fence", "show", resource, env=env).stdout)["mark"] == 200


@pytest.mark.integration
def test_endpoints_option_beats_the_environment(etcd_endpoints: list[str]) -> None:
    good = ",".join(etcd_endpoints)
    bad = f"http://127.0.0.1:{free_port()}"
    env = clean_env(ETCDFENCE_ENDPOINTS=bad)
    assert etcdfence("--endpoints", good, "leader", "x", env=env).returncode == 0
    assert etcdfence("leader", "x", "--endpoints", good, env=env).returncode == 0
    assert etcdfence("leader", "x", env=clean_env(ETCDCTL_ENDPOINTS=good)).returncode == 0
    both = clean_env(ETCDFENCE_ENDPOINTS=good, ETCDCTL_ENDPOINTS=bad)
    assert etcdfence("--timeout", "1", "leader", "x", env=both).returncode == 0


@pytest.mark.integration
def test_run_resigns_and_returns_the_commands_exit_code(
    env: dict[str, str], etcd_namespace: str
) -> None:
    name = f"{etcd_namespace}/job"
    script = 'echo "$ETCDFENCE_TOKEN $ETCDFENCE_KEY"; exit 5'
    result = etcdfence("run", name, "--id", "solo", "--", "sh", "-c", script, env=env)
    assert result.returncode == 5, result
    token, key = result.stdout.split()
    assert int(token) > 0 and key.startswith(name + "/")
    assert "elected leader" in result.stderr and "resigning" in result.stderr
    assert _leader_json(env, name)["key"] is None


WRITER = """
import os, sys, time
import structlog
import etcdfence as ef

structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
resource, log = sys.argv[1], sys.argv[2]
token = ef.FencingToken.from_env()
client = ef.Client(os.environ["ETCDFENCE_ENDPOINTS"], timeout=2)
guard = client.fence(resource)
with open(log, "a", buffering=1) as out:
    out.write(f"start {os.getpid()} {token.value}\\n")
    while True:
        try:
            guard.put(token, resource + "-data", str(token.value))
            out.write(f"ok {token.value} {time.monotonic()}\\n")
        except ef.StaleTokenError as exc:
            out.write(f"stale {token.value} {exc.current} {time.monotonic()}\\n")
        time.sleep(0.05)
"""


def _log(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


@pytest.mark.integration
def test_run_supervisor_frozen_by_sigstop_loses_and_stops_its_command(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    name, resource = f"{etcd_namespace}/elect", f"{etcd_namespace}/res"
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    logs = {node: tmp_path / f"{node}.log" for node in ("a", "b")}

    def supervise(node: str) -> subprocess.Popen[str]:
        return start(
            "run", name, "--id", node, "--ttl", "1", "--grace", "0.2", "--",
            PYTHON, str(writer), resource, str(logs[node]),
            env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip

    a = supervise("a")
    b: subprocess.Popen[str] | None = None
    try:
        a_err = Lines(a.stderr)
        wait_until(lambda: any(r[0] == "ok" for r in _log(logs["a"])), what="a's command writes")
        a_child, a_token = (int(x) for x in _log(logs["a"])[0][1:3])
        b = supervise("b")
        b_err = Lines(b.stderr)
        wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, what="b queued")

        a.send_signal(signal.SIGSTOP)  # the supervisor freezes; its reaper does not
        wait_until(lambda: any(r[0] == "ok" for r in _log(logs["b"])), 10, "b's command writes")
        b_token = int(_log(logs["b"])[0][2])
        assert b_token > a_token
        # The reaper killed a's command by the kill deadline its frozen supervisor could no
        # longer renew: before b was elected, so a's command never met b's token.
        assert not alive(a_child), "a's command outlived its frozen supervisor's lease"
        a_last = max(float(r[2]) for r in _log(logs["a"]) if r[0] == "ok")
        b_first = min(float(r[2]) for r in _log(logs["b"]) if r[0] == "ok")
        assert a_last < b_first

        a.send_signal(signal.SIGCONT)
        # Woken past its deadline, the supervisor learns it from the reaper, the elector
        # ("leadership lost") or its own deadline check: it reports stopping that command.
        a_err.wait_for(lambda line: f"stopping pid {a_child} " in line)

        stale = [r for r in _log(logs["a"]) if r[0] == "stale"]
        assert all(int(r[2]) >= b_token for r in stale)
        assert etcd_client.fence(resource).current() == b_token
        kv = etcd_client.get(resource + "-data")
        assert kv is not None and kv.value == str(b_token).encode()

        # a campaigns again and queues behind b; b's command keeps its lead.
        wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, 15, "a re-campaigns")
        assert _leader_json(env, name)["value"] == "b"
        b_child = int(_log(logs["b"])[0][1])
        assert stop(b, signal.SIGTERM) == 0
        assert not alive(b_child)
        b_err.wait_for(lambda line: "shutting down" in line)
        # b resigned: a is elected again, with a fresh, larger token.
        a_err.wait_for(lambda line: "elected leader" in line and f"token {a_token})" not in line)
        assert stop(a, signal.SIGTERM) == 0
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                stop(proc, signal.SIGKILL)
        # No command may survive its supervisor. Its reaper kills it when it sees the
        # supervisor's pipe close, a moment *after* the supervisor died, so wait for that
        # (how fast it lands is test_sigkilled_supervisor_takes_the_whole_group_with_it's
        # business; this checks that nothing is left behind).
        commands = [int(r[1]) for log in logs.values() for r in _log(log) if r[0] == "start"]
        died = time.monotonic()
        while any(alive(pid) for pid in commands) and time.monotonic() < died + 5:
            time.sleep(0.01)
        survivors = [pid for pid in commands if alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert not survivors, f"commands {survivors} outlived their supervisor by 5 s"


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_demo_rejects_the_zombie_write_and_leaves_nothing_behind() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [PYTHON, "-m", "etcdfence", "demo"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=80,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "REJECTED" in out and "verdict: PASS" in out
    assert re.search(r"^t\+\s*\d+\.\d\ds\s+A\s+elected leader, fencing token \d+", out, re.M)
    assert "SIGSTOP A" in out and "SIGCONT A" in out
    assert elapsed < 60
    for pid in map(int, re.findall(r"\(pid (\d+)", out)):
        assert not alive(pid), f"demo left process {pid} behind"


@pytest.mark.integration
def test_etcd_command_serves_until_sigterm() -> None:
    proc = start("etcd", "--listen", "127.0.0.1:0", env=clean_env())
    try:
        out = Lines(proc.stdout)
        err = Lines(proc.stderr)
        endpoints = out.wait_for(lambda line: line.startswith("http://"), timeout=30)
        assert out.wait_for(lambda line: line.startswith("export")) == (
            f"export ETCDFENCE_ENDPOINTS={endpoints}"
        )
        assert all(e.startswith("http://127.0.0.1:") for e in endpoints.split(","))
        info = err.wait_for(lambda line: "running" in line)
        etcd_pid = int(re.search(r"pid (\d+)", info).group(1))  # type: ignore[union-attr]
        result = etcdfence("leader", "x", env=clean_env(ETCDFENCE_ENDPOINTS=endpoints))
        assert result.returncode == 0, result
        assert stop(proc, signal.SIGTERM, timeout=15) == 0
        assert not alive(etcd_pid)
    finally:
        stop(proc, signal.SIGKILL)


@pytest.mark.integration
def test_etcd_command_writes_json_with_w_json() -> None:
    proc = start("etcd", "--listen", "127.0.0.1:0", "--members", "3", "-w", "json", env=clean_env())
    try:
        record = json.loads(Lines(proc.stdout).wait_for(lambda line: line.startswith("{"), 60))
        assert len(record["endpoints"]) == 3 and record["version"].startswith("3.")
        assert [m["endpoint"] for m in record["members"]] == record["endpoints"]
        assert all(alive(m["pid"]) for m in record["members"])
        endpoints = ",".join(record["endpoints"])
        result = etcdfence("leader", "x", env=clean_env(ETCDFENCE_ENDPOINTS=endpoints))
        assert result.returncode == 0, result
        assert stop(proc, signal.SIGTERM, timeout=20) == 0
        assert not any(alive(m["pid"]) for m in record["members"])
    finally:
        stop(proc, signal.SIGKILL)


@pytest.mark.integration
def test_user_option_and_auth_errors_exit_5(tmp_path: Path) -> None:
    from etcdfence.testing import EtcdServer, find_etcdctl

    with EtcdServer() as server:
        ctl = [find_etcdctl(server.binary), f"--endpoints={server.endpoint}"]
        ctl_env = {"ETCDCTL_API": "3", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for args in (
            ["user", "add", "root:rootpw"],
            ["user", "add", "app:apppw"],
            ["role", "add", "app"],
            ["role", "grant-permission", "app", "--prefix=true", "readwrite", "app/"],
            ["user", "grant-role", "app", "app"],
            ["auth", "enable", "--user", "root:rootpw"],
        ):
            subprocess.run(ctl + args, check=True, capture_output=True, env=ctl_env, timeout=20)
        env = clean_env(ETCDFENCE_ENDPOINTS=server.endpoint)

        for args in (
            ["--user", "root:nope"],
            [],  # no credentials at all
            ["--user", "app:apppw"],  # outside the role's prefix: permission denied
        ):
            result = etcdfence(*args, "leader", "other/x", env=env)
            assert result.returncode == cli.EXIT_AUTH, (args, result)
            one_error_line(result.stderr)

        assert etcdfence("--user", "root:rootpw", "leader", "x", env=env).returncode == 0
        assert (
            etcdfence("leader", "x", "--user", "root", "--password", "rootpw", env=env).returncode
            == 0
        )
        assert etcdfence("leader", "app/x", "--user", "app:apppw", env=env).returncode == 0
        from_env = {**env, "ETCDFENCE_USER": "root", "ETCDFENCE_PASSWORD": "rootpw"}
        assert etcdfence("leader", "x", env=from_env).returncode == 0
        script = "echo $ETCDFENCE_TOKEN"
        locked = etcdfence(
            "--user", "app:apppw", "lock", "app/l", "--", "sh", "-c", script, env=env
        )
        assert locked.returncode == 0 and int(locked.stdout) > 0, locked

        no_password = etcdfence("--user", "root", "leader", "x", env=env)
        assert no_password.returncode == cli.EXIT_USAGE
        assert "no password" in one_error_line(no_password.stderr)

    missing_ca = etcdfence(
        "--cacert", str(tmp_path / "nope.pem"), "--endpoints", "https://127.0.0.1:1",
        "leader", "x", env=clean_env(),
    )  # fmt: skip
    assert missing_ca.returncode == cli.EXIT_USAGE
    assert "CA file" in one_error_line(missing_ca.stderr)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_demo_child_reports_in_the_history_event_format(etcd_endpoints: list[str]) -> None:
    """The demo's contender speaks the history package's event lines (no line protocol of
    its own): every line it prints parses with :func:`etcdfence.history.parse_events`, and
    the checker finds its campaign, term and write consistent."""
    from etcdfence.cli._demo_child import DECIDING, EXIT, STARTED
    from etcdfence.history import EVENT_KINDS, History, check, parse_events

    proc = procs_.start(
        [
            PYTHON,
            "-m",
            "etcdfence.cli._demo_child",
            "--endpoints",
            ",".join(etcd_endpoints),
            "--id",
            "A",
        ],
        env=clean_env(),
        stdin=subprocess.PIPE,
        new_group=False,
        bufsize=1,
    )
    lines: list[str] = []
    reader = LineReader(proc.stdout, on_line=lambda line, _at: lines.append(line), name="child")
    try:
        assert proc.stdin is not None
        wait_until(lambda: any('"accepted"' in line for line in lines), timeout=20)
        proc.stdin.write("write\ngo\n")
        proc.stdin.flush()
        wait_until(lambda: sum('"accepted"' in line for line in lines) == 2, timeout=10)
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=15) == 0
        wait_until(lambda: reader.eof, timeout=5)
    finally:
        stop(proc, timeout=3)
    printed = [line for line in lines if line.strip()]
    events = parse_events(printed)
    assert len(events) == len(printed), "a line the history parser does not read"
    kinds = [e.kind for e in events]
    assert set(kinds) <= EVENT_KINDS
    assert {"campaign", "elected", "write", "accepted", "lost"} <= set(kinds)
    notes = [e.detail for e in events if e.kind == "note"]
    assert notes[0] == STARTED and notes[-1] == EXIT and DECIDING in notes
    assert all(e.contender == "A" for e in events)
    elected = next(e for e in events if e.kind == "elected")
    assert elected.deadline is not None and elected.key and elected.token
    result = check(History.collect(events))
    assert result.ok and result.stats["accepted"] == 2, result.report()

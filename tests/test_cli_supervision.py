"""How ``etcdfence lock -- CMD`` and ``etcdfence run -- CMD`` keep the command (its whole
process group, grandchildren included) inside the lease: stopped on loss, killed with a
SIGKILLed supervisor, SIGKILLed before etcd can expire the lease; and hostile command
lines refused at once with exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env
from test_cli import Lines, alive, etcdfence, one_error_line, start

import etcdfence as ef
from etcdfence import cli
from etcdfence.testing import FaultProxy
from etcdfence.testing.procs import stop, wait_until

PYTHON = sys.executable


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, from /proc."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def pids(path: Path, count: int) -> list[int]:
    """Wait until ``path`` holds ``count`` pids (one per line) and return them."""

    def ready() -> list[int] | None:
        try:
            found = [int(x) for x in path.read_text().split()]
        except (FileNotFoundError, ValueError):
            return None
        return found if len(found) >= count else None

    found: list[int] = wait_until(ready, what=f"{count} pids in {path}")
    return found


def tree_script(pidfile: Path) -> str:
    """A shell command whose work happens in a grandchild and a great-grandchild:
    ``sh -c 'worker & wait'`` with a nested shell, each ignoring nothing."""
    return (
        f"sleep 1000 & echo $! >> {pidfile}; "
        f"sh -c 'sleep 1000 & echo $! >> {pidfile}; wait' & "
        f"echo $$ >> {pidfile}; wait"
    )


def kill_leftovers(found: list[int]) -> None:
    for pid in found:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- 1. lock stops the group


@pytest.mark.integration
def test_lock_stops_grandchildren_when_the_lock_is_lost(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    name = f"{etcd_namespace}/lost"
    pidfile = tmp_path / "pids"
    proc = start(
        "lock", name, "--ttl", "1", "--grace", "0.2", "--", "sh", "-c", tree_script(pidfile),
        env=env,
    )  # fmt: skip
    found: list[int] = []
    try:
        found = pids(pidfile, 3)
        assert all(alive(pid) for pid in found)
        proc.send_signal(signal.SIGSTOP)  # frozen past its lease: the lock is lost
        wait_until(lambda: etcd_client.get_prefix(name + "/") == [], what="lease expired")
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(10) == cli.EXIT_LOST
        survivors = [pid for pid in found if alive(pid)]
        assert survivors == [], "the lock's command group (grandchildren too) must be stopped"
        assert proc.stderr is not None and "lost the lock" in proc.stderr.read()
    finally:
        stop(proc, signal.SIGKILL)
        kill_leftovers(found)


@pytest.mark.integration
def test_lock_stops_background_jobs_the_command_left_before_releasing(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    name = f"{etcd_namespace}/left"
    pidfile = tmp_path / "pids"
    script = f"sleep 1000 & echo $! > {pidfile}; exit 3"
    result = etcdfence("lock", name, "--grace", "0.5", "--", "sh", "-c", script, env=env)
    found = pids(pidfile, 1)
    try:
        assert result.returncode == 3, result  # the command's own status
        assert not alive(found[0]), "a job left in the group must not outlive the lock"
        assert etcd_client.get_prefix(name + "/") == []
    finally:
        kill_leftovers(found)


# ------------------------------------------------- 2. a SIGKILLed supervisor orphans nothing


@pytest.mark.integration
@pytest.mark.parametrize("command", ["lock", "run"])
def test_sigkilled_supervisor_takes_the_whole_group_with_it(
    command: str, env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    ttl = 3
    name = f"{etcd_namespace}/{command}"
    pidfile = tmp_path / "pids"
    options = ["--id", "node-a"] if command == "run" else []
    proc = start(
        command, name, *options, "--ttl", str(ttl), "--", "sh", "-c", tree_script(pidfile),
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    found: list[int] = []
    try:
        found = pids(pidfile, 3)
        pgid = os.getpgid(found[-1])  # the shell's group: the command's own group
        assert pgid != os.getpgid(proc.pid), "the command runs in a group of its own"
        assert set(found) <= set(group_members(pgid))
        assert len(etcd_client.get_prefix(name + "/")) == 1

        proc.kill()  # kill -9: no cleanup runs in the supervisor
        killed = time.monotonic()
        proc.wait(10)
        wait_until(lambda: not group_members(pgid), 10, "the command's group to be gone")
        gone_after = time.monotonic() - killed
        assert not any(alive(pid) for pid in found)
        # The lease still holds the key: the command died *before* anyone else could lead.
        assert len(etcd_client.get_prefix(name + "/")) == 1
        assert gone_after < ttl - 0.3, f"group outlived the safety window ({gone_after:.2f}s)"
    finally:
        stop(proc, signal.SIGKILL)
        kill_leftovers(found)


# ---------------------------------------------- 3. SIGKILL lands before the lease can expire

IGNORES_TERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "a", buffering=1) as out:
    out.write(f"start {__import__('os').getpid()}\\n")
    while True:
        out.write(f"tick {time.monotonic()}\\n")
        time.sleep(0.02)
"""


def ticks(path: Path) -> list[float]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [float(line.split()[1]) for line in lines if line.startswith("tick ")]


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_run_kills_a_term_ignoring_command_before_the_next_leader_starts(
    etcd_endpoints: list[str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    """A is cut off from etcd (its keepalives are blackholed, the process keeps running)
    with a command that ignores SIGTERM and the largest --grace its TTL allows. Its
    command must be dead before B's command runs: no overlap of the two terms."""
    ttl = 3
    grace = cli.max_grace(ttl)
    name = f"{etcd_namespace}/elect"
    program = tmp_path / "ignores_term.py"
    program.write_text(IGNORES_TERM)
    logs = {node: tmp_path / f"{node}.log" for node in ("a", "b")}
    procs: list[subprocess.Popen[str]] = []
    with FaultProxy(etcd_endpoints[0]) as proxy:

        def supervise(node: str, endpoint: str) -> subprocess.Popen[str]:
            proc = start(
                "run", name, "--id", node, "--ttl", str(ttl), "--grace", f"{grace:.2f}",
                "--", PYTHON, str(program), str(logs[node]),
                env=clean_env(ETCDFENCE_ENDPOINTS=endpoint), stdout=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(proc)
            return proc

        try:
            a = supervise("a", proxy.endpoint)
            a_err = Lines(a.stderr)
            wait_until(lambda: ticks(logs["a"]), what="a's command runs")
            a_child = int(logs["a"].read_text().split()[1])
            b = supervise("b", etcd_endpoints[0])
            Lines(b.stderr)
            wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, what="b queued")

            proxy.blackhole()  # a can no longer renew its lease; its process runs on
            cut = time.monotonic()
            wait_until(lambda: ticks(logs["b"]), 20, "b's command runs")
            wait_until(lambda: not alive(a_child), 5, "a's command is dead")
            line = a_err.wait_for(lambda text: "stopping pid" in text)
            # SIGTERM went out while the lease still held (not when the deadline passed).
            assert "lease not renewed in time" in line, line

            a_last, b_first = max(ticks(logs["a"])), min(ticks(logs["b"]))
            assert a_last < b_first, (
                f"a's command ran {a_last - b_first:.3f}s into b's term (cut at {cut:.3f})"
            )
            proxy.heal()
            assert stop(b) == 0
            assert stop(a) == 0
        finally:
            for proc in procs:
                stop(proc, signal.SIGKILL)
            for log in logs.values():
                if log.exists():
                    kill_leftovers([int(log.read_text().split()[1])])


# --------------------------------------------------------------- 4. hostile command lines

HOSTILE: list[list[str | bytes]] = [
    ["run", "x", "--id", "", "--", "true"],
    ["run", "x", "--id", "  ", "--", "true"],
    ["run", "x", "--id", b"\xff\xfe", "--", "true"],  # not UTF-8: a lone surrogate in argv
    ["--endpoints", "garbage url", "leader", "x"],
    ["--endpoints", ",", "leader", "x"],
    ["--endpoints", "http://exa mple:2379", "lock", "x", "--", "true"],
    ["fence", "put", "r", "k", "v", "--token", "99999999999999999999"],
    ["fence", "put", "r", "k", "v", "--token", str(2**63)],
    ["fence", "put", "r", "k", "v", "--token", "-5"],
    ["fence", "put", "r", "", "v", "--token", "1"],
    ["fence", "put", "r", "k", b"\xff", "--token", "1"],
    ["fence", "show", ""],
    ["lock", "x", "--ttl", "-3", "--", "true"],
    ["lock", "x", "--ttl", str(2**63), "--", "true"],
    ["run", "x", "--id", "a", "--ttl", "99999999999", "--", "true"],
    ["lock", "x", "--ttl", "1.5", "--", "true"],
    ["--timeout", "nan", "leader", "x"],
    ["--timeout", "inf", "leader", "x"],
    ["--timeout", "0", "leader", "x"],
    ["lock", "x", "--timeout-acquire", "nan", "--", "true"],
    ["lock", "x", "--timeout-acquire", "1e300", "--", "true"],
    ["lock", "x", "--grace", "-1", "--", "true"],
    ["lock", "x", "--grace", "inf", "--", "true"],
    ["lock", "", "--", "true"],
    ["lock", " x", "--", "true"],
    ["lock", b"jobs/\xff", "--", "true"],
    ["run", "", "--id", "a", "--", "true"],
    ["observe", "x/"],
    ["leader", b"\xed\xa0\x80"],  # an encoded surrogate: not valid UTF-8 either
    ["--user", b"\xff:pw", "leader", "x"],
]


@pytest.mark.parametrize("args", HOSTILE, ids=lambda a: " ".join(map(repr, a)))
def test_hostile_input_exits_2_at_once_with_one_line(args: list[str | bytes]) -> None:
    started = time.monotonic()
    # An endpoint where nothing answers: a usage error must not wait for it (exit 3).
    result = subprocess.run(
        [PYTHON.encode(), b"-m", b"etcdfence", *(os.fsencode(a) for a in args)],
        capture_output=True,
        env=clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1"),
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == cli.EXIT_USAGE, stderr
    one_error_line(stderr)
    assert "unexpected" not in stderr
    assert time.monotonic() - started < 4.0, "refused at once, not after the etcd timeout"


@pytest.mark.parametrize("command", [["lock", "x"], ["run", "x", "--id", "a"]])
def test_grace_that_cannot_fit_the_ttl_is_refused_naming_the_limit(command: list[str]) -> None:
    limit = cli.max_grace(3)
    assert 1.0 < limit < 3 - 0.3  # TTL - margin is not enough: keepalives come every TTL/3
    result = etcdfence(
        *command, "--ttl", "3", "--grace", "2", "--", "true",
        env=clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1"),
    )  # fmt: skip
    assert result.returncode == cli.EXIT_USAGE
    line = one_error_line(result.stderr)
    assert "--grace 2" in line and f"at most {int(limit * 100) / 100:g}s" in line


def test_max_grace_leaves_margin_keepalive_interval_and_slack() -> None:
    for ttl, expected in ((1, 0.2167), (3, 1.45), (10, 5.4167), (30, 16.75), (60, 34.75)):
        assert cli.max_grace(ttl) == pytest.approx(expected, abs=1e-3)
    args = cli.parse_args(["run", "x", "--id", "a", "--ttl", "3", "--", "true"])
    assert args.grace == pytest.approx(cli.max_grace(3)), "the default shrinks to fit"
    args = cli.parse_args(["lock", "x", "--", "true"])
    assert args.grace == cli.DEFAULT_GRACE


def test_the_reaper_never_collects_the_commands_own_status() -> None:
    """Reaping the group's orphans must leave the command to Popen: a command reaped by
    the orphan sweep read as exit status 0 (seen as `exit 5` → 'status 0' under load)."""
    import subprocess
    import time as _time

    from etcdfence.cli._reaper import _reap_orphans

    command = subprocess.Popen(["sh", "-c", "exit 5"])
    orphan = subprocess.Popen(["sh", "-c", "exit 0"])
    deadline = _time.monotonic() + 10
    while _time.monotonic() < deadline:  # both exited, neither collected yet (zombies)
        states = [Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                  for p in (command, orphan)]  # fmt: skip
        if states == ["Z", "Z"]:
            break
        _time.sleep(0.01)
    _reap_orphans(command.pid)  # the reaper's loop: sweep, then Popen polls the command
    assert command.wait(5) == 5
    _reap_orphans(command.pid)  # the next sweep collects the rest
    assert not Path(f"/proc/{orphan.pid}").exists(), "the other exited child was collected"

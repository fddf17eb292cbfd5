"""How ``etcdfence lock -- CMD`` and ``etcdfence run -- CMD`` keep the command (its whole
process group, grandchildren included) inside the lease: stopped on loss, killed with a
SIGKILLed supervisor, SIGKILLed before etcd can expire the lease; and hostile command
lines refused at once with exit 2."""

from __future__ import annotations

import contextlib
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
from etcdfence.cli._process import STOP_EXTRA
from etcdfence.testing import FaultProxy
from etcdfence.testing.procs import start as procs_start
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


@pytest.mark.serial  # the group is dead before TTL - 0.3 s
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
        wait_until(lambda: not any(alive(pid) for pid in found), 10, "every command pid gone")
        gone_after = time.monotonic() - killed
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
            # every step of b's stop takes what is left of one budget (grace + STOP_EXTRA)
            assert stop(b, timeout=grace + STOP_EXTRA + 3.0) == 0
            assert stop(a) == 0
        finally:
            for proc in procs:
                stop(proc, signal.SIGKILL)
            for log in logs.values():
                if log.exists():
                    kill_leftovers([int(log.read_text().split()[1])])


#: A command that ignores SIGTERM and leaves a grandchild that ignores it too (both tick
#: into their own log): the stop must SIGKILL the whole tree.
IGNORES_TERM_WITH_CHILD = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2] + ".child"])
exec(open(sys.argv[1]).read().replace("sys.argv[1]", "sys.argv[2]"))
"""


@pytest.mark.serial  # the stop ends within its budget
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_run_stops_within_its_budget_when_etcd_is_blackholed_at_sigterm(
    etcd_endpoints: list[str], etcd_namespace: str, etcd_client: ef.Client, tmp_path: Path
) -> None:
    """B leads with a SIGTERM-ignoring command (and grandchild); its etcd is blackholed,
    then it gets SIGTERM. Every etcd step of its stop (resign, revoke, closing the
    client) would wait for its own timeout; the stop budget (--grace + STOP_EXTRA) caps
    them all: B exits 0 within it, its command tree is dead, and A's command starts
    only after B's (A waits for B's lease: it could not be revoked)."""
    ttl = 3
    grace = cli.max_grace(ttl)
    budget = grace + STOP_EXTRA
    name = f"{etcd_namespace}/budget"
    program = tmp_path / "ignores_term.py"
    program.write_text(IGNORES_TERM)
    parent = tmp_path / "with_child.py"
    parent.write_text(IGNORES_TERM_WITH_CHILD)
    logs = {node: tmp_path / f"{node}.log" for node in ("a", "b")}
    procs: list[subprocess.Popen[str]] = []
    with FaultProxy(etcd_endpoints[0]) as proxy:

        def supervise(node: str, endpoint: str) -> subprocess.Popen[str]:
            proc = start(
                "run", name, "--id", node, "--ttl", str(ttl), "--grace", f"{grace:.2f}",
                "--", PYTHON, str(parent), str(program), str(logs[node]),
                env=clean_env(ETCDFENCE_ENDPOINTS=endpoint), stdout=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(proc)
            return proc

        b_tree: list[int] = []
        try:
            b = supervise("b", proxy.endpoint)
            b_err = Lines(b.stderr)
            b_child_log = Path(str(logs["b"]) + ".child")
            wait_until(lambda: ticks(logs["b"]) and ticks(b_child_log), 20, "b's tree runs")
            b_tree = [int(p.read_text().split()[1]) for p in (logs["b"], b_child_log)]
            a = supervise("a", etcd_endpoints[0])
            Lines(a.stderr)
            wait_until(lambda: len(etcd_client.get_prefix(name + "/")) == 2, what="a queued")

            proxy.blackhole()  # b's resign, revoke and keepalives now go nowhere
            sent = time.monotonic()
            b.send_signal(signal.SIGTERM)
            try:
                code = b.wait(budget + 3.0)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - sent
            assert code == 0, (code, f"{took:.1f}s", "\n".join(b_err.lines))
            assert took <= budget + 3.0, f"b took {took:.1f}s, budget {budget:.2f}s"
            assert [pid for pid in b_tree if alive(pid)] == [], "b's command tree must be dead"

            wait_until(lambda: ticks(logs["a"]), ttl + 15, "a's command runs")
            b_last = max(ticks(logs["b"]) + ticks(b_child_log))
            a_first = min(ticks(logs["a"]))
            assert b_last < a_first, f"b's command ran {b_last - a_first:.3f}s into a's term"
            proxy.heal()
            assert stop(a) == 0
        finally:
            for proc in procs:
                stop(proc, signal.SIGKILL)
            kill_leftovers(b_tree)
            for log in tmp_path.glob("*.log*"):
                with contextlib.suppress(ValueError, IndexError):
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


# ------------------------------- 5. nothing the operator does to the supervisor keeps the
#                                    command alive past its lease (issue #22, items 1-3)

#: A heartbeat: the wall-clock time, appended to $1 every 50 ms. ``setsid`` as $2 runs the
#: loop in a new session (it leaves the command's process group) and waits in a sleep.
BEAT = """\
beat='while :; do date +%s.%N >> "$0"; sleep 0.05; done'
if [ "$2" = setsid ]; then
    setsid sh -c "$beat" "$1" &
    exec sleep 1000
fi
exec sh -c "$beat" "$1"
"""


#: Commands that try to outlive their supervisor (argv: KIND LOG). Each appends the
#: wall-clock time to LOG (and its pid to LOG.pids) every 50 ms from some process, and
#: exits once LOG.stop exists (the tests' cleanup; a hopper cannot be killed by pid).
HOSTILE_COMMAND = """\
import ctypes, os, signal, sys, threading, time
kind, log = sys.argv[1], sys.argv[2]
def beat():
    if os.path.exists(log + ".stop"):
        os._exit(0)
    for path, text in ((log, f"{time.time():.6f}\\n"), (log + ".pids", f"{os.getpid()}\\n")):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, text.encode())
        os.close(fd)
def beat_forever():
    while True:
        beat()
        time.sleep(0.05)
def daemonize():  # double fork, setsid, no fds: True in the daemon
    if os.fork():
        return False
    os.setsid()
    if os.fork():
        os._exit(0)
    os.closerange(0, 1024)
    return True
def hop(new_group):  # a new pid all the time: fork, the parent exits
    last = 0.0
    while True:
        if os.fork():
            os._exit(0)
        if new_group:
            os.setpgid(0, 0)
        if time.time() - last > 0.05:
            beat()
            last = time.time()
if kind == "plain":
    beat_forever()
elif kind == "daemon":
    if daemonize():
        beat_forever()
elif kind == "zombie-leader":  # the main thread exits, a thread goes on: the leader reads Z
    if daemonize():
        threading.Thread(target=beat_forever).start()
        sys_exit = {"x86_64": 60, "aarch64": 93}[os.uname().machine]
        ctypes.CDLL(None).syscall(sys_exit, 0)  # exit(2): this thread only
elif kind in ("hopper", "pgrp-hopper"):
    if daemonize():
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        hop(kind == "pgrp-hopper")
time.sleep(1000)
"""


def hostile_alive(log: Path) -> list[int]:
    """Pids that beat into ``log`` and still have a live thread (a leader reading Z
    while another thread runs counts as alive)."""
    try:
        pids = {int(x) for x in Path(f"{log}.pids").read_text().split()}
    except (FileNotFoundError, ValueError):
        return []
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes()
                if stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X"):
                    found.append(pid)
                    break
    return found


def beats(path: Path) -> list[float]:
    try:
        return [float(x) for x in path.read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def beaters(path: Path) -> list[int]:
    """Pids of the shells that append to ``path`` (any session), from /proc (not the
    supervisors and reapers, whose command lines name it too)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0] != b"sh" and cmdline[:2] != [b"setsid", b"sh"]:
            continue
        if str(path).encode() in cmdline and alive(int(name)):
            found.append(int(name))
    return found


class Contest:
    """Two supervisors (``run`` or ``lock``) of NAME whose commands beat into a.log and
    b.log; a leads first. ``a_endpoint`` lets a talk to etcd through a proxy."""

    def __init__(
        self,
        kind: str,
        name: str,
        tmp_path: Path,
        *,
        ttl: int,
        mode: str,
        payload: str | None = None,
        containment: str = "cgroup",
    ) -> None:
        self.kind, self.name, self.ttl, self.mode = kind, name, ttl, mode
        self.script = tmp_path / "beat.sh"
        self.script.write_text(BEAT)
        #: a's command: a HOSTILE payload (b's beats plainly), instead of BEAT.
        self.payload = payload
        self.hostile = tmp_path / "hostile.py"
        self.hostile.write_text(HOSTILE_COMMAND)
        self.extra_env = {"ETCDFENCE_CGROUP": "off"} if containment == "subreaper" else {}
        self.logs = {node: tmp_path / f"{node}.log" for node in ("a", "b")}
        self.errs = {node: tmp_path / f"{node}.err" for node in ("a", "b")}
        self.procs: list[subprocess.Popen[str]] = []
        self.reapers: list[int] = []  # reapers a test stopped: continued at cleanup
        #: Exit status of a supervisor SIGTERMed while its command runs: run resigns and
        #: exits 0; lock passes the signal on and exits with the command's status.
        self.stopped = 0 if kind == "run" else 128 + signal.SIGTERM

    def start(self, node: str, endpoint: str, **kwargs: object) -> subprocess.Popen[str]:
        options = ["--id", node] if self.kind == "run" else []
        command = ["sh", str(self.script), str(self.logs[node]), self.mode]
        if self.payload is not None:
            payload = self.payload if node == "a" else "plain"
            command = [PYTHON, str(self.hostile), payload, str(self.logs[node])]
        with self.errs[node].open("w") as err:  # kept for failure messages
            kwargs.setdefault("stderr", err)
            proc = procs_start(
                [PYTHON, "-m", "etcdfence", self.kind, self.name, *options, "--ttl",
                 str(self.ttl), "--", *command],
                env=clean_env(ETCDFENCE_ENDPOINTS=endpoint, **self.extra_env),
                stdout=subprocess.DEVNULL, new_group=False, process_group=0, **kwargs,
            )  # fmt: skip
        # A group of its own in our session, as a shell's job: not orphaned (the kernel
        # drops SIGTSTP to an orphaned group), so a Ctrl-Z stops it.
        self.procs.append(proc)
        return proc

    def no_overlap(self) -> None:
        """b's command beats; a's last beat came before b's first one, and a's beat no
        more (a's whole tree is dead, setsid worker included)."""
        wait_until(lambda: beats(self.logs["b"]), 30, "b's command beats")
        wait_until(lambda: not beaters(self.logs["a"]), 5, "a's command tree is dead")
        a_last, b_first = max(beats(self.logs["a"])), min(beats(self.logs["b"]))
        assert a_last < b_first, f"a's command beat {a_last - b_first:.3f}s into b's term"

    def cleanup(self) -> None:
        for log in self.logs.values():  # hostile payloads: exit, wherever you are
            Path(f"{log}.stop").touch()
        for pid in self.reapers:  # (an old reaper would then see EOF and kill)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                stop(proc, signal.SIGKILL)
        for log in self.logs.values():
            kill_leftovers(beaters(log))
            end = time.monotonic() + 10
            while hostile_alive(log) and time.monotonic() < end:
                time.sleep(0.05)
            kill_leftovers(hostile_alive(log))


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("freeze", ["SIGSTOP", "SIGTSTP"])
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_a_frozen_supervisor_cannot_keep_its_command_alive(
    kind: str, freeze: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    """The supervisor is stopped (kill -STOP PID, or Ctrl-Z: SIGTSTP to its job's process
    group) past its TTL: its reaper must kill the command by the kill deadline, before b's
    command starts — it does not need the frozen supervisor to do it."""
    contest = Contest(kind, f"{etcd_namespace}/{kind}", tmp_path, ttl=2, mode="plain")
    try:
        a = contest.start("a", etcd_endpoints[0])
        wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
        b = contest.start("b", etcd_endpoints[0])
        time.sleep(0.5)  # b is waiting behind a
        if freeze == "SIGSTOP":
            a.send_signal(signal.SIGSTOP)
        else:
            os.killpg(a.pid, signal.SIGTSTP)  # Ctrl-Z: the job's whole group
        contest.no_overlap()
        os.killpg(a.pid, signal.SIGCONT)
        if kind == "lock":
            assert a.wait(15) == cli.EXIT_LOST
        assert stop(b) == contest.stopped
    finally:
        contest.cleanup()


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_a_setsid_worker_dies_with_the_lease(
    kind: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    """a's command starts ``setsid worker &`` (it leaves the process group) and a is cut
    off from etcd: the worker must be dead before b's command starts, and after a exits."""
    contest = Contest(kind, f"{etcd_namespace}/{kind}", tmp_path, ttl=2, mode="setsid")
    with FaultProxy(etcd_endpoints[0]) as proxy:
        try:
            a = contest.start("a", proxy.endpoint)
            wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
            b = contest.start("b", etcd_endpoints[0])
            time.sleep(0.5)
            proxy.blackhole()
            contest.no_overlap()
            proxy.heal()
            if kind == "lock":
                assert a.wait(15) == cli.EXIT_LOST
            assert stop(a) in (0, cli.EXIT_LOST)
            assert stop(b) == contest.stopped
            time.sleep(0.3)
            assert not beaters(contest.logs["a"]) and not beaters(contest.logs["b"])
        finally:
            contest.cleanup()


@pytest.mark.integration
def test_lock_kills_a_setsid_worker_the_command_left_before_releasing(
    env: dict[str, str], etcd_namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    script = f"setsid sh -c 'while :; do date >> {log}; sleep 0.05; done' & sleep 0.3; exit 3"
    try:
        result = etcdfence("lock", f"{etcd_namespace}/left", "--", "sh", "-c", script, env=env)
        assert result.returncode == 3, result
        assert not beaters(log), "a setsid worker outlived the lock's command"
    finally:
        kill_leftovers(beaters(log))


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_a_stalled_stderr_does_not_delay_the_stop(
    kind: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    """a's stderr is a full pipe nobody reads (a blocked log driver) when a is cut off
    from etcd: its command must still die before b's starts, and a stays responsive."""
    contest = Contest(kind, f"{etcd_namespace}/{kind}", tmp_path, ttl=2, mode="plain")
    read_end, write_end = os.pipe()
    with FaultProxy(etcd_endpoints[0]) as proxy:
        try:
            a = contest.start("a", proxy.endpoint, stderr=write_end)
            wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
            b = contest.start("b", etcd_endpoints[0])
            time.sleep(0.5)
            # Fill the pipe through a description of our own (O_NONBLOCK is per description:
            # a's stays blocking, as a stalled journald's would).
            filler = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK)
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(filler, b"x" * 4096)
            os.close(filler)
            proxy.blackhole()
            contest.no_overlap()
            proxy.heal()
            # a never waits on its stderr: it stops at once when asked (with the pipe
            # still full, its last lines are dropped after a short flush).
            a.send_signal(signal.SIGTERM)
            assert a.wait(10) in (0, cli.EXIT_LOST)  # lock: lost already; run: resigned
            assert stop(b) == contest.stopped
        finally:
            contest.cleanup()
            os.close(read_end)
            os.close(write_end)


# ------------------------- 6. nothing the command does, nor what befalls the reaper, keeps
#                              any of it alive past the lease (review of the reaper)

CONTAINMENTS = ["cgroup", "subreaper"]  # the reaper's cgroup v2, or ETCDFENCE_CGROUP=off


def hostile_contest(
    kind: str, payload: str, containment: str, namespace: str, tmp_path: Path
) -> Contest:
    if containment == "cgroup" and not cgroup_writable():
        pytest.skip("no writable cgroup v2 hierarchy here")
    name = f"{namespace}/{kind}"
    return Contest(kind, name, tmp_path, ttl=2, mode="plain", payload=payload,
                   containment=containment)  # fmt: skip


def cgroup_writable() -> bool:
    """Whether we may create a cgroup below our own in a cgroup2 hierarchy."""
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    mount = next((m for m in mounts if m[m.index("-") + 1] == "cgroup2"), None)
    own = next((x[3:] for x in Path("/proc/self/cgroup").read_text().splitlines()
                if x.startswith("0::")), None)  # fmt: skip
    if mount is None or own is None or not own.startswith(mount[3]):
        return False
    probe = Path(mount[4], own[len(mount[3]) :].lstrip("/"), f"probe-{os.getpid()}")
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def children(pid: int) -> list[int]:
    """``pid``'s children (of any of its threads), from /proc."""
    found = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found += [
                    int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                ]
    return found


def a_is_quiet(contest: Contest) -> None:
    """a's command tree is dead: nothing of it beats any more, nothing of it lives, and
    its last beat came before b's first one."""
    log = contest.logs["a"]
    wait_until(lambda: beats(contest.logs["b"]), 30, "b's command beats")
    wait_until(lambda: not hostile_alive(log), 5, "a's hostile command tree is dead")
    before = len(beats(log))
    time.sleep(1.0)
    assert len(beats(log)) == before, "a's command still beats"
    a_last, b_first = max(beats(log)), min(beats(contest.logs["b"]))
    assert a_last < b_first, f"a's command beat {a_last - b_first:.3f}s into b's term"


def reaper_of(contest: Contest, supervisor: subprocess.Popen[str]) -> int:
    """The reaper: the supervisor's only child."""
    found: list[int] = wait_until(lambda: sorted(children(supervisor.pid)) or None, 10, "reaper")
    assert len(found) == 1, found
    contest.reapers.append(found[0])
    return found[0]


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("containment", CONTAINMENTS)
@pytest.mark.parametrize("payload", ["zombie-leader", "hopper", "pgrp-hopper"])
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_no_descendant_outlives_the_lease_however_it_hides(
    kind: str,
    payload: str,
    containment: str,
    etcd_endpoints: list[str],
    etcd_namespace: str,
    tmp_path: Path,
) -> None:
    """a's command leaves a daemon that hides from a /proc scan — a thread group whose
    main thread exited (it reads as a zombie), or one that changes its pid (and process
    group) all the time — and a is cut off from etcd: that daemon must be dead before
    b's command starts."""
    contest = hostile_contest(kind, payload, containment, etcd_namespace, tmp_path)
    with FaultProxy(etcd_endpoints[0]) as proxy:
        try:
            a = contest.start("a", proxy.endpoint)
            wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
            b = contest.start("b", etcd_endpoints[0])
            time.sleep(0.5)
            proxy.blackhole()
            a_is_quiet(contest)
            proxy.heal()
            assert stop(a) in (0, cli.EXIT_LOST), contest.errs["a"].read_text()
            assert stop(b) == contest.stopped, contest.errs["b"].read_text()
        finally:
            contest.cleanup()


@pytest.mark.serial  # the daemon is dead within the TTL
@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("containment", CONTAINMENTS)
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_a_killed_reaper_leaves_nothing_running(
    kind: str, containment: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    """``kill -9`` on a's reaper: its PDEATHSIG only reaches the command, not the daemon
    the command double-forked; a must kill that daemon itself at once (then stop: the
    command died of SIGKILL), and b takes over only after."""
    contest = hostile_contest(kind, "daemon", containment, etcd_namespace, tmp_path)
    try:
        a = contest.start("a", etcd_endpoints[0])
        wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
        b = contest.start("b", etcd_endpoints[0])
        time.sleep(0.5)
        os.kill(reaper_of(contest, a), signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not hostile_alive(contest.logs["a"]), 5, "a's daemon is dead")
        assert time.monotonic() - killed < contest.ttl, "a's daemon outlived the reaper"
        assert a.wait(15) == 128 + signal.SIGKILL, contest.errs["a"].read_text()
        a_is_quiet(contest)
        assert stop(b) == contest.stopped, contest.errs["b"].read_text()
    finally:
        contest.cleanup()


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("containment", CONTAINMENTS)
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_a_stopped_reaper_wakes_when_its_supervisor_is_killed(
    kind: str, containment: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    """a (frozen first, so it cannot notice) and then its reaper are SIGSTOPped, then a
    is SIGKILLed: nothing runs the reaper's EOF check unless the kernel wakes it (its
    process group is orphaned with a stopped member: SIGHUP, SIGCONT), and then the
    daemon must be dead before b's command starts."""
    contest = hostile_contest(kind, "daemon", containment, etcd_namespace, tmp_path)
    try:
        a = contest.start("a", etcd_endpoints[0])
        wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
        b = contest.start("b", etcd_endpoints[0])
        time.sleep(0.5)
        reaper = reaper_of(contest, a)
        a.send_signal(signal.SIGSTOP)
        os.kill(reaper, signal.SIGSTOP)
        wait_until(lambda: Path(f"/proc/{reaper}/stat").read_text().split(") ")[1][0] == "T",
                   5, "the reaper is stopped")  # fmt: skip
        a.kill()
        a.wait(10)
        a_is_quiet(contest)
        assert stop(b) == contest.stopped, contest.errs["b"].read_text()
    finally:
        contest.cleanup()


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["run", "lock"])
def test_a_stopped_reaper_does_not_wedge_its_supervisor(
    kind: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    """a's reaper is SIGSTOPped and a is asked to stop (SIGTERM): a must still stop its
    command (and the daemon it left) and exit in bounded time, freeing the lease for b,
    rather than wait on the reaper forever while keeping the lease alive."""
    contest = hostile_contest(kind, "daemon", "cgroup", etcd_namespace, tmp_path)
    try:
        a = contest.start("a", etcd_endpoints[0])
        wait_until(lambda: beats(contest.logs["a"]), 20, "a's command beats")
        b = contest.start("b", etcd_endpoints[0])
        time.sleep(0.5)
        os.kill(reaper_of(contest, a), signal.SIGSTOP)
        a.send_signal(signal.SIGTERM)
        assert a.wait(15) is not None, contest.errs["a"].read_text()
        a_is_quiet(contest)
        assert stop(b) == contest.stopped, contest.errs["b"].read_text()
    finally:
        contest.cleanup()


HOPPER = """\
import os, sys, time
while not os.path.exists(sys.argv[1]):
    if os.fork():
        os._exit(0)
    os.setpgid(0, 0)
"""


@pytest.mark.parametrize("how", ["kill", "freeze_and_kill"])
def test_the_commands_cgroup_is_killed_whole_even_while_it_hops(how: str, tmp_path: Path) -> None:
    """cgroup.kill, and its stand-in before Linux 5.14 (freeze, SIGKILL each member,
    thaw), leave a pid-hopper in the cgroup no way out: ``populated 0`` follows."""
    from etcdfence.cli._reaper import Cgroup

    cgroup = Cgroup.create()
    if cgroup is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    stop_file = tmp_path / "stop"
    hopper = subprocess.Popen([PYTHON, "-c", HOPPER, str(stop_file)], preexec_fn=cgroup.join)
    try:
        assert hopper.wait(10) == 0  # its first hop: the hopper lives on in its children
        assert cgroup.populated()
        end = time.monotonic() + 10
        while cgroup.populated() and time.monotonic() < end:
            getattr(cgroup, how)()
            time.sleep(0.005)
        assert not cgroup.populated(), "the hopper got away"
    finally:
        stop_file.touch()
        cgroup.remove()
    assert not Path(cgroup.path).exists()


def test_empty_cgroups_of_dead_reapers_are_collected() -> None:
    """A reaper SIGKILLed together with its supervisor leaves its (empty) cgroup behind:
    the next reaper removes it, but never one whose reaper still runs."""
    from etcdfence.cli._reaper import Cgroup

    probe = Cgroup.create()
    if probe is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    probe.remove()
    parent = Path(probe.path).parent
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live = parent / f"etcdfence-{gone.pid}-1", parent / f"etcdfence-{os.getpid()}-1"
    dead.mkdir()
    live.mkdir()
    try:
        cgroup = Cgroup.create()
        assert cgroup is not None
        cgroup.remove()
        assert not dead.exists(), "the dead reaper's cgroup was left"
        assert live.exists(), "a live reaper's cgroup was removed"
    finally:
        for path in (dead, live):
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()

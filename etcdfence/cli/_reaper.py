"""The reaper: runs a command for ``etcdfence lock``/``run``, and kills the command and
every process it started — whatever their process group or session — the moment the
supervisor dies, asks, or stops renewing the kill deadline.

Why a separate process. A supervisor that is SIGKILLed (``kill -9``, the OOM killer)
runs no cleanup, and one that is *frozen* (SIGSTOP, Ctrl-Z, a debugger, a swapped-out
VM) runs nothing at all, while its lease runs out within the TTL and another node is
elected. The guarantee has to come from something that holds without the supervisor's
help:

* ``PR_SET_PDEATHSIG`` alone is not enough: it signals only the *direct* child, and a
  command such as ``sh -c 'worker & wait'`` leaves ``worker`` (a grandchild) running.
* ``os.fork()`` in the supervisor is not an option either: it runs gRPC threads, and a
  forked copy of a threaded process may deadlock before it can exec.

So the supervisor starts this small stdlib-only program (``python -I -S _reaper.py``,
which does not import etcdfence or gRPC, so it starts in a few milliseconds). It leads
a process group of its own *in the supervisor's session* (never a session of its own:
when the supervisor dies, the kernel sends an orphaned process group with a stopped
member SIGHUP and SIGCONT, which is what wakes a SIGSTOPped reaper to see the EOF below)
and starts the command in *another* new group (``run``: in a new session) so signals
for the command's group, SIGKILL included, never hit the reaper, and a Ctrl-Z at the
terminal stops the command, not the reaper (it also ignores SIGTSTP/SIGTTIN/SIGTTOU).

Containment — what "the command and everything it started" is:

* **cgroup v2**, when a cgroup2 hierarchy is mounted and the reaper may create a cgroup
  below its own: the command is moved into a new cgroup of its own before it execs, so
  every descendant is in it whatever it does with groups, sessions, double forks or pid
  hopping; the kill is ``cgroup.kill`` (or, before Linux 5.14, freeze the cgroup and
  SIGKILL every member), and nothing is left when ``cgroup.events`` says
  ``populated 0``. The cgroup is removed afterwards. The reaper reports its path so the
  supervisor can kill it too should the reaper itself die.
* **always, as well**: the reaper is the ``PR_SET_CHILD_SUBREAPER`` of the command's
  tree, so every orphaned descendant is re-parented to it rather than to init. It kills
  by walking its own subtree (``/proc/PID/task/TID/children``, zombie-looking thread
  group leaders included — a leader whose main thread exited reads ``Z`` while its
  other threads run, and a signal to it reaches the whole group), and repeats until
  ``waitid`` says it has no child at all: as every descendant's chain of parents ends at
  the reaper, no child means no descendant, however fast they fork (a SIGKILL that
  lands during a fork cancels the fork). It reaps as it goes.

The command gets ``PR_SET_PDEATHSIG=SIGKILL`` (covers the reaper itself being killed;
the supervisor, a subreaper too, then kills what is left). The reaper kills everything
(SIGKILL, until nothing is left, then exits) when

* the control pipe reaches EOF: its only write end is the supervisor's, which the
  kernel closes when the supervisor dies — SIGKILL included (SIGHUP to the reaper means
  "look": it is how the kernel wakes it when it was stopped as the supervisor died);
* the kill deadline passes without renewal. The supervisor sends the deadline as a
  ``CLOCK_BOOTTIME`` time (system-wide, and unlike ``CLOCK_MONOTONIC`` it keeps counting
  while the machine is suspended, as etcd's clock does; an absolute time, so a renewal
  read late cannot extend it) each time its session's deadline advances. A frozen
  supervisor renews nothing, so the command dies by the deadline the last acknowledged
  keepalive allowed — before etcd can expire the lease. ``--grace`` before it, the
  reaper sends SIGTERM to every descendant first, unless the supervisor has already
  started stopping the command;
* the supervisor writes ``kill``.

Protocol (all lines ASCII). Argv: ``CONTROL_FD STATUS_FD [--session] [--foreground]
[--no-cgroup] [--deadline=KILL_AT,GRACE] -- CMD ...`` (``--session``: the command gets a
new session; ``--no-cgroup``: the subreaper alone contains it). Control lines:
``deadline KILL_AT GRACE`` (renewal), ``term`` (SIGTERM to every descendant), ``kill``.
On STATUS_FD the reaper writes ``started PID [CGROUP]`` once the command runs (or
``error ERRNO MESSAGE`` if it could not be executed, then exits 127/126), ``expired``
when it starts stopping the command on its own because the deadline came without
renewal (its backstop SIGTERM, or the kill), and ``exited RC`` when the command exits
(RC as :attr:`subprocess.Popen.returncode`: negative for a signal). It stays alive
while descendants of the command still run (a command's background jobs), so the
supervisor can stop those before releasing the lock; it then exits with the command's
status (dying of the same signal if the command did). TERM/INT/HUP/QUIT/TSTP/TTIN/TTOU
sent to the reaper are ignored (HUP and the others only wake it up).

Linux gets the full guarantee; elsewhere the pipe, the deadline and the group kill
still work but without cgroups, the subreaper, the PDEATHSIG and the ``/proc`` walks.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_IGNORED_IN_REAPER = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)
_LEFTOVER_POLL = 0.05
#: The longest single poll() wait in seconds (its timeout is a C int of milliseconds,
#: which a deadline a --ttl of weeks away would overflow); the loop just waits again.
_MAX_WAIT = 3600.0
#: How long after the supervisor's own SIGTERM time the reaper sends its backstop one.
_TERM_LATE = 0.25
_LINUX = sys.platform.startswith("linux")


def now() -> float:
    """The kill deadline's clock: ``CLOCK_BOOTTIME`` on Linux (system-wide, counts
    suspended time as etcd's lease clock does), else ``time.monotonic()``."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; whether it succeeded."""
    if not _LINUX:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


# -- finding processes -----------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgrp, state) for every process visible in /proc (Linux)."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3:
            table[int(name)] = (int(fields[1]), int(fields[2]), fields[0].decode())
    return table


@functools.cache
def _children_files() -> bool:
    """Whether the kernel has ``/proc/PID/task/TID/children`` (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def children(pid: int) -> set[int]:
    """Children of ``pid`` (of any of its threads: a child belongs to the thread that
    forked it), zombies included; from one scan of /proc where the kernel lacks
    ``/proc/PID/task/TID/children``."""
    if not _children_files():
        return {kid for kid, (ppid, _g, _s) in _proc_table().items() if ppid == pid}
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
            found.update(int(c) for c in fh.read().split())
    return found


def subtree(roots: Iterable[int]) -> set[int]:
    """Every descendant of ``roots`` (roots excluded unless one descends from another),
    whatever its group or session, zombie-looking ones included (a thread group leader
    whose main thread exited reads state Z while its other threads still run)."""
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for kid in children(todo.pop()) - found:
            found.add(kid)
            todo.append(kid)
    return found


def signal_tree(root: int, group: int, signum: int) -> bool:
    """Send ``signum`` to process group ``group`` and to every descendant of ``root``
    (those that left the group too, zombie-looking leaders included); whether any was
    found."""
    with contextlib.suppress(OSError):
        os.killpg(group, signum)
    victims = subtree([root])
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
    return bool(victims)


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (SIGSTOP: it runs nothing until someone
    sends SIGCONT), from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] == b"T"


# -- the cgroup --------------------------------------------------------------------------------


def _cgroup2_root() -> tuple[str, str] | None:
    """(mount point, cgroup path it shows) of the cgroup2 hierarchy, from mountinfo."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                cut = fields.index("-") if "-" in fields else -1
                if cut > 4 and fields[cut + 1 : cut + 2] == ["cgroup2"]:
                    return fields[4], fields[3]
    except OSError:
        pass
    return None


def _own_cgroup(pid: str = "self") -> str | None:
    """The cgroup v2 path of process ``pid`` (as /proc/PID/cgroup shows it), or None."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None


def _collect_leftovers(parent: str) -> None:
    """Remove the empty cgroups of reapers that are gone: one SIGKILLed together with
    its supervisor (nobody left to remove it) leaves its cgroup behind. A cgroup that
    still holds a process cannot be removed (EBUSY), so nothing running is touched."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            words = name.split("-")
            if len(words) != 3 or words[0] != "etcdfence" or not words[1].isdigit():
                continue
            try:
                os.kill(int(words[1]), 0)
                continue  # its reaper (or a process that took its pid) runs
            except ProcessLookupError:
                pass
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))


class Cgroup:
    """A cgroup v2 for the command's tree (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls) -> Cgroup | None:
        """A new cgroup below our own, or None (no cgroup2, not writable, not Linux)."""
        mount, own = _cgroup2_root(), _own_cgroup()
        if not _LINUX or mount is None or own is None or not own.startswith(mount[1]):
            return None
        parent = os.path.join(mount[0], own[len(mount[1]) :].lstrip("/"))
        _collect_leftovers(parent)
        path = os.path.join(parent, f"etcdfence-{os.getpid()}-{time.time_ns() % 10**9}")
        try:
            os.mkdir(path)
        except OSError:
            return None
        return cls(path)

    def _write(self, name: str, value: str) -> None:
        fd = os.open(os.path.join(self.path, name), os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def join(self) -> None:
        """Move the calling process in (the command, before it execs)."""
        with contextlib.suppress(OSError):
            self._write("cgroup.procs", "0")

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is in this cgroup."""
        own = _own_cgroup(str(pid))
        return own is not None and self.path.endswith(own.rstrip("/")) and own != "/"

    def populated(self) -> bool:
        """Whether a process is still in it (False once it is gone)."""
        try:
            with open(os.path.join(self.path, "cgroup.events"), "rb") as fh:
                return b"populated 1" in fh.read()
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL everything in it: ``cgroup.kill``, else freeze, kill each, thaw."""
        try:
            self._write("cgroup.kill", "1")
        except FileNotFoundError:
            if os.path.isdir(self.path):  # Linux < 5.14
                self.freeze_and_kill()
        except OSError:
            pass  # gone already

    def freeze_and_kill(self) -> None:
        """SIGKILL everything in it without ``cgroup.kill``: freeze it (a frozen process
        cannot fork, so the member list holds still), SIGKILL each member, thaw (the
        killed ones then exit)."""
        with contextlib.suppress(OSError):
            self._write("cgroup.freeze", "1")  # a frozen process cannot fork
            for _ in range(200):  # freezing takes effect asynchronously
                with open(os.path.join(self.path, "cgroup.events"), "rb") as fh:
                    if b"frozen 1" in fh.read():
                        break
                time.sleep(0.001)
            with open(os.path.join(self.path, "cgroup.procs"), "rb") as fh:
                for pid in fh.read().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            self._write("cgroup.freeze", "0")

    def remove(self, end: float | None = None) -> None:
        """Remove it (kill what is in it first); gives up quietly if it cannot, after
        about a second or at ``end`` (a ``time.monotonic()`` time) if that is earlier."""
        for _ in range(200):
            if end is not None and time.monotonic() >= end:
                return
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
            self.kill()
            time.sleep(0.005)


# -- the reaper ------------------------------------------------------------------------------


def _has_children() -> bool:
    """Whether we still have a child (running, or exited and not collected)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _reap_orphans(command: int) -> None:
    """Collect exited descendants re-parented to us (we are their subreaper) — never the
    command itself: its status is Popen's to read (a command reaped here would read as
    exit status 0: Popen reports a child it cannot wait for any more as 0)."""
    while True:
        try:
            exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if exited is None or exited.si_pid == command:  # nothing, or the command: Popen's
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(exited.si_pid, 0)


def _nothing_left(child: subprocess.Popen[bytes], cgroup: Cgroup | None) -> bool:
    """The command was collected, we have no child (so no descendant: each orphan is
    re-parented to us) and its cgroup, if any, is empty."""
    return (
        child.returncode is not None
        and not _has_children()
        and (cgroup is None or not cgroup.populated())
    )


def _kill_everything(child: subprocess.Popen[bytes], status_fd: int, cgroup: Cgroup | None) -> None:
    """SIGKILL the command's group and every descendant (even ones that left the group
    with setsid, or hop pids), again until none is left, then exit as the command did."""
    me = os.getpid()
    while True:
        if cgroup is not None:
            cgroup.kill()
        signal_tree(me, child.pid, signal.SIGKILL)
        _reap_orphans(child.pid)
        child.poll()
        if _nothing_left(child, cgroup):
            break
        time.sleep(0.002)  # a process may fork while we look: look again
    returncode = child.wait()
    if cgroup is not None:
        cgroup.remove()
    _write(status_fd, f"exited {returncode}")
    os.close(status_fd)
    _die_like(returncode)


def _die_like(returncode: int) -> None:
    if returncode >= 0:
        os._exit(returncode)
    signum = -returncode
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signum, signal.SIG_DFL)  # fails for SIGKILL/SIGSTOP: fine
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def _write(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, line.encode("ascii", "replace") + b"\n")


def _lead_group() -> int:
    """Become the leader of a new process group in the supervisor's session (so that
    the kernel wakes us with SIGHUP+SIGCONT if we are stopped when the supervisor
    dies), immune to the stop and terminal signals, woken by SIGCHLD; returns our pid."""
    os.setpgid(0, 0)
    for signum in _IGNORED_IN_REAPER:
        # A Python handler, not SIG_IGN: the command must not inherit an ignored signal;
        # and the handler wakes our poll (SIGHUP: the supervisor may be gone; look).
        signal.signal(signum, lambda *_: None)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    return os.getpid()


def _start(
    command: list[str], status_fd: int, me: int, flags: set[str]
) -> tuple[subprocess.Popen[bytes], Cgroup | None]:
    """Start the command in a new process group of its own (a new session with
    ``--session``; the terminal's foreground group with ``--foreground``), in a cgroup of
    its own when possible, and report ``started PID [CGROUP]`` (or ``error ...`` and exit
    127/126 as a shell would)."""
    cgroup = None if "--no-cgroup" in flags else Cgroup.create()

    def in_child() -> None:
        if cgroup is not None:
            cgroup.join()  # before exec: nothing the command starts is outside it
        # Dies with the reaper, e.g. if the OOM killer picks the reaper. If the reaper
        # is already gone (the race PDEATHSIG cannot see), exit.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(128 + signal.SIGKILL)
        if "--session" in flags:
            os.setsid()
        else:
            os.setpgid(0, 0)
        if "--foreground" in flags:  # lock from a terminal: Ctrl-C, Ctrl-Z to the command
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(0, os.getpid())
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)

    try:
        child = subprocess.Popen(command, preexec_fn=in_child)
    except OSError as exc:
        if cgroup is not None:
            cgroup.remove()
        code = 127 if exc.errno == errno.ENOENT else 126
        _write(status_fd, f"error {exc.errno or 0} {exc.strerror or exc}")
        os._exit(code)
    if cgroup is not None and not cgroup.holds(child.pid):
        cgroup.remove()  # could not move it in: the subreaper alone contains it
        cgroup = None
    _write(status_fd, f"started {child.pid}" + (f" {cgroup.path}" if cgroup else ""))
    return child, cgroup


class _Deadline:
    """The kill deadline the supervisor renews (a :func:`now` time), and the backstop
    SIGTERM before it."""

    def __init__(self, spec: str | None) -> None:
        self.kill_at = math.inf
        self.grace = 0.0
        self.stopping = False  # SIGTERM went out (the supervisor's or ours)
        self.expired = False  # we started stopping on our own: "expired" was written
        if spec:
            self.renew(*spec.split(","))

    def renew(self, kill_at: str, grace: str) -> None:
        with contextlib.suppress(ValueError):
            self.kill_at, self.grace = float(kill_at), float(grace)

    def term_at(self) -> float:
        return self.kill_at - self.grace + min(_TERM_LATE, self.grace / 2)

    def timeout(self, now: float) -> float:
        """Seconds until the next thing to do (inf: none)."""
        return max(0.0, (self.kill_at if self.stopping else self.term_at()) - now)


class _Reaper:
    """The command, its cgroup, our pipes and the deadline."""

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        cgroup: Cgroup | None,
        control_fd: int,
        status_fd: int,
        deadline: _Deadline,
    ) -> None:
        self.child, self.cgroup, self.deadline = child, cgroup, deadline
        self.control_fd, self.status_fd = control_fd, status_fd
        self.me = os.getpid()

    def kill(self) -> None:
        """SIGKILL everything until nothing is left, report, exit (no return)."""
        _kill_everything(self.child, self.status_fd, self.cgroup)

    def term(self) -> None:
        """SIGTERM to everything (group, subtree)."""
        signal_tree(self.me, self.child.pid, signal.SIGTERM)

    def control(self, lines: list[bytes]) -> None:
        """Act on the supervisor's control lines."""
        for line in (raw.decode("ascii", "replace") for raw in lines):
            words = line.split()
            if words[:1] == ["deadline"] and len(words) == 3:
                self.deadline.renew(words[1], words[2])
            elif words == ["term"]:
                self.deadline.stopping = True
                self.term()
            elif words == ["kill"]:
                self.kill()

    def enforce(self, now: float) -> None:
        """The supervisor did not renew the deadline in time: SIGTERM everything at
        ``term_at`` (unless it is stopping already), SIGKILL everything at ``kill_at``."""
        deadline = self.deadline
        if not deadline.stopping and now >= deadline.term_at():
            _write(self.status_fd, "expired")  # before the signal: read before its effect
            deadline.stopping = deadline.expired = True
            self.term()
        if now >= deadline.kill_at:
            if not deadline.expired:
                _write(self.status_fd, "expired")
            self.kill()


def _watch(reaper: _Reaper) -> int:
    """Until the command and everything it left exited (its return code); when the
    supervisor died, asked, or let the deadline pass, kill everything (no return)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    poller = select.poll()
    poller.register(reaper.control_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    poller.register(wake_r, select.POLLIN)
    child, returncode = reaper.child, None
    pending = b""  # a control line not complete yet
    while True:
        clock = now()
        reaper.enforce(clock)
        if returncode is None:
            returncode = child.poll()
            if returncode is not None:
                _write(reaper.status_fd, f"exited {returncode}")
        _reap_orphans(child.pid)
        if returncode is not None and _nothing_left(child, reaper.cgroup):
            if reaper.cgroup is not None:
                reaper.cgroup.remove()
            return returncode
        # While only the command runs, sleep until SIGCHLD, a control line, a signal or
        # the deadline; once it exited but left jobs behind, look again every 50 ms.
        timeout = reaper.deadline.timeout(clock)
        if returncode is not None:
            timeout = min(timeout, _LEFTOVER_POLL)
        # poll() takes a C int of ms: a far deadline (a long --ttl) is waited in chunks
        wait = None if math.isinf(timeout) else math.ceil(min(timeout, _MAX_WAIT) * 1000)
        for fd, _event in poller.poll(wait):
            if fd == reaper.control_fd:
                data = os.read(reaper.control_fd, 4096)
                if not data:  # EOF: the supervisor is gone
                    reaper.kill()
                *lines, pending = (pending + data).split(b"\n")
                reaper.control(lines)
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)


def main(argv: Sequence[str]) -> None:
    """``_reaper.py CONTROL_FD STATUS_FD [--session] [--foreground] [--no-cgroup]
    [--deadline=KILL_AT,GRACE] -- CMD ...``."""
    args = list(argv)
    cut = args.index("--")
    control_fd, status_fd = int(args[0]), int(args[1])
    flags, command = set(args[2:cut]), args[cut + 1 :]
    spec = next((f.split("=", 1)[1] for f in flags if f.startswith("--deadline=")), None)
    me = _lead_group()
    child, cgroup = _start(command, status_fd, me, flags)
    returncode = _watch(_Reaper(child, cgroup, control_fd, status_fd, _Deadline(spec)))
    os.close(status_fd)
    _die_like(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])

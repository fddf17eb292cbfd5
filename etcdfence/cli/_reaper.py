"""The reaper: runs a command for ``etcdfence lock``/``run`` and kills its whole process
group the moment the supervisor dies, however it dies.

Why a separate process. A supervisor that is SIGKILLed (``kill -9``, the OOM killer)
runs no cleanup, so nothing it would do "on exit" can stop the command — and its lease
runs out within the TTL while the command keeps writing as if it still held the lock.
The guarantee has to come from something that holds without the supervisor's help:

* ``PR_SET_PDEATHSIG`` alone is not enough: it signals only the *direct* child, and a
  command such as ``sh -c 'worker & wait'`` leaves ``worker`` (a grandchild) running.
  It is also tied to the parent *thread*, which in a threaded supervisor may exit first.
* ``os.fork()`` in the supervisor is not an option either: it runs gRPC threads, and a
  forked copy of a threaded process may deadlock before it can exec.

So the supervisor starts this small stdlib-only program (``python -I -S _reaper.py``,
which does not import etcdfence or gRPC, so it starts in a few milliseconds). It
becomes the leader of a new process group (``setpgid``, or ``setsid`` for ``run``),
starts the command in that group with ``PR_SET_PDEATHSIG=SIGKILL`` (covers the case
where the reaper itself is killed), marks itself ``PR_SET_CHILD_SUBREAPER`` (orphaned
descendants are re-parented to it instead of to init, so it can reap and find them),
and then blocks on the read end of a pipe whose only write end the supervisor holds.
The kernel closes that write end when the supervisor dies — SIGKILL included — so the
reaper sees EOF within milliseconds and SIGKILLs every descendant it can find and then
its whole process group (itself last). The lease cannot expire sooner than TTL −
margin after the last keepalive, so the command is gone long before another node can
lead. Closing the write end on purpose has the same effect: the supervisor uses it as
its last word when it exits.

Protocol (all lines ASCII). Argv: ``CONTROL_FD STATUS_FD [--session] [--foreground]
-- CMD ...``. On STATUS_FD the reaper writes ``started PID`` once the command runs (or
``error ERRNO MESSAGE`` if it could not be executed, then exits 127/126), and
``exited RC`` when the command exits (RC as :attr:`subprocess.Popen.returncode`:
negative for a signal). It stays alive while other members of its group still run
(a command's background jobs), so the supervisor can stop those before releasing the
lock; it then exits with the command's status (dying of the same signal if the
command did). TERM/INT/HUP/QUIT sent to the group are ignored by the reaper itself.

Linux gets the full guarantee; elsewhere the pipe/group kill still works but without
the subreaper, the PDEATHSIG and the ``/proc`` scans.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_IGNORED_IN_REAPER = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_LEFTOVER_POLL = 0.05


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


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


def _descendants(root: int, table: dict[int, tuple[int, int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgrp, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _others_alive(me: int) -> bool:
    """Whether a process other than the reaper still runs in its group or below it."""
    table = _proc_table()
    if not table:  # no /proc: only the direct child was tracked
        return False
    group = {pid for pid, (_pp, pgrp, _st) in table.items() if pgrp == me}
    live = (group | _descendants(me, table)) - {me}
    return any(table[pid][2] not in ("Z", "X") for pid in live)


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


def _kill_everything(me: int) -> None:
    """SIGKILL every descendant (even ones that left the group with setsid), then the
    group, which includes the reaper itself."""
    for _ in range(3):  # a process may fork while we look: look again
        victims = _descendants(me, _proc_table())
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not victims:
            break
    os.killpg(me, signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)  # not reached


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


def _lead_group(flags: set[str]) -> int:
    """Become the leader of a new process group (or session), immune to the stop
    signals sent to the group, woken by SIGCHLD; returns the group id (our pid)."""
    if "--session" in flags:
        os.setsid()
    else:
        os.setpgid(0, 0)
    me = os.getpid()
    for signum in _IGNORED_IN_REAPER:
        # A Python handler, not SIG_IGN: the command must not inherit an ignored signal.
        signal.signal(signum, lambda *_: None)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if "--foreground" in flags:  # lock from a terminal: Ctrl-C goes to the command's group
        with contextlib.suppress(OSError):
            previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(0, me)
            finally:
                signal.signal(signal.SIGTTOU, previous)
    return me


def _start(command: list[str], status_fd: int, me: int) -> subprocess.Popen[bytes]:
    """Start the command in our group and report ``started PID`` (or ``error ...`` and
    exit 127/126 as a shell would)."""

    def in_child() -> None:
        # Dies with the reaper, e.g. if the OOM killer picks the reaper. If the reaper
        # is already gone (the race PDEATHSIG cannot see), exit.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(128 + signal.SIGKILL)

    try:
        child = subprocess.Popen(command, preexec_fn=in_child)
    except OSError as exc:
        code = 127 if exc.errno == errno.ENOENT else 126
        _write(status_fd, f"error {exc.errno or 0} {exc.strerror or exc}")
        os._exit(code)
    _write(status_fd, f"started {child.pid}")
    return child


def _watch(child: subprocess.Popen[bytes], control_fd: int, status_fd: int, me: int) -> int:
    """Until the command and everything left in the group exited (its return code), or
    the supervisor died (then kill everything: does not return)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    poller = select.poll()
    poller.register(control_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    poller.register(wake_r, select.POLLIN)
    returncode: int | None = None
    while True:
        if returncode is None:
            returncode = child.poll()
            if returncode is not None:
                _write(status_fd, f"exited {returncode}")
        _reap_orphans(child.pid)
        if returncode is not None and not _others_alive(me):
            return returncode
        # While only the command runs, sleep until SIGCHLD or the supervisor's death;
        # once it exited but left jobs in the group, look again every 50 ms.
        timeout = None if returncode is None else _LEFTOVER_POLL * 1000
        for fd, _event in poller.poll(timeout):
            if fd == control_fd:
                if not os.read(control_fd, 4096):  # EOF: the supervisor is gone
                    _kill_everything(me)
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)


def main(argv: Sequence[str]) -> None:
    """``_reaper.py CONTROL_FD STATUS_FD [--session] [--foreground] -- CMD ...``."""
    args = list(argv)
    cut = args.index("--")
    control_fd, status_fd = int(args[0]), int(args[1])
    flags, command = set(args[2:cut]), args[cut + 1 :]
    me = _lead_group(flags)
    child = _start(command, status_fd, me)
    returncode = _watch(child, control_fd, status_fd, me)
    os.close(status_fd)
    _die_like(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])

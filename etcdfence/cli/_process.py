"""Running the command after ``--`` for ``lock`` and ``run``, and the signals around it.

:class:`Child` starts the command through the reaper (:mod:`etcdfence.cli._reaper`),
which kills its whole process group the moment this process dies, however it dies.
:class:`Signals` turns SIGINT/SIGTERM/SIGHUP into either an exception (while blocked in
a library call) or a wake-up of the command's main loop. :func:`max_grace` and
:func:`must_stop` size the SIGTERM-to-SIGKILL window so the command is dead before etcd
can expire the lease and elect someone else.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from .._sync.session import default_margin
from ._exits import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, CommandError, Interrupted
from ._options import nonnegative_float
from ._output import say

DEFAULT_GRACE = 5.0
#: What a --grace must leave of the window besides margin and keepalive interval: the
#: supervisor's poll, the keepalive's round trip and signal delivery.
GRACE_SLACK = 0.25
#: How often the supervising loops look at the command and the session.
POLL = 0.05

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The reaper program (see :mod:`etcdfence.cli._reaper`), run by path so that it imports
#: neither etcdfence nor gRPC and starts in milliseconds.
_REAPER = str(Path(__file__).with_name("_reaper.py"))


# -- grace ---------------------------------------------------------------------------------


def max_grace(ttl: int) -> float:
    """The longest ``--grace`` that fits a session of ``ttl`` seconds.

    The command must be dead before etcd can expire the lease, i.e. by the session's
    local deadline (send time of the last acknowledged keepalive + TTL − margin). So
    the supervisor starts SIGTERM at the latest ``grace`` before that deadline. Right
    after an acknowledged keepalive the deadline is TTL − margin away, and it shrinks
    by up to one keepalive interval (TTL/3) before the next acknowledgement refreshes
    it; a grace that does not fit into ``TTL − margin − TTL/3 − GRACE_SLACK`` would
    stop a healthy command between two keepalives.
    """
    interval = max(ttl / 3.0, 0.1)
    return ttl - default_margin(ttl) - interval - GRACE_SLACK


def add_grace_option(parser: argparse.ArgumentParser, when: str) -> None:
    """``--grace SECONDS``: the SIGTERM-to-SIGKILL window; ``when`` says what triggers it."""
    parser.add_argument(
        "--grace",
        metavar="SECONDS",
        type=nonnegative_float,
        default=None,
        help=f"seconds between SIGTERM and SIGKILL {when}; must fit "
        "the TTL (see 'Sizing TTL, margin and grace' in the README) "
        f"(default: {DEFAULT_GRACE:g}, or the most the TTL allows)",
    )


def fit_grace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Default ``args.grace`` to what fits ``args.ttl``; refuse a ``--grace`` that does not."""
    limit = max_grace(args.ttl)
    if args.grace is None:
        args.grace = max(0.0, min(DEFAULT_GRACE, limit))
    elif args.grace > limit:
        parser.error(
            f"--grace {args.grace:g} does not fit --ttl {args.ttl}: the command must be "
            f"killed before etcd can expire the lease, so with TTL {args.ttl} --grace can "
            f"be at most {math.floor(limit * 100) / 100:g}s (TTL - margin "
            f"{default_margin(args.ttl):g}s - keepalive interval {args.ttl / 3:.2f}s - "
            f"{GRACE_SLACK:g}s); lower --grace or raise --ttl"
        )


def kill_deadline(session: Any) -> Callable[[], float]:
    """When the command must be dead at the latest: the session's local deadline (TTL −
    margin after the send time of the last acknowledged keepalive; etcd cannot expire
    the lease earlier), or now if the session already expired."""

    def deadline() -> float:
        return time.monotonic() if session.expired else float(session.deadline)

    return deadline


def must_stop(deadline: Callable[[], float], grace: float) -> bool:
    """Whether SIGTERM, ``grace`` and SIGKILL would no longer fit before ``deadline()``:
    the keepalive was not acknowledged in time, so stop now, while the lease still holds."""
    return time.monotonic() >= deadline() - grace - POLL


# -- signals -------------------------------------------------------------------------------


class Signals:
    """SIGINT/SIGTERM/SIGHUP handling for one command.

    While ``raising`` is true (blocked in a library call, e.g. waiting for a lock) a
    signal raises :class:`~etcdfence.cli._exits.Interrupted`, so the wait is abandoned
    and cleaned up. After that, signals are only recorded (``take()``) and ``wake`` is
    set for the main loop.
    """

    def __init__(self, *, raising: bool) -> None:
        self.raising = raising
        self.wake = threading.Event()
        self._pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)
        self.wake.set()
        if self.raising:
            raise Interrupted(signum)

    def take(self) -> list[int]:
        """Signals received since the last call, oldest first."""
        taken = []
        while self._pending:  # pop one by one: a handler may append meanwhile
            taken.append(self._pending.pop(0))
        return taken


def tty_delivers_sigint() -> bool:
    """Whether a Ctrl-C reached the child directly (it shares our foreground tty group)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


# -- the command ---------------------------------------------------------------------------


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it (128+N when killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def _read_lines(fd: int, buffer: bytearray, *, block: bool) -> list[str] | None:
    """Complete lines available on ``fd`` (``None`` at EOF with nothing left)."""
    while True:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            data = None
        if data == b"":
            if not buffer:
                return None
            lines, buffer[:] = buffer.decode("ascii", "replace").splitlines(), b""
            return lines
        if data:
            buffer.extend(data)
        if b"\n" in buffer:
            head, _, tail = bytes(buffer).rpartition(b"\n")
            buffer[:] = tail
            return head.decode("ascii", "replace").splitlines()
        if data is None or not block:
            return []


class Child:
    """The command after ``--``, run by a reaper in a process group of its own.

    The reaper (:mod:`etcdfence.cli._reaper`) leads the group and SIGKILLs all of it the
    moment this process dies — even by SIGKILL — so the command never outlives its
    supervisor. ``run`` puts it in a new session with stdin from /dev/null; ``lock``
    in a new process group of our session (with the terminal's foreground, when we
    had it, so Ctrl-C and terminal input reach the command as in a shell).
    """

    def __init__(
        self, command: list[str], env: dict[str, str], *, new_session: bool, foreground: bool
    ) -> None:
        self.foreground = foreground
        self._buffer = bytearray()
        self.returncode: int | None = None  # the command's, as Popen.returncode
        self.reaper = self._spawn_reaper(command, env, new_session=new_session)
        self.pgid = self.reaper.pid
        lines = _read_lines(self._status_r, self._buffer, block=True) or []
        first = lines[0] if lines else ""
        if not first.startswith("started "):
            self._failed_to_start(command, first)
        self.pid = int(first.split()[1])
        os.set_blocking(self._status_r, False)
        self._handle(lines[1:])

    def _spawn_reaper(
        self, command: list[str], env: dict[str, str], *, new_session: bool
    ) -> subprocess.Popen[bytes]:
        """Start the reaper with its two pipes: control (ours to hold; EOF kills the
        group) and status (its ``started``/``exited`` lines)."""
        flags = ["--session"] if new_session else []
        if self.foreground:
            flags.append("--foreground")
        control_r, self._control_w = os.pipe()
        status_r, status_w = os.pipe()
        self._status_r = status_r
        try:
            fds = [str(control_r), str(status_w)]
            return subprocess.Popen(
                [sys.executable, "-I", "-S", _REAPER, *fds, *flags, "--", *command],
                env=env,
                stdin=subprocess.DEVNULL if new_session else None,
                pass_fds=(control_r, status_w),
            )
        except BaseException:
            self._close_fds()
            raise
        finally:
            os.close(control_r)
            os.close(status_w)

    def _failed_to_start(self, command: list[str], first: str) -> None:
        """The reaper could not start the command: raise with the shell's exit code."""
        self.reaper.wait()
        self.close()
        if first.startswith("error ") and self.reaper.returncode == EXIT_NOT_FOUND:
            raise CommandError(f"command not found: {command[0]}", EXIT_NOT_FOUND)
        if first.startswith("error "):
            raise CommandError(f"command not executable: {command[0]}", EXIT_CANNOT_EXECUTE)
        raise CommandError(f"could not start {command[0]} (reaper failed: {first!r})")

    def _handle(self, lines: list[str]) -> None:
        for line in lines:
            if line.startswith("exited "):
                self.returncode = int(line.split()[1])

    def poll(self) -> int | None:
        """The command's exit status (128+N for signal N) once it exited, else None.
        Members of its group may still run (see :meth:`finish`)."""
        if self.returncode is None:
            lines = _read_lines(self._status_r, self._buffer, block=False)
            if lines is None:  # the reaper is gone (the group was SIGKILLed)
                self.returncode = self.reaper.wait()
            else:
                self._handle(lines)
        return None if self.returncode is None else exit_status(self.returncode)

    def gone(self) -> bool:
        """True once the command and everything left in its group have exited."""
        return self.reaper.poll() is not None and not _group_alive(self.pgid)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the command's whole process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def stop(
        self,
        grace: float,
        *,
        deadline: Callable[[], float] | None = None,
        hurry: threading.Event | None = None,
    ) -> int:
        """SIGTERM the group, then SIGKILL it after ``grace`` seconds — or earlier, one
        poll before ``deadline()`` (the session's local deadline: past it etcd may
        expire the lease and elect someone else), or when ``hurry`` is set. Returns
        the command's exit status."""
        started = time.monotonic()
        if not self.gone():
            self.signal(signal.SIGTERM)
        while not self.gone():
            kill_at = started + grace
            if deadline is not None:
                kill_at = min(kill_at, deadline() - POLL)
            if time.monotonic() >= kill_at or (hurry is not None and hurry.is_set()):
                self.signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        self.reaper.wait()
        status = self.poll()
        self.close()
        return status if status is not None else exit_status(self.reaper.returncode)

    def finish(self, grace: float, *, deadline: Callable[[], float] | None = None) -> int:
        """After the command exited: stop what it left running in its group (background
        jobs must not keep working once the lock is released), return its status."""
        status = self.poll()
        end = time.monotonic() + 0.5  # the reaper exits by itself when nothing is left
        while not self.gone() and time.monotonic() < end:
            time.sleep(0.01)
        if not self.gone():
            say(f"stopping processes the command left in its group {self.pgid}")
        stopped = self.stop(grace, deadline=deadline)
        return status if status is not None else stopped

    def _close_fds(self) -> None:
        for fd in (self._control_w, self._status_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._control_w = self._status_r = -1

    def close(self) -> None:
        """Close our end of the reaper's pipe (a reaper still running then kills its
        group) and take the terminal back if the command had it."""
        self._close_fds()
        if self.foreground:
            self.foreground = False
            _take_terminal()


def _take_terminal() -> None:
    with contextlib.suppress(OSError, ValueError):
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(0, os.getpgrp())
        finally:
            signal.signal(signal.SIGTTOU, previous)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True

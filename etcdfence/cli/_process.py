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
from ._output import command_stderr, say, warn
from ._reaper import (
    PR_SET_CHILD_SUBREAPER,
    Cgroup,
    children,
    prctl,
    signal_tree,
    stopped,
    subtree,
)
from ._reaper import now as reaper_clock

DEFAULT_GRACE = 5.0
#: What a --grace must leave of the window besides margin and keepalive interval: the
#: supervisor's poll, the keepalive's round trip and signal delivery.
GRACE_SLACK = 0.25
#: How often the supervising loops look at the command and the session.
POLL = 0.05
#: How long the reaper may take to finish killing once told to, before we SIGKILL it and
#: sweep what it left ourselves.
REAPER_EXIT_WAIT = 2.0
#: How long a sweep keeps killing a process that does not die (uninterruptible sleep),
#: unless a stop budget leaves less.
SWEEP_LIMIT = 10.0
#: What a stop may take beyond ``--grace`` (see :class:`StopBudget`).
STOP_EXTRA = 4.0
#: What a stop budget keeps after the SIGKILL for the kill to land and be proven (the
#: reaper's exit, the sweep): the SIGKILL goes out this long before its steps' end at
#: the latest, even if ``--grace`` is not over by then.
KILL_RESERVE = 2.0
#: The end of a stop budget kept for leaving: closing the client, the last log lines.
EXIT_RESERVE = 0.5

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


class StopBudget:
    """The one time limit of a supervisor's stop: ``grace`` + :data:`STOP_EXTRA` seconds
    from the moment it decides to stop (a stop signal, the loss of the term, the
    command's exit).

    Every step of the stop takes what is left of it, never its own fixed timeout:
    SIGTERM to SIGKILL (``grace``), the reaper's exit and the sweep of what it left,
    the resign and the lease revoke, the joins of worker threads, closing the client,
    the health server and the last stderr lines. The 4 s beyond ``grace`` hold the
    kill and collection (milliseconds unless a process is stuck in the kernel), one
    etcd round trip each for resign and revoke on a healthy cluster, and the exit; a
    slow or unreachable etcd only makes the supervisor skip a release (the key then
    goes with the lease, within its TTL). :data:`EXIT_RESERVE` of it is kept for the
    exit steps (:meth:`exit_left`); the stop steps use :attr:`steps_end`.

    Safety does not borrow from it: the command and all it started are dead (proven by
    the reaper or the sweep) before the term is reported over and before the resign
    lets the next leader in; if the budget runs out first, nothing is released and
    the supervisor exits non-zero, so the next leader waits for the lease's TTL.
    """

    def __init__(self, grace: float) -> None:
        self.total = grace + STOP_EXTRA
        self.started: float | None = None

    def start(self, at: float | None = None) -> None:
        """The supervisor decided to stop (only the first call counts), now or ``at``
        (a ``time.monotonic()`` time, e.g. when the stop signal arrived)."""
        if self.started is None:
            self.started = time.monotonic() if at is None else at

    def reset(self) -> None:
        """The stop of a term is over and the supervisor goes on (it campaigns again)."""
        self.started = None

    @property
    def steps_end(self) -> float | None:
        """By when the stop steps must be done (``None``: not stopping)."""
        if self.started is None:
            return None
        return self.started + self.total - EXIT_RESERVE

    def left(self, cap: float) -> float:
        """Seconds left for a stop step, at most ``cap`` (``cap`` while not stopping)."""
        end = self.steps_end
        return cap if end is None else max(0.0, min(cap, end - time.monotonic()))

    def exit_left(self, cap: float) -> float:
        """Seconds left for an exit step (the reserve included), at most ``cap``."""
        if self.started is None:
            return cap
        return max(0.0, min(cap, self.started + self.total - time.monotonic()))


# -- signals -------------------------------------------------------------------------------


class Signals:
    """SIGINT/SIGTERM/SIGHUP handling for one command.

    While ``raising`` is true (blocked in a library call, e.g. waiting for a lock) a
    signal raises :class:`~etcdfence.cli._exits.Interrupted`, so the wait is abandoned
    and cleaned up. After that, signals are only recorded (``take()``) and ``wake`` is
    set for the main loop.
    """

    def __init__(self, *, raising: bool, never_raising: tuple[int, ...] = ()) -> None:
        self.raising = raising
        self._never_raising = never_raising  # only recorded, even while raising (SIGHUP)
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
        if self.raising and signum not in self._never_raising:
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
    """The command after ``--``, run by a reaper (:mod:`etcdfence.cli._reaper`) in a
    process group of its own.

    The reaper kills the command and every descendant (whatever its group or session)
    the moment this process dies — even by SIGKILL — or stops renewing the kill
    ``deadline`` (frozen by SIGSTOP/Ctrl-Z, wedged), so the command never outlives its
    lease. ``run`` puts it in a new session with stdin from /dev/null; ``lock`` in a
    new process group of our session (with the terminal's foreground, when we had it,
    so Ctrl-C and terminal input reach the command as in a shell).

    The reaper itself may die (``kill -9``) or be stopped: this process is a child
    subreaper too, so what the reaper's death orphans is re-parented here, and then it
    kills all of that (and the command's cgroup) itself (:meth:`_sweep`) before it
    reports the command gone. No wait on the reaper is unbounded.

    ``deadline()`` is the session's local deadline (see :func:`kill_deadline`): the
    reaper's kill deadline is one :data:`POLL` before it, renewed by :meth:`renew`
    (every supervising loop calls it), with ``grace`` seconds of SIGTERM before it.
    """

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        *,
        new_session: bool,
        foreground: bool,
        deadline: Callable[[], float] | None = None,
        grace: float = 0.0,
    ) -> None:
        self.foreground = foreground
        self._buffer = bytearray()
        self._deadline = deadline
        self._grace = grace
        self._sent_kill_at: float | None = None
        self._stopping: float | None = None  # when SIGTERM went out
        self.returncode: int | None = None  # the command's, as Popen.returncode
        self.expired = False  # the reaper stops it: the kill deadline came unrenewed
        self.cgroup: Cgroup | None = None  # the command's, when the reaper made one
        self._reaper_killed = False  # we SIGKILLed the reaper (it was stopped, or wedged)
        self._swept = False
        #: The command and all it started are proven gone (set by the sweep).
        self.contained = False
        #: A stop budget's end for the steps here (a ``time.monotonic()`` time).
        self.until: float | None = None
        # Orphans of the command's tree are re-parented to us should the reaper die; the
        # children we had before it started are not ours to sweep.
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        self._before = children(os.getpid())
        self.reaper = self._spawn_reaper(command, env, new_session=new_session)
        lines = _read_lines(self._status_r, self._buffer, block=True) or []
        first = lines[0] if lines else ""
        if not first.startswith("started "):
            self._failed_to_start(command, first)
        words = first.split(" ", 2)
        self.pid = int(words[1])
        if len(words) > 2:
            self.cgroup = Cgroup(words[2])
        self.pgid = self.pid  # the command leads a group of its own (not the reaper's)
        os.set_blocking(self._status_r, False)
        self._handle(lines[1:])

    def _kill_at(self) -> float | None:
        return None if self._deadline is None else self._deadline() - POLL

    @staticmethod
    def _on_reaper_clock(kill_at: float) -> str:
        """``kill_at`` (a ``time.monotonic()`` time) on the reaper's clock
        (``CLOCK_BOOTTIME``: it goes on while the machine is suspended, as etcd's does)."""
        return repr(reaper_clock() + (kill_at - time.monotonic()))

    def _spawn_reaper(
        self, command: list[str], env: dict[str, str], *, new_session: bool
    ) -> subprocess.Popen[bytes]:
        """Start the reaper with its two pipes: control (ours to hold; EOF kills the
        command's tree; deadline renewals) and status (its ``started``/``exited`` lines)."""
        flags = ["--session"] if new_session else []
        if self.foreground:
            flags.append("--foreground")
        if os.environ.get("ETCDFENCE_CGROUP", "").lower() in ("0", "no", "off", "false"):
            flags.append("--no-cgroup")
        kill_at = self._kill_at()
        if kill_at is not None:
            flags.append(f"--deadline={self._on_reaper_clock(kill_at)},{self._grace!r}")
            self._sent_kill_at = kill_at
        control_r, self._control_w = os.pipe()
        status_r, status_w = os.pipe()
        self._status_r = status_r
        try:
            fds = [str(control_r), str(status_w)]
            return subprocess.Popen(
                [sys.executable, "-I", "-S", _REAPER, *fds, *flags, "--", *command],
                env=env,
                stdin=subprocess.DEVNULL if new_session else None,
                stderr=command_stderr(),
                pass_fds=(control_r, status_w),
            )
        except BaseException:
            self._close_fds()
            raise
        finally:
            os.close(control_r)
            os.close(status_w)
            # Never block on the reaper (a stopped reaper must not stop us): a renewal
            # that does not fit is dropped, which only brings the kill closer.
            with contextlib.suppress(OSError):
                os.set_blocking(self._control_w, False)

    def _tell(self, line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._control_w, line.encode() + b"\n")

    def renew(self) -> None:
        """Pass the session's deadline on to the reaper when it advanced."""
        kill_at = self._kill_at()
        if kill_at is not None and kill_at != self._sent_kill_at and self._control_w >= 0:
            self._sent_kill_at = kill_at
            self._tell(f"deadline {self._on_reaper_clock(kill_at)} {self._grace!r}")

    def _failed_to_start(self, command: list[str], first: str) -> None:
        """The reaper could not start the command: raise with the shell's exit code."""
        self._await_reaper(REAPER_EXIT_WAIT)
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
            elif line == "expired":  # the reaper sent SIGTERM (or SIGKILL) itself
                self.expired = True
                if self._stopping is None:
                    self._stopping = time.monotonic()

    def poll(self) -> int | None:
        """The command's exit status (128+N for signal N) once it exited, else None.
        Processes it started may still run (see :meth:`finish`)."""
        if self.returncode is None:
            lines = _read_lines(self._status_r, self._buffer, block=False)
            if lines is not None:
                self._handle(lines)
            if lines is None:  # the reaper is gone, and it did not say the command exited
                self._reaper_lost("died")
            elif self.returncode is None and stopped(self.reaper.pid):
                self._reaper_lost("was stopped")  # it could enforce nothing any more
        return None if self.returncode is None else exit_status(self.returncode)

    def _reaper_lost(self, how: str) -> None:
        """The reaper died or was stopped before the command exited: kill it, kill all it
        left (the command included) ourselves; the command counts as killed."""
        if not self._reaper_killed:
            warn(f"the reaper of pid {self.pid} {how}: killing the command and all it started")
        self._await_reaper(0.0 if how == "was stopped" else REAPER_EXIT_WAIT)
        self._sweep()
        if self.returncode is None:
            self.returncode = -signal.SIGKILL

    def _bounded(self, seconds: float) -> float:
        """A step's end: ``seconds`` from now, or the stop budget's end if earlier."""
        end = time.monotonic() + seconds
        return end if self.until is None else min(end, self.until)

    def _await_reaper(self, bound: float) -> None:
        """Wait up to ``bound`` seconds (less if the stop budget ends earlier) for the
        reaper to exit; past that (or at once if it is stopped: it cannot finish),
        SIGKILL it."""
        end = self._bounded(bound)
        while self.reaper.poll() is None:
            if time.monotonic() >= end or stopped(self.reaper.pid):
                self._reaper_killed = True
                with contextlib.suppress(OSError):
                    self.reaper.kill()
                # SIGKILL works on a stopped process, not on one stuck in the kernel (a
                # frozen cgroup): give up at the bound; the tree then stays unproven.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.reaper.wait(max(0.2, end - time.monotonic()))
                return
            time.sleep(0.01)

    def _sweep(self) -> None:
        """Once the reaper exited: SIGKILL what it left — the command's cgroup, and every
        process re-parented to us since it started (we are their subreaper) with all its
        descendants — until nothing is left, and collect them. A no-op after a reaper
        that finished its work. Gives up after :data:`SWEEP_LIMIT` or at the stop
        budget's end (looking at least once); :attr:`contained` says whether nothing
        was left."""
        if self._swept:
            return
        self._swept = True
        me, end = os.getpid(), self._bounded(SWEEP_LIMIT)
        first = True
        while first or time.monotonic() < end:
            first = False
            if self.cgroup is not None:
                self.cgroup.kill()
            orphans = children(me) - self._before - {self.reaper.pid}
            for pid in orphans | subtree(orphans):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            for pid in orphans:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            if not orphans and (self.cgroup is None or not self.cgroup.populated()):
                # an unreaped reaper (stuck in the kernel) proves nothing of its children
                self.contained = self.reaper.returncode is not None
                break
            time.sleep(0.002)
        else:
            warn(f"processes the command {self.pid} started would not die", pid=self.pid)
        if self.contained and self.cgroup is not None:  # an empty one goes at once
            self.cgroup.remove(end=self._bounded(1.0))

    def gone(self) -> bool:
        """True once the command and everything it started have exited."""
        if self.reaper.poll() is None:
            return False
        self._sweep()
        return not _group_alive(self.pgid)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the command's process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def _signal_all(self, signum: int) -> None:
        """``signum`` to the command's group and every descendant, whatever its group
        or session: by the reaper (which sweeps until none is left) and from here."""
        self._tell("term" if signum == signal.SIGTERM else "kill")
        signal_tree(self.reaper.pid, self.pgid, signum)

    def kill_now(self) -> None:
        """SIGKILL the command and all it started at once, without SIGTERM or grace: for
        when etcd has taken the key and the next leader may already run (see
        :meth:`stop`, which then collects them)."""
        if self._stopping is None:
            self._stopping = time.monotonic()
        if self.cgroup is not None:
            self.cgroup.kill()
        if not self.gone():
            self._signal_all(signal.SIGKILL)

    def begin_stop(self) -> None:
        """SIGTERM the command and all it started, without waiting (see :meth:`stop`)."""
        if self._stopping is None:
            self._stopping = time.monotonic()
            if not self.gone():
                self._signal_all(signal.SIGTERM)

    def stop(
        self,
        grace: float,
        *,
        deadline: Callable[[], float] | None = None,
        hurry: Callable[[], bool] | None = None,
        until: float | None = None,
    ) -> int:
        """SIGTERM the command and every descendant, then SIGKILL them after ``grace``
        seconds — or earlier, one poll before ``deadline()`` (the session's local
        deadline: past it etcd may expire the lease and elect someone else), when
        ``hurry()`` turns true, or :data:`KILL_RESERVE` before ``until``. Returns the
        command's exit status; :attr:`contained` says whether all is proven gone.
        ``until``: the stop budget's end (a ``time.monotonic()`` time) for all its
        steps: the kill must leave time to collect."""
        if until is not None:
            self.until = until
        self.begin_stop()
        started = self._stopping if self._stopping is not None else time.monotonic()
        while not self.gone():
            self.renew()
            kill_at = started + grace
            if deadline is not None:
                kill_at = min(kill_at, deadline() - POLL)
            if self.until is not None:
                kill_at = min(kill_at, self.until - KILL_RESERVE)
            if (
                time.monotonic() >= kill_at
                or (hurry is not None and hurry())
                or stopped(self.reaper.pid)
            ):
                self._signal_all(signal.SIGKILL)
                break
            time.sleep(0.02)
        self._await_reaper(REAPER_EXIT_WAIT)
        self._sweep()
        status = self.poll()
        self.close()
        if status is not None:
            return status
        reaper = self.reaper.returncode  # None: a reaper stuck in the kernel was never reaped
        return exit_status(-signal.SIGKILL if reaper is None else reaper)

    def finish(
        self,
        grace: float,
        *,
        deadline: Callable[[], float] | None = None,
        hurry: Callable[[], bool] | None = None,
        until: float | None = None,
    ) -> int:
        """After the command exited: stop what it left running (background jobs, in its
        group or not, must not keep working once the lock is released), return its
        status. ``hurry``, ``until``: as for :meth:`stop`."""
        if until is not None:
            self.until = until
        status = self.poll()
        end = self._bounded(0.5)  # the reaper exits by itself when nothing is left
        while not self.gone() and time.monotonic() < end:
            self.renew()
            time.sleep(0.01)
        if not self.gone():
            say(f"stopping processes the command {self.pid} left running")
        stopped = self.stop(grace, deadline=deadline, hurry=hurry, until=until)
        return status if status is not None else stopped

    def _close_fds(self) -> None:
        for fd in (self._control_w, self._status_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._control_w = self._status_r = -1

    def close(self) -> None:
        """Close our end of the reaper's pipe (a reaper still running then kills all
        the command started) and take the terminal back if the command had it."""
        self._close_fds()
        if self.foreground:
            self.foreground = False
            _take_terminal()


def stop_command(
    child: Child,
    why: str,
    grace: float,
    *,
    taken: Callable[[], bool],
    what: str,
    who: str,
    deadline: Callable[[], float] | None = None,
    hurry: Callable[[], bool] | None = None,
    until: float | None = None,
) -> int:
    """Stop the command and all it started when its key is lost (``why``); its status.

    ``taken()``: whether etcd has taken the key (deleted, or the lease revoked or gone
    on the server; ``LeaderElector.key_taken``, ``Lock.key_taken``): then the next
    holder may already run, so the whole tree gets SIGKILL at once, no grace — also
    when it turns true while a stop is under way. Otherwise (the lease still holds:
    a stop signal, a local deadline) SIGTERM, SIGKILL after ``grace`` or by
    ``deadline()``. ``what`` names the key for the log ("leader key", "lock key"), ``who`` its
    next owner ("leader", "holder");
    ``hurry``, ``until``: as for :meth:`Child.stop`. Used by ``run`` and ``lock``."""
    at_once = taken()
    if at_once:
        child.kill_now()  # first kill, then report (a log write may stall)
        say(
            f"{why}: etcd took the {what} (the next {who} may run already): "
            f"killing pid {child.pid} and all it started now (SIGKILL, no grace)"
        )
    else:
        child.begin_stop()
        say(f"{why}: stopping pid {child.pid} (SIGTERM, SIGKILL after {grace:g}s)")
    hurried = hurry if hurry is not None else (lambda: False)
    status = child.stop(
        grace,
        deadline=deadline,
        hurry=lambda: hurried() or taken(),
        until=until,
    )
    if not at_once and taken() and not hurried():
        say(
            f"etcd took the {what} while pid {child.pid} was stopping: "
            "SIGKILL at once to what still ran"
        )
    return status


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

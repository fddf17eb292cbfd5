"""``etcdfence lock NAME [-- CMD ...]``: hold a lock while a command runs (or until Ctrl-C).

The lock is etcdctl's and Go's ``concurrency.Mutex``; the command's environment carries
the fencing token under both projects' names. ``lock`` watches its own lock key: when
etcd takes it (deleted, or the lease revoked or gone on the server) the next holder may
already run, so the command's whole tree gets SIGKILL at once; when the lease cannot be
renewed in time for ``--grace``, the tree is stopped (SIGTERM, SIGKILL after ``--grace``)
before etcd can hand the lock to someone else. Either way ``lock`` exits 6.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _early_signals
from ..errors import EtcdfenceError
from ..token import FencingToken
from . import _options as opt
from . import _output
from ._exits import EXIT_ERROR, EXIT_LOST, EXIT_OK, Interrupted
from ._notify import Notifier, child_env
from ._output import add_write_out, error, print_held, say, signame, warn
from ._process import (
    POLL,
    STOP_EXTRA,
    Child,
    Signals,
    StopBudget,
    add_grace_option,
    kill_deadline,
    must_stop,
    stop_command,
    tty_delivers_sigint,
)

DESCRIPTION = """\
Acquire the distributed lock NAME (compatible with 'etcdctl lock' and Go's
concurrency.Mutex). With a command after '--', run it while holding the lock and
exit with its status; the command's environment carries the fencing token:
  ETCDFENCE_TOKEN, ETCD_LOCK_REV   the token (the revision that granted the lock)
  ETCD_LOCK_KEY, ETCDFENCE_KEY     the lock key NAME/<lease hex>
  ETCDFENCE_LOCK                   the lock name NAME
  ETCDFENCE_CLUSTER                the etcd cluster id (decimal)
  ETCDFENCE_CREATE_REVISION        the lock key's create revision
  ETCDFENCE_LEASE                  the session's lease id (decimal)
(FencingToken.from_env() reads them all back; etcdctl's two still work.)
The command runs in a process group of its own (the terminal's foreground group
when lock runs in one). The lock is released when the command exits, after what it
left running in its group is stopped. lock watches its own lock key: when etcd
takes it (the key deleted, e.g. 'etcdctl del', or the lease revoked or expired on
the server) the next holder may already run, so the command and all it started get
SIGKILL at once, no grace, and lock exits 6. When the lease cannot be renewed in
time for --grace (etcd still holds it), the command and all it started get SIGTERM,
then SIGKILL after --grace and no later than the session's local deadline, and lock
exits 6. If lock itself dies (even by SIGKILL), the whole group is killed at once.
SIGTERM/SIGHUP (and SIGINT when not from the terminal) are passed on to it; a
command still running --grace seconds after the first SIGTERM/SIGINT gets SIGKILL
with all it started, and lock exits within --grace + 4 s of that signal (the
release is skipped if etcd does not answer in time: the lock then frees when the
lease expires). SIGHUP starts no timer (a command may reload on it).
Without a command, print 'KEY TOKEN' and hold the lock until SIGINT/SIGTERM (exit 0)
or its loss: etcd took the key or the lease expired (exit 6)."""

EXAMPLES = """\
  etcdfence lock jobs/nightly -- sh -c 'echo token $ETCDFENCE_TOKEN'
  etcdfence lock --ttl 10 --timeout-acquire 30 jobs/nightly -- ./backup.sh
  etcdfence lock jobs/nightly            # prints 'jobs/nightly/694d... 1234', holds"""


def add_parser(subparsers: Any) -> None:
    """Add ``lock`` to the command line."""
    p = opt.add_command(
        subparsers,
        "lock",
        "acquire a lock, run a command while holding it (or hold until Ctrl-C)",
        DESCRIPTION,
        EXAMPLES,
    )
    p.add_argument("name", metavar="NAME", type=opt.name, help="lock name (keys live under NAME/)")
    p.add_argument("command", metavar="CMD", nargs="*", help="command to run (after '--')")
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=opt.ttl,
        default=60,
        help="session lease TTL in seconds (default: 60)",
    )
    p.add_argument(
        "--timeout-acquire",
        metavar="SECONDS",
        type=opt.nonnegative_float,
        default=None,
        help="give up (exit 124) if the lock is not acquired in time (default: wait forever)",
    )
    add_grace_option(p, "when the lease cannot be renewed in time (none once etcd took the key)")
    add_write_out(p, "simple", ("simple", "json", "table"))
    p.set_defaults(func=run)


#: The signals that ask the command to stop (SIGHUP, often "reload", does not).
_STOPPING = (signal.SIGTERM, signal.SIGINT)


def run(args: argparse.Namespace) -> int:
    """``etcdfence lock NAME [-- CMD ...]``."""
    with Signals(raising=True) as signals, Notifier.from_env() as notifier:
        client = opt.make_client(args)
        leaving = _Leaving(StopBudget(args.grace), signals)
        try:
            return _locked(args, client, signals, notifier, leaving)
        finally:
            leaving.close(client)


def _locked(
    args: argparse.Namespace,
    client: Any,
    signals: Signals,
    notifier: Notifier,
    leaving: _Leaving,
) -> int:
    """Acquire, then run the command (or hold) under the lock; release within the budget,
    and only once the command and all it started are proven dead."""
    session = client.session(ttl=args.ttl)
    lock = None
    proven = [True]  # False: the command's tree could not be proven dead (release nothing)
    try:
        _early_signals.replay()  # one that came during start-up counts like one now
        session.open()
        lock = session.lock(args.name)
        token = lock.acquire(timeout=args.timeout_acquire)
        signals.raising = False
        notifier.ready(f"holding {args.name} (token {token.value})")
        notifier.start_watchdog(lambda: not session.expired)
        lost = threading.Event()

        def on_expired() -> None:
            lost.set()
            signals.wake.set()

        session.on_expired(on_expired)
        lock.watch_key(on_taken=on_expired)
        if not args.command:
            print_held(args.write_out, token, name=args.name)
            return _hold(args.name, signals, lost, lock, leaving)
        status = _run_locked(args, token, signals, lost, lock, leaving, proven)
        return status if proven[0] else _unproven(args.grace)
    except Interrupted as exc:
        if exc.signum in _STOPPING:
            leaving.stop(exc.at)  # a stop signal while acquiring: the budget counts from it
        raise
    finally:
        signals.raising = False
        leaving.release(lambda: _release(lock, session, release=proven[0]))


def _unproven(grace: float) -> int:
    """The command's tree could not be proven dead: say that nothing is released."""
    error(
        "the command or a process it started could not be proven dead "
        f"within --grace + {STOP_EXTRA:g}s ({grace + STOP_EXTRA:g}s): not releasing the lock "
        "or revoking its lease (the next holder waits for the lease's TTL); exiting 1"
    )
    return EXIT_ERROR


class _Leaving:
    """The stop budget of one ``lock`` and its leaving steps (release, close).

    The budget starts at the first SIGTERM/SIGINT — while acquiring, while the command
    runs, or during the release itself — and bounds every later step: the command gets
    SIGKILL --grace after it, and the release and the client's close take what is left
    of --grace + 4 s. A step cut short only leaves the lock to its lease's expiry: the
    command is proven gone before anything is released (or nothing is released)."""

    def __init__(self, budget: StopBudget, signals: Signals) -> None:
        self.budget = budget
        self.signals = signals
        self._unfinished = False  # a release the budget cut short still runs

    def stop(self, at: float | None = None) -> None:
        """A stop signal came (now or ``at``): start the budget (the first call counts),
        and bound the last stderr lines by it."""
        self.budget.start(at)
        started = self.budget.started
        _output.exit_by[0] = None if started is None else started + self.budget.total

    def _out_of_time(self) -> bool:
        return self.budget.started is not None and self.budget.exit_left(STOP_EXTRA) <= 0

    def release(self, step: Callable[[], None]) -> None:
        """Release (``step``) in a thread; wait for it to end, or, once a stop signal
        started the budget (before or during the wait), for what is left of it."""
        worker = threading.Thread(target=step, name="etcdfence-release", daemon=True)
        worker.start()
        while worker.is_alive() and not self._out_of_time():
            if any(signum in _STOPPING for signum in self.signals.take()):
                self.stop()
            worker.join(POLL)
        if worker.is_alive():
            self._unfinished = True
            warn("etcd did not confirm the release within the stop budget; "
                 "the lock frees when its lease expires")  # fmt: skip

    def close(self, client: Any) -> None:
        """Close the client, within the budget; not while a release still uses it (the
        process exits instead, and the lease expires on the server)."""
        if self._unfinished:
            return
        closer = threading.Thread(target=client.close, name="etcdfence-close", daemon=True)
        closer.start()
        while closer.is_alive() and not self._out_of_time():
            if any(signum in _STOPPING for signum in self.signals.take()):
                self.stop()
            closer.join(POLL)


def _release(lock: Any, session: Any, *, release: bool = True) -> None:
    """Release the lock and revoke the lease; with ``release=False`` (the command is not
    proven dead) neither: stop renewing, so the lock goes with the lease's expiry."""
    if not release:
        session.close(revoke=False)
        return
    try:
        if lock is not None:
            lock.release()  # sends nothing once the session expired; ends the key watch
    except EtcdfenceError as exc:
        say(f"warning: could not release the lock ({exc}); it frees when the lease expires")
    finally:
        session.close()


def _hold(name: str, signals: Signals, lost: threading.Event, lock: Any, leaving: _Leaving) -> int:
    """No command: hold the lock until a signal or its loss."""
    while True:
        signals.wake.clear()
        if signals.take():
            leaving.stop()
            return EXIT_OK
        if lost.is_set() or lock.key_taken():
            error(f"lost the lock {name!r}: {_loss(lock, lost)}")
            return EXIT_LOST
        signals.wake.wait(1.0)


def _loss(lock: Any, lost: threading.Event) -> str:
    """Why the lock is lost, for the log line."""
    if lock.key_taken():
        return "etcd took its key (deleted, or the lease revoked or gone on the server)"
    if lost.is_set():
        return "the session's lease expired"
    return "lease not renewed in time"


def _overdue(budget: StopBudget, grace: float) -> bool:
    """Whether --grace has passed since the first stop signal."""
    return budget.started is not None and time.monotonic() >= budget.started + grace


def _kill_overdue(
    child: Child, grace: float, deadline: Callable[[], float], lock: Any, budget: StopBudget
) -> int:
    """The command outlived --grace after a stop signal: SIGKILL it and all it started,
    collect them within the budget, and return its status."""
    child.kill_now()  # first kill, then report (a log write may stall)
    say(f"command {child.pid} still ran {grace:g}s after the stop signal: "
        "killed it and all it started (SIGKILL)")  # fmt: skip
    return child.stop(0, deadline=deadline, hurry=lock.key_taken, until=budget.steps_end)


def _report_crash(pid: int, returncode: int | None, status: int) -> None:
    """A command that failed (non-zero status, or a signal we did not send) is logged as
    crashed, at warning, with its status (lock still exits with that status)."""
    if status == 0:
        return
    if returncode is not None and returncode < 0:
        warn(f"command crashed (killed by {signame(-returncode)})", pid=pid, status=status)
    else:
        warn(f"command crashed (exit status {status})", pid=pid, status=status)


def _lock_env(token: FencingToken) -> dict[str, str]:
    """Our environment plus the whole token (``token.to_env()``: value, key, lock,
    cluster, create revision, lease) and etcdctl's ``ETCD_LOCK_REV`` / ``ETCD_LOCK_KEY``."""
    env = child_env(dict(os.environ))
    env.update(token.to_env())
    env.update(ETCD_LOCK_KEY=token.key or "", ETCD_LOCK_REV=str(token.value))
    return env


def _run_locked(
    args: argparse.Namespace,
    token: FencingToken,
    signals: Signals,
    lost: threading.Event,
    lock: Any,
    leaving: _Leaving,
    proven: list[bool],
) -> int:
    """Run the command while the lock holds; stop it in time when the lease is lost,
    kill it at once when etcd took the key, and --grace after a stop signal.
    ``proven[0]`` is set to whether its tree was proven dead at the end."""
    deadline = kill_deadline(lock.session)
    child = Child(
        args.command,
        _lock_env(token),
        new_session=False,
        foreground=tty_delivers_sigint(),
        deadline=deadline,
        grace=args.grace,
    )
    child_was_foreground = child.foreground  # Ctrl-C at the terminal reaches it directly
    forwarded = False  # a signal we passed on ended it: not a crash
    budget = leaving.budget
    try:
        while True:
            signals.wake.clear()
            child.renew()
            taken = lock.key_taken()
            if not taken and child.poll() is not None and not child.expired:
                returncode = child.returncode
                status = child.finish(
                    args.grace, deadline=deadline, hurry=lock.key_taken, until=budget.steps_end
                )
                if not forwarded and not (child_was_foreground and status == 128 + 2):
                    _report_crash(child.pid, returncode, status)
                return status
            for signum in signals.take():
                forwarded = True
                child.signal(signum)
                if signum in _STOPPING:
                    leaving.stop()
            if taken or child.expired or lost.is_set() or must_stop(deadline, args.grace):
                why = f"lost the lock {args.name!r} ({_loss(lock, lost)})"
                status = stop_command(
                    child,
                    why,
                    args.grace,
                    taken=lock.key_taken,
                    what="lock key",
                    who="holder",
                    deadline=deadline,
                    until=budget.steps_end,
                )
                if child.contained:  # else the line that nothing was released says the end
                    error(f"{why} while the command ran; stopped it (status {status}); exiting 6")
                return EXIT_LOST
            if _overdue(budget, args.grace):  # after the loss check: a loss says exit 6
                return _kill_overdue(child, args.grace, deadline, lock, budget)
            signals.wake.wait(POLL)
    finally:
        proven[0] = child.contained
        child.close()

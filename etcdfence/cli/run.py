"""``etcdfence run NAME --id ID -- CMD ...``: a leader-elected supervisor.

The command runs only while this process leads election NAME. When leadership is lost
its process group is stopped (SIGTERM, SIGKILL after ``--grace``, always before etcd can
expire the lease; SIGKILL at once when etcd has already taken the key, as the next
leader may run) and the supervisor campaigns again; when the command exits by itself
the supervisor resigns and exits with its status. Without a command it holds
leadership like ``etcdctl elect``: prints the key and token once elected, exits 6 on
loss. ``--health`` serves probes (:mod:`._health`); under systemd it speaks
``sd_notify`` (:mod:`._notify`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

from .. import _early_signals
from .._sync.client import Client
from .._sync.elector import LeaderElector
from ..token import FencingToken
from . import _options as opt
from . import _output
from ._exits import EXIT_ERROR, EXIT_LOST, EXIT_OK, CommandError, Interrupted
from ._health import HealthServer, RunProbe, enable_library_metrics, listen_address
from ._notify import Notifier, child_env
from ._output import add_write_out, error, print_held, say, signame, warn
from ._process import (
    EXIT_RESERVE,
    POLL,
    STOP_EXTRA,
    Child,
    Signals,
    StopBudget,
    add_grace_option,
    kill_deadline,
    must_stop,
    stop_command,
)

DESCRIPTION = """\
Campaign in election NAME with value ID and run the command only while leader,
in its own process group with stdin from /dev/null. Its environment carries
ETCDFENCE_TOKEN (the term's fencing token), ETCDFENCE_KEY (the leader key),
ETCDFENCE_LOCK (NAME), ETCDFENCE_CLUSTER (the etcd cluster id), ETCDFENCE_CREATE_REVISION
and ETCDFENCE_LEASE: FencingToken.from_env() reads the whole token back.

When leadership is lost while the lease still holds (a keepalive came too late
for the session's local deadline — e.g. this process was frozen) the command's
process group gets SIGTERM, then SIGKILL after --grace, and the supervisor
campaigns again. SIGTERM starts early enough (when the lease has less than --grace
left) that SIGKILL lands before etcd can expire the lease. When etcd has already
taken the key (it was deleted, or the lease revoked or expired on the server), the
next leader may start at once: the command and all it started get SIGKILL at once,
no grace. If the supervisor dies, even by SIGKILL, the command's group is killed at
once.
When the command exits by itself, the supervisor resigns and exits with its status
(a non-zero status or a signal it was not sent is logged as a crash, at warning).
SIGTERM/SIGINT to the supervisor: stop the command the same way, resign and exit 0
(a requested shutdown is a clean one, also before etcd answered at start-up); a
second signal kills at once. A stop (signal, loss, the command's exit) has one
budget of --grace + 4 s in all: resign, lease revoke and the exit take what is left
(an unreachable etcd skips them: the key goes with the lease's TTL). If the command
and all it started cannot be proven dead within it, nothing is released (the next
leader waits for the TTL) and the supervisor exits 1.
SIGHUP is systemd's reload: it is passed on to the command's process group
(ignored while no command runs); it never stops anything.
etcd must answer at start-up (else exit 3/5); later outages are ridden out.

Without a command (as 'etcdctl elect'): print 'KEY TOKEN' once elected and hold
leadership until SIGTERM/SIGINT (resign, exit 0) or its loss (exit 6).

--health HOST:PORT serves /healthz (liveness: 200 unless this process is wedged;
never fails because etcd is away), /readyz (200 only while leading — and, with
--ready-url, once the command answers there — 503 the moment a loss is known),
/candidatez (200 while leading or a standby with a live session: a Kubernetes
readinessProbe that lets rollouts complete) and /metrics (Prometheus text).
Under systemd (Type=notify) it sends READY=1 once leading (with --ready-url: once
the command answers) and WATCHDOG=1 while not wedged (see examples/deploy/)."""

EXAMPLES = """\
  etcdfence run services/scheduler --id node-a -- ./scheduler --serve
  etcdfence run jobs/compactor --id "$(hostname)" --ttl 5 --grace 10 -- \\
      python compactor.py       # compactor.py: FencingToken.from_env()
  etcdfence run services/api --id "$(hostname)" --health 0.0.0.0:8080 -- ./api
  etcdfence run services/vip --id node-a     # prints 'KEY TOKEN' when elected, holds"""


def add_parser(subparsers: Any) -> None:
    """Add ``run`` to the command line."""
    p = opt.add_command(
        subparsers,
        "run",
        "leader-elected supervisor: run a command only while leader",
        DESCRIPTION,
        EXAMPLES,
    )
    p.add_argument(
        "name", metavar="NAME", type=opt.name, help="election name (keys live under NAME/)"
    )
    p.add_argument("command", metavar="CMD", nargs="*", help="command to run (after '--')")
    p.add_argument(
        "--id",
        dest="identity",
        type=opt.identity,
        metavar="ID",
        required=True,
        help="this candidate's identity, the value 'leader' shows",
    )
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=opt.ttl,
        default=10,
        help="session lease TTL in seconds (default: 10)",
    )
    add_grace_option(p, "when stopping the command")
    p.add_argument(
        "--health",
        metavar="HOST:PORT",
        type=listen_address,
        default=None,
        help="serve /healthz, /readyz and /metrics there (port 0: any free port)",
    )
    p.add_argument(
        "--ready-url",
        metavar="URL",
        type=_http_url,
        default=None,
        help="the command is ready once GET URL answers 2xx (polled every 0.5 s): "
        "/readyz and READY=1 wait for it (default: ready once leading and started)",
    )
    add_write_out(p, "simple", ("simple", "json", "table"))
    p.set_defaults(func=run)


def _http_url(text: str) -> str:
    """``--ready-url``: an http(s) URL."""
    if not text.startswith(("http://", "https://")) or len(text) < 8:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def run(args: argparse.Namespace) -> int:
    """``etcdfence run NAME --id ID [--ttl N] [--grace S] [--health H:P] [-- CMD ...]``."""
    budget = StopBudget(args.grace)
    probe = RunProbe(args.name, args.identity, args.ttl, lambda: None)
    probe.wants_command_ready = args.ready_url is not None and bool(args.command)
    server = HealthServer(args.health, _routes(probe)) if args.health is not None else None
    notifier = Notifier.from_env()
    try:
        if server is not None:
            if not enable_library_metrics():
                warn("prometheus_client is not installed: /metrics serves etcdfence_supervisor_* "
                     "only (pip install 'etcdfence[metrics]')")  # fmt: skip
            server.start()
            say(f"health checks on {server.url} (/healthz, /readyz, /metrics)")
        return _run(args, probe, notifier, budget)
    finally:
        notifier.close(budget.exit_left(2.0))
        if server is not None:
            server.close(budget.exit_left(2.0))


def _routes(probe: RunProbe) -> dict[str, Any]:
    return {
        "/healthz": probe.healthz,
        "/livez": probe.healthz,
        "/readyz": probe.readyz,
        "/candidatez": probe.candidatez,
        "/metrics": probe.metrics,
    }


def _run(args: argparse.Namespace, probe: RunProbe, notifier: Notifier, budget: StopBudget) -> int:
    """Campaign and supervise until stopped; the exit code.

    One clean-stop rule: SIGTERM/SIGINT is a requested shutdown and exits 0, also
    while etcd has not answered yet at start-up (systemd would otherwise mark a unit
    stopped during an etcd outage as failed)."""
    with Signals(raising=True, never_raising=(signal.SIGHUP,)) as signals:
        try:
            _early_signals.replay()  # one that came during start-up counts like one now
            client = _connect(args)
        except Interrupted as exc:
            say(f"received {signame(exc.signum)} before etcd answered: stopping")
            return EXIT_OK
        signals.raising = False
        try:
            return _supervise(args, client, probe, notifier, signals, budget)
        finally:
            _close_within(client, budget)


def _close_within(client: Client, budget: StopBudget) -> None:
    """Close the client (its worker joins) within what is left of the stop budget."""
    closer = threading.Thread(target=client.close, name="etcdfence-close", daemon=True)
    closer.start()
    closer.join(budget.exit_left(6.0))


def _connect(args: argparse.Namespace) -> Client:
    """A client whose etcd answered (fail fast, exit 3/5, if unreachable or refused)."""
    client = opt.make_client(args)
    try:
        client.revision()
    except BaseException:
        client.close()
        raise
    return client


def _supervise(
    args: argparse.Namespace,
    client: Client,
    probe: RunProbe,
    notifier: Notifier,
    signals: Signals,
    budget: StopBudget,
) -> int:
    """Run the elector thread; the main loop takes signals and ticks for liveness, and
    gives up waiting for the elector thread when the stop budget ran out."""
    supervisor = _Supervisor(args, client, probe, notifier, budget)
    worker = threading.Thread(target=supervisor.run_elector, name="etcdfence-run", daemon=True)
    worker.start()
    notifier.start_watchdog(lambda: probe.health()[0])
    while not supervisor.done.is_set():
        probe.tick("main")
        signals.wake.clear()
        supervisor.on_signals(signals.take())
        if supervisor.shutdown.is_set():
            # stop() may race with the start of a campaign; repeat until it lands.
            supervisor.elector.limit_release(budget.steps_end)
            supervisor.elector.stop()
        # the release steps end at budget.steps_end; give the thread half the reserve
        if supervisor.exiting() and budget.exit_left(1.0) <= EXIT_RESERVE / 2:
            break
        signals.wake.wait(0.05 if budget.started is not None else 0.2)
    if not supervisor.done.is_set():
        return supervisor.overran()
    worker.join()  # done is the thread's last act
    if supervisor.uncontained:
        return EXIT_ERROR
    if supervisor.error is not None:
        raise supervisor.error
    if supervisor.lost:
        return EXIT_LOST
    if supervisor.shutdown.is_set():
        return EXIT_OK
    return supervisor.child_status if supervisor.child_status is not None else EXIT_OK


class _Supervisor:
    """State shared by ``etcdfence run``'s main thread and its elector thread."""

    def __init__(
        self,
        args: argparse.Namespace,
        client: Client,
        probe: RunProbe,
        notifier: Notifier,
        budget: StopBudget,
    ) -> None:
        self.args = args
        self.budget = budget
        _output.exit_by[0] = None
        self.uncontained = False  # the command could not be proven dead: exit 1
        self.step = "campaigning"  # what the elector thread does (for a log line)
        self.probe = probe
        self.notifier = notifier
        self.shutdown = threading.Event()  # a stop signal arrived
        self.hurry = threading.Event()  # a second one: kill now
        self.done = threading.Event()
        self.child_status: int | None = None
        self.command_exited = False  # the command's main process exited by itself
        self.child: Child | None = None  # the running command, for SIGHUP
        self.lost = False  # holding without a command, leadership was lost: exit 6
        self.error: BaseException | None = None
        self.elector = LeaderElector(
            client,
            args.name,
            identity=args.identity,
            reclaim=True,  # take back keys left on this process's own former leases
            ttl=args.ttl,
            on_elected=self._on_elected,
            on_lost=self._on_lost,
            # observing moves etcdfence_leader_changes_total and logs who leads
            on_leader_change=self._on_leader_change,
        )
        probe.session_of = lambda: self.elector.session

    def _on_elected(self, token: FencingToken) -> None:
        say(f"elected leader of {self.args.name!r} as {self.args.identity!r} (token {token})")

    def _on_leader_change(self, leader: Any) -> None:
        if leader is None:
            say(f"{self.args.name!r} has no leader")
        else:
            value = leader.value.decode("utf-8", "replace")
            say(f"leader of {self.args.name!r} is {value!r} (key {leader.key})")

    def _on_lost(self) -> None:
        self.probe.ended()
        if self.exiting():
            return
        if not self.args.command:
            self.lost = True
            error(f"lost leadership of {self.args.name!r}; exiting")
            self._begin_stop()
            self.elector.stop()
            return
        self.notifier.status(f"campaigning for {self.args.name} as {self.args.identity}")
        say(f"no longer leader of {self.args.name!r}; campaigning again")

    def run_elector(self) -> None:
        """The elector thread: campaign and run terms until stopped."""
        try:
            self.notifier.status(f"campaigning for {self.args.name} as {self.args.identity}")
            say(f"campaigning for {self.args.name!r} as {self.args.identity!r}")
            self.elector.run(self.work)
        except BaseException as exc:
            self.error = self.error or exc
        finally:
            self.done.set()

    def work(self, token: FencingToken, stop: threading.Event) -> None:
        """One leadership term: run the command (or hold) until it exits or the term ends."""
        if self.shutdown.is_set() or stop.is_set():
            return
        self.budget.reset()  # a new term: any earlier term's stop is over
        _output.exit_by[0] = None
        self.probe.elected(token, stop)
        leading = f"leading {self.args.name} as {self.args.identity} (token {token.value})"
        if not self.args.command:
            print_held(self.args.write_out, token, name=self.args.name, identity=self.args.identity)
            self.notifier.ready(leading)
            stop.wait()
            return
        session = self.elector.session
        deadline = kill_deadline(session) if session is not None else None
        grace = self.args.grace
        env = child_env(dict(os.environ))
        env.update(token.to_env())  # every field, "" for a missing one: no stale outer one
        try:
            child = Child(
                self.args.command,
                env,
                new_session=True,
                foreground=False,
                deadline=deadline,
                grace=grace,
            )
        except CommandError as exc:
            self.error = exc
            self._begin_stop()
            self.elector.stop()
            return
        self.child = child
        try:
            say(f"started {shlex.join(self.args.command)} (pid {child.pid}, token {token})")
            if self.args.ready_url is None:
                self.notifier.ready(leading)
            else:
                threading.Thread(
                    target=self._watch_ready, args=(stop, leading), daemon=True
                ).start()
            try:
                why = self._supervise(child, stop, deadline)
            finally:
                self.probe.idle("supervising")
            if why is None:
                return
            self._begin_stop()
            if not self.shutdown.is_set():
                # loss known: /readyz, is_leader and lock_held say so now, not after grace
                self.elector.step_down(why)
            self.step = f"stopping the command (pid {child.pid})"
            status = self._stop_command(child, why, deadline)
            if self._contained(child):
                say(f"command stopped (status {status})")
        finally:
            self.child = None
            child.close()

    def _stop_command(self, child: Child, why: str, deadline: Callable[[], float] | None) -> int:
        """Stop the command and all it started; its status. SIGTERM, SIGKILL after
        --grace while this supervisor still holds the lease; SIGKILL at once once etcd
        has taken the key (deleted, or the lease revoked): the next leader may already
        run, so a grace period would only let the two overlap."""
        child.until = self.budget.steps_end  # also for a sweep the first look may do
        return stop_command(
            child,
            why,
            self.args.grace,
            taken=self.elector.key_taken,
            what="leader key",
            who="leader",
            deadline=deadline,
            hurry=self.hurry.is_set,
            until=self.budget.steps_end,
        )

    def _supervise(
        self, child: Child, stop: threading.Event, deadline: Callable[[], float] | None
    ) -> str | None:
        """Wait for the command to exit (resign; None) or the term to end (the reason
        to stop the command)."""
        grace = self.args.grace
        why = "leadership lost"
        while True:
            self.probe.tick("supervising")
            child.renew()
            child.poll()
            if child.expired:
                why = "lease not renewed in time (the reaper stopped the command by the deadline)"
                break
            if child.poll() is not None:
                returncode = child.returncode
                self.command_exited = True  # the main loop watches the budget from now
                self._begin_stop()
                self.step = f"stopping what the command (pid {child.pid}) left running"
                self.child_status = child.finish(
                    grace, deadline=deadline, until=self.budget.steps_end
                )
                if self._contained(child):
                    self._report_exit(child.pid, returncode, self.child_status)
                self.elector.stop()
                return None
            if stop.wait(POLL):
                break
            if deadline is not None and must_stop(deadline, grace):
                why = "lease not renewed in time (SIGKILL must land before it can expire)"
                break
        return "shutting down" if self.shutdown.is_set() else why

    def _report_exit(self, pid: int, returncode: int | None, status: int) -> None:
        """The command ended by itself: a clean exit, or a crash (non-zero status, or a
        signal the supervisor did not send) logged at warning with its status."""
        if status == 0:
            say("command exited with status 0; resigning")
        elif self.shutdown.is_set():  # e.g. systemd signalled the whole cgroup as we stop
            say(f"command ended with status {status} while shutting down; resigning")
        elif returncode is not None and returncode < 0:
            sig = signame(-returncode)
            warn(
                f"command crashed (killed by {sig}); resigning", pid=pid, status=status, signal=sig
            )
        else:
            warn(f"command crashed (exit status {status}); resigning", pid=pid, status=status)

    def on_signals(self, received: list[int]) -> None:
        """Signals from the main loop: SIGHUP is systemd's reload (passed on to the
        command's group; ignored with none); of the stop signals, the first shuts down,
        a second hurries."""
        for signum in [s for s in received if s == signal.SIGHUP]:
            child = self.child
            if child is None or self.shutdown.is_set():
                say("received SIGHUP: no command running, nothing to reload")
            else:
                child.signal(signum)
                say(f"received SIGHUP: passed on to the command (pid {child.pid}) to reload")
        stops = [s for s in received if s != signal.SIGHUP]
        if stops and not self.shutdown.is_set():
            say(f"received {signame(stops[0])}: stopping")
        for _ in stops:
            self.request_stop()

    def _watch_ready(self, stop: threading.Event, leading: str) -> None:
        """--ready-url: poll the command until it answers 2xx, then /readyz may say 200
        and READY=1 goes out; for this term only (``stop``)."""
        url = self.args.ready_url
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=1.0) as answer:
                    ok = 200 <= answer.status < 300
            except (OSError, ValueError):
                ok = False
            if ok and not stop.is_set():
                self.probe.command_ready.set()
                say(f"the command answers on {url}: ready")
                self.notifier.ready(leading)
                return
            stop.wait(0.5)

    def _begin_stop(self) -> None:
        """The supervisor decided to stop: the budget starts (once), and bounds the
        elector's release (resign, revoke) and the final log flush."""
        self.budget.start()
        self.elector.limit_release(self.budget.steps_end)
        _output.exit_by[0] = (
            None if self.budget.started is None else (self.budget.started + self.budget.total)
        )

    def _contained(self, child: Child) -> bool:
        """After a stop: whether the command and all it started are proven dead. If
        not, release nothing (the next leader waits for the lease's TTL) and exit 1."""
        if child.contained:
            self.step = "releasing leadership (resign, revoke)"
            return True
        self._unproven(child.pid)
        self.elector.stop()
        return False

    def _unproven(self, pid: int) -> None:
        """The command's tree could not be proven dead: release nothing, say so."""
        if self.uncontained:
            return
        self.uncontained = True
        self.elector.limit_release(None, release=False)
        error(
            f"the command (pid {pid}) or a process it started could not be proven "
            f"dead within the stop budget ({self.budget.total:g}s = --grace + "
            f"{STOP_EXTRA:g}s): not resigning or revoking (the next leader waits for the "
            "lease's TTL); exiting 1"
        )

    def exiting(self) -> bool:
        """Whether the supervisor is on its way out (not just ending a term)."""
        return (
            self.shutdown.is_set()
            or self.uncontained
            or self.lost
            or self.error is not None
            or self.command_exited
            or self.child_status is not None
        )

    def overran(self) -> int:
        """The stop budget ran out while the elector thread was still at work: say where,
        exit 1 (nothing it had not released yet is released now; the lease runs out).
        Still stopping the command: it is not proven dead, which is said as such."""
        child = self.child
        if child is not None and not child.contained:
            self._unproven(child.pid)
            return EXIT_ERROR
        self.elector.limit_release(None, release=False)
        error(
            f"the stop budget ({self.budget.total:g}s = --grace + {STOP_EXTRA:g}s) ran out "
            f"while {self.step}; exiting 1 without waiting further"
        )
        return EXIT_ERROR

    def request_stop(self) -> None:
        """Shut down (stop the command, resign); asked twice, kill the command at once."""
        if self.shutdown.is_set():
            self.hurry.set()
            return
        if self.child is None:
            self.budget.reset()  # no term is stopping: this stop starts now
        self._begin_stop()
        self.shutdown.set()
        self.probe.stopping = True
        self.elector.stop()

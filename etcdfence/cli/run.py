"""``etcdfence run NAME --id ID -- CMD ...``: a leader-elected supervisor.

The command runs only while this process leads election NAME. When leadership is lost
its process group is stopped (SIGTERM, SIGKILL after ``--grace``, always before etcd can
expire the lease) and the supervisor campaigns again; when the command exits by itself
the supervisor resigns and exits with its status. Without a command it holds
leadership like ``etcdctl elect``: prints the key and token once elected, exits 6 on
loss. ``--health`` serves probes (:mod:`._health`); under systemd it speaks
``sd_notify`` (:mod:`._notify`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import threading
from collections.abc import Callable
from typing import Any

from .._sync.client import Client
from .._sync.elector import LeaderElector
from ..token import FencingToken
from . import _options as opt
from ._exits import EXIT_LOST, EXIT_OK, CommandError
from ._health import HealthServer, RunProbe, enable_library_metrics, listen_address
from ._notify import Notifier, child_env
from ._output import add_write_out, error, print_held, say, signame, warn
from ._process import POLL, Child, Signals, add_grace_option, kill_deadline, must_stop

DESCRIPTION = """\
Campaign in election NAME with value ID and run the command only while leader,
in its own process group with stdin from /dev/null. Its environment carries
ETCDFENCE_TOKEN (the term's fencing token) and ETCDFENCE_KEY (the leader key).

When leadership is lost (the session's local deadline passed — e.g. this process
was frozen — the lease expired, or the key was deleted) the command's process
group gets SIGTERM, then SIGKILL after --grace, and the supervisor campaigns again.
SIGTERM starts early enough (when the lease has less than --grace left) that SIGKILL
lands before etcd can expire the lease; if the supervisor dies, even by SIGKILL,
the command's group is killed at once.
When the command exits by itself, the supervisor resigns and exits with its status
(a non-zero status or a signal it was not sent is logged as a crash, at warning).
SIGTERM/SIGINT/SIGHUP to the supervisor: stop the command the same way, resign and
exit 0 (a requested shutdown is a clean one); a second signal kills at once.
etcd must answer at start-up (else exit 3/5); later outages are ridden out.

Without a command (as 'etcdctl elect'): print 'KEY TOKEN' once elected and hold
leadership until SIGTERM/SIGINT (resign, exit 0) or its loss (exit 6).

--health HOST:PORT serves /healthz (200 while the session is live and etcd answered
a keepalive within the interval plus the margin), /readyz (200 only while leading)
and /metrics (Prometheus text). Under systemd (Type=notify) it sends READY=1 once
leading and WATCHDOG=1 while healthy (see examples/deploy/)."""

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
    add_write_out(p, "simple", ("simple", "json", "table"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence run NAME --id ID [--ttl N] [--grace S] [--health H:P] [-- CMD ...]``."""
    probe = RunProbe(args.name, args.identity, args.ttl, lambda: None)
    server = HealthServer(args.health, _routes(probe)) if args.health is not None else None
    notifier = Notifier.from_env()
    try:
        if server is not None:
            if not enable_library_metrics():
                warn("prometheus_client is not installed: /metrics serves etcdfence_supervisor_* "
                     "only (pip install 'etcdfence[metrics]')")  # fmt: skip
            server.start()
            say(f"health checks on {server.url} (/healthz, /readyz, /metrics)")
        return _run(args, probe, notifier)
    finally:
        notifier.close()
        if server is not None:
            server.close()


def _routes(probe: RunProbe) -> dict[str, Any]:
    return {"/healthz": probe.healthz, "/readyz": probe.readyz, "/metrics": probe.metrics}


def _run(args: argparse.Namespace, probe: RunProbe, notifier: Notifier) -> int:
    """Campaign and supervise until stopped; the exit code."""
    with Signals(raising=True) as signals, opt.make_client(args) as client:
        client.revision()  # fail fast (exit 3/5) if etcd is unreachable or refuses us
        signals.raising = False
        supervisor = _Supervisor(args, client, probe, notifier)
        worker = threading.Thread(target=supervisor.run_elector, name="etcdfence-run", daemon=True)
        worker.start()
        notifier.start_watchdog(lambda: probe.health()[0])
        while not supervisor.done.is_set():
            signals.wake.clear()
            supervisor.on_signals(signals.take())
            if supervisor.shutdown.is_set():
                # stop() may race with the start of a campaign; repeat until it lands.
                supervisor.elector.stop()
            signals.wake.wait(0.2)
        worker.join()
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
        self, args: argparse.Namespace, client: Client, probe: RunProbe, notifier: Notifier
    ) -> None:
        self.args = args
        self.probe = probe
        self.notifier = notifier
        self.shutdown = threading.Event()  # a stop signal arrived
        self.hurry = threading.Event()  # a second one: kill now
        self.done = threading.Event()
        self.child_status: int | None = None
        self.lost = False  # holding without a command, leadership was lost: exit 6
        self.error: BaseException | None = None
        self.elector = LeaderElector(
            client,
            args.name,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=self._on_elected,
            on_lost=self._on_lost,
        )
        probe.session_of = lambda: self.elector.session

    def _on_elected(self, token: FencingToken) -> None:
        say(f"elected leader of {self.args.name!r} as {self.args.identity!r} (token {token})")

    def _on_lost(self) -> None:
        self.probe.ended()
        if self.shutdown.is_set() or self.child_status is not None or self.error is not None:
            return
        if not self.args.command:
            self.lost = True
            error(f"lost leadership of {self.args.name!r}; exiting")
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
        env.update(token.to_env())
        env["ETCDFENCE_KEY"] = token.key or ""
        try:
            child = Child(self.args.command, env, new_session=True, foreground=False)
        except CommandError as exc:
            self.error = exc
            self.elector.stop()
            return
        try:
            say(f"started {shlex.join(self.args.command)} (pid {child.pid}, token {token})")
            self.notifier.ready(leading)
            why = self._supervise(child, stop, deadline)
            if why is None:
                return
            say(f"{why}: stopping pid {child.pid} (SIGTERM, SIGKILL after {grace:g}s)")
            status = child.stop(grace, deadline=deadline, hurry=self.hurry)
            say(f"command stopped (status {status})")
        finally:
            child.close()

    def _supervise(
        self, child: Child, stop: threading.Event, deadline: Callable[[], float] | None
    ) -> str | None:
        """Wait for the command to exit (resign; None) or the term to end (the reason
        to stop the command)."""
        grace = self.args.grace
        why = "leadership lost"
        while True:
            if child.poll() is not None:
                returncode = child.returncode
                self.child_status = child.finish(grace, deadline=deadline)
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
        """Stop signals from the main loop: the first shuts down, a second hurries."""
        if received and not self.shutdown.is_set():
            say(f"received {signame(received[0])}: stopping")
        for _ in received:
            self.request_stop()

    def request_stop(self) -> None:
        """Shut down (stop the command, resign); asked twice, kill the command at once."""
        if self.shutdown.is_set():
            self.hurry.set()
            return
        self.shutdown.set()
        self.elector.stop()

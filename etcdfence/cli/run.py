"""``etcdfence run NAME --id ID -- CMD ...``: a leader-elected supervisor.

The command runs only while this process leads election NAME. When leadership is lost
its process group is stopped (SIGTERM, SIGKILL after ``--grace``, always before etcd can
expire the lease) and the supervisor campaigns again; when the command exits by itself
the supervisor resigns and exits with its status.
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
from ._exits import EXIT_OK, CommandError
from ._output import say, signame
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
When the command exits by itself, the supervisor resigns and exits with its status.
SIGTERM/SIGINT/SIGHUP to the supervisor: stop the command the same way, resign and
exit 0 (a requested shutdown is a clean one); a second signal kills at once.
etcd must answer at start-up (else exit 3/5); later outages are ridden out."""

EXAMPLES = """\
  etcdfence run services/scheduler --id node-a -- ./scheduler --serve
  etcdfence run jobs/compactor --id "$(hostname)" --ttl 5 --grace 10 -- \\
      python compactor.py       # compactor.py: FencingToken.from_env()"""


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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence run NAME --id ID [--ttl N] [--grace S] -- CMD ...``."""
    with Signals(raising=True) as signals, opt.make_client(args) as client:
        client.revision()  # fail fast (exit 3/5) if etcd is unreachable or refuses us
        signals.raising = False
        supervisor = _Supervisor(args, client)
        worker = threading.Thread(target=supervisor.run_elector, name="etcdfence-run", daemon=True)
        worker.start()
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
        if supervisor.shutdown.is_set():
            return EXIT_OK
        return supervisor.child_status if supervisor.child_status is not None else EXIT_OK


class _Supervisor:
    """State shared by ``etcdfence run``'s main thread and its elector thread."""

    def __init__(self, args: argparse.Namespace, client: Client) -> None:
        self.args = args
        self.shutdown = threading.Event()  # a stop signal arrived
        self.hurry = threading.Event()  # a second one: kill now
        self.done = threading.Event()
        self.child_status: int | None = None
        self.error: BaseException | None = None
        self.elector = LeaderElector(
            client,
            args.name,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=self._on_elected,
            on_lost=self._on_lost,
        )

    def _on_elected(self, token: FencingToken) -> None:
        say(f"elected leader of {self.args.name!r} as {self.args.identity!r} (token {token})")

    def _on_lost(self) -> None:
        if self.shutdown.is_set() or self.child_status is not None or self.error is not None:
            return
        say(f"no longer leader of {self.args.name!r}; campaigning again")

    def run_elector(self) -> None:
        """The elector thread: campaign and run terms until stopped."""
        try:
            say(f"campaigning for {self.args.name!r} as {self.args.identity!r}")
            self.elector.run(self.work)
        except BaseException as exc:
            self.error = self.error or exc
        finally:
            self.done.set()

    def work(self, token: FencingToken, stop: threading.Event) -> None:
        """One leadership term: run the command until it exits or the term ends."""
        if self.shutdown.is_set() or stop.is_set():
            return
        session = self.elector.session
        deadline = kill_deadline(session) if session is not None else None
        grace = self.args.grace
        env = dict(os.environ)
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
                self.child_status = child.finish(grace, deadline=deadline)
                say(f"command exited with status {self.child_status}; resigning")
                self.elector.stop()
                return None
            if stop.wait(POLL):
                break
            if deadline is not None and must_stop(deadline, grace):
                why = "lease not renewed in time (SIGKILL must land before it can expire)"
                break
        return "shutting down" if self.shutdown.is_set() else why

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

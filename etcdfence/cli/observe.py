"""``etcdfence observe NAME``: every leader change of an election, as JSON lines."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from . import _options as opt
from ._exits import EXIT_OK
from ._output import add_write_out
from ._process import Signals
from .leader import RECORD_HELP, leader_record, print_leader


def add_parser(subparsers: Any) -> None:
    """Add ``observe`` to the command line."""
    p = opt.add_command(
        subparsers,
        "observe",
        "print every leader change of an election as JSON lines",
        "Print the leader of election NAME now and at every change (new leader, new\n"
        "proclaimed value, nobody) until SIGINT/SIGTERM (exit 0). Survives compaction\n"
        "and endpoint failover.\n" + RECORD_HELP,
        "  etcdfence observe services/scheduler\n"
        "  etcdfence observe services/scheduler | jq -c '{value, revision}'",
    )
    p.add_argument("name", metavar="NAME", type=opt.name, help="election name")
    add_write_out(p, "json", ("json", "table"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence observe NAME``: JSON lines until SIGINT/SIGTERM."""
    failure: list[BaseException] = []
    output_lock = threading.Lock()
    with Signals(raising=False) as signals, opt.make_client(args) as client:
        stopping = threading.Event()

        def follow() -> None:
            try:
                for leader in client.observe(args.name):
                    with output_lock:
                        if stopping.is_set():
                            return
                        print_leader(leader_record(args.name, leader), args.write_out)
            except BaseException as exc:
                if not stopping.is_set():
                    failure.append(exc)
            finally:
                signals.wake.set()

        follower = threading.Thread(target=follow, name="etcdfence-observe", daemon=True)
        follower.start()
        while not signals.take() and follower.is_alive():
            signals.wake.clear()
            signals.wake.wait(0.5)
        with output_lock:
            stopping.set()
    follower.join(2.0)
    if failure:
        raise failure[0]
    return EXIT_OK

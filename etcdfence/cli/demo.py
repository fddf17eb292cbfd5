"""``etcdfence demo``: the zombie-leader story on an embedded etcd (see
:mod:`etcdfence._demo`)."""

from __future__ import annotations

import argparse
from typing import Any

from . import _options as opt
from ._process import Signals

DESCRIPTION = """\
Start an embedded etcd and two contender processes, A and B, electing on one
name and writing one etcd-stored config through a fence. A leads and writes,
decides to write again and is frozen (SIGSTOP) past its lease; B takes over and
writes; A is thawed and writes with its old token — the fence rejects it. Prints
a timestamped timeline and a verdict; exits 0 only if the stale write was rejected
and the mark never went down. Takes about 10 s; leaves no process behind.
Connection options are accepted and ignored (the demo brings its own etcd)."""


def add_parser(subparsers: Any) -> None:
    """Add ``demo`` to the command line."""
    p = opt.add_command(
        subparsers,
        "demo",
        "the zombie-leader story on an embedded etcd",
        DESCRIPTION,
        "  etcdfence demo\n  etcdfence demo --ttl 3",
    )
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=opt.ttl,
        default=2,
        help="the contenders' lease TTL in seconds (default: 2)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence demo``: see :mod:`etcdfence._demo`."""
    from .._demo import run_demo

    with Signals(raising=True):  # SIGTERM/SIGINT: the demo cleans up, then 128+N
        return run_demo(ttl=args.ttl)

"""``python -m etcdfence.conformance package.module:factory`` — run the kit from a shell.

Exit status 0 when every scenario passed (or was skipped), 1 when any failed, 2 for a
usage error (bad factory, unknown scenario, no etcd) or no verdict, 130 when interrupted
(Ctrl-C). Whatever the adapter raises (``SystemExit`` too) is a finding, not an exit.
The report goes to stdout as text (progress on stderr) or, with ``-w json``, as one
JSON document.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import EtcdfenceError
from . import ScenarioResult, run_conformance, scenario_names
from ._adapter import describe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m etcdfence.conformance",
        description="Is my resource really fencing? Runs the conformance scenarios against "
        "the adapter a factory returns, with tokens from real etcd.",
        epilog=f"scenarios: {', '.join(scenario_names())}",
    )
    parser.add_argument("factory", help="package.module:function returning the adapter")
    parser.add_argument(
        "--endpoints", help="comma-separated etcd URLs (default: start an embedded etcd)"
    )
    parser.add_argument("-w", "--write-out", choices=["text", "json"], default="text")
    parser.add_argument("--only", action="append", metavar="SCENARIO", help="run only these")
    parser.add_argument("--skip", action="append", default=[], metavar="SCENARIO")
    parser.add_argument("--ttl", type=int, default=2, help="lease TTL of the zombie's term (s)")
    parser.add_argument(
        "--deadline", type=float, default=10.0,
        help="seconds an adapter call may take before its outcome counts as unknown",
    )  # fmt: skip
    parser.add_argument(
        "--zombie-delay", type=float, default=10.0,
        help="seconds the late zombie sleeps before its stale write: the kit cannot see a "
        "mark that expires later than this, so set it above your store's mark TTL (a Redis "
        "SET ... EX 60 needs --zombie-delay 70)",
    )  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show the library's warnings too"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the kit; the exit status says whether the resource fences."""
    args = parse_args(argv)
    if not args.verbose:  # the kit's zombies lose their leases on purpose
        logging.getLogger("etcdfence").setLevel(logging.ERROR)
    endpoints = None if not args.endpoints else [e for e in args.endpoints.split(",") if e]

    def progress(result: ScenarioResult) -> None:
        if not args.quiet:
            print(
                f"{result.status.upper():4} {result.name} ({result.seconds:.1f} s)", file=sys.stderr
            )

    try:
        report = run_conformance(
            args.factory, endpoints, only=args.only, skip=args.skip, ttl=args.ttl,
            on_result=progress, deadline=args.deadline, zombie_delay=args.zombie_delay,
        )  # fmt: skip
    except EtcdfenceError as err:
        print(f"etcdfence.conformance: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the user's Ctrl-C (adapter code runs on other threads)
        print("etcdfence.conformance: interrupted, no verdict", file=sys.stderr)
        return 130
    except BaseException as err:  # never exit 0 without a verdict
        print(f"etcdfence.conformance: no verdict: {describe(err)}", file=sys.stderr)
        return 2
    print(report.to_json() if args.write_out == "json" else report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

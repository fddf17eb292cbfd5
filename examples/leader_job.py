"""A leader-elected periodic job: run it on every node, it runs on exactly one.

Start several copies with different ``--id``. One is elected and runs the job every
``--interval`` seconds; the others wait. Stop the leader (Ctrl-C, kill -9, a frozen VM)
and another copy takes over within the lease TTL. Each run records its result through
a fence (``client.fence("jobs/<name>")``) with the term's fencing token, so a leader
that was paused and wakes up after losing the election cannot overwrite the newer
leader's result::

    etcdfence etcd &                       # or any etcd; see ETCDFENCE_ENDPOINTS
    python examples/leader_job.py --id node-a --iterations 5
    python examples/leader_job.py --id node-b --duration 30

The job ends after ``--iterations`` runs (by this node) or ``--duration`` seconds,
whichever comes first; then it resigns, and another node takes over at once. Each run
prints ``[ID] run N (token T)``. Uses :class:`etcdfence.LeaderElector`.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import etcdfence as ef


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--endpoints",
        default=os.environ.get("ETCDFENCE_ENDPOINTS", "http://127.0.0.1:2379"),
        help="etcd endpoints (default: $ETCDFENCE_ENDPOINTS or http://127.0.0.1:2379)",
    )
    parser.add_argument("--name", default="jobs/nightly-report", help="election name")
    parser.add_argument("--id", dest="identity", default=f"pid-{os.getpid()}")
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL in seconds")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between runs")
    parser.add_argument("--iterations", type=int, default=None, help="stop after N runs")
    parser.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    args = parser.parse_args(argv)
    if args.iterations is None and args.duration is None:
        parser.error("give --iterations and/or --duration so the job ends")

    runs = 0
    with ef.Client(args.endpoints, timeout=5.0) as client:
        guard = client.fence(args.name)

        def work(token: ef.FencingToken, stop: threading.Event) -> None:
            """One leadership term: run the job until told to stop."""
            nonlocal runs
            while not stop.is_set():
                runs += 1
                result = {"by": args.identity, "run": runs, "at": time.time()}
                # Not under NAME/: every key there counts as a candidate of the election.
                try:
                    guard.put(token, f"results/{args.name}", json.dumps(result))
                except ef.StaleTokenError as exc:
                    print(f"[{args.identity}] fenced off (mark {exc.current}); stepping down")
                    return
                print(f"[{args.identity}] run {runs} (token {token})", flush=True)
                if args.iterations is not None and runs >= args.iterations:
                    elector.stop()
                    return
                stop.wait(args.interval)

        elector = ef.LeaderElector(
            client,
            args.name,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=lambda t: print(f"[{args.identity}] elected (token {t})", flush=True),
            on_lost=lambda: print(f"[{args.identity}] not leader any more", flush=True),
        )
        if args.duration is not None:
            timer = threading.Timer(args.duration, elector.stop)
            timer.daemon = True
            timer.start()
        print(f"[{args.identity}] campaigning for {args.name!r}", flush=True)
        elector.run(work)
    print(f"[{args.identity}] done after {runs} run(s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Leader-only APScheduler jobs: run this on every replica, the jobs run on one of them.

Start several copies with different ``--id``. Each starts a ``BackgroundScheduler``
wrapped in :class:`etcdfence.apscheduler.LeaderScheduler`; one is elected and runs the
job every ``--interval`` seconds, the others keep their scheduler paused. Stop the
leader (Ctrl-C, kill -9, a frozen VM) and another copy takes over within the lease TTL.
Each run records its result through a fence (``client.fence("reports/<name>")``) with
the term's fencing token: the new leader advances the fence before its first job, so a
paused leader that wakes up after losing cannot overwrite the newer leader's result::

    etcdfence etcd &                       # or any etcd; see ETCDFENCE_ENDPOINTS
    pip install 'etcdfence[apscheduler]'
    python examples/apscheduler_leader.py --id node-a --duration 30
    python examples/apscheduler_leader.py --id node-b --duration 30

Each run prints ``[ID] run N (token T)``; a refused write prints ``[ID] fenced off``.
The replica shuts down after ``--runs`` runs (by this replica) or ``--duration``
seconds, whichever comes first (SIGTERM/Ctrl-C too): it waits for the running job,
resigns, and another replica takes over at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

from apscheduler.schedulers.background import BackgroundScheduler

import etcdfence as ef
from etcdfence.apscheduler import LeaderScheduler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--endpoints",
        default=os.environ.get("ETCDFENCE_ENDPOINTS", "http://127.0.0.1:2379"),
        help="etcd endpoints (default: $ETCDFENCE_ENDPOINTS or http://127.0.0.1:2379)",
    )
    parser.add_argument("--name", default="jobs/scheduler", help="election name")
    parser.add_argument("--id", dest="identity", default=f"pid-{os.getpid()}")
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL in seconds")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between runs")
    parser.add_argument("--runs", type=int, default=None, help="shut down after N runs")
    parser.add_argument("--duration", type=float, default=None, help="shut down after S s")
    args = parser.parse_args(argv)
    if args.runs is None and args.duration is None:
        parser.error("give --runs and/or --duration so the replica ends")

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    runs = 0
    with ef.Client(args.endpoints, timeout=5.0) as client:
        guard = client.fence(f"reports/{args.name}")
        leader = LeaderScheduler(
            client,
            args.name,
            scheduler=BackgroundScheduler(),
            identity=args.identity,
            ttl=args.ttl,
            fence=guard,  # advanced to the new term's token before its first job
            on_elected=lambda t: print(f"[{args.identity}] elected (token {t})", flush=True),
            on_lost=lambda: print(f"[{args.identity}] not leader any more", flush=True),
        )

        # `token` is passed in: the token of the term this run started in. A run that is
        # still writing after the term was lost carries a token the fence refuses.
        @leader.scheduled_job("interval", seconds=args.interval, misfire_grace_time=30, id="report")
        def report(token: ef.FencingToken) -> None:
            nonlocal runs
            if done.is_set():  # shutting down: --runs reached
                return
            runs += 1
            result = {"by": args.identity, "run": runs, "at": time.time()}
            try:
                guard.put(token, f"results/{args.name}", json.dumps(result))
            except ef.StaleTokenError as exc:
                print(f"[{args.identity}] fenced off (mark {exc.current})", flush=True)
                return
            print(f"[{args.identity}] run {runs} (token {token})", flush=True)
            if args.runs is not None and runs >= args.runs:
                done.set()

        print(f"[{args.identity}] campaigning for {args.name!r}", flush=True)
        with leader:  # start(): campaign in the background; exit: shutdown() and resign
            try:
                done.wait(args.duration)
            except KeyboardInterrupt:
                pass
    print(f"[{args.identity}] done after {runs} run(s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One replica for tests/test_apscheduler.py (a real process): one-shot ``date`` jobs.

Job ``d<k>`` is a ``date`` job due at ``--start + k * --gap`` (epoch seconds), with a
large ``misfire_grace_time`` (as the README advises for runs that must not be lost to a
failover), the same ids in every replica. Each run prints ``{"ran": k, ...}`` on stdout,
so a slot that no replica ran, or one that two ran, is plain to see. ``--hold K:S``
makes job K sleep S seconds (to occupy the executor); ``--workers W`` sizes the thread
pool. Hooks print ``elected`` / ``lost``; etcdfence's own log events are printed too.
SIGTERM shuts the scheduler down and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import signal
import sys
import threading
import time
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

import etcdfence as ef
from etcdfence.apscheduler import LeaderScheduler

_OUT = threading.Lock()


def emit(me: str, **fields: Any) -> None:
    with _OUT:
        sys.stdout.write(json.dumps({"who": me, "t": time.time(), **fields}) + "\n")
        sys.stdout.flush()


class _Printer(logging.Handler):
    def __init__(self, me: str) -> None:
        super().__init__(logging.INFO)
        self.me = me

    def emit(self, record: logging.LogRecord) -> None:
        emit(self.me, log=record.getMessage())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoints", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--ttl", type=int, default=2)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--gap", type=float, default=0.25)
    p.add_argument("--workers", type=int, default=10)
    p.add_argument("--hold", default="")
    args = p.parse_args()
    me = args.id
    logger = logging.getLogger("etcdfence")
    logger.setLevel(logging.INFO)
    logger.addHandler(_Printer(me))
    hold = {}
    if args.hold:
        k, s = args.hold.split(":")
        hold[int(k)] = float(s)

    client = ef.Client(args.endpoints.split(","), timeout=5.0)
    scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(args.workers)})
    leader = LeaderScheduler(
        client,
        args.name,
        scheduler=scheduler,
        identity=me,
        ttl=args.ttl,
        on_elected=lambda token: emit(me, elected=int(token)),
        on_lost=lambda: emit(me, lost=True),
        retry_interval=0.2,
    )

    def job(k: int, token: ef.FencingToken) -> None:
        emit(me, ran=k, token=int(token))
        if k in hold:
            time.sleep(hold[k])

    for k in range(args.count):
        at = dt.datetime.fromtimestamp(args.start + k * args.gap, dt.timezone.utc)
        leader.add_job(job, "date", args=[k], run_date=at, id=f"d{k}", misfire_grace_time=60)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    leader.start()
    emit(me, started=True)
    done.wait()
    leader.shutdown()
    client.close()
    emit(me, exited=True)


if __name__ == "__main__":
    main()

"""One replica of a leader-only APScheduler for tests/test_apscheduler.py (a real process).

It runs :class:`etcdfence.apscheduler.LeaderScheduler` with one interval job; each run
writes ``--steps`` times, ``--gap`` seconds apart, through a fence (an etcd fence under
the run's :class:`~etcdfence.history.Layout`, or a RedisFence), and records everything
as history events (JSON lines on stdout): ``elected``/``lost`` from the scheduler's
hooks, a ``note`` per run, ``write`` + ``accepted``/``rejected``/``unknown`` per write
(``detail`` = ``run N step S``). ``--no-fence`` is the control: plain puts, no fence
advanced at election. SIGTERM shuts the scheduler down (resign) and exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
import threading
import time
from typing import Any

import etcdfence as ef
from etcdfence.apscheduler import LeaderScheduler
from etcdfence.errors import RequestError, UnavailableError
from etcdfence.history import Layout, Recorder, jsonl_sink

RESOURCE = "jobs"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--root", required=True, help="the run's Layout root in etcd")
    parser.add_argument("--id", required=True)
    parser.add_argument("--ttl", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gap", type=float, default=0.3)
    parser.add_argument("--redis", help="RedisFence on 127.0.0.1:6379 with this resource")
    parser.add_argument("--no-fence", action="store_true", help="the control: no fencing")
    return parser.parse_args()


def store(args: argparse.Namespace, client: ef.Client) -> tuple[Any, str, str]:
    """(fence, resource name, data key) for the chosen backend."""
    layout = Layout(args.root)
    if args.redis:
        import redis

        from etcdfence.redis import RedisFence

        fence = RedisFence(redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5), args.redis)
        return fence, args.redis, fence.key_for("data")
    return layout.guard(client, RESOURCE), RESOURCE, layout.data_key(RESOURCE)


def main() -> None:
    args = parse()
    client = ef.Client(args.endpoints.split(","), timeout=5.0)
    fence, resource, key = store(args, client)
    leader: LeaderScheduler | None = None

    def deadline() -> float | None:
        session = leader.elector.session if leader is not None else None
        return None if session is None else float(session.deadline)

    recorder = Recorder(args.id, jsonl_sink(sys.stdout), deadline=deadline)

    def write(token: ef.FencingToken, detail: str) -> None:
        pending = recorder.write(resource, key, token, detail=detail)
        try:
            if args.no_fence:
                revision = client.put(key, pending.value)
            else:
                revision = fence.put(token, key, pending.value)
        except ef.StaleTokenError as err:
            recorder.rejected(pending, err.current, detail=detail)
        except (UnavailableError, RequestError) as err:
            recorder.unknown(pending, f"{type(err).__name__}: {err}")
        else:
            recorder.accepted(pending, revision, detail=detail)

    runs = itertools.count(1)

    def job(token: ef.FencingToken) -> None:  # never looks at `stop`: the fence must catch it
        run = next(runs)
        recorder.note(f"run {run} start", token=int(token))
        for step in range(args.steps):
            if step:
                time.sleep(args.gap)
            write(token, f"run {run} step {step}")

    leader = LeaderScheduler(
        client,
        Layout(args.root).election,
        identity=args.id,
        ttl=args.ttl,
        fence=None if args.no_fence else fence,
        on_elected=lambda token: recorder.elected(token),
        on_lost=lambda: recorder.lost("term ended"),
        retry_interval=0.2,
    )
    leader.add_job(job, "interval", seconds=args.interval, max_instances=1, id="job")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    recorder.campaign()
    leader.start()
    done.wait()
    leader.shutdown()
    client.close()


if __name__ == "__main__":
    main()

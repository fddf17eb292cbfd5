"""Exactly one Celery beat, fenced all the way to the worker: a report written once per slot.

This module is a Celery app (``celery -A celery_beat ...`` from this directory) with one
periodic, fenced task. Run a worker and as many beats as you like (etcd at
$ETCDFENCE_ENDPOINTS, the broker at $CELERY_BROKER_URL, default redis://127.0.0.1:6379/0):

    celery -A celery_beat worker -l info
    celery -A celery_beat beat --scheduler etcdfence.celery:LeaderScheduler -l info   # host A
    celery -A celery_beat beat --scheduler etcdfence.celery:LeaderScheduler -l info   # host B

or each beat under the supervisor (then it takes the supervisor's token, never campaigns):

    etcdfence run celery/celery_beat/beat --id host-a -- \\
        celery -A celery_beat beat --scheduler etcdfence.celery:LeaderScheduler

One beat leads and sends; the others wait. Each task carries the term's token and its
slot; the worker writes the report through the fence, once per slot, and refuses a task
of an older term. ``python celery_beat.py --seconds 6`` does all of that for you (a worker
and two beats; the leader is stopped half-way), then prints every report: one per slot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from celery import Celery

import etcdfence as ef
from etcdfence.celery import Fenced, Settings, fenced_task

#: The app's name: election, fence and keys derive from it (celery/<name>/beat, ...).
NAME = os.environ.get("CELERY_BEAT_EXAMPLE", "celery_beat")

app = Celery(NAME, broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=NAME,
    broker_transport_options={"confirm_publish": True},  # (RabbitMQ) publish = accepted
    beat_schedule={"report": {"task": "celery_beat.report", "schedule": 1.0}},
    beat_max_loop_interval=1,
    etcdfence_ttl=int(os.environ.get("CELERY_BEAT_TTL", "10")),
)


@fenced_task(app)
def report(fenced: Fenced) -> None:
    """The periodic effect: one report per slot, written through the fence with the
    slot's key (a second delivery of the slot writes nothing)."""
    body = json.dumps({"slot": fenced.slot, "token": fenced.token.value})
    fenced.put(f"{Settings.from_app(app).prefix}reports/{fenced.slot}", body)


def _celery(*args: str) -> subprocess.Popen[bytes]:
    here = Path(__file__).resolve().parent
    command = [sys.executable, "-m", "celery", "-A", "celery_beat", *args, "-l", "warning"]
    return subprocess.Popen(command, cwd=here, stdout=subprocess.DEVNULL)


def demo(seconds: float) -> int:
    """A worker and two beats for ``seconds``; the leader is stopped half-way."""
    worker = _celery("worker", "-P", "solo", "--without-mingle", "--without-gossip")
    scheduler = ["beat", "--scheduler", "etcdfence.celery:LeaderScheduler"]
    beats = [_celery(*scheduler, "--schedule", os.devnull) for _ in range(2)]
    try:
        time.sleep(seconds / 2)
        with ef.Client() as client:
            leader = client.leader(Settings.from_app(app).election)
        first = next((b for b in beats if leader and leader.value.endswith(b":%d" % b.pid)), None)
        if first is not None:  # the leader stops (resigns); the other beat takes over
            first.send_signal(signal.SIGTERM)
            first.wait(15)
        time.sleep(seconds / 2)
    finally:
        for beat in beats:
            beat.send_signal(signal.SIGTERM)
        for beat in beats:
            beat.wait(15)
        time.sleep(1.0)  # the worker finishes what was sent
        worker.send_signal(signal.SIGTERM)
        worker.wait(15)
    with ef.Client() as client:
        reports = client.get_prefix(f"{Settings.from_app(app).prefix}reports/")
    for kv in reports:
        entry = json.loads(kv.value)
        print(f"report {entry['slot']} written with token {entry['token']}")
    print(f"{len(reports)} report(s), one per slot")
    return 0 if reports else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to run the demo")
    return demo(parser.parse_args().seconds)


if __name__ == "__main__":
    sys.exit(main())

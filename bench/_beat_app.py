"""The Celery app of the ``beat_failover`` bench: the beats and the worker import it.

Use it only through ``bench/beat_failover.py``, which starts ``celery -A bench._beat_app
beat`` and ``celery -A bench._beat_app worker`` processes with the environment below;
nothing here is meant for an application.

Environment (set by the bench for each process):

* ``BENCH_BEAT_BROKER``: the broker URL (Redis, a database of its own);
* ``BENCH_BEAT_PREFIX``: the run's prefix: kombu's ``global_keyprefix`` (its queues and
  bindings), the receipt logs; every key of the run starts with it and is deleted after;
* ``BENCH_BEAT_SCHEDULER``: ``redbeat`` or ``etcdfence``: which entry the beat schedules
  (the worker serves both queues);
* ``BENCH_BEAT_ROUND``: the round's own prefix: redbeat's keys and lock live under it and
  the entry is named after it (``tick-<round>``), so neither redbeat's schedule nor
  etcdfence's schedule state (kept per entry) carries from one round to the next. The
  etcdfence election, fenced resource and key prefix are the run's (the one worker serves
  every round; the beats of a round end resigned);
* ``BENCH_BEAT_TTL``: the leader lock's lifetime in seconds (redbeat's
  ``redbeat_lock_timeout``; etcdfence's session TTL);
* ``BENCH_BEAT_INTERVAL``: the entry's interval and ``beat_max_interval``, seconds;
* ``BENCH_BEAT_ETCD``: the etcd endpoint of the run (etcdfence side);
* ``BENCH_BEAT_PAUSE_KEY``: (the ``publish-stop`` fault) a Redis key the bench sets to
  arm a pause: the first beat that publishes after that deletes the key, notes the time
  in ``<prefix>:paused`` and SIGSTOPs itself *inside* the publish, after its schedule
  decided to send and before the message is out; once SIGCONTed it sends that message —
  a frozen beat holding a message.

What the processes record:

* every beat stamps ``bench-sent`` (``time.time()`` at publish) into each task message's
  headers (``before_task_publish``), so a failover is timed from the send, not from when a
  worker got round to the message;
* the worker appends one JSON line per message it *receives* (``task_received``: every
  message, a refused one too) to ``<prefix>:received``, one per effect it *applies* to
  ``<prefix>:applied`` and, on the etcdfence side, one per message the fenced task refuses
  to ``<prefix>:refused`` (with the reason).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery, signals  # type: ignore[import-untyped]  # no stubs, no py.typed

BROKER = os.environ.get("BENCH_BEAT_BROKER", "redis://127.0.0.1:6379/14")
PREFIX = os.environ.get("BENCH_BEAT_PREFIX", "bench-beat-unset")
SCHEDULER = os.environ.get("BENCH_BEAT_SCHEDULER", "redbeat")
ROUND = os.environ.get("BENCH_BEAT_ROUND", PREFIX + ":round")
TTL = float(os.environ.get("BENCH_BEAT_TTL", "3"))
INTERVAL = float(os.environ.get("BENCH_BEAT_INTERVAL", "1"))
ETCD = os.environ.get("BENCH_BEAT_ETCD", "http://127.0.0.1:2379")
PAUSE_KEY = os.environ.get("BENCH_BEAT_PAUSE_KEY", "")
ENTRY = "tick-" + ROUND.rsplit(":", 1)[-1]

SENT_HEADER = "bench-sent"
RECEIVED = PREFIX + ":received"
APPLIED = PREFIX + ":applied"
REFUSED = PREFIX + ":refused"
PAUSED = PREFIX + ":paused"
#: The task (and its queue) each scheduler's entry sends.
TASKS = {"redbeat": "bench.beat.tick_redbeat", "etcdfence": "bench.beat.tick_etcdfence"}
#: Message headers kept in a receipt (besides ``bench-sent``): who sent it, and the
#: fencing headers etcdfence adds (any header naming a token or a slot).
KEPT = ("id", "task", "origin")


def queue_of(scheduler: str) -> str:
    """The queue a scheduler's entry is sent to (under the run's prefix)."""
    return f"{PREFIX}-{scheduler}"


app = Celery("bench_beat", broker=BROKER, set_as_current=True)
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX + ":"},
    broker_connection_retry_on_startup=True,
    task_default_queue=queue_of(SCHEDULER),
    task_default_exchange=queue_of(SCHEDULER),
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    beat_max_loop_interval=INTERVAL,  # Celery 5.7's name (beat_max_interval before);
    # the beat command gets --max-interval too: redbeat's standby retries its lock that often
    beat_schedule={
        ENTRY: {
            "task": TASKS[SCHEDULER],
            "schedule": INTERVAL,
            "options": {"queue": queue_of(SCHEDULER)},
        }
    },
    # redbeat: its keys and lock under the round's prefix, the lock's timeout = TTL
    redbeat_redis_url=BROKER,
    redbeat_key_prefix=ROUND + ":redbeat:",
    redbeat_lock_timeout=int(TTL),
    # etcdfence: the same lifetime (session TTL), the run's names
    etcdfence_endpoints=ETCD.split("//", 1)[-1],
    etcdfence_election=PREFIX + "/beat",
    etcdfence_resource=PREFIX + "/workers",
    etcdfence_prefix=f"/{PREFIX}/",
    etcdfence_ttl=int(TTL),
)

_redis: redis.Redis | None = None


def _store() -> redis.Redis:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(BROKER)
    return _redis


@signals.before_task_publish.connect  # type: ignore[untyped-decorator]
def _stamp_sent(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if PAUSE_KEY and _store().delete(PAUSE_KEY):  # armed: this beat takes the pause
        note = {"origin": f"gen{os.getpid()}", SENT_HEADER: time.time()}
        _store().rpush(PAUSED, json.dumps(note | {"paused": note[SENT_HEADER]}))
        os.kill(os.getpid(), signal.SIGSTOP)
    if headers is not None:  # stamped after a pause: the time the message really left
        headers[SENT_HEADER] = time.time()


def _kept(headers: dict[str, Any]) -> dict[str, Any]:
    out = {k: headers.get(k) for k in (*KEPT, SENT_HEADER)}
    out.update({k: v for k, v in headers.items() if "token" in k or "slot" in k})
    return out


@signals.task_received.connect  # type: ignore[untyped-decorator]
def _log_received(request: Any = None, **_: Any) -> None:
    if request is None:
        return
    record = _kept(dict(request.request_dict)) | {"received": time.time()}
    _store().rpush(RECEIVED, json.dumps(record, default=str))


def _log_applied(headers: dict[str, Any], **extra: Any) -> None:
    record = _kept(headers) | {"applied": time.time(), **extra}
    _store().rpush(APPLIED, json.dumps(record, default=str))


@app.task(name=TASKS["redbeat"], bind=True)  # type: ignore[untyped-decorator]
def tick_redbeat(self: Any) -> None:
    """The redbeat side's effect: nothing fences it, so every message received is
    applied (a plain Celery task, as an application on redbeat has it)."""
    _log_applied(_request_headers(self.request))


def _request_headers(request: Any) -> dict[str, Any]:
    """The message headers as the task sees them (protocol 2 puts custom headers on the
    request context)."""
    names = (*KEPT, SENT_HEADER)
    out = {name: getattr(request, name, None) for name in names if name != "task"}
    out["task"] = request.task
    for key, value in vars(request).items():
        if "token" in key or "slot" in key:
            out[key] = value
    return out


def _fenced_side() -> None:
    """The etcdfence side of the worker: the fenced task (when etcdfence.celery exists)."""
    try:
        from etcdfence.celery import Fenced, FencedTask, TaskRefused, fenced_task
    except ImportError:
        return

    class BenchFencedTask(FencedTask):  # type: ignore[misc]
        """Logs each refusal (a stale term's message, a slot applied already)."""

        def on_refused(self, refused: TaskRefused) -> None:
            headers = _request_headers(self.request)
            record = _kept(headers) | {"refused": time.time(), "reason": refused.reason}
            _store().rpush(REFUSED, json.dumps(record, default=str))

    @fenced_task(app, name=TASKS["etcdfence"], base=BenchFencedTask)  # type: ignore[untyped-decorator]
    def tick_etcdfence(fenced: Fenced) -> None:
        """The etcdfence side's effect: one etcd key per slot, written through the fence
        (the worker refuses a stale token and a slot applied already)."""
        key = f"/{PREFIX}/effects/{fenced.slot}"
        revision = fenced.put(key, json.dumps({"token": fenced.token.value}))
        _log_applied(_request_headers(app.current_task.request), revision=revision)


_fenced_side()

"""The Celery app tests/test_celery.py runs as real ``celery beat`` and ``celery worker``
processes (``python -m celery -A _celery_app ...``), configured by the environment:

- ``CELERY_TEST_BROKER``, ``CELERY_TEST_QUEUE``: the broker URL and this test's own queue;
- ``CELERY_TEST_NS``: this test's namespace (election, resource, state prefix);
- ``CELERY_TEST_LOG``: an append-only JSON-lines log: ``sent`` (beat, before publish),
  ``applied`` and ``refused`` (worker);
- ``CELERY_TEST_TTL``: the beats' lease TTL; ``CELERY_TEST_FENCING=0``: the unsafe control;
- ``CELERY_TEST_PAUSE_AT=N``: the beat stops itself (SIGSTOP) right before its N-th
  publish, after its leadership check: a frozen beat holding a message;
- ``CELERY_TEST_KILL_AFTER=N``: the beat kills itself (SIGKILL) right after its N-th
  publish, before recording the slot;
- ``CELERY_TEST_QUEUE_ARGS``: JSON ``x-`` arguments the test's queue is declared with
  (``x-max-length`` with ``reject-publish``: a broker that refuses every publish);
- ``CELERY_TEST_CONF``: JSON merged into ``app.conf`` (``task_acks_late``, a bad
  ``etcdfence_*`` value, ...);
- ``CELERY_TEST_TASK_SLEEP=S``: a worker process's first task sleeps S s after it was
  admitted and before its effect (a worker killed mid-task);
- ``CELERY_TEST_ADVANCE=fail:N``: ``etcdfence_advance`` is :func:`flaky_advance`, whose
  first N calls in the process raise ``ConnectionError`` (a store briefly down) before
  advancing the etcd fence; ``CELERY_TEST_ADVANCE=exit``: it raises ``SystemExit`` (the
  elector thread dies).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from typing import Any

from celery import Celery
from celery.signals import after_task_publish, before_task_publish
from kombu.entity import Exchange, Queue

import etcdfence as ef
from etcdfence.celery import Fenced, FencedTask, TaskRefused, fenced_task

NS = os.environ.get("CELERY_TEST_NS", "t/celery-app")
LOG = os.environ.get("CELERY_TEST_LOG", os.devnull)

app = Celery("etcdfence_test", broker=os.environ.get("CELERY_TEST_BROKER", "memory://"))
app.conf.update(
    task_default_queue=os.environ.get("CELERY_TEST_QUEUE", "etcdfence-test"),
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_enable_remote_control=False,
    beat_max_loop_interval=1,
    etcdfence_election=f"{NS}/beat",
    etcdfence_resource=f"{NS}/workers",
    etcdfence_prefix=f"/{NS}/",
    etcdfence_ttl=int(os.environ.get("CELERY_TEST_TTL", "2")),
    etcdfence_fencing=os.environ.get("CELERY_TEST_FENCING", "1") == "1",
    beat_schedule={"tick": {"task": "_celery_app.tick", "schedule": 1.0}},
)
app.conf.update(json.loads(os.environ.get("CELERY_TEST_CONF") or "{}"))
if os.environ.get("CELERY_TEST_QUEUE_ARGS"):  # the queue declared with these arguments
    _queue = app.conf.task_default_queue
    app.conf.task_queues = [
        Queue(  # type: ignore[no-untyped-call]
            _queue,
            Exchange(_queue),  # type: ignore[no-untyped-call]
            routing_key=_queue,
            queue_arguments=json.loads(os.environ["CELERY_TEST_QUEUE_ARGS"]),
        )
    ]


def note(event: str, **fields: Any) -> None:
    """Append one line to the test's log (O_APPEND: whole lines from several processes)."""
    line = json.dumps({"event": event, "pid": os.getpid(), "time": time.time(), **fields})
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class RecordingTask(FencedTask):  # type: ignore[misc]
    """Records every refusal in the test's log."""

    def on_refused(self, refused: TaskRefused) -> None:
        request = self.request
        headers = getattr(request, "headers", None) or {}
        note(
            "refused",
            reason=refused.reason,
            slot=headers.get("etcdfence-slot"),
            token=headers.get("fencing-token"),
        )


_advance_mode, _, _advance_fails = os.environ.get("CELERY_TEST_ADVANCE", "").partition(":")
_advance_left = [int(_advance_fails or "0")]


def flaky_advance(token: ef.FencingToken) -> None:
    """The beat's ``etcdfence_advance`` hook of ``CELERY_TEST_ADVANCE``: advances the
    workers' etcd fence, after failing first as configured."""
    note("advance", token=token.value)
    if _advance_mode == "exit":
        raise SystemExit("the advance hook exits")
    if _advance_left[0] > 0:
        _advance_left[0] -= 1
        note("advance_failed", token=token.value)
        raise ConnectionError("the store is briefly unreachable")
    with ef.Client(timeout=5.0) as client:
        client.fence(f"{NS}/workers", lock=f"{NS}/beat").advance(token)


if _advance_mode:
    app.conf.etcdfence_advance = flaky_advance

_slept: list[bool] = []


@fenced_task(app, base=RecordingTask)
def tick(fenced: Fenced) -> None:
    """The periodic effect: one key per application, under the test's namespace."""
    note("started", slot=fenced.slot, token=fenced.token.value)
    if not _slept:  # the process's first task only: a worker killed mid-task
        _slept.append(True)
        time.sleep(float(os.environ.get("CELERY_TEST_TASK_SLEEP", "0")))
    key = f"/{NS}/effects/{fenced.slot}/{uuid.uuid4().hex}"
    revision = fenced.put(key, json.dumps({"token": fenced.token.value, "slot": fenced.slot}))
    note("applied", slot=fenced.slot, token=fenced.token.value, revision=revision)


_published = 0


@before_task_publish.connect  # type: ignore[untyped-decorator]
def _before_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    global _published
    headers = headers or {}
    if "etcdfence-slot" not in headers:
        return
    _published += 1
    note("sent", slot=headers["etcdfence-slot"], token=headers.get("fencing-token"))
    if os.environ.get("CELERY_TEST_PAUSE_AT") == str(_published):
        note("pausing", slot=headers["etcdfence-slot"])
        os.kill(os.getpid(), signal.SIGSTOP)
        note("resumed", slot=headers["etcdfence-slot"])


@after_task_publish.connect  # type: ignore[untyped-decorator]
def _after_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if (headers or {}).get("etcdfence-slot") and os.environ.get("CELERY_TEST_KILL_AFTER") == str(
        _published
    ):
        note("killing", slot=(headers or {})["etcdfence-slot"])
        os.kill(os.getpid(), signal.SIGKILL)

"""Structured log events and optional Prometheus metrics for etcdfence.

Every part of the library reports what happened through the helpers in this
module (:func:`fence_accepted`, :func:`fence_rejected`, :func:`leader_elected`,
:func:`leader_lost`, :func:`leader_changed`, :func:`lease_lost`). They

* log namespaced events (``etcdfence.fence_rejected``, ``etcdfence.leader_elected``,
  ...) through :mod:`etcdfence._log`: to structlog with their fields when the
  application configured structlog, else to the stdlib logger ``etcdfence``. The
  library never configures logging and never writes to stdout; an unconfigured
  application sees warnings on stderr only. The per-write success path logs nothing.
* update Prometheus collectors, but only after :func:`enable_metrics` was called.
  Metrics are off by default; ``prometheus_client`` comes with the ``metrics``
  extra (``pip install etcdfence[metrics]``). While metrics are off the helpers
  cost one global read plus the log call.

Collectors (all prefixed ``etcdfence_``):

=====================================  =========  =====================================
``etcdfence_fenced_write_seconds``     histogram  guarded write latency {resource, backend}
``etcdfence_fence_mark``               gauge      highest mark seen per {resource}
``etcdfence_stale_rejections_total``   counter    stale tokens rejected per {resource}
``etcdfence_is_leader``                gauge      1 while this process leads {election} (*)
``etcdfence_leader_token``             gauge      fencing token of the current term {election}
``etcdfence_leader_elected_total``     counter    terms won by this process {election}
``etcdfence_leader_lost_total``        counter    terms lost by this process {election}
``etcdfence_leader_changes_total``     counter    observed leader changes {election}
``etcdfence_leases_lost_total``        counter    sessions whose lease was lost
``etcdfence_lock_wait_seconds``        histogram  acquire/campaign until owned {kind, name}
``etcdfence_lock_hold_seconds``        histogram  owned until released or lost {kind, name}
``etcdfence_lock_held``                gauge      1 while this process holds {kind, name} (*)
``etcdfence_lock_acquired_total``      counter    holds/terms won {kind, name}
``etcdfence_lock_released_total``      counter    holds/terms ended {kind, name, reason}
``etcdfence_requests_total``           counter    etcd requests {method, code}
``etcdfence_request_errors_total``     counter    failed etcd requests {method, code}
``etcdfence_tasks_refused_total``      counter    fenced Celery tasks refused {task, reason}
=====================================  =========  =====================================

(*) computed when scraped, from the same answer as the holder's ``token`` and the
session's ``expired``: past the session's local deadline it is 0 at once, even while
the event loop or the library's threads are stalled and have not noticed the expiry.

``kind`` is ``lock`` or ``election`` (plain :class:`~etcdfence.Lock` /
:class:`~etcdfence.Election`, and the elector's campaigns); ``reason`` is
``resigned`` (released or resigned on purpose), ``expired`` (the session's local
deadline passed), ``revoked`` (etcd said the lease is gone) or ``deleted`` (the key
was deleted or replaced behind the holder's back). ``method`` is the etcd RPC
(``Range``, ``Txn``, ``LeaseGrant``, ``stream:Watch``, ...), ``code`` the gRPC status
name (``OK``, ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``CANCELLED``, ...).

``resource`` and ``election`` are label values: keep the number of distinct names
bounded (do not put request ids or timestamps into resource names).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _log
from .types import CallRecord

__all__ = [
    "METRIC_PREFIX",
    "disable_metrics",
    "enable_metrics",
    "fence_accepted",
    "fence_rejected",
    "hold_ended",
    "hold_started",
    "leader_changed",
    "leader_elected",
    "leader_lost",
    "lease_lost",
    "log",
    "metrics_enabled",
    "record_call",
    "task_duplicate",
    "task_refused",
]

#: Every collector name starts with this.
METRIC_PREFIX = "etcdfence_"

#: The library's logger (re-exported for modules that report through metrics).
log = _log.log

# Latency buckets for one guarded write: sub-millisecond (SQLite, local etcd) up to
# a few seconds (a transaction that waited for a row lock or a slow fsync).
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


# Waits for and holds of a lock: from immediate to an hour.
_HOLD_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


@dataclass(frozen=True)
class _Collectors:
    """The collectors registered in one registry."""

    registry: Any
    fenced_write_seconds: Any
    fence_mark: Any
    stale_rejections: Any
    is_leader: Any
    leader_token: Any
    leader_elected: Any
    leader_lost: Any
    leader_changes: Any
    leases_lost: Any
    lock_wait_seconds: Any
    lock_hold_seconds: Any
    lock_held: Any
    lock_acquired: Any
    lock_released: Any
    requests: Any
    request_errors: Any
    tasks_refused: Any


_lock = threading.Lock()
# The active collectors, or None while metrics are off. Read without the lock on the
# hot path: rebinding a module global is atomic, and a helper that races with
# enable/disable either updates the old or the new collectors, both harmless.
_active: _Collectors | None = None
# Collectors already created, per registry (creation must be idempotent: registering
# the same names twice in one registry raises in prometheus_client).
_by_registry: dict[int, _Collectors] = {}
# Last leader key observed per election, to count changes rather than notifications.
_last_leader: dict[str, str | None] = {}


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - exercised with a patched import
        raise ImportError(
            "etcdfence metrics need prometheus_client; install it with "
            "pip install 'etcdfence[metrics]'"
        ) from exc
    return prometheus_client


def _create(registry: Any) -> _Collectors:
    pc = _import_prometheus()
    p = METRIC_PREFIX
    return _Collectors(
        registry=registry,
        fenced_write_seconds=pc.Histogram(
            p + "fenced_write_seconds",
            "Latency of fenced writes (check-and-advance plus the caller's write), seconds.",
            ["resource", "backend"],
            registry=registry,
            buckets=_LATENCY_BUCKETS,
        ),
        fence_mark=pc.Gauge(
            p + "fence_mark",
            "Highest fencing token this process saw a resource accept (its high-water mark).",
            ["resource"],
            registry=registry,
        ),
        stale_rejections=pc.Counter(
            p + "stale_rejections",
            "Writes rejected because their fencing token was below the resource's mark.",
            ["resource"],
            registry=registry,
        ),
        is_leader=pc.Gauge(
            p + "is_leader",
            "1 while this process leads the election, else 0.",
            ["election"],
            registry=registry,
        ),
        leader_token=pc.Gauge(
            p + "leader_token",
            "Fencing token of this process's latest leadership term.",
            ["election"],
            registry=registry,
        ),
        leader_elected=pc.Counter(
            p + "leader_elected",
            "Leadership terms won by this process.",
            ["election"],
            registry=registry,
        ),
        leader_lost=pc.Counter(
            p + "leader_lost",
            "Leadership terms this process lost (lease expiry, resign, error).",
            ["election"],
            registry=registry,
        ),
        leader_changes=pc.Counter(
            p + "leader_changes",
            "Leader changes observed for the election (a new leader key).",
            ["election"],
            registry=registry,
        ),
        leases_lost=pc.Counter(
            p + "leases_lost",
            "Sessions whose lease expired or was revoked before they were closed.",
            registry=registry,
        ),
        **_create_lock_and_call_collectors(pc, registry),
    )


def _create_lock_and_call_collectors(pc: Any, registry: Any) -> dict[str, Any]:
    p = METRIC_PREFIX
    kn = ["kind", "name"]
    return {
        "lock_wait_seconds": pc.Histogram(
            p + "lock_wait_seconds",
            "Time from acquire()/campaign() to ownership, seconds.",
            kn,
            registry=registry,
            buckets=_HOLD_BUCKETS,
        ),
        "lock_hold_seconds": pc.Histogram(
            p + "lock_hold_seconds",
            "Time a lock was held / an election led, until released or lost, seconds.",
            kn,
            registry=registry,
            buckets=_HOLD_BUCKETS,
        ),
        "lock_held": pc.Gauge(
            p + "lock_held", "1 while this process holds the lock / leads.", kn, registry=registry
        ),
        "lock_acquired": pc.Counter(
            p + "lock_acquired", "Locks acquired / elections won.", kn, registry=registry
        ),
        "lock_released": pc.Counter(
            p + "lock_released",
            "Holds that ended, by reason: resigned, expired, revoked, deleted.",
            [*kn, "reason"],
            registry=registry,
        ),
        "requests": pc.Counter(
            p + "requests",
            "Requests sent to etcd (every attempt) and streams opened, by gRPC status.",
            ["method", "code"],
            registry=registry,
        ),
        "request_errors": pc.Counter(
            p + "request_errors",
            "Requests to etcd that failed (any status but OK), by gRPC status.",
            ["method", "code"],
            registry=registry,
        ),
        "tasks_refused": pc.Counter(
            p + "tasks_refused",
            "Fenced Celery tasks refused (stale, no_token, invalid, foreign, duplicate).",
            ["task", "reason"],
            registry=registry,
        ),
    }


def enable_metrics(registry: Any = None) -> None:
    """Start recording Prometheus metrics into ``registry`` (default: the global
    ``prometheus_client.REGISTRY``).

    Call it once at start-up in an application that exposes Prometheus metrics.
    Calling it again with the same registry reuses the collectors already created
    there; with another registry it switches recording to that one. Raises
    :class:`ImportError` naming ``pip install etcdfence[metrics]`` when
    ``prometheus_client`` is not installed.
    """
    global _active
    pc = _import_prometheus()
    if registry is None:
        registry = pc.REGISTRY
    with _lock:
        collectors = _by_registry.get(id(registry))
        if collectors is None or collectors.registry is not registry:
            collectors = _create(registry)
            _by_registry[id(registry)] = collectors
        _active = collectors


def disable_metrics() -> None:
    """Stop recording metrics (the helpers go back to logging only).

    Collectors stay registered and keep their last values; a later
    :func:`enable_metrics` with the same registry continues with them. Mostly for
    tests.
    """
    global _active
    with _lock:
        _active = None
        _last_leader.clear()


def metrics_enabled() -> bool:
    """Whether :func:`enable_metrics` is in effect."""
    return _active is not None


# -- helpers the library calls ------------------------------------------------------


def fence_accepted(resource: str, token: int, seconds: float, backend: str) -> None:
    """A guarded write with ``token`` was accepted by ``resource`` after ``seconds``.

    Called on the hot path of every fenced write: records latency and the mark,
    logs nothing.
    """
    m = _active
    if m is None:
        return
    m.fenced_write_seconds.labels(resource, backend).observe(seconds)
    m.fence_mark.labels(resource).set(token)


def fence_rejected(resource: str, token: int, current: int, seconds: float, backend: str) -> None:
    """A guarded write was refused: ``token`` is below the resource's mark ``current``.

    Logs the warning event ``etcdfence.fence_rejected`` (resource, token, current,
    gap, backend) and counts the rejection.
    """
    log.warning(
        "etcdfence.fence_rejected",
        resource=resource,
        token=token,
        current=current,
        gap=current - token,
        backend=backend,
    )
    m = _active
    if m is None:
        return
    m.stale_rejections.labels(resource).inc()
    m.fenced_write_seconds.labels(resource, backend).observe(seconds)
    m.fence_mark.labels(resource).set(current)


def _held_gauge(child: Any, holding: Callable[[], object] | None) -> None:
    """Make a 0/1 "held" gauge answer at scrape time: ``holding()`` is the holder's own
    answer (its session's deadline compared with the clock *now*), so a scrape from
    the metrics thread while the loop or the holder's threads are stalled past the
    deadline says 0, never a stale 1 that only the (stalled) expiry path would clear.
    ``None``: not held (0)."""
    if holding is None:
        child.set_function(lambda: 0.0)
    else:
        child.set_function(lambda: 1.0 if holding() else 0.0)


def leader_elected(
    election: str,
    token: int,
    identity: str | None,
    leading: Callable[[], object] | None = None,
) -> None:
    """This process won ``election``; ``token`` fences the new term. ``leading()``
    answers, at scrape time, whether the term still runs (default: until
    :func:`leader_lost`)."""
    log.info("etcdfence.leader_elected", election=election, token=token, identity=identity)
    m = _active
    if m is None:
        return
    _held_gauge(m.is_leader.labels(election), (lambda: True) if leading is None else leading)
    m.leader_token.labels(election).set(token)
    m.leader_elected.labels(election).inc()


_ROUTINE_LOSS = frozenset({"stopped", "work returned"})


def leader_lost(election: str, identity: str | None, reason: str) -> None:
    """This process no longer leads ``election`` (``reason``: why, e.g. ``"lease expired"``)."""
    # a deliberate stop is routine; anything else (expiry, key deleted) deserves a warning
    level = log.info if reason in _ROUTINE_LOSS else log.warning
    level("etcdfence.leader_lost", election=election, identity=identity, reason=reason)
    m = _active
    if m is None:
        return
    _held_gauge(m.is_leader.labels(election), None)
    m.leader_lost.labels(election).inc()


def leader_changed(election: str, leader_key: str | None) -> None:
    """An observer saw ``election``'s leader become ``leader_key`` (``None``: no leader).

    Counts a change only when a leader key differs from the last one observed for
    the election in this process, so repeated notifications for the same leader
    (a re-established watch, say) are not counted twice.
    """
    log.debug("etcdfence.leader_changed", election=election, leader_key=leader_key)
    m = _active
    if m is None:
        return
    with _lock:
        previous = _last_leader.get(election)
        _last_leader[election] = leader_key
    if leader_key is not None and leader_key != previous:
        m.leader_changes.labels(election).inc()


def lease_lost(lease_id: int, reason: str) -> None:
    """A session's lease is gone (expired, revoked, or its local deadline passed)."""
    log.warning("etcdfence.lease_lost", lease_id=f"{lease_id:x}", reason=reason)
    m = _active
    if m is None:
        return
    m.leases_lost.inc()


#: ``reason`` values of :func:`hold_ended` that are not a deliberate release.
LOSS_REASONS = frozenset({"expired", "revoked", "deleted"})
_HOLD_EVENTS = {
    "lock": ("etcdfence.lock_acquired", "etcdfence.lock_released", "etcdfence.lock_lost"),
    "election": ("etcdfence.elected", "etcdfence.resigned", "etcdfence.election_lost"),
    # the recipes: each side of a read-write lock and a semaphore permit is a hold too
    "read_lock": (
        "etcdfence.read_lock_acquired",
        "etcdfence.read_lock_released",
        "etcdfence.read_lock_lost",
    ),
    "write_lock": (
        "etcdfence.write_lock_acquired",
        "etcdfence.write_lock_released",
        "etcdfence.write_lock_lost",
    ),
    "semaphore": (
        "etcdfence.semaphore_acquired",
        "etcdfence.semaphore_released",
        "etcdfence.semaphore_lost",
    ),
}


def hold_started(
    kind: str,
    name: str,
    token: int,
    key: str,
    waited: float,
    holding: Callable[[], object] | None = None,
) -> None:
    """A plain lock was acquired / election won (``kind``: ``lock`` or ``election``)
    after waiting ``waited`` seconds; ``token`` fences the hold. ``holding()`` answers,
    at scrape time, whether it is still held (default: until :func:`hold_ended`)."""
    event = _HOLD_EVENTS[kind][0]
    log.info(event, **{kind: name}, token=token, key=key, wait_seconds=round(waited, 6))
    m = _active
    if m is None:
        return
    m.lock_wait_seconds.labels(kind, name).observe(waited)
    _held_gauge(m.lock_held.labels(kind, name), (lambda: True) if holding is None else holding)
    m.lock_acquired.labels(kind, name).inc()


def hold_ended(kind: str, name: str, token: int, held: float, reason: str) -> None:
    """A hold ended after ``held`` seconds: ``reason`` is ``resigned`` (released on
    purpose, an info event) or a loss — ``expired``, ``revoked``, ``deleted`` — logged
    as a warning (``etcdfence.lock_lost`` / ``etcdfence.election_lost``)."""
    _, released, lost = _HOLD_EVENTS[kind]
    fields = {kind: name, "token": token, "held_seconds": round(held, 6), "reason": reason}
    if reason in LOSS_REASONS:
        log.warning(lost, **fields)
    else:
        log.info(released, **fields)
    m = _active
    if m is None:
        return
    m.lock_hold_seconds.labels(kind, name).observe(held)
    _held_gauge(m.lock_held.labels(kind, name), None)
    m.lock_released.labels(kind, name, reason).inc()


def record_call(record: CallRecord) -> None:
    """Count one etcd request attempt (a :class:`~etcdfence.CallRecord`) by method and
    gRPC status code. The client's connection calls it while metrics are on."""
    m = _active
    if m is None:
        return
    m.requests.labels(record.method, record.code).inc()
    if record.code != "OK":
        m.request_errors.labels(record.method, record.code).inc()


def task_refused(task: str, reason: str, detail: str, **fields: Any) -> None:
    """A fenced Celery task was refused before or at its effect (``reason``: ``stale``,
    ``no_token``, ``invalid``, ``foreign``): the warning ``etcdfence.task_refused``."""
    log.warning("etcdfence.task_refused", task=task, reason=reason, detail=detail, **fields)
    m = _active
    if m is None:
        return
    m.tasks_refused.labels(task, reason).inc()


def task_duplicate(task: str, slot: str, token: int) -> None:
    """A fenced Celery task's slot was applied already (a resend after a failover, a
    redelivery): the info event ``etcdfence.task_duplicate``, counted as reason
    ``duplicate``. Not an error: the slot's effect exists once."""
    log.info("etcdfence.task_duplicate", task=task, slot=slot, token=token)
    m = _active
    if m is None:
        return
    m.tasks_refused.labels(task, "duplicate").inc()

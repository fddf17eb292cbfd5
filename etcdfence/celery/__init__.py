"""Exactly one Celery beat, fenced all the way to the worker (extra ``celery``).

- :class:`LeaderScheduler`: ``celery -A proj beat --scheduler
  etcdfence.celery:LeaderScheduler`` sends periodic tasks only while it leads an etcd
  election, stamps every task with the term's fencing token (header ``fencing-token``)
  and its slot id (header ``etcdfence-slot``: the entry and its scheduled time), and
  advances the workers' mark at election, before its first publish;
- the worker side, :class:`FencedTask` / :func:`fenced_task`: the task gets its token
  and a fence (any backend); a stale, tokenless or foreign task is refused (logged,
  counted, not retried) and a slot's effect is applied once.

Settings are ``app.conf`` keys with an ``etcdfence_`` prefix (:class:`Settings`). The
README's "Exactly one Celery beat" walks through both run modes.
"""

from __future__ import annotations

try:
    import celery as _celery  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without celery
    raise ImportError(
        "etcdfence.celery needs Celery; install it with `pip install 'etcdfence[celery]'`"
    ) from exc

from ._config import CeleryConfigError, Settings
from .scheduler import ElectorDiedError, LeaderScheduler
from .worker import (
    REASONS,
    SLOT_HEADER,
    TOKEN_HEADER,
    Fenced,
    FencedTask,
    TaskRefused,
    fence_for,
    fenced_task,
    refusals,
)

__all__ = [
    "REASONS",
    "SLOT_HEADER",
    "TOKEN_HEADER",
    "CeleryConfigError",
    "ElectorDiedError",
    "Fenced",
    "FencedTask",
    "LeaderScheduler",
    "Settings",
    "TaskRefused",
    "fence_for",
    "fenced_task",
    "refusals",
]

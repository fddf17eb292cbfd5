"""The recorder: the event log of one contender, kept by the contender itself.

Use a :class:`Recorder` in every contender of a test (one process or thread each): record
``campaign`` / ``elected`` / ``lost`` and each write with its outcome, or let
:meth:`Recorder.guarded_put` do the write through a :class:`~etcdfence.FenceGuard` and
record it. Give it ``jsonl_sink(sys.stdout)`` in a child process and read the lines back
with :func:`~etcdfence.history.parse_events` in the parent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import NotOwnerError, RequestError, StaleTokenError, UnavailableError
from .events import EVENT_KINDS, Event, write_value


@dataclass(frozen=True)
class PendingWrite:
    """A write attempt returned by :meth:`Recorder.write`; pass it to the outcome."""

    write_id: str
    token: int
    resource: str
    key: str
    value: str


class Recorder:
    """The event log of one contender (thread-safe).

    ``deadline`` is a callable returning the session's local deadline (or ``None``);
    it is sampled into every event, which is how the checker knows until when the
    contender may have believed it led.
    """

    def __init__(
        self,
        contender: str,
        sink: Callable[[Event], None] | None = None,
        *,
        deadline: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.contender = contender
        self.events: list[Event] = []
        self._sink = sink
        self._deadline = deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.term: int | None = None

    def set_deadline_source(self, deadline: Callable[[], float | None] | None) -> None:
        """Change where the session deadline is sampled from (e.g. a new session)."""
        self._deadline = deadline

    def emit(self, kind: str, **fields: Any) -> Event:
        """Record an event of ``kind`` now (the helpers below are the usual way)."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        if "deadline" not in fields and self._deadline is not None:
            fields["deadline"] = self._deadline()
        with self._lock:
            event = Event(t=self._clock(), contender=self.contender, kind=kind, **fields)
            self.events.append(event)
        if self._sink is not None:
            self._sink(event)
        return event

    def campaign(self, **fields: Any) -> Event:
        """About to campaign (or acquire)."""
        return self.emit("campaign", **fields)

    def elected(self, token: Any, **fields: Any) -> Event:
        """Won: a term with ``token`` (a :class:`~etcdfence.FencingToken` or int) starts;
        record it as soon as the campaign returns."""
        value = int(token)
        self.term = value
        key = getattr(token, "key", None)
        lease = getattr(token, "lease_id", None)
        fields.setdefault("key", key)
        fields.setdefault("lease", lease)
        return self.emit("elected", token=value, **fields)

    def lost(self, reason: str = "", **fields: Any) -> Event:
        """The term ended (expired, resigned, revoked): record it *before* resigning."""
        term, self.term = self.term, None
        return self.emit("lost", token=term, detail=reason or None, **fields)

    def note(self, detail: str, **fields: Any) -> Event:
        """Anything else worth seeing in a report (ignored by the checks)."""
        return self.emit("note", detail=detail, **fields)

    def write(self, resource: str, key: str, token: Any, **fields: Any) -> PendingWrite:
        """About to write ``key`` of ``resource`` with ``token``: returns the write, whose
        ``value`` (see :func:`write_value`) is what to store. Record its outcome next."""
        value = int(token)
        with self._lock:
            self._seq += 1
            write_id = f"{self.contender}#{self._seq}"
        pending = PendingWrite(write_id, value, resource, key, write_value(write_id, value))
        self.emit("write", token=value, resource=resource, key=key, write_id=write_id, **fields)
        return pending

    def accepted(self, write: PendingWrite, revision: int, **fields: Any) -> Event:
        """The write was acknowledged at ``revision``."""
        return self._outcome("accepted", write, revision=revision, **fields)

    def rejected(self, write: PendingWrite, current: int | None = None, **fields: Any) -> Event:
        """The resource refused the write (``current``: its mark, if it said)."""
        return self._outcome("rejected", write, current=current, **fields)

    def unknown(self, write: PendingWrite, error: str = "", **fields: Any) -> Event:
        """The outcome is unknown (timeout, connection lost): it may or may not be applied."""
        return self._outcome("unknown", write, detail=error or None, **fields)

    def _outcome(self, kind: str, write: PendingWrite, **fields: Any) -> Event:
        return self.emit(
            kind,
            token=write.token,
            resource=write.resource,
            key=write.key,
            write_id=write.write_id,
            **fields,
        )

    def guarded_put(self, guard: Any, token: Any, key: str, **fields: Any) -> bool | None:
        """Write ``key`` through a sync :class:`~etcdfence.FenceGuard` and record it:
        True if accepted, False if rejected (stale token, or not the owner with
        ``require_owner=True``), None if the outcome is unknown (etcd unavailable or the
        request failed). Other errors (bad arguments, auth) propagate."""
        pending = self.write(guard.resource, key, token, **fields)
        try:
            revision = guard.put(token, key, pending.value)
        except StaleTokenError as err:
            self.rejected(pending, err.current)
            return False
        except NotOwnerError as err:
            self.rejected(pending, detail=f"not the owner: {err}")
            return False
        except (UnavailableError, RequestError) as err:
            self.unknown(pending, f"{type(err).__name__}: {err}")
            return None
        self.accepted(pending, revision)
        return True

"""Schedule slots: the times an entry is due, computed the same way by every beat.

A slot is an entry's *scheduled* time, never "now": the time a beat happened to look.
Two beats that agree on the last slot recorded in etcd therefore agree on every later
one, so a new leader resends exactly the slots the old one did not record, and the slot
id (``<entry>@<UTC time>``) names the same effect whichever beat sends it.

- interval schedules (``schedule(run_every=...)``, a ``timedelta`` or a number of
  seconds in ``beat_schedule``): the multiples of the period since the Unix epoch
  (UTC), to the microsecond — a 1-minute entry is due at every whole minute, a 10 s one
  at :00, :10, ...;
- ``crontab``: the next time the crontab matches after the recorded slot (celery's own
  ``remaining_delta``, in the schedule's time zone).

Other schedule kinds (``solar``, custom classes) are refused with a clear error: their
next time depends on when they are asked.
"""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import dataclass
from typing import Any

from ._config import CeleryConfigError

__all__ = ["Clock", "Slot", "clock_for", "parse_time", "slot_id", "utc_text"]

_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_US = dt.timedelta(microseconds=1)
#: Slots a crontab catch-up steps through at most before starting again from now.
_MAX_STEPS = 100_000


def utc_text(at: dt.datetime) -> str:
    """``at`` as UTC text: ``2025-01-31T12:00:00Z`` (``.ffffff`` only when needed)."""
    at = at.astimezone(_UTC)
    text = at.strftime("%Y-%m-%dT%H:%M:%S")
    if at.microsecond:
        text += f".{at.microsecond:06d}"
    return text + "Z"


def parse_time(text: str) -> dt.datetime:
    """The inverse of :func:`utc_text`."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(_UTC)


def slot_id(entry: str, at: dt.datetime) -> str:
    """The slot id a task carries in its ``etcdfence-slot`` header: ``<entry>@<UTC>``."""
    return f"{entry}@{utc_text(at)}"


@dataclass(frozen=True)
class Slot:
    """One due occurrence of a schedule entry."""

    entry: str
    at: dt.datetime

    @property
    def id(self) -> str:
        return slot_id(self.entry, self.at)


class Clock:
    """The slot times of one entry's schedule."""

    def after(self, at: dt.datetime) -> dt.datetime:
        """The first slot strictly after ``at``."""
        raise NotImplementedError

    def first(self, now: dt.datetime) -> dt.datetime:
        """The first slot at or after ``now`` (an entry with no recorded slot)."""
        return self.after(now - _US)

    def skip_to(self, start: dt.datetime, now: dt.datetime, keep: int) -> tuple[dt.datetime, int]:
        """Bounded catch-up: of the slots from ``start`` up to ``now``, keep the last
        ``keep``; return the first slot kept (or the next one after ``now`` when none is
        due) and how many were skipped (a lower bound once more than 100,000 slots are
        due: the count stops there and resumes from a day before ``now``)."""
        recent: collections.deque[dt.datetime] = collections.deque(maxlen=keep)
        at, due = start, 0
        while at <= now:
            recent.append(at)
            due += 1
            if due > _MAX_STEPS:  # years of a minutely crontab: count no further
                resume, skipped = self.skip_to(self.first(now - dt.timedelta(days=1)), now, keep)
                return resume, skipped + due - 1
            at = self.after(at)
        if not recent:
            return start, 0
        return recent[0], due - len(recent)


class IntervalClock(Clock):
    """Slots at the multiples of ``period`` since the Unix epoch (UTC)."""

    def __init__(self, period: dt.timedelta) -> None:
        self.period_us = period // _US
        if self.period_us <= 0:
            raise CeleryConfigError(f"an interval schedule needs a positive period, got {period}")

    def _at(self, k: int) -> dt.datetime:
        return _EPOCH + dt.timedelta(microseconds=k * self.period_us)

    def _index(self, at: dt.datetime) -> int:
        """The index of the last slot at or before ``at``."""
        return ((at.astimezone(_UTC) - _EPOCH) // _US) // self.period_us

    def after(self, at: dt.datetime) -> dt.datetime:
        return self._at(self._index(at) + 1)

    def skip_to(self, start: dt.datetime, now: dt.datetime, keep: int) -> tuple[dt.datetime, int]:
        if start > now:
            return start, 0
        due = self._index(now) - self._index(start - _US)  # slots in [start, now]
        if due <= keep:
            return start, 0
        return self._at(self._index(now) - keep + 1), due - keep


class CrontabClock(Clock):
    """Slots where a celery ``crontab`` matches, in its own time zone."""

    def __init__(self, crontab: Any) -> None:
        self.crontab = crontab

    def after(self, at: dt.datetime) -> dt.datetime:
        last, delta, _now = self.crontab.remaining_delta(at)
        nxt: dt.datetime = last + delta
        if nxt <= at:  # never go backwards (a DST fold): the next minute on
            nxt = self.after(at + dt.timedelta(minutes=1) - _US)
        return nxt.astimezone(_UTC)


def clock_for(entry_name: str, schedule: Any) -> Clock:
    """The :class:`Clock` of a celery schedule; :class:`CeleryConfigError` for a kind
    whose slots are not a function of the previous slot."""
    from celery import schedules

    if isinstance(schedule, schedules.crontab):
        return CrontabClock(schedule)
    if type(schedule) is schedules.schedule:
        return IntervalClock(schedule.run_every)
    raise CeleryConfigError(
        f"beat_schedule entry {entry_name!r}: etcdfence.celery schedules interval and "
        f"crontab entries, not {type(schedule).__name__} (its due times depend on when "
        "it is asked, so two beats could not agree on its slots)"
    )

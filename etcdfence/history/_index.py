"""The checker's view of a history: writes, outcomes and etcd's changes, indexed once.

:class:`HistoryIndex` is built from a :class:`~etcdfence.history.History` and shared
by every invariant; :class:`Invariant` is the base of the invariant families (in
``_write_checks`` and ``_term_checks``), each of which adds its
:class:`~etcdfence.history.Violation`\\ s to one list.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._keys import MARK_WIDTH
from .events import OUTCOMES, Change, Event, parse_write_value
from .report import Violation

if TYPE_CHECKING:
    from .checker import History
    from .layout import Layout


class HistoryIndex:
    """A history's events and changes, sorted, and the lookups the invariants share:
    writes and their first outcome by write id, acknowledgements, which change applied
    each write, the tokens each resource accepted, and the changes of each data key."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.events = sorted(history.events, key=lambda e: e.t)
        self.changes = sorted(history.changes, key=lambda c: c.revision)
        self.layout = history.layout
        self.writes = {e.write_id: e for e in self.events if e.kind == "write" and e.write_id}
        self.outcomes: dict[str, Event] = {}
        for event in self.events:
            if event.kind in OUTCOMES and event.write_id:
                self.outcomes.setdefault(event.write_id, event)
        self.accepted = [e for e in self.events if e.kind == "accepted"]
        self.applied: dict[str, Change] = {}  # write id -> the change that applied it
        self.per_resource: dict[str, list[tuple[int, Change]]] = {}  # resource -> tokens
        self.data_writes: dict[str, list[Change]] = {}  # data key -> changes, revision order
        self.observed = self.layout is not None and bool(self.changes)
        if self.layout is not None:
            for change in self.changes:
                self._index(self.layout, change)

    def _index(self, layout: Layout, change: Change) -> None:
        kind = layout.classify(change.key)
        if kind is None or kind[0] == "election":
            return
        if kind[0] == "mark":
            token = None if change.deleted else _decode_mark(change.value)
            if token is not None:
                self.per_resource.setdefault(kind[1], []).append((token, change))
            return
        self.data_writes.setdefault(change.key, []).append(change)
        parsed = None if change.deleted else parse_write_value(change.value)
        if parsed is not None:
            self.applied.setdefault(parsed[0], change)
            self.per_resource.setdefault(kind[1], []).append((parsed[1], change))


class Invariant:
    """One family of invariants: :meth:`run` checks them on the shared index and adds
    what it finds to ``violations``; subclasses may keep counts for the stats."""

    def __init__(self, index: HistoryIndex, violations: list[Violation]) -> None:
        self.index = index
        self.violations = violations

    def run(self) -> None:
        """Check this family's invariants."""
        raise NotImplementedError

    def add(self, kind: str, message: str, events: Iterable[Event | None] = (),
            changes: Iterable[Change | None] = ()) -> None:  # fmt: skip
        """Record a violation of ``kind`` with the events and changes that show it."""
        self.violations.append(
            Violation(
                kind,
                message,
                tuple(e for e in events if e is not None),
                tuple(c for c in changes if c is not None),
            )
        )


def _decode_mark(value: str) -> int | None:
    """The token part of a FenceGuard mark (``<token>`` or ``<token>:<epoch>``)."""
    token, _, epoch = value.strip().partition(":")
    if token.isdigit() and len(token) <= MARK_WIDTH and (not epoch or epoch.isdigit()):
        return int(token)
    return None


class AckIndex:
    """Per resource, the highest token acknowledged up to each moment."""

    def __init__(self, accepted: list[Event]) -> None:
        self._times: dict[str | None, list[float]] = {}
        self._best: dict[str | None, list[Event]] = {}
        for ack in sorted(accepted, key=lambda e: e.t):
            times = self._times.setdefault(ack.resource, [])
            best = self._best.setdefault(ack.resource, [])
            top = best[-1] if best else None
            times.append(ack.t)
            best.append(ack if top is None or (ack.token or 0) > (top.token or 0) else top)

    def higher_before(self, write: Event) -> Event | None:
        """The first acknowledgement of a token above ``write``'s before it started."""
        times = self._times.get(write.resource)
        if not times:
            return None
        index = bisect.bisect_left(times, write.t)  # acknowledgements strictly before
        if index == 0:
            return None
        top = self._best[write.resource][index - 1]
        return top if (top.token or 0) > (write.token or 0) else None

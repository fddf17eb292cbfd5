"""The checker: :func:`check` a :class:`History` against every invariant of the package.

Each family of invariants is one class (``_write_checks``, ``_term_checks``) run on one
shared index of the history; this module collects the history, runs them, and counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._index import HistoryIndex, Invariant
from ._term_checks import Overlaps, Phantoms, TermTokens
from ._write_checks import AcknowledgedWrites, LateWrites, StaleWrites, TokenOrder
from .events import Change, Event
from .layout import Layout
from .report import CheckResult, Violation, history_slice
from .terms import build_terms

if TYPE_CHECKING:
    from .observer import Observer


@dataclass
class History:
    """Everything the checker looks at.

    ``changes`` (from an :class:`Observer`) and ``final`` (key → value read at the end)
    are optional; checks that need them are skipped without them. ``layout`` tells
    which observed keys are marks, data and contender keys. ``observed_from`` is the
    first revision the observer covered (phantom-leader checks need full coverage).
    """

    events: list[Event]
    changes: list[Change] = field(default_factory=list)
    final: dict[str, str] | None = None
    layout: Layout | None = None
    observed_from: int | None = None

    @classmethod
    def collect(
        cls,
        events: Iterable[Event],
        observer: Observer | None = None,
        final: Mapping[str, str] | None = None,
    ) -> History:
        """A history from events (any order) and, optionally, an observer's changes."""
        ordered = sorted(events, key=lambda e: e.t)
        if observer is None:
            return cls(ordered, final=None if final is None else dict(final))
        return cls(
            ordered,
            observer.changes,
            None if final is None else dict(final),
            observer.layout,
            observer.start_revision,
        )

    def read_final(self, client: Any) -> dict[str, str]:
        """Read the data keys named by the events from a sync client into ``final``."""
        final: dict[str, str] = {}
        for key in sorted({e.key for e in self.events if e.kind == "write" and e.key}):
            kv = client.get(key)
            if kv is not None:
                final[key] = kv.value.decode("utf-8", "replace")
        self.final = final
        return final


def check(history: History, *, context: float = 0.5) -> CheckResult:
    """Check every invariant listed in :mod:`etcdfence.history`.

    ``context`` is how many seconds of events around each violation go into the slice.
    """
    index = HistoryIndex(history)
    violations: list[Violation] = []
    stale = StaleWrites(index, violations)
    late = LateWrites(index, violations)
    terms = build_terms(index.events)
    families: list[Invariant] = [
        TokenOrder(index, violations),
        stale,
        AcknowledgedWrites(index, violations),
        late,
        TermTokens(index, violations, terms),
        Phantoms(index, violations, terms),
        Overlaps(index, violations, terms),
    ]
    for family in families:
        family.run()
    outcomes = list(index.outcomes.values())
    stats = {
        "contenders": len({e.contender for e in index.events}),
        "terms": len(terms),
        "writes": len(index.writes),
        "accepted": sum(1 for o in outcomes if o.kind == "accepted"),
        "rejected": sum(1 for o in outcomes if o.kind == "rejected"),
        "unknown": sum(1 for o in outcomes if o.kind == "unknown"),
        "stale_attempted": stale.stale_attempted,
        "stale_accepted": stale.stale_accepted,
        "late_writes": late.late,
        "violations": len(violations),
    }
    window = history_slice(violations, index.events, index.changes, context)
    return CheckResult(violations, stats, terms, window)

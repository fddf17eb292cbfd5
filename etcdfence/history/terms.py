"""Leadership terms as each contender believed them, from its own events."""

from __future__ import annotations

from dataclasses import dataclass

from .events import Event

_INF = float("inf")


@dataclass(frozen=True)
class Term:
    """One leadership term as the contender believed it: ``[start, end)``."""

    contender: str
    token: int
    start: float
    end: float
    elected: Event
    closed_by: Event | None

    @property
    def believed(self) -> bool:
        """Whether the interval is non-empty (elected before its deadline passed)."""
        return self.end > self.start


def build_terms(events: list[Event]) -> list[Term]:
    """Leadership terms per contender from its ``elected``/``lost`` events and the
    latest ``deadline`` it reported while leading."""
    terms: list[Term] = []
    by_contender: dict[str, list[Event]] = {}
    for event in sorted(events, key=lambda e: e.t):
        by_contender.setdefault(event.contender, []).append(event)

    def term(cur: Event, at: float, by: Event | None, deadline: float | None) -> Term:
        end = at if deadline is None else min(at, deadline)
        return Term(cur.contender, cur.token or 0, cur.t, end, cur, by)

    for own in by_contender.values():
        current: Event | None = None
        deadline: float | None = None
        for event in own:
            if event.kind == "elected":
                if current is not None:
                    terms.append(term(current, event.t, event, deadline))
                current, deadline = event, event.deadline
                continue
            if current is None:
                continue
            if event.deadline is not None:
                deadline = event.deadline if deadline is None else max(deadline, event.deadline)
            if event.kind == "lost":
                terms.append(term(current, event.t, event, deadline))
                current, deadline = None, None
        if current is not None:
            terms.append(term(current, _INF, None, deadline))
    terms.sort(key=lambda term: (term.start, term.token))
    return terms

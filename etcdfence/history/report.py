"""The checker's verdict: violations, counts, and the offending slice of history.

:class:`CheckResult` is what :func:`~etcdfence.history.check` returns; ``str(result)``
is a one-line verdict and :meth:`CheckResult.report` adds every violation and the part
of the history around them. :func:`describe_events` prints a whole small history in the
same form when no violation points at a slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .events import OUTCOMES, Change, Event
from .terms import Term


@dataclass(frozen=True)
class Violation:
    """One broken invariant, with the events and changes that show it."""

    kind: str
    message: str
    events: tuple[Event, ...] = ()
    changes: tuple[Change, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class CheckResult:
    """The checker's verdict: ``bool(result)`` / ``result.ok``, ``str(result)`` (one line),
    ``violations``, ``stats``, ``terms``, ``slice`` (the offending part of the history,
    one line per event/change) and :meth:`report`."""

    violations: list[Violation]
    stats: dict[str, int]
    terms: list[Term]
    slice: list[str]

    @property
    def ok(self) -> bool:
        """No violations."""
        return not self.violations

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        s = self.stats
        summary = (
            f"{s['contenders']} contenders, {s['terms']} terms, {s['writes']} writes "
            f"({s['accepted']} accepted, {s['rejected']} rejected, {s['unknown']} unknown), "
            f"stale writes {s['stale_attempted']} attempted / {s['stale_accepted']} accepted"
        )
        if self.ok:
            return f"OK: {summary}, 0 violations"
        kinds = sorted({v.kind for v in self.violations})
        return (
            f"FAIL: {len(self.violations)} violation(s) [{', '.join(kinds)}]; "
            f"first: {self.violations[0]}; {summary}"
        )

    def report(self) -> str:
        """The verdict, every violation and the offending slice of history."""
        lines = [str(self)]
        for violation in self.violations:
            lines.append(f"  - {violation}")
        if self.slice:
            lines.append("offending slice of history:")
            lines.extend(f"    {line}" for line in self.slice)
        return "\n".join(lines)


def describe_events(events: Iterable[Event]) -> list[str]:
    """Every event as one line, in time order, a write and its outcome on one line and
    runs of similar writes folded: a whole small history in the form of a report's slice.
    Use it to show what happened when no violation points at a slice (the conformance
    kit's own findings)."""
    ordered = sorted(events, key=lambda e: e.t)
    return _event_lines(ordered, set(range(len(ordered))), set())


def history_slice(
    violations: list[Violation], events: list[Event], changes: list[Change], context: float
) -> list[str]:
    """The part of the history around the violations: the involved contenders' events
    within ``context`` seconds (every contender's elected/lost events too, and the
    election that started each involved term), and the changes near the revisions
    involved. A write and its outcome share one line."""
    if not violations:
        return []
    involved = [e for v in violations for e in v.events]
    chosen = _chosen_events(involved, events, context)
    lines = _event_lines(events, chosen, {id(e) for e in involved})
    lines += _changes_near(violations, involved, changes)
    limit = 120
    if len(lines) > limit:
        half = limit // 2
        lines = [*lines[:half], f"... {len(lines) - limit} lines left out ...", *lines[-half:]]
    return lines


def _chosen_events(involved: list[Event], events: list[Event], context: float) -> set[int]:
    """Indexes into ``events`` worth showing around the ``involved`` events."""
    chosen: set[int] = set()
    if not involved:
        return chosen
    lo = min(e.t for e in involved) - context
    hi = max(e.t for e in involved) + context
    who = {e.contender for e in involved}
    for index, event in enumerate(events):
        if lo <= event.t <= hi and (event.contender in who or event.kind in ("elected", "lost")):
            chosen.add(index)
    for contender in who:
        starts = [
            i
            for i, e in enumerate(events)
            if e.contender == contender and e.kind == "elected" and e.t < lo
        ]
        if starts:
            chosen.add(starts[-1])
    return chosen


def _with_outcome(event: Event, outcome: Event | None) -> str:
    """An event's line; a write's carries its outcome (``-> accepted at t=...``)."""
    line = event.describe()
    if outcome is None:
        return line
    tail = outcome.kind
    if outcome.revision is not None:
        tail += f" revision={outcome.revision}"
    if outcome.current is not None:
        tail += f" current={outcome.current}"
    if outcome.detail:
        tail += f" ({outcome.detail})"
    return f"{line} -> {tail} at t={outcome.t:.3f}"


def _event_lines(events: list[Event], chosen: set[int], key_events: set[int]) -> list[str]:
    """The chosen events as lines, a run of more than three uneventful writes of one
    contender, token and outcome folded to its first and last."""
    outcome_of = {e.write_id: e for e in events if e.kind in OUTCOMES and e.write_id is not None}
    lines: list[str] = []
    run: list[str] = []  # consecutive uneventful writes of one contender/token/outcome
    run_sig: tuple[str, int | None, str] | None = None

    def flush() -> None:
        if len(run) > 3:
            lines.extend([run[0], f"... {len(run) - 2} similar writes ...", run[-1]])
        else:
            lines.extend(run)
        run.clear()

    for index, event in enumerate(events):
        if index not in chosen or (event.kind in OUTCOMES and event.write_id is not None):
            continue
        outcome = outcome_of.get(event.write_id or "") if event.kind == "write" else None
        line = _with_outcome(event, outcome)
        plain = (
            event.kind == "write" and id(event) not in key_events and id(outcome) not in key_events
        )
        signature = (event.contender, event.token, "" if outcome is None else outcome.kind)
        if not plain or signature != run_sig:
            flush()
            run_sig = signature if plain else None
        (run if plain else lines).append(line)
    flush()
    return lines


def _changes_near(
    violations: list[Violation], involved: list[Event], changes: list[Change]
) -> list[str]:
    """etcd's changes within two revisions of any revision the violations involve."""
    revisions = sorted(
        {c.revision for v in violations for c in v.changes}
        | {e.revision for e in involved if e.revision}
    )
    shown: set[int] = set()
    for revision in revisions:
        for change in changes:
            if abs(change.revision - revision) <= 2 and id(change) not in shown:
                shown.add(id(change))
    if not shown:
        return []
    return [
        "etcd's history near the revisions involved:",
        *(c.describe() for c in changes if id(c) in shown),
    ]

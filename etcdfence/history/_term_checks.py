"""The invariants about terms: tokens, who really led, and who believed it led.

``term-token-duplicate`` / ``term-token-order`` (:class:`TermTokens`),
``phantom-leader`` (:class:`Phantoms`) and ``leadership-overlap`` (:class:`Overlaps`);
see :mod:`etcdfence.history` for what each asserts.
"""

from __future__ import annotations

import itertools

from ._index import HistoryIndex, Invariant
from .events import Change
from .report import Violation
from .terms import Term


class TermTokens(Invariant):
    """``term-token-duplicate`` / ``term-token-order``."""

    def __init__(self, index: HistoryIndex, violations: list[Violation], terms: list[Term]) -> None:
        super().__init__(index, violations)
        self.terms = terms

    def run(self) -> None:
        """Each term's token is unique and increasing (per contender, and by start)."""
        seen: dict[int, Term] = {}
        last_per_contender: dict[str, Term] = {}
        for term in self.terms:
            other = seen.setdefault(term.token, term)
            if other is not term:
                self.add(
                    "term-token-duplicate",
                    f"token {term.token} was handed to {other.contender} "
                    f"(t={other.start:.3f}) and to {term.contender} (t={term.start:.3f})",
                    (other.elected, term.elected),
                )
            previous = last_per_contender.get(term.contender)
            if previous is not None and term.token <= previous.token:
                self.add(
                    "term-token-order",
                    f"{term.contender}'s term at t={term.start:.3f} has token {term.token}, "
                    f"not above its previous term's {previous.token}",
                    (previous.elected, term.elected),
                )
            last_per_contender[term.contender] = term
        believed = [term for term in self.terms if term.believed]
        for earlier, later in itertools.pairwise(believed):
            if later.contender != earlier.contender and later.token < earlier.token:
                self.add(
                    "term-token-order",
                    f"{later.contender}'s term starting t={later.start:.3f} has token "
                    f"{later.token}, below {earlier.contender}'s earlier term's "
                    f"{earlier.token}",
                    (earlier.elected, later.elected),
                )


class Phantoms(Invariant):
    """``phantom-leader``: each elected key really was the first at its token's revision."""

    def __init__(self, index: HistoryIndex, violations: list[Violation], terms: list[Term]) -> None:
        super().__init__(index, violations)
        self.terms = terms

    def run(self) -> None:
        """At the revision of its token, an elected contender's key was the first (needs
        the observer's changes from before the run started)."""
        layout, observed_from = self.index.layout, self.index.history.observed_from
        if not self.index.observed or layout is None or observed_from is None:
            return
        prefix = layout.election + "/"
        election = [c for c in self.index.changes if c.key.startswith(prefix)]
        live: dict[str, Change] = {}
        index = 0
        for term in sorted(self.terms, key=lambda t: t.token):
            if term.token < observed_from or term.elected.key is None:
                continue
            while index < len(election) and election[index].revision <= term.token:
                change = election[index]
                if change.deleted:
                    live.pop(change.key, None)
                else:
                    live[change.key] = change
                index += 1
            first = min(live.values(), key=lambda c: c.create_revision, default=None)
            if first is None or first.key != term.elected.key:
                self.add(
                    "phantom-leader",
                    f"{term.contender} was elected with token {term.token} as "
                    f"{term.elected.key}, but at revision {term.token} etcd's leader was "
                    f"{None if first is None else first.key}",
                    (term.elected,),
                    (first,),
                )


class Overlaps(Invariant):
    """``leadership-overlap``: believed-leadership intervals never overlap."""

    def __init__(self, index: HistoryIndex, violations: list[Violation], terms: list[Term]) -> None:
        super().__init__(index, violations)
        self.terms = terms

    def run(self) -> None:
        """No two believed-leadership intervals overlap."""
        reach: Term | None = None
        for term in (term for term in self.terms if term.believed):
            if reach is not None and term.start < reach.end:
                self.add(
                    "leadership-overlap",
                    f"{term.contender} believed it led from t={term.start:.3f} (token "
                    f"{term.token}) while {reach.contender} still believed it led until "
                    f"t={reach.end:.3f} (token {reach.token})",
                    (reach.elected, reach.closed_by, term.elected),
                )
            if reach is None or term.end > reach.end:
                reach = term

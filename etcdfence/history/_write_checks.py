"""The invariants about writes: what the resource accepted, and in which order.

``token-regression`` (:class:`TokenOrder`), ``stale-accepted`` and ``rejected-applied``
(:class:`StaleWrites`), ``ack-lost`` (:class:`AcknowledgedWrites`) and ``late-write``
(:class:`LateWrites`); see :mod:`etcdfence.history` for what each asserts.
"""

from __future__ import annotations

import bisect

from ._index import AckIndex, HistoryIndex, Invariant
from .events import Change, Event, parse_write_value, write_value
from .report import Violation


class TokenOrder(Invariant):
    """``token-regression``: the tokens each resource accepted never decrease."""

    def run(self) -> None:
        """Accepted tokens per resource never decrease (ground truth, revision order)."""
        for resource, seq in sorted(self.index.per_resource.items()):
            highest: tuple[int, Change] | None = None
            for token, change in seq:
                if highest is not None and token < highest[0]:
                    parsed = parse_write_value(change.value)
                    write_id = "" if parsed is None else parsed[0]
                    self.add(
                        "token-regression",
                        f"resource {resource!r} accepted token {token} at revision "
                        f"{change.revision} after token {highest[0]} at revision "
                        f"{highest[1].revision}",
                        (self.index.writes.get(write_id), self.index.outcomes.get(write_id)),
                        (highest[1], change),
                    )
                if highest is None or token > highest[0]:
                    highest = (token, change)


class StaleWrites(Invariant):
    """``stale-accepted`` / ``rejected-applied``; counts the stale writes attempted and accepted."""

    def __init__(self, index: HistoryIndex, violations: list[Violation]) -> None:
        super().__init__(index, violations)
        self.stale_attempted = 0
        self.stale_accepted = 0

    def run(self) -> None:
        """Once a token is acknowledged, no lower token attempted later gets in; a write
        reported rejected never gets in."""
        acks = AckIndex(self.index.accepted)
        for write_id, write in self.index.writes.items():
            outcome = self.index.outcomes.get(write_id)
            rejected = outcome is not None and outcome.kind == "rejected"
            change = self.index.applied.get(write_id)
            got_in = (outcome is not None and outcome.kind == "accepted") or change is not None
            higher = acks.higher_before(write)
            if higher is None and not rejected:
                continue
            self.stale_attempted += 1
            if not got_in:
                continue
            self.stale_accepted += 1
            if higher is not None:
                self.add(
                    "stale-accepted",
                    f"{write.contender} wrote {write.resource!r} with token {write.token} at "
                    f"t={write.t:.3f}, after {higher.contender}'s token {higher.token} was "
                    f"acknowledged at t={higher.t:.3f}, and the write was accepted"
                    + ("" if change is None else f" (revision {change.revision})"),
                    (higher, write, outcome),
                    (change,),
                )
            if rejected and change is not None:
                self.add(
                    "rejected-applied",
                    f"write {write_id} was reported rejected (stale) but etcd applied it at "
                    f"revision {change.revision}",
                    (write, outcome),
                    (change,),
                )


class AcknowledgedWrites(Invariant):
    """``ack-lost``: acknowledged writes are in etcd's history and final state."""

    def run(self) -> None:
        """Every acknowledged write is in etcd's history at its revision, and in the final
        state unless a later write to the same key superseded it."""
        final_state = self.index.history.final
        for ack in self.index.accepted:
            key = ack.key
            write = self.index.writes.get(ack.write_id or "")
            if key is None or write is None:
                continue
            if self.index.observed:
                change = self.index.applied.get(write.write_id or "")
                if change is None or change.revision != ack.revision:
                    where = (
                        "it never appeared in etcd's history"
                        if change is None
                        else f"etcd applied it at revision {change.revision}"
                    )
                    self.add(
                        "ack-lost",
                        f"{ack.contender}'s write {ack.write_id} to {key} was acknowledged "
                        f"at revision {ack.revision} but {where}",
                        (write, ack),
                        (change,),
                    )
                    continue
                superseded = any(
                    c.revision > (ack.revision or 0) for c in self.index.data_writes.get(key, [])
                )
            else:
                superseded = any(
                    a.key == key and (a.revision or 0) > (ack.revision or 0)
                    for a in self.index.accepted
                )
            if final_state is None or superseded:
                continue
            final = final_state.get(key)
            if final != write_value(write.write_id or "", write.token or 0):
                self.add(
                    "ack-lost",
                    f"{ack.contender}'s write {ack.write_id} to {key} (revision "
                    f"{ack.revision}) is the last write, but the final value is {final!r}",
                    (write, ack),
                )


class LateWrites(Invariant):
    """``late-write``: a contender's writes apply in the order it made them; counts them."""

    def __init__(self, index: HistoryIndex, violations: list[Violation]) -> None:
        super().__init__(index, violations)
        self.late = 0

    def run(self) -> None:
        """No write of a contender applied after a later acknowledged write of that
        contender to the same resource (later: sent after the first one's outcome).
        Writes without a recorded outcome were still in flight when the run ended."""
        if not self.index.observed:
            return
        acks: dict[tuple[str, str | None], list[tuple[float, int, Event]]] = {}
        for ack in self.index.accepted:
            write = self.index.writes.get(ack.write_id or "")
            if write is not None and ack.revision is not None:
                acks.setdefault((write.contender, write.resource), []).append(
                    (write.t, ack.revision, ack)
                )
        # per writer: acknowledgements by send time, with the lowest revision among
        # those sent at or after each position
        index: dict[tuple[str, str | None], tuple[list[float], list[tuple[int, Event]]]] = {}
        for writer, entries in acks.items():
            entries.sort(key=lambda entry: entry[0])
            lowest: list[tuple[int, Event]] = []
            for _sent, revision, ack in reversed(entries):
                if not lowest or revision < lowest[-1][0]:
                    lowest.append((revision, ack))
                else:
                    lowest.append(lowest[-1])
            lowest.reverse()
            index[writer] = ([entry[0] for entry in entries], lowest)
        for write_id, change in sorted(
            self.index.applied.items(), key=lambda item: item[1].revision
        ):
            write, outcome = self.index.writes.get(write_id), self.index.outcomes.get(write_id)
            found = None if write is None else index.get((write.contender, write.resource))
            if write is None or outcome is None or found is None:
                continue
            times, lowest = found
            position = bisect.bisect_right(times, outcome.t)  # sent after the outcome
            if position == len(times) or lowest[position][0] >= change.revision:
                continue
            revision, later = lowest[position]
            self.late += 1
            self.add(
                "late-write",
                f"{write.contender}'s write {write_id} to {write.resource!r} "
                f"({outcome.kind} at t={outcome.t:.3f}) was applied at revision "
                f"{change.revision}, after its later write {later.write_id} was acknowledged "
                f"at revision {revision}",
                (write, outcome, self.index.writes.get(later.write_id or ""), later),
                (change,),
            )

"""The history checker on synthetic histories (no server): good histories pass, and each
kind of violation is detected and shown with the offending slice of history."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import etcdfence as ef
from etcdfence.history import (
    Change,
    Event,
    History,
    Layout,
    PendingWrite,
    Recorder,
    build_terms,
    check,
    jsonl_sink,
    leader_changes,
    parse_events,
    parse_write_value,
    write_value,
)

LAYOUT = Layout("ns")
DATA = LAYOUT.data_key("res")
MARK = LAYOUT.mark_key("res")


class Sim:
    """A tiny model of etcd + a fenced resource that produces consistent histories.

    Contenders are names; ``t`` is set explicitly so tests control overlap."""

    def __init__(self) -> None:
        self.revision = 1
        self.events: list[Event] = []
        self.changes: list[Change] = []
        self.mark = 0
        self.keys: dict[str, int] = {}  # contender -> create revision of its key
        self.seq: dict[str, int] = {}
        self.terms: dict[str, int] = {}

    def ev(self, t: float, contender: str, kind: str, **fields: Any) -> Event:
        event = Event(t=t, contender=contender, kind=kind, **fields)
        self.events.append(event)
        return event

    def change(self, key: str, value: str = "", deleted: bool = False, same: bool = False) -> int:
        if not same:
            self.revision += 1
        create = self.revision if not deleted else 0
        self.changes.append(Change(self.revision, key, value, deleted, create))
        return self.revision

    def key_of(self, contender: str) -> str:
        return f"{LAYOUT.election}/{contender}"

    def campaign(self, t: float, contender: str) -> None:
        self.ev(t, contender, "campaign")
        self.keys[contender] = self.change(self.key_of(contender), contender)

    def elected(self, t: float, contender: str, deadline: float | None) -> int:
        """The contender's key is first now: its token is the current revision."""
        token = self.revision
        self.terms[contender] = token
        self.ev(t, contender, "elected", token=token, key=self.key_of(contender), deadline=deadline)
        return token

    def lost(self, t: float, contender: str, deadline: float | None = None) -> None:
        self.ev(t, contender, "lost", token=self.terms.pop(contender, None), deadline=deadline)

    def release(self, contender: str) -> None:
        self.keys.pop(contender, None)
        self.change(self.key_of(contender), deleted=True)

    def write(
        self,
        t: float,
        contender: str,
        token: int,
        *,
        guarded: bool = True,
        deadline: float | None = None,
        outcome: str | None = None,
        apply: bool | None = None,
    ) -> tuple[Event, str | None]:
        """A write attempt; by default the resource decides as a correct guard would."""
        n = self.seq[contender] = self.seq.get(contender, 0) + 1
        wid = f"{contender}#{n}"
        value = write_value(wid, token)
        self.ev(t, contender, "write", token=token, resource="res", key=DATA, write_id=wid,
                deadline=deadline)  # fmt: skip
        ok = (not guarded) or token >= self.mark
        if apply is None:
            apply = ok
        revision = None
        if apply:
            if guarded:
                self.mark = max(self.mark, token)
                self.change(MARK, str(token).zfill(20))
                revision = self.change(DATA, value, same=True)
            else:
                revision = self.change(DATA, value)
        kind = outcome or ("accepted" if ok else "rejected")
        fields: dict[str, Any] = {"token": token, "resource": "res", "key": DATA, "write_id": wid}
        if kind == "accepted":
            fields["revision"] = revision if revision is not None else self.revision + 100
        elif kind == "rejected":
            fields["current"] = self.mark
        self.ev(t + 0.002, contender, kind, **fields)
        return self.events[-1], wid

    def history(self, *, final: bool = True, observed: bool = True) -> History:
        finals = None
        if final:
            last = {c.key: c for c in self.changes if c.key == DATA}
            finals = {k: c.value for k, c in last.items() if not c.deleted}
        if not observed:
            return History(list(self.events), final=finals)
        return History(list(self.events), list(self.changes), finals, LAYOUT, 1)


def kleppmann(sim: Sim, *, zombie_guarded: bool = True) -> None:
    """A leads with a deadline of 1.0 and is paused; B takes over at 1.3 and writes;
    A wakes at 2.0, writes once with its old token and then notices."""
    sim.campaign(0.0, "A")
    sim.campaign(0.05, "B")
    a = sim.elected(0.1, "A", deadline=1.0)
    for i in range(3):
        sim.write(0.2 + i * 0.1, "A", a, deadline=1.0)
    sim.release("A")  # the lease ran out on the server
    b = sim.elected(1.3, "B", deadline=2.5)
    sim.write(1.4, "B", b, deadline=2.5)
    sim.write(2.0, "A", a, deadline=1.0, guarded=zombie_guarded)  # the zombie
    sim.lost(2.01, "A", deadline=1.0)
    sim.write(2.1, "B", b, deadline=2.5)
    sim.lost(2.2, "B", deadline=2.5)


def kinds(result: Any) -> set[str]:
    return {v.kind for v in result.violations}


# ----------------------------------------------------------------------------- passing


def test_good_history_passes_and_counts_the_stale_write() -> None:
    sim = Sim()
    kleppmann(sim)
    result = check(sim.history())
    assert result.ok and bool(result), result.report()
    assert str(result).startswith("OK: 2 contenders, 2 terms, 6 writes")
    assert "\n" not in str(result)
    assert result.stats["stale_attempted"] == 1
    assert result.stats["stale_accepted"] == 0
    assert result.stats["rejected"] == 1
    assert result.slice == [] and result.report() == str(result)


def test_good_history_passes_without_observer_or_final_state() -> None:
    sim = Sim()
    kleppmann(sim)
    assert check(sim.history(observed=False)).ok
    assert check(sim.history(final=False, observed=False)).ok


def test_belief_ends_at_the_local_deadline_not_when_the_process_noticed() -> None:
    """A frozen leader's ``lost`` comes long after its successor was elected; that is
    not an overlap as long as its local deadline had passed."""
    sim = Sim()
    kleppmann(sim)
    terms = build_terms(sim.events)
    a, b = terms
    assert (a.contender, a.end) == ("A", 1.0)  # min(lost at 2.01, deadline 1.0)
    assert b.start == 1.3 and b.end == 2.2


def test_superseded_acknowledged_write_needs_not_be_final() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    for i in range(5):
        sim.write(0.2 + i / 10, "A", a, deadline=5)
    history = sim.history()
    assert history.final is not None and parse_write_value(history.final[DATA]) == ("A#5", a)
    assert check(history).ok


def test_equal_tokens_and_unknown_outcomes_are_fine() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    sim.write(0.2, "A", a, deadline=5)
    sim.write(0.3, "A", a, deadline=5, outcome="unknown", apply=True)  # it did land
    sim.write(0.4, "A", a, deadline=5, outcome="unknown", apply=False)  # it did not
    result = check(sim.history())
    assert result.ok, result.report()
    assert result.stats["unknown"] == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ABC"), st.sampled_from(["lead", "write", "zombie"])),
                max_size=40))  # fmt: skip
def test_property_histories_of_a_correct_guard_always_pass(ops: list[tuple[str, str]]) -> None:
    """Random sequences of hand-overs, writes and zombie writes, decided by a correct
    guard, never produce a violation."""
    sim = Sim()
    t = 0.0
    leader: str | None = None
    old: dict[str, int] = {}
    for who, op in ops:
        t += 0.1
        if op == "lead" and who != leader:
            if leader is not None:
                sim.lost(t, leader, deadline=t)
                sim.release(leader)
            t += 0.1
            sim.campaign(t, who)
            old[who] = sim.elected(t + 0.01, who, deadline=t + 100)
            leader = who
        elif op == "write" and leader is not None:
            sim.write(t, leader, old[leader], deadline=t + 100)
        elif op == "zombie" and who in old:
            sim.write(t, who, old[who])
    result = check(sim.history())
    assert result.ok, result.report()


# ----------------------------------------------------------------------------- failing


def test_unguarded_zombie_write_is_a_token_regression_and_a_stale_acceptance() -> None:
    sim = Sim()
    kleppmann(sim, zombie_guarded=False)
    result = check(sim.history())
    assert not result.ok
    assert kinds(result) == {"token-regression", "stale-accepted"}
    assert result.stats["stale_accepted"] == 1
    line = str(result)
    assert line.startswith("FAIL: 2 violation(s) [stale-accepted, token-regression]")
    assert "\n" not in line
    report = result.report()
    assert "offending slice of history" in report
    assert any("A#4" in s and "accepted" in s for s in result.slice)  # the zombie write
    assert any(s.startswith("rev=") and "A#4" in s for s in result.slice)  # etcd's view


def test_stale_acceptance_is_caught_from_the_clients_view_alone() -> None:
    sim = Sim()
    kleppmann(sim, zombie_guarded=False)
    result = check(sim.history(observed=False))
    assert kinds(result) == {"stale-accepted"}


def test_regression_in_the_mark_itself() -> None:
    sim = Sim()
    sim.change(MARK, str(9).zfill(20))
    sim.change(MARK, str(7).zfill(20))
    result = check(sim.history())
    assert kinds(result) == {"token-regression"}
    assert "accepted token 7" in result.violations[0].message


def test_rejected_write_that_was_applied() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    sim.write(0.2, "A", a, deadline=5, outcome="rejected", apply=True)
    result = check(sim.history())
    assert kinds(result) == {"rejected-applied"}
    assert result.stats["stale_accepted"] == 1


def test_acknowledged_write_missing_from_history() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    sim.write(0.2, "A", a, deadline=5)
    sim.write(0.3, "A", a, deadline=5, outcome="accepted", apply=False)  # lost by etcd
    result = check(sim.history())
    assert kinds(result) == {"ack-lost"}
    assert "never appeared" in result.violations[0].message


def test_acknowledged_write_missing_from_final_state() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    sim.write(0.2, "A", a, deadline=5)
    history = sim.history(observed=False)
    history.final = {DATA: write_value("someone#1", a)}
    result = check(history)
    assert kinds(result) == {"ack-lost"}
    history.final = {}
    assert kinds(check(history)) == {"ack-lost"}


def test_acknowledged_at_another_revision() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    sim.write(0.2, "A", a, deadline=5)
    history = sim.history()
    ack = next(e for e in history.events if e.kind == "accepted")
    history.events[history.events.index(ack)] = Event(**{**ack.to_dict(), "revision": 99})
    assert kinds(check(history)) == {"ack-lost"}


def _late_landing(sim: Sim, *, outcome: str = "unknown", later: int = 2) -> str:
    """A writes, loses one write's outcome (its bytes held in the network), writes
    ``later`` more (acknowledged), then the held write lands: the mark takes the same
    token again (equal tokens pass) and the data goes back to the older value."""
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=50)
    sim.write(0.2, "A", a, deadline=50)
    _, held = sim.write(0.3, "A", a, deadline=50, outcome=outcome, apply=False)
    for i in range(later):
        sim.write(0.4 + i / 10, "A", a, deadline=50)
    sim.change(MARK, str(a).zfill(20))
    sim.change(DATA, write_value(held or "", a), same=True)
    return held or ""


def test_write_applied_after_a_later_acknowledged_write_is_late() -> None:
    """#17: an outcome-unknown write may apply late, but never after a later
    acknowledged write of the same writer."""
    sim = Sim()
    held = _late_landing(sim)
    result = check(sim.history(final=False))
    assert kinds(result) == {"late-write"}, result.report()
    assert result.stats["late_writes"] == 1 and result.stats["stale_accepted"] == 0
    assert held in result.violations[0].message and "A#3" in result.violations[0].message
    assert any(s.startswith("rev=") and held in s for s in result.slice)
    # the final value is the late one: with etcd's history the ordering rule tells
    # (the late change supersedes the last ack); from the final value alone, ack-lost
    assert kinds(check(sim.history())) == {"late-write"}
    assert kinds(check(sim.history(observed=False))) == {"ack-lost"}


def test_unknown_write_applied_late_but_before_the_next_ack_is_fine() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=5)
    sim.write(0.2, "A", a, deadline=5)
    _, held = sim.write(0.3, "A", a, deadline=5, outcome="unknown", apply=False)
    sim.change(DATA, write_value(held or "", a))  # applied after its outcome was reported
    sim.write(0.4, "A", a, deadline=5)
    result = check(sim.history())
    assert result.ok and result.stats["late_writes"] == 0, result.report()


def test_late_write_is_per_writer_and_needs_a_later_write() -> None:
    """Another contender's write, and writes still in flight at the end (no outcome
    recorded), are not ordered against A's acknowledged writes."""
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=50)
    sim.write(0.2, "A", a, deadline=50)
    sim.ev(0.25, "B", "write", token=a, resource="res", key=DATA, write_id="B#1")
    sim.ev(0.26, "A", "write", token=a, resource="res", key=DATA, write_id="A#9")
    sim.write(0.3, "A", a, deadline=50)
    sim.change(DATA, write_value("B#1", a))
    sim.change(DATA, write_value("A#9", a))  # no outcome: still in flight
    result = check(sim.history(final=False))
    assert "late-write" not in kinds(result), result.report()


def test_duplicate_term_token() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    sim.campaign(0, "B")
    sim.ev(0.1, "A", "elected", token=7, deadline=0.5)
    sim.ev(1.0, "B", "elected", token=7, deadline=2.0)
    result = check(sim.history(observed=False))
    assert "term-token-duplicate" in kinds(result)


def test_term_tokens_must_increase() -> None:
    sim = Sim()
    sim.ev(0.1, "A", "elected", token=9, deadline=0.5)
    sim.ev(1.0, "B", "elected", token=7, deadline=2.0)  # later term, lower token
    assert kinds(check(sim.history(observed=False))) == {"term-token-order"}
    sim = Sim()
    sim.ev(0.1, "A", "elected", token=9, deadline=0.5)
    sim.ev(0.6, "A", "lost", token=9)
    sim.ev(1.0, "A", "elected", token=8, deadline=2.0)  # its own next term went down
    assert kinds(check(sim.history(observed=False))) == {"term-token-order"}


def test_phantom_leader() -> None:
    """B reports leadership while A's key is still first (Go's Election.Campaign bug)."""
    sim = Sim()
    sim.campaign(0, "A")
    sim.campaign(0.1, "B")
    a = sim.elected(0.2, "A", deadline=0.5)
    sim.write(0.3, "A", a, deadline=0.5)
    sim.lost(0.6, "A", deadline=0.5)
    sim.elected(1.0, "B", deadline=2.0)  # but A's key was never deleted
    result = check(sim.history())
    assert kinds(result) == {"phantom-leader"}
    assert "etcd's leader was ns/election/A" in result.violations[0].message


def test_overlapping_belief() -> None:
    sim = Sim()
    sim.campaign(0, "A")
    a = sim.elected(0.1, "A", deadline=2.0)
    sim.release("A")
    sim.campaign(0.2, "B")
    b = sim.elected(1.0, "B", deadline=3.0)  # A believes until 1.5 (lost) / 2.0
    sim.lost(1.5, "A", deadline=2.0)
    result = check(sim.history())
    assert kinds(result) == {"leadership-overlap"}
    message = result.violations[0].message
    assert f"token {b}" in message and f"token {a}" in message and "until t=1.500" in message


def test_overlap_with_a_term_that_never_ended() -> None:
    sim = Sim()
    sim.ev(0.1, "A", "elected", token=3)  # no deadline, no loss: believes forever
    sim.ev(5.0, "B", "elected", token=8, deadline=6)
    assert kinds(check(sim.history(observed=False))) == {"leadership-overlap"}


def test_terms_with_empty_belief_are_ignored() -> None:
    """Elected only after its own deadline had passed (frozen in between): no belief."""
    sim = Sim()
    sim.ev(1.0, "A", "elected", token=3, deadline=0.9)
    sim.ev(0.95, "B", "elected", token=8, deadline=6)
    assert check(sim.history(observed=False)).ok


# ----------------------------------------------------------------------------- plumbing


def test_recorder_json_lines_round_trip() -> None:
    out = io.StringIO()
    deadline = [10.0]
    rec = Recorder("A", jsonl_sink(out), deadline=lambda: deadline[0])
    rec.campaign()
    rec.elected(ef.FencingToken(5, key="ns/election/1", create_revision=4, lease_id=0x1))
    pending = rec.write("res", DATA, 5)
    rec.accepted(pending, 12)
    rec.rejected(rec.write("res", DATA, 5), current=9)
    rec.unknown(rec.write("res", DATA, 5), "timeout")
    deadline[0] = 11.0
    rec.lost("expired")
    out.write("a log line that is not JSON\n{broken\n")
    events = parse_events(out.getvalue().splitlines())
    assert events == rec.events
    assert [e.kind for e in events] == [
        "campaign", "elected", "write", "accepted", "write", "rejected", "write", "unknown",
        "lost",
    ]  # fmt: skip
    assert events[1].key == "ns/election/1" and events[1].lease == 1
    assert events[-1].token == 5 and events[-1].deadline == 11.0
    assert all(json.loads(line)["contender"] == "A" for line in out.getvalue().splitlines()[:9])
    assert parse_write_value(pending.value) == ("A#1", 5)
    with pytest.raises(ValueError):
        rec.emit("bogus")


class FakeGuard:
    resource = "res"

    def __init__(self, outcome: Exception | int) -> None:
        self.outcome = outcome
        self.calls: list[tuple[Any, ...]] = []

    def put(self, token: Any, key: str, value: str) -> int:
        self.calls.append((token, key, value))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_recorder_guarded_put_records_each_outcome() -> None:
    rec = Recorder("A")
    assert rec.guarded_put(FakeGuard(17), 5, DATA) is True
    assert rec.guarded_put(FakeGuard(ef.StaleTokenError("res", 5, 9)), 5, DATA) is False
    assert rec.guarded_put(FakeGuard(ef.UnavailableError("cut off")), 5, DATA) is None
    assert rec.guarded_put(FakeGuard(ef.NotOwnerError("lock lost")), 5, DATA) is False
    outcomes = [e for e in rec.events if e.kind != "write"]
    assert [(e.kind, e.revision, e.current) for e in outcomes] == [
        ("accepted", 17, None),
        ("rejected", None, 9),
        ("unknown", None, None),
        ("rejected", None, None),
    ]
    assert "UnavailableError" in (outcomes[2].detail or "")
    assert "not the owner" in (outcomes[3].detail or "")
    with pytest.raises(ef.InvalidToken):  # a bug in the caller is not an outcome
        rec.guarded_put(FakeGuard(ef.InvalidToken("bad")), 5, DATA)


def test_pending_write_value_identifies_the_write() -> None:
    pending = Recorder("X").write("res", DATA, 3)
    assert isinstance(pending, PendingWrite)
    assert parse_write_value(pending.value.encode()) == (pending.write_id, 3)
    for junk in ["", "00000000000000000003", "{}", "[1]", '{"w": 1, "tok": "x"}', "{bad"]:
        assert parse_write_value(junk) is None


def test_layout_classifies_keys() -> None:
    assert LAYOUT.classify("ns/election/abc") == ("election", "ns/election/abc")
    assert LAYOUT.classify("ns/fence/res") == ("mark", "res")
    assert LAYOUT.classify("ns/data/res") == ("data", "res")
    assert LAYOUT.classify("ns/observer-sync") is None
    assert LAYOUT.classify("other/data/res") is None


def test_leader_changes_follow_the_first_created_key() -> None:
    e = LAYOUT.election
    changes = [
        Change(2, f"{e}/a", "A", create_revision=2),
        Change(3, f"{e}/b", "B", create_revision=3),  # queued behind a: no change
        Change(4, f"{e}/a", "A2", create_revision=2),  # proclaim: a change
        Change(5, f"{e}/a", "", deleted=True),
        Change(6, f"{e}/b", "", deleted=True),
        Change(7, "ns/data/res", "x", create_revision=7),  # not an election key
    ]
    assert leader_changes(changes, e) == [
        (2, (f"{e}/a", 2, "A")),
        (4, (f"{e}/a", 2, "A2")),
        (5, (f"{e}/b", 3, "B")),
        (6, None),
    ]


def test_the_history_package_does_not_import_the_grpc_stack() -> None:
    """A parent that only parses and checks events (the demo, the kit's runner) stays
    light: importing :mod:`etcdfence.history` pulls in neither gRPC nor protobuf."""
    code = (
        "import sys, etcdfence.history\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google'))\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == "", f"importing etcdfence.history imported {out}"


def test_the_old_testing_history_module_re_exports_the_package() -> None:
    import etcdfence.history as history
    import etcdfence.testing.history as old

    assert old.__all__ == history.__all__
    for name in history.__all__:
        assert getattr(old, name) is getattr(history, name), name

"""Within-term ordering under a member partition (#17): the follower-isolation scenario.

A 3-member :class:`NetnsCluster`. The lock holder's client is given every endpoint, a
*follower* first, so it talks to that follower. It takes a lock (session TTL 3) and
writes continuously through ``client.fence(resource).put(token, key, value)``, one
write after another (each value names the write: a sequence number, see
:func:`~etcdfence.history.write_value`). Then that follower is isolated from
the other two members while the holder keeps writing for a few seconds: the write in
flight at the cut is forwarded by the follower to the raft leader and its bytes stay
in the network; the session's keepalive on that follower goes unanswered, the client
fails over to a healthy member (ending the stuck write as outcome-unknown), keeps its
lock and keeps writing. Then the network heals.

Checked from etcd's own history (a watch from the start revision):

- no write of the writer applied after a later acknowledged write of it (applied
  sequence numbers, in revision order, never go below an acknowledged one before them)
  — also :func:`~etcdfence.history.check`'s ``late-write`` rule;
- the final value is the last acknowledged write (or a later outcome-unknown one);
- no stale token was accepted (the full history check is clean).

The control writes the same way with ordering switched off — the 0.1 guard txn sent
raw, epoch always 0 — and the stuck write *does* land after later acknowledged writes
once the link heals. Why that is deterministic: the holder writes back to back, so at
the cut one write is always on its way through the follower (the follower forwards the
proposal to the leader over its raft stream, where it waits in TCP retransmission); it
is the write the fail-over ends as unknown, and every write after it is acknowledged
before the heal.

:func:`follower_isolation` is also what ``bench/bench_ordering.py`` runs.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

import etcdfence as ef
from etcdfence import _txn
from etcdfence._keys import decode_mark_epoch
from etcdfence.history import (
    CheckResult,
    History,
    Layout,
    Observer,
    Recorder,
    check,
    parse_write_value,
)
from etcdfence.testing.netns import NetnsCluster

from .conftest import ScenarioRecord, netns_cluster, rounds

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 3
ELECTION_TIMEOUT = 0.5
#: how long the holder keeps writing after the cut (through the healthy member)
PARTITION_SECONDS = 4.0
#: bound on the control's late landing after the heal (the issue saw > 13 s after send)
LANDING_WAIT = 30.0


@dataclass
class Call:
    """One write of the holder: its sequence number and what came back."""

    seq: int
    sent: float
    done: float
    outcome: str  # "acked", "unknown", "stale"
    revision: int | None = None
    error: str = ""
    fenced_off: bool | None = None  # OutcomeUnknown.fenced_off (None: another error)


@dataclass
class IsolationRun:
    """What one follower-isolation run did and what etcd applied."""

    ordered: bool
    follower: int
    calls: list[Call]
    applied: list[tuple[int, int]]  # (revision, seq) of the data key, revision order
    final_seq: int | None
    cut: float  # when every drop rule was in place
    cut_began: float  # when the first one went in
    healed: float
    kept_lock: bool
    fail_over_endpoint: str
    check: CheckResult
    mark: tuple[int, int] = (0, 0)
    late: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (seq, revision it applied at, later acknowledged seq, its revision)

    @property
    def acked(self) -> list[Call]:
        return [c for c in self.calls if c.outcome == "acked"]

    @property
    def unknown(self) -> list[Call]:
        return [c for c in self.calls if c.outcome == "unknown"]

    @property
    def stale(self) -> list[Call]:
        return [c for c in self.calls if c.outcome == "stale"]

    @property
    def stuck_ended(self) -> float | None:
        """Seconds from the cut until the write stuck at the cut came back as unknown."""
        done = [c.done for c in self.unknown]
        return min(done) - self.cut if done else None

    @property
    def first_ack_after_cut(self) -> float | None:
        """Seconds from the cut to the first acknowledged write sent after it."""
        done = [c.done for c in self.acked if c.sent >= self.cut]
        return min(done) - self.cut if done else None

    def summary(self) -> str:
        first = self.first_ack_after_cut
        return (
            f"{'ordered' if self.ordered else 'control'}: {len(self.calls)} writes "
            f"({len(self.acked)} acked, {len(self.unknown)} unknown, {len(self.stale)} stale), "
            f"first ack {'-' if first is None else f'{first:.2f}s'} after the cut, "
            f"late landings {len(self.late)} {self.late[:3]}, final seq {self.final_seq}, "
            f"mark {self.mark}, kept lock {self.kept_lock}; unknown: "
            + "; ".join(
                f"#{c.seq} after {c.done - c.sent:.2f}s (fenced off: {c.fenced_off})"
                for c in self.unknown
            )
        )


def late_landings(
    calls: list[Call], applied: list[tuple[int, int]]
) -> list[tuple[int, int, int, int]]:
    """Writes that applied after a later acknowledged write of the (sequential) writer:
    ``(seq, revision, later acked seq, its revision)``. A write is *later* than another
    when it was sent after the other's outcome came back: for one writer writing back
    to back, a higher sequence number."""
    acked = {c.seq: c.revision for c in calls if c.outcome == "acked"}
    out: list[tuple[int, int, int, int]] = []
    top: tuple[int, int] | None = None  # highest acknowledged seq applied so far
    for revision, seq in applied:
        if top is not None and seq < top[0]:
            out.append((seq, revision, top[0], top[1]))
        if seq in acked and (top is None or seq > top[0]):
            top = (seq, revision)
    return out


def _writer(
    client: ef.Client,
    guard: ef.FenceGuard,
    token: ef.FencingToken,
    key: str,
    recorder: Recorder,
    ordered: bool,
    calls: list[Call],
    stop: threading.Event,
) -> None:
    while not stop.is_set():
        pending = recorder.write(guard.resource, key, token)
        seq = int(pending.write_id.rsplit("#", 1)[1])
        sent = time.monotonic()
        try:
            if ordered:
                revision = guard.put(token, key, pending.value)
            else:  # the 0.1 guard txn: (token) only, the epoch never moves
                raw = _txn.fence_txn(
                    guard.key, token.value, [_txn.op_put(key.encode(), pending.value.encode())]
                )
                response = client.txn_raw(raw)
                if response.succeeded:
                    kvs = response.responses[0].response_range.kvs
                    current = decode_mark_epoch(kvs[0].value)[0] if kvs else 0
                    raise ef.StaleTokenError(guard.resource, token.value, current)
                revision = response.header.revision
        except ef.StaleTokenError as err:
            recorder.rejected(pending, err.current)
            calls.append(Call(seq, sent, time.monotonic(), "stale", error=str(err)))
            continue
        except ef.EtcdUnavailable as err:  # OutcomeUnknown is one
            recorder.unknown(pending, f"{type(err).__name__}: {err}")
            fenced = err.fenced_off if isinstance(err, ef.OutcomeUnknown) else None
            calls.append(Call(seq, sent, time.monotonic(), "unknown", error=str(err),
                              fenced_off=fenced))  # fmt: skip
            continue
        recorder.accepted(pending, revision)
        calls.append(Call(seq, sent, time.monotonic(), "acked", revision))


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def _put_ok(client: ef.Client, key: str) -> bool:
    try:
        client.put(key, "probe")
    except ef.EtcdfenceError:
        return False
    return True


def follower_isolation(
    cluster: NetnsCluster,
    *,
    ordered: bool,
    root: str | None = None,
    partition_seconds: float = PARTITION_SECONDS,
    timeout: float = 5.0,
    jitter: float = TTL / 3,
) -> IsolationRun:
    """One run of the scenario (see the module docstring); ``ordered=False`` is the
    control. The cut lands a random 0 … ``jitter`` seconds after the first writes, so at
    a random point of the session's keepalive cycle. Leaves the cluster healed, with a
    leader."""
    root = root or f"t/ordering-{uuid.uuid4().hex[:8]}"
    layout = Layout(root)
    leader = cluster.wait_for_leader(15)
    follower = (leader + 1) % len(cluster)
    endpoints = cluster.endpoints
    order = [endpoints[follower]] + [e for i, e in enumerate(endpoints) if i != follower]
    healthy = [e for i, e in enumerate(endpoints) if i != follower]
    key = layout.data_key("res")
    calls: list[Call] = []
    stop = threading.Event()
    with ef.Client(healthy, timeout=5.0) as admin, ef.Client(order, timeout=timeout) as client:
        start = admin.revision() + 1
        observer = Observer(admin, layout, start_revision=start).start()
        session = client.session(ttl=TTL)
        with session:
            token = session.lock(layout.election).acquire(timeout=10)
            recorder = Recorder("holder", deadline=lambda: session.deadline)
            recorder.elected(token)
            guard = layout.guard(client, "res")
            assert client.endpoint == order[0], "the holder talks to the follower"
            thread = threading.Thread(
                target=_writer,
                args=(client, guard, token, key, recorder, ordered, calls, stop),
                name="ordering-writer",
                daemon=True,
            )
            thread.start()
            try:
                _wait(lambda: sum(c.outcome == "acked" for c in calls) >= 20, 20, "writes")
                stop.wait(random.uniform(0, jitter))
                cut_began = time.monotonic()
                cluster.isolate(follower)
                cut = time.monotonic()
                # the holder fails over and keeps writing for a while
                _wait(
                    lambda: any(c.sent >= cut and c.outcome == "acked" for c in calls),
                    30,
                    "an acknowledged write after the cut",
                )
                _wait(lambda: time.monotonic() >= cut + partition_seconds, 30, "the partition")
                fail_over_endpoint = client.endpoint
                cluster.heal()
                healed = time.monotonic()
                cluster.wait_for_leader(20)
                # a write through the healed follower: its raft link to the leader
                # works again, so whatever it forwarded during the cut was delivered
                with ef.Client([endpoints[follower]], timeout=2.0) as via_follower:
                    _wait(lambda: _put_ok(via_follower, root + "/probe"), 30, "the follower")
                if not ordered:
                    # the control: wait (bounded) for a stuck write to land
                    def landed() -> bool:
                        lost = {f"holder#{c.seq}" for c in calls if c.outcome == "unknown"}
                        return any(
                            (parsed := parse_write_value(c.value)) and parsed[0] in lost
                            for c in observer.changes
                            if c.key == key
                        )

                    with contextlib.suppress(AssertionError):
                        _wait(landed, LANDING_WAIT, "the stuck write to land")
            finally:
                stop.set()
                cluster.heal()  # idempotent: also on a failure before the heal above
                thread.join(timeout + 10)
            kept_lock = not session.expired and session.lock(layout.election).is_owner()
            recorder.lost("done")
        try:
            observer.sync(timeout=15)
        finally:
            observer.stop()
        history = History.collect(recorder.events, observer)
        history.read_final(admin)
        changes = [c for c in observer.changes if c.key == key and not c.deleted]
        applied = []
        for change in changes:
            parsed = parse_write_value(change.value)
            if parsed is not None:
                applied.append((change.revision, int(parsed[0].rsplit("#", 1)[1])))
        final = admin.get(key)
        final_parsed = None if final is None else parse_write_value(final.value)
        mark_kv = admin.get(guard.key)
        mark = (0, 0) if mark_kv is None else decode_mark_epoch(mark_kv.value)
    run = IsolationRun(
        ordered=ordered,
        follower=follower,
        calls=sorted(calls, key=lambda c: c.seq),
        applied=applied,
        final_seq=None if final_parsed is None else int(final_parsed[0].rsplit("#", 1)[1]),
        cut=cut,
        cut_began=cut_began,
        healed=healed,
        kept_lock=kept_lock,
        fail_over_endpoint=fail_over_endpoint,
        check=check(history),
        mark=mark,
    )
    run.late = late_landings(run.calls, applied)
    return run


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def etcd_cluster() -> Iterator[NetnsCluster]:
    """This module's cluster: members in network namespaces of our own."""
    yield from netns_cluster(ELECTION_TIMEOUT)


@pytest.fixture(autouse=True)
def _restore(etcd_cluster: NetnsCluster) -> Iterator[None]:
    yield
    etcd_cluster.heal()
    etcd_cluster.wait_for_leader(20)


@pytest.mark.timeout(60 + 60 * rounds(1))
def test_follower_isolation_no_late_landing(
    etcd_cluster: NetnsCluster, etcd_namespace: str, chaos: ScenarioRecord
) -> None:
    """The holder fails over, keeps its lock and keeps writing; the write stuck at the
    cut is fenced off, so whenever its bytes arrive it is rejected."""
    chaos.scenario = "ordering_follower_isolated"
    for n in range(rounds(1)):
        timeout = 10.0  # well above the fail-over: a stuck write must not wait for it
        run = follower_isolation(
            etcd_cluster, ordered=True, root=f"{etcd_namespace}/{n}", timeout=timeout
        )
        chaos.fault("isolate the holder's follower (all endpoints given)")
        chaos.rounds += 1
        chaos.add(run.check)
        detail = run.summary()
        # the scenario happened: writes acknowledged through another member after the cut
        assert run.first_ack_after_cut is not None, detail
        assert run.fail_over_endpoint != etcd_cluster.endpoints[run.follower], detail
        # safety
        assert run.late == [], detail
        assert run.check.ok, run.check.report()
        assert run.stale == [], detail
        last_acked = run.acked[-1].seq
        assert run.final_seq is not None and run.final_seq >= last_acked, detail
        assert run.final_seq == last_acked or run.final_seq in {c.seq for c in run.unknown}
        applied = [seq for _revision, seq in run.applied]
        assert all(c.seq in applied for c in run.acked), "an acknowledged write is missing"
        for lost in run.unknown:  # the guard said so, and moved the mark's epoch on
            assert lost.fenced_off is not None, lost.error
            # ended by the fail-over (the keepalive moved on), not by the client timeout
            assert lost.done - lost.sent < timeout, detail
        if run.unknown:
            assert run.mark[1] >= 1, f"the writer never moved past its lost attempt: {detail}"
        chaos.verdicts.append(detail)


@pytest.mark.timeout(60 + 60 * rounds(1))
def test_follower_isolation_control_lands_late(
    etcd_cluster: NetnsCluster, etcd_namespace: str, chaos: ScenarioRecord
) -> None:
    """Control: the same scenario with ordering switched off (the 0.1 guard txn, epoch
    always 0) — the stuck write lands after later acknowledged writes."""
    chaos.scenario = "ordering_follower_isolated_control"
    chaos.expect_violations = True
    chaos.expected_because = "ordering off: 0.1 guard txn, epoch 0"
    run = follower_isolation(etcd_cluster, ordered=False, root=etcd_namespace)
    chaos.fault("isolate the holder's follower (all endpoints given)")
    chaos.rounds += 1
    chaos.add(run.check)
    chaos.verdicts.append(run.summary())
    assert run.unknown, f"no write was stuck at the cut: {run.summary()}"
    assert run.late, f"control: the stuck write did not land late: {run.summary()}"
    assert {v.kind for v in run.check.violations} == {"late-write"}, run.check.report()
    # the late landing took the key back to an older value of the same term
    seq, _revision, later, _ = run.late[0]
    assert seq < later and run.stale == []

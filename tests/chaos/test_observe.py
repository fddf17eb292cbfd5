"""``observe()`` under compaction and defragmentation: no leader change is missed.

A driver keeps changing the leader of one election (proclaim a new value, hand over to
a queued candidate, step down to nobody). ``client.observe(name)`` runs in a thread; an
:class:`~etcdfence.history.Observer` on another connection records the ground
truth, from which :func:`~etcdfence.history.leader_changes` derives every
leader change.

Phase 1 compacts at the current revision and defragments every member while the
observer is connected. Phase 2 cuts the observer's connection (FaultProxy), makes more
changes, compacts past them, then heals and resets the connection, so the observer's
watch resumes below the compaction and must resync.

The exact criterion, with G the ground-truth sequence of leader states (key, create
revision, value, or nobody — starting with the state before the first change) and O the
sequence ``observe()`` yielded:

1. O is a subsequence of G: every state it reports existed, in order, none repeated;
2. O ends with G's last state (after the driver stops, the observer has caught up);
3. every state of G is in O, except states that began at a revision r with
   ``cut < r <= compacted`` for a phase-2 window (``cut``: the revision when the
   connection was cut, ``compacted``: the revision compacted while it was cut, with no
   change made between that compaction and the resync). Those may be coalesced into the
   state the resync reads. Phase 1 has no window: nothing may be missed at all.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

import etcdfence as ef
from etcdfence.history import Layout, LeaderState, Observer, leader_changes
from etcdfence.testing import FaultProxy

from .conftest import ScenarioRecord, rounds, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]


def _state(leader: ef.Leader | None) -> LeaderState | None:
    if leader is None:
        return None
    return (leader.key, leader.create_revision, leader.value.decode())


class Driver:
    """Changes the leader of ``election`` one step at a time."""

    def __init__(self, client: ef.Client, election: str) -> None:
        self.client = client
        self.election = election
        self.pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="campaign")
        self.leader: Any = None
        self.n = 0

    def _campaign(self, session: Any) -> Any:
        return self.pool.submit(session.election(self.election).campaign, f"v{self.n}")

    def step(self) -> None:
        self.n += 1
        nxt = self.client.session(ttl=5)
        nxt.open()
        if self.leader is None:
            self._campaign(nxt).result(10)  # nobody -> a leader
        else:
            self.leader.election(self.election).proclaim(f"v{self.n}-proclaimed")
            if self.n % 3 == 0:  # step down to nobody, then a new leader
                self.leader.election(self.election).resign()
                self._campaign(nxt).result(10)
            else:  # hand over to a queued candidate
                queued = self._campaign(nxt)
                wait_until(
                    lambda: len(self.client.get_prefix(self.election + "/")) == 2,
                    5,
                    "the next candidate queued",
                )
                self.leader.election(self.election).resign()
                queued.result(10)
            self.leader.close()
        self.leader = nxt

    def close(self) -> None:
        if self.leader is not None:
            self.leader.close()
        self.pool.shutdown(wait=True)


class Watcher:
    """``client.observe(name)`` in a thread, collecting what it yields."""

    def __init__(self, client: ef.Client, election: str) -> None:
        self.seen: list[LeaderState | None] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._iterator: Iterator[ef.Leader | None] = client.observe(election)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="observe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for leader in self._iterator:
                with self._lock:
                    self.seen.append(_state(leader))
                if self.stop.is_set():
                    break
        except BaseException as err:  # surfaced by the test
            self.error = err
        finally:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()

    def snapshot(self) -> list[LeaderState | None]:
        with self._lock:
            return list(self.seen)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _defrag_all(cluster: Any) -> None:
    for endpoint in cluster.endpoints:
        with ef.Client(endpoint, timeout=10.0) as member:
            member.defragment()


def _check_sequence(
    truth: list[tuple[int, LeaderState | None]],
    seen: list[LeaderState | None],
    windows: list[tuple[int, int]],
) -> list[str]:
    """Problems with ``seen`` against ``truth`` under the criterion in the docstring."""
    problems = []
    states = [state for _, state in truth]
    position = 0
    matched: set[int] = set()
    for item in seen:  # 1. a subsequence of the truth
        while position < len(states) and states[position] != item:
            position += 1
        if position == len(states):
            problems.append(f"observe() reported {item} out of order or never real")
            break
        matched.add(position)
        position += 1
    if seen and truth and seen[-1] != states[-1]:  # 2. the final state
        problems.append(f"final state {seen[-1]} != ground truth {states[-1]}")
    for index, (revision, state) in enumerate(truth):  # 3. nothing missed outside windows
        excused = any(cut < revision <= compacted for cut, compacted in windows)
        if index not in matched and not excused:
            problems.append(f"missed the change at revision {revision}: {state}")
    return problems


@pytest.mark.timeout(60 + 20 * rounds(2))
def test_observe_through_compaction_and_defrag(
    etcd_cluster: Any, cluster_client: ef.Client, etcd_namespace: str, chaos: ScenarioRecord
) -> None:
    layout = Layout(etcd_namespace)
    election = layout.election
    start = cluster_client.revision()
    windows: list[tuple[int, int]] = []
    coalesced = 0
    with (
        Observer(cluster_client, layout, start_revision=start + 1) as truth_observer,
        FaultProxy(etcd_cluster.endpoints[0]) as proxy,
        ef.Client([proxy.endpoint], timeout=2.0) as watched,
        capture_logs() as logs,
    ):
        driver = Driver(cluster_client, election)
        watcher = Watcher(watched, election)
        wait_until(lambda: watcher.snapshot(), 10, "observe() to report the initial state")
        try:
            for _ in range(rounds(2)):
                # phase 1: compaction and defrag with the observer connected
                for i in range(6):
                    driver.step()
                    if i == 2:
                        cluster_client.compact(truth_observer.sync())
                        chaos.fault("compact")
                        _defrag_all(etcd_cluster)
                        chaos.fault("defrag (3 members)")
                # phase 2: compaction past what the cut-off observer has seen
                cut = truth_observer.sync()
                proxy.blackhole()
                chaos.fault("blackhole observer")
                for _ in range(4):
                    driver.step()
                compacted = truth_observer.sync()
                cluster_client.compact(compacted)
                chaos.fault("compact")
                _defrag_all(etcd_cluster)
                chaos.fault("defrag (3 members)")
                windows.append((cut, compacted))
                proxy.heal()
                proxy.reset()
                chaos.fault("reset observer connection")
                final = leader_changes(truth_observer.changes, election)[-1][1]
                wait_until(
                    lambda: watcher.snapshot()[-1:] == [final],  # noqa: B023
                    10,
                    "observe() to resync after the compaction",
                )
                for _ in range(2):
                    driver.step()
                chaos.rounds += 1
            truth_observer.sync()
            truth = [(start, None), *leader_changes(truth_observer.changes, election)]
            wait_until(
                lambda: watcher.snapshot()[-1:] == [truth[-1][1]], 10, "observe() to catch up"
            )
            seen = watcher.snapshot()
        finally:
            watcher.stop.set()
            driver.step()  # one more change lets the observe loop see the stop flag
            driver.close()
            watcher.join(10)
    assert watcher.error is None, watcher.error
    problems = _check_sequence(truth, seen, windows)
    assert not problems, "\n".join(
        [*problems, "truth:", *map(str, truth), "seen:", *map(str, seen)]
    )
    coalesced = len(truth) - len(seen)
    resyncs = [e for e in logs if e.get("event") == "etcdfence.observe_resync"]
    assert len(resyncs) >= chaos.rounds, "the observer never had to resync after a compaction"
    chaos.verdicts.append(
        f"OK: {len(truth)} leader changes, {len(seen)} observed, {coalesced} coalesced "
        f"inside {len(windows)} compaction window(s), {len(resyncs)} resync(s)"
    )

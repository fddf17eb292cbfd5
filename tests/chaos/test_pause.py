"""Kleppmann's pause with real processes: the leader is frozen (SIGSTOP) past its TTL,
another contender takes over, the old leader wakes up and writes with its old token."""

from __future__ import annotations

import time
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.history import Observer

from .conftest import Contenders, ScenarioRecord, finish, rounds

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 1
PAUSE = 2 * TTL + 0.5  # at least 2 x TTL


def _pause_rounds(group: Contenders, n: int, record: ScenarioRecord) -> None:
    for _ in range(n):
        leader = group.wait_leader(15)
        leader.pause()
        stopped = time.monotonic()
        record.fault("SIGSTOP leader")
        # while it sleeps, someone else must be elected and write
        successor = group.wait_leader(PAUSE + 8, exclude=leader)
        assert successor is not leader
        time.sleep(max(0.0, stopped + PAUSE - time.monotonic()))
        woke = time.monotonic()  # before SIGCONT: the child may write and lose within 1 ms
        leader.resume()
        # on waking it writes once with its old token (see etcdfence.testing.contender),
        # then learns that it lost
        leader.wait_for(lambda e: e.kind == "lost", 10, "lost after waking", after=woke)
        record.rounds += 1


@pytest.mark.timeout(60 + 10 * rounds(3))
def test_kleppmann_pause(
    etcd_cluster: Any,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    for i in range(3):
        contenders.start(f"c{i}", etcd_cluster.endpoints, ttl=TTL)
    _pause_rounds(contenders, rounds(3), chaos)
    result = finish(contenders, observer, cluster_client, chaos)
    assert result.ok, result.report()
    assert result.stats["stale_attempted"] >= 1, result.report()
    assert result.stats["stale_accepted"] == 0, result.report()
    assert result.stats["rejected"] >= 1, result.report()


def test_kleppmann_pause_unsafe_control(
    etcd_cluster: Any,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    """The same pause with the guard bypassed (plain puts): the checker must see it."""
    chaos.expect_violations = True
    for i in range(3):
        contenders.start(f"u{i}", etcd_cluster.endpoints, ttl=TTL, unsafe=True)
    _pause_rounds(contenders, 1, chaos)
    result = finish(contenders, observer, cluster_client, chaos)
    assert not result.ok, f"the checker missed the unfenced zombie write: {result}"
    kinds = {v.kind for v in result.violations}
    assert {"stale-accepted", "token-regression"} <= kinds, result.report()
    assert result.stats["stale_accepted"] >= 1
    assert result.slice, "a failing result carries the offending slice of history"

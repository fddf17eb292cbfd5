"""Faults of the etcd members themselves, under contenders that keep campaigning and
writing: SIGKILL + restart of the raft leader and of a follower; SIGSTOP of a minority
(nothing happens, even to a leader connected to the frozen member) and of a quorum
(nobody can win, the leader fences itself by its local deadline), then recovery
(exactly one leader)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.history import Observer

from .conftest import Contenders, ScenarioRecord, finish, rounds, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 1
ELECTION_TIMEOUT = 0.5  # EtcdCluster's default --election-timeout
#: time for processes to be scheduled, calls to fail over and backoffs to run out
MARGIN = 4.0


def _writing_after(group: Contenders, since: float) -> bool:
    """Whether some contender had a write accepted after ``since``."""
    return any(e.kind == "accepted" and e.t > since for p in group.procs for e in p.events)


def _restore(cluster: Any) -> None:
    for index, member in enumerate(cluster.members):
        if member.paused:
            cluster.resume(index)
        if not member.running:
            cluster.restart(index)
    cluster.wait_for_leader(20)


@pytest.mark.timeout(60 + 30 * rounds(1))
def test_kill_and_restart_members(
    etcd_cluster: Any,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    """Leadership moves every second (``--term 1``), so kills land on campaigns, hand-overs
    and guarded writes alike. After each kill some contender must lead and write again
    within etcd's election time + TTL + a margin; the checker then proves tokens unique
    and increasing and every acknowledged write durable."""
    bound = ELECTION_TIMEOUT + TTL + MARGIN
    recovery: dict[str, float] = {}
    for i in range(3):
        contenders.start(f"c{i}", etcd_cluster.endpoints, ttl=TTL, term=1.0)
    try:
        for _ in range(rounds(1)):
            for role in ("leader", "follower"):
                contenders.wait_leader(15)
                raft_leader = etcd_cluster.wait_for_leader(10)
                victim = (
                    raft_leader
                    if role == "leader"
                    else next(i for i in range(len(etcd_cluster)) if i != raft_leader)
                )
                etcd_cluster.kill(victim)
                killed = time.monotonic()
                chaos.fault(f"SIGKILL etcd {role}")
                wait_until(
                    lambda: _writing_after(contenders, killed),  # noqa: B023
                    bound,
                    f"a leader writing within {bound:.1f}s of killing the etcd {role}",
                )
                took = time.monotonic() - killed
                recovery[role] = max(recovery.get(role, 0.0), took)
                time.sleep(TTL)  # let it run on two members for a while
                etcd_cluster.restart(victim)
                chaos.fault(f"restart etcd {role}")
                restarted = time.monotonic()
                wait_until(
                    lambda: _writing_after(contenders, restarted),  # noqa: B023
                    bound,
                    "a leader writing after the restart",
                )
            chaos.rounds += 1
    finally:
        _restore(etcd_cluster)
    result = finish(contenders, observer, cluster_client, chaos)
    chaos.verdicts.append(
        "writes accepted again after killing the etcd "
        + ", ".join(f"{role}: {took:.2f}s" for role, took in recovery.items())
        + f" (bound {bound:.1f}s)"
    )
    assert result.ok, result.report()
    assert result.stats["terms"] >= 3
    assert result.stats["accepted"] > 0


@pytest.mark.timeout(60 + 30 * rounds(1))
def test_pause_members(
    etcd_cluster: Any,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    """SIGSTOP a minority — the very follower every contender, the leader included, is
    connected to: the leader keeps its term (its keepalives fail over to a healthy
    member). SIGSTOP a quorum: no campaign succeeds, the leader's session expires by its
    local deadline. SIGCONT: exactly one leader again. (TTL 2 here: "keeps its term"
    must not depend on a busy machine scheduling a 1 s TTL's keepalives in time.)"""
    ttl = 2
    try:
        for n in range(rounds(1)):
            # fresh contenders whose clients all start on one follower (a client moves
            # to another endpoint only when the one it uses fails)
            for proc in contenders.procs:
                proc.stop()
            follower = (etcd_cluster.wait_for_leader(10) + 1) % len(etcd_cluster)
            endpoints = etcd_cluster.endpoints
            ordered = [endpoints[follower], *(e for i, e in enumerate(endpoints) if i != follower)]
            for i in range(3):
                contenders.start(f"c{n}{i}", ordered, ttl=ttl)

            # -- a minority: the follower they all talk to
            leader = contenders.wait_leader(15)
            term = leader.leading()
            assert term is not None
            if etcd_cluster.wait_for_leader(10) == follower:  # raft leadership moved meanwhile
                follower = next(i for i in range(3) if i != etcd_cluster.wait_for_leader(10))
            etcd_cluster.pause(follower)
            paused = time.monotonic()
            chaos.fault("SIGSTOP etcd follower")
            time.sleep(2 * ttl + 0.5)
            etcd_cluster.resume(follower)
            assert leader.leading() == term, "a paused follower cost the leader its term"
            assert any(e.kind == "accepted" and e.t > paused + 2 * ttl for e in leader.events), (
                "the leader stopped writing while a minority was paused"
            )

            # -- a quorum: two members, the raft leader among them
            leader = contenders.wait_leader(15)
            raft_leader = etcd_cluster.wait_for_leader(10)
            quorum = [raft_leader, next(i for i in range(3) if i != raft_leader)]
            for index in quorum:
                etcd_cluster.pause(index)
            cut = time.monotonic()
            chaos.fault("SIGSTOP etcd quorum")
            lost = leader.wait_for(
                lambda e: e.kind == "lost", ttl + 2.0 + MARGIN, "self-fencing", after=cut
            )
            assert lost.detail == "session expired=True", lost
            assert lost.deadline is not None and lost.deadline <= cut + ttl, (
                "the leader believed past its TTL without etcd"
            )
            time.sleep(max(0.0, cut + ttl + 1.0 - time.monotonic()))
            resumed = time.monotonic()
            for index in quorum:
                etcd_cluster.resume(index)
            chaos.fault("SIGCONT etcd quorum")
            won = [e for p in contenders.procs for e in p.events if e.kind == "elected"]
            assert not [e for e in won if cut < e.t < resumed], "a campaign won without quorum"

            # -- recovery: exactly one leader, and it writes
            leader = contenders.wait_leader(ttl + ELECTION_TIMEOUT + 10)
            believers = [p for p in contenders.procs if p.leading() is not None]
            assert believers == [leader], [p.ident for p in believers]
            chaos.rounds += 1
    finally:
        _restore(etcd_cluster)
    result = finish(contenders, observer, cluster_client, chaos)
    assert result.ok, result.report()


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_session_outlives_a_frozen_member(etcd_cluster: Any, twin: str) -> None:
    """A frozen (SIGSTOPped, not dead) member keeps its TCP connections open and answers
    nothing. A session whose keepalive stream is on it must fail over to a healthy
    member before its local deadline, not expire while two of three members are fine."""
    ttl = 1
    follower = (etcd_cluster.wait_for_leader(10) + 1) % len(etcd_cluster)
    endpoints = etcd_cluster.endpoints
    ordered = [endpoints[follower], *(e for i, e in enumerate(endpoints) if i != follower)]

    async def run_async() -> tuple[bool, int]:
        async with ef.AsyncClient(ordered, timeout=2.0) as client:
            session = client.session(ttl)
            await session.open()
            etcd_cluster.pause(follower)
            try:
                expired = await session.wait_expired(2 * ttl + 0.5)
            finally:
                etcd_cluster.resume(follower)
            await session.aclose()
            return expired, session.keepalives_sent

    def run_sync() -> tuple[bool, int]:
        with ef.Client(ordered, timeout=2.0) as client:
            session = client.session(ttl)
            session.open()
            etcd_cluster.pause(follower)
            try:
                expired = session.wait_expired(2 * ttl + 0.5)
            finally:
                etcd_cluster.resume(follower)
            session.close()
            return expired, session.keepalives_sent

    expired, sent = asyncio.run(run_async()) if twin == "async" else run_sync()
    assert not expired, "the session expired although a majority of members was healthy"
    assert sent >= 4  # it kept renewing, through another member

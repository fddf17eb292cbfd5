"""Partitions *between etcd members* (members in network namespaces, :class:`NetnsCluster`).

In every scenario the lock holder ``a`` talks to one member only — the one the fault
cuts off from the raft leader (or the raft leader itself, cut off from everyone) — and
``b`` talks to the members that keep a quorum. ``a`` leads and writes through the fence
guard; the fault lands; ``b`` takes over; the network heals:

- ``symmetric``: the link between the raft leader and ``a``'s member is cut both ways;
- ``oneway``: the raft leader receives nothing from ``a``'s member, which still hears
  the leader's heartbeats — so it keeps following and forwarding ``a``'s requests (its
  keepalives too) into the void;
- ``flapping``: that link goes down and up every 1.5 s (longer than the TTL);
- ``leader-isolated``: the classic case — the raft leader is isolated in a minority of
  one while ``a``'s client is connected to it (only to it); it keeps renewing leases
  until it notices it lost quorum;
- ``leader-isolated-all-endpoints``: the same, ``a``'s client given every endpoint (the
  isolated leader first): it may fail over and keep its term, or lose it — either way
  the invariants hold.

The checker then asserts what the other chaos scenarios assert: no stale token
accepted, accepted tokens never decrease, no acknowledged write lost, believed-
leadership intervals never overlap. Each scenario (but the last, which may legitimately
keep ``a``'s term) has a control: ``a`` is the *naive* contender — plain puts, no guard,
and it ignores its local deadline, trusting its lease until etcd says otherwise. After
the heal its writes reach etcd with its old token while ``b`` leads, and the checker
must report it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.history import Observer
from etcdfence.testing.netns import NetnsCluster

from .conftest import (
    ASYNC_CONTENDER,
    ContenderProcess,
    Contenders,
    ScenarioRecord,
    finish,
    netns_cluster,
    rounds,
    wait_until,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 1
ELECTION_TIMEOUT = 0.5
FLAP_PERIOD = 1.5
#: a new etcd leader extends every lease by TTL + election timeout; allow a few changes
TAKEOVER = 4 * (TTL + 2 * ELECTION_TIMEOUT) + 6.0

SCENARIOS = ["symmetric", "oneway", "flapping", "leader-isolated", "leader-isolated-all-endpoints"]
CONTROLS = SCENARIOS[:4]


@pytest.fixture(scope="module")
def etcd_cluster() -> Iterator[NetnsCluster]:
    """This module's cluster: members in network namespaces of our own."""
    yield from netns_cluster(ELECTION_TIMEOUT)


@pytest.fixture(autouse=True)
def _restore(etcd_cluster: NetnsCluster) -> Iterator[None]:
    yield
    etcd_cluster.heal()
    for index, member in enumerate(etcd_cluster.members):
        if member.paused:
            etcd_cluster.resume(index)
        if not member.running:
            etcd_cluster.restart(index)
    etcd_cluster.wait_for_leader(20)


def _queued(client: ef.Client, group: Contenders, n: int) -> bool:
    try:
        return len(client.get_prefix(group.layout.election + "/")) >= n
    except ef.EtcdfenceError:
        return False


def _start_pair(
    kind: str, cluster: NetnsCluster, client: ef.Client, group: Contenders, control: bool, n: int
) -> tuple[ContenderProcess, ContenderProcess, int, int]:
    """Start ``a`` on the member the fault will cut off and ``b`` on the others; return
    them with the raft leader and ``a``'s member (retrying if raft leadership moves
    while the contenders start)."""
    for _attempt in range(3):
        leader = cluster.wait_for_leader(15)
        target = leader if kind.startswith("leader-isolated") else (leader + 1) % len(cluster)
        endpoints = cluster.endpoints
        a_endpoints = [endpoints[target]]
        if kind.endswith("all-endpoints"):
            a_endpoints += [e for i, e in enumerate(endpoints) if i != target]
        if control:
            a = group.start(f"a{n}", a_endpoints, ttl=TTL, script=ASYNC_CONTENDER,
                            extra_args=["--naive"])  # fmt: skip
        else:
            a = group.start(f"a{n}", a_endpoints, ttl=TTL)
        try:
            group.wait_leader(20)
        except AssertionError:
            # a TTL-1 session on a loaded machine can expire before its first keepalive
            # answer (its campaign then ends with SessionExpired): start the pair again
            a.stop()
            continue
        assert group.leader() is a
        b = group.start(f"b{n}", [e for i, e in enumerate(endpoints) if i != target], ttl=TTL)
        wait_until(lambda: _queued(client, group, 2), 15, "b's key queued behind a's")
        if cluster.wait_for_leader(15) == leader:
            return a, b, leader, target
        a.stop()
        b.stop()
    raise AssertionError(
        "no stable start in 3 attempts (raft leadership kept moving, or a's session expired)"
    )


def _inject(kind: str, cluster: NetnsCluster, leader: int, target: int) -> str:
    if kind == "symmetric":
        cluster.cut(leader, target)
        return "cut leader<->follower"
    if kind == "oneway":
        cluster.cut_oneway(target, leader)
        return "cut follower->leader (one way)"
    if kind == "flapping":
        cluster.flap(leader, target, FLAP_PERIOD)
        return f"flap leader<->follower every {FLAP_PERIOD}s"
    cluster.isolate(leader)
    return "isolate raft leader" + (" (client: all endpoints)" if "all" in kind else "")


def _scenario(
    kind: str,
    cluster: NetnsCluster,
    client: ef.Client,
    group: Contenders,
    chaos: ScenarioRecord,
    *,
    control: bool,
    n: int = 0,
) -> dict[str, Any]:
    a, b, leader, target = _start_pair(kind, cluster, client, group, control, n)
    fault = _inject(kind, cluster, leader, target)
    cut = time.monotonic()
    chaos.fault(fault)
    info: dict[str, Any] = {"a": a, "b": b, "cut": cut}
    if kind.endswith("all-endpoints"):
        # a may fail over to a healthy member and keep its term, or lose it to b
        def settled() -> bool:
            kept = any(e.kind == "accepted" and e.t > cut + TTL + 1 for e in a.events)
            return kept or b.leading() is not None

        wait_until(settled, TAKEOVER, "a keeping its term through another member, or b leading")
        info["a_kept_term"] = b.leading() is None
    else:
        elected = b.wait_for(lambda e: e.kind == "elected", TAKEOVER, "b elected", after=cut)
        first = b.wait_for(lambda e: e.kind == "accepted", 10, "b writing", after=elected.t)
        info["b_elected"], info["b_first_ack"] = elected, first
        if not control:
            # a fenced itself by its local deadline, before b could be elected
            lost = a.wait_for(lambda e: e.kind == "lost", 10, "a lost", after=cut)
            info["a_lost"] = lost
    cluster.heal()
    healed = time.monotonic()
    info["healed"] = healed
    if control:
        # the naive a still believes it leads: its plain puts get through after the heal
        first_ack = info["b_first_ack"].t
        a.wait_for(
            lambda e: e.kind == "accepted" and e.t > first_ack,
            20,
            "the naive a's write accepted after b's",
        )
    else:
        # after the heal everybody settles on one leader that writes
        group.wait_leader(TAKEOVER)
    chaos.rounds += 1
    return info


@pytest.mark.timeout(120 + 60 * rounds(1))
@pytest.mark.parametrize("kind", SCENARIOS)
def test_member_partition(
    kind: str,
    etcd_cluster: NetnsCluster,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    chaos.scenario = f"partition_{kind}"
    infos = []
    for n in range(rounds(1)):
        infos.append(
            _scenario(kind, etcd_cluster, cluster_client, contenders, chaos, control=False, n=n)
        )
        for proc in contenders.procs:
            proc.stop()
    result = finish(contenders, observer, cluster_client, chaos)
    assert result.ok, result.report()
    assert result.stats["accepted"] > 0, result.report()
    for info in infos:
        if "b_elected" in info:
            lost, elected = info["a_lost"], info["b_elected"]
            assert lost.deadline is not None and lost.deadline < elected.t, (lost, elected)
            chaos.verdicts.append(
                f"a stopped believing {elected.t - lost.deadline:.2f}s before b was elected "
                f"({elected.t - info['cut']:.2f}s after the fault)"
            )
        else:
            chaos.verdicts.append(
                "a kept its term through another member"
                if info["a_kept_term"]
                else "a lost its term to b"
            )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", CONTROLS)
def test_member_partition_naive_control(
    kind: str,
    etcd_cluster: NetnsCluster,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    """The same fault with a naive holder (no guard, no local deadline): must fail."""
    chaos.scenario = f"partition_{kind}_naive_control"
    chaos.expect_violations = True
    chaos.expected_because = "naive holder: no guard, no deadline"
    _scenario(kind, etcd_cluster, cluster_client, contenders, chaos, control=True)
    result = finish(contenders, observer, cluster_client, chaos)
    assert not result.ok, f"the checker missed the naive holder's stale writes: {result}"
    kinds = {v.kind for v in result.violations}
    assert "stale-accepted" in kinds, result.report()
    assert result.stats["stale_accepted"] >= 1, result.report()


def test_netns_cluster_link_faults(etcd_cluster: NetnsCluster) -> None:
    """The harness itself: rules land where asked, an isolated leader is replaced and
    no longer reported as leader (it still answers Status), heal removes every rule,
    bad member indexes are refused."""
    leader = etcd_cluster.wait_for_leader(15)
    other = (leader + 1) % 3
    etcd_cluster.cut_oneway(leader, other)
    assert etcd_cluster.cuts() == [(leader, other)]
    etcd_cluster.heal()
    assert etcd_cluster.cuts() == []
    etcd_cluster.isolate(leader)
    assert sorted(etcd_cluster.cuts()) == sorted(
        (i, j) for i in range(3) for j in range(3) if i != j and leader in (i, j)
    )
    new = etcd_cluster.wait_for_leader(15, exclude=leader)
    assert new != leader
    assert etcd_cluster.member_status(leader) is not None  # isolated, still answering
    etcd_cluster.heal()
    assert etcd_cluster.cuts() == []
    with ef.Client(etcd_cluster.endpoints, timeout=5.0) as client:
        wait_until(lambda: _put_ok(client), 20, "a write after the heal")
    for bad in [(0, 0), (0, 3), (-1, 1)]:
        with pytest.raises(ef.EtcdfenceError):
            etcd_cluster.cut(*bad)
    with pytest.raises(ef.EtcdfenceError):
        etcd_cluster.flap(0, 1, 0)


def _put_ok(client: ef.Client) -> bool:
    try:
        client.put("netns-probe", "x")
    except ef.EtcdfenceError:
        return False
    return True

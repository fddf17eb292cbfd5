"""A leader cut off from etcd by a network partition (FaultProxy) for longer than its TTL.

Contender ``a`` talks to etcd only through a :class:`~etcdfence.testing.FaultProxy`;
``b`` talks to the cluster directly. ``a`` leads and writes; the proxy blackholes its
traffic until ``b`` has taken over and written, then heals:

- ``both-held``: both ways, bytes held back and delivered on heal (a partition that
  heals before TCP gives up);
- ``upstream-held``: only client → etcd, held: ``a``'s responses still arrive, but its
  keepalives and its next write wait in the partition. That write reaches etcd *after*
  ``b`` took over — a delayed packet — and must bounce;
- ``downstream``: only etcd → client, dropped: ``a``'s requests — keepalives too — reach
  etcd, the answers never come back. ``a`` must give up by its local deadline, etcd
  lets the lease run out only after the keepalives stop.

Whatever ``a`` wrote after the cut either landed before ``b``'s token or not at all.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.history import Observer, parse_write_value
from etcdfence.testing import FaultProxy
from etcdfence.testing.proxy import Direction

from .conftest import Contenders, ScenarioRecord, finish, rounds

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 1

MODES: dict[str, tuple[Direction, bool]] = {
    "both-held": ("both", True),
    "upstream-held": ("upstream", True),
    "downstream": ("downstream", False),
}


@pytest.mark.timeout(60 + 20 * rounds(1))
@pytest.mark.parametrize("mode", list(MODES))
def test_blackhole(
    mode: str,
    etcd_cluster: Any,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    direction, hold = MODES[mode]
    chaos.scenario = f"blackhole_{mode}"
    cuts: list[tuple[float, int]] = []
    with FaultProxy(etcd_cluster.endpoints[0]) as proxy:
        for n in range(rounds(1)):
            # a long client timeout for the held partition, so a's in-flight write is
            # still waiting for its answer when the partition heals
            a = contenders.start(f"a{n}", [proxy.endpoint], ttl=TTL, timeout=10.0 if hold else 2.0)
            contenders.wait_leader(15)
            assert contenders.leader() is a
            b = contenders.start(f"b{n}", etcd_cluster.endpoints, ttl=TTL)
            b.wait_for(lambda e: e.kind == "campaign", 15, "b campaigning")
            time.sleep(0.5)  # b's key is queued behind a's
            proxy.blackhole(direction, hold=hold)
            cut = time.monotonic()
            chaos.fault(f"blackhole {direction}{' (held)' if hold else ''}")
            elected = b.wait_for(lambda e: e.kind == "elected", TTL + 8, "b elected", after=cut)
            b.wait_for(lambda e: e.kind == "accepted", 5, "b writing", after=elected.t)
            took_over = elected.t - cut
            assert 0 < took_over < TTL + 5, f"b took over {took_over:.2f}s after the cut"
            proxy.heal()
            lost = a.wait_for(lambda e: e.kind == "lost", 15, "a lost", after=cut)
            # a stopped believing it led before b was elected: by its local deadline
            assert lost.deadline is not None and lost.deadline < elected.t, (lost, elected)
            cuts.append((cut, elected.token or 0))
            a.stop()
            b.stop()
            chaos.rounds += 1
    result = finish(contenders, observer, cluster_client, chaos)
    assert result.ok, result.report()
    events = contenders.events()
    outcome = {e.write_id: e for e in events if e.kind in ("accepted", "rejected", "unknown")}
    applied = {}  # write id -> revision at which etcd applied it
    for change in observer.changes:
        parsed = parse_write_value(change.value)
        if parsed is not None and not change.deleted:
            applied[parsed[0]] = change.revision
    for n, (cut, token) in enumerate(cuts):
        # a's writes not completed before the cut: in flight then, or attempted later
        late = [
            e
            for e in events
            if e.contender == f"a{n}"
            and e.kind == "write"
            and (e.t > cut or outcome.get(e.write_id) is None or outcome[e.write_id].t > cut)
        ]
        assert late, "a had no write in flight or attempted after the cut"
        late_applied = [applied[e.write_id] for e in late if e.write_id in applied]
        # nothing a wrote after the cut landed after b's token
        assert all(revision < token for revision in late_applied), (late_applied, token)
        if direction == "upstream":
            # a's first write that met the partition waited there and reached etcd on heal
            # — after b took over: it bounced ("rejected"), or a's client gave up on the
            # member first (its keepalive went unanswered, so calls waiting there end as
            # "unknown"); either way nothing a sent after the cut got in
            ended = [
                e
                for e in late
                if getattr(outcome.get(e.write_id), "kind", "") in ("rejected", "unknown")
            ]
            assert ended, late
            assert not [e for e in late if e.t > cut and e.write_id in applied]

"""Clock-rate skew: a leader whose clocks run fast or slow (libfaketime), cut off from etcd.

Contender ``a`` is the asyncio contender under libfaketime (``FAKETIME="+0 x<rate>"``:
``time.monotonic``, ``time.time`` and asyncio's timers all run at ``rate``), talking to
etcd through a :class:`~etcdfence.testing.FaultProxy`. ``b`` is an ordinary contender on
the cluster. Once ``a`` leads, the proxy holds all of ``a``'s traffic (a partition that
heals later): etcd expires ``a``'s lease ``TTL`` (+ 0–0.5 s, etcd's expiry tick) after
the last keepalive it received and ``b`` takes over, while ``a`` believes it leads until
its local deadline — ``TTL - margin`` *in its own clock* after it sent that keepalive,
i.e. ``(TTL - margin) / rate`` real seconds. So:

- rate error below ``margin / TTL`` (``rate > 1 - margin/TTL``; fast clocks always):
  ``a`` stops believing before etcd can expire the lease: believed-leadership intervals
  never overlap;
- well above it (``(TTL - margin) / rate > TTL + 0.5``): they overlap, and fencing still
  rejects every write ``a`` makes with its old token (the write held in the partition
  lands after ``b``'s and bounces; with ``heal-early`` the partition heals *inside* the
  overlap, while ``a`` still believes).

``a``'s event times are in its faked clock; the parent maps them to real time
(``ContenderProcess(clock_rate=...)``). ``SKEW_SWEEP=1`` runs a finer sweep of rates
(the numbers in docs/SKEW.md) and prints one line per rate.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.history import Observer, Term, parse_write_value
from etcdfence.testing import FaultProxy

from .conftest import ASYNC_CONTENDER, Contenders, ScenarioRecord, finish, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 2
MARGIN = 0.4  # explicit, so the bound is round: margin / TTL = 20 %
BOUND = 1 - MARGIN / TTL  # the slowest rate the margin covers: 0.8
EXPIRY_TICK = 0.5  # etcd checks lease expiry about every 500 ms
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SWEEP = os.environ.get("SKEW_SWEEP", "").strip() not in ("", "0")
SWEEP_RATES = [2.0, 1.5, 1.0, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5]
CASES = [r for r in SWEEP_RATES for _ in range(3)] if SWEEP else [2.0, 0.9, 0.5]


def _libfaketime() -> str | None:
    for path in (LIBFAKETIME, "/usr/lib/faketime/libfaketime.so.1"):
        if Path(path).exists():
            return path
    return None


@dataclass
class SkewRun:
    rate: float
    overlap: float  # a's believed end minus b's start (> 0: both believed they led)
    a_believed: float  # real seconds a believed it led after its last acknowledged keepalive
    stale_attempted: int
    stale_accepted: int
    writes_in_overlap: int  # a's writes attempted while b already led
    applied_in_overlap: int  # of those, how many etcd applied (must be 0)


RUNS: list[SkewRun] = []


def _terms(result: Any, who: str) -> list[Term]:
    return [t for t in result.terms if t.contender == who and t.believed]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rate", CASES, ids=[f"x{r}" for r in CASES])
def test_clock_rate_skew(
    rate: float,
    etcd_cluster: Any,
    cluster_client: ef.Client,
    contenders: Contenders,
    observer: Observer,
    chaos: ScenarioRecord,
) -> None:
    lib = _libfaketime()
    if lib is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    chaos.scenario = f"skew_x{rate}"
    env = dict(os.environ, LD_PRELOAD=lib, FAKETIME=f"+0 x{rate}", FAKETIME_NO_CACHE="1")
    with FaultProxy(etcd_cluster.endpoints[0]) as proxy:
        a = contenders.start(
            "a",
            [proxy.endpoint],
            ttl=TTL,
            # 1 s of real time (its clocks run at `rate`): a keeps attempting writes
            # while cut off; the partition holds them and delivers them when it heals
            timeout=1.0 * rate,
            script=ASYNC_CONTENDER,
            extra_args=["--margin", str(MARGIN)],
            env=env,
            clock_rate=rate,
        )
        assert contenders.wait_leader(30) is a
        b = contenders.start("b", etcd_cluster.endpoints, ttl=TTL)
        wait_until(
            lambda: len(cluster_client.get_prefix(contenders.layout.election + "/")) >= 2,
            20,
            "b's key queued behind a's",
        )
        proxy.blackhole("both", hold=True)
        cut = time.monotonic()
        chaos.fault(f"clock x{rate} + partition (held)")
        elected = b.wait_for(lambda e: e.kind == "elected", TTL / min(rate, 1) + 10, "b elected")
        first = b.wait_for(lambda e: e.kind == "accepted", 10, "b writing", after=elected.t)
        a.wait_for(lambda e: e.kind == "lost", TTL / rate + 10, "a lost", after=cut)
        proxy.heal()
        healed = time.monotonic()
        # the writes held in the partition reach etcd now, after b's: they must bounce
        chaos.rounds += 1
        result = finish(contenders, observer, cluster_client, chaos)

    a_terms, b_terms = _terms(result, "a"), _terms(result, "b")
    assert a_terms and b_terms, result.report()
    a_term = a_terms[-1]
    b_term = next(t for t in b_terms if t.start >= cut)
    overlap = a_term.end - b_term.start
    # how long a believed it led after sending its last acknowledged keepalive
    a_believed = (TTL - MARGIN) / rate
    events = contenders.events()
    applied = {
        parsed[0]
        for change in observer.changes
        if not change.deleted and (parsed := parse_write_value(change.value)) is not None
    }
    # a's writes attempted while b already led and a still believed it did
    in_overlap = [
        e
        for e in events
        if e.contender == "a" and e.kind == "write" and b_term.start <= e.t < a_term.end
    ]
    landed = [e for e in in_overlap if e.write_id in applied]
    run = SkewRun(
        rate,
        overlap,
        a_believed,
        result.stats["stale_attempted"],
        result.stats["stale_accepted"],
        len(in_overlap),
        len(landed),
    )
    RUNS.append(run)
    chaos.verdicts.append(
        f"rate x{rate}: a believed {a_believed:.2f}s after its last keepalive (TTL {TTL}); "
        f"overlap with b {overlap:+.3f}s; a's writes inside the overlap: {len(in_overlap)}, "
        f"applied {len(landed)}; stale writes {run.stale_attempted} attempted / "
        f"{run.stale_accepted} accepted; healed {healed - cut:.2f}s after the cut"
    )
    if SWEEP:
        print(f"\nSKEW rate={rate} overlap={overlap:+.3f} a_believed={a_believed:.3f} "
              f"in_overlap={len(in_overlap)} applied={len(landed)} "
              f"stale={run.stale_attempted}/{run.stale_accepted} "
              f"kinds={sorted({v.kind for v in result.violations})}")  # fmt: skip

    # fencing holds at every rate: nothing stale got in, whatever a believed
    kinds = {v.kind for v in result.violations}
    assert kinds <= {"leadership-overlap"}, result.report()
    assert result.stats["stale_accepted"] == 0, result.report()
    assert not landed, result.report()
    if rate >= BOUND + 0.05:  # inside the guarantee, with a little slack
        assert overlap < 0, f"x{rate} is inside margin/TTL but beliefs overlapped:\n" + (
            result.report()
        )
        assert result.ok, result.report()
    elif (TTL - MARGIN) / rate > TTL + EXPIRY_TICK + 0.3:
        # far outside it: a believed past the lease's expiry, the checker saw it, and
        # the writes a made meanwhile (held by the partition, delivered after b's) bounced
        chaos.expect_violations = True
        chaos.expected_because = "clock outside margin/TTL"
        assert overlap > 0, f"x{rate}: expected a believed-leadership overlap, got {overlap:+.3f}s"
        assert "leadership-overlap" in kinds, result.report()
        assert in_overlap, f"a attempted no write inside the overlap\n{result.report()}"
        # a write is stale once b's higher token has been acknowledged before it started;
        # one a attempted between b's election and b's first acknowledged write is not yet
        after_ack = [e for e in in_overlap if e.t > first.t]
        assert result.stats["stale_attempted"] >= len(after_ack), result.report()

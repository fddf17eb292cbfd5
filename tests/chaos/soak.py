"""The soak: randomized fault schedules, round after round, each checked by the history checker.

    make soak ROUNDS=200 SEED=1234
    .venv/bin/python tests/chaos/soak.py --rounds 200 --seed 1234 [--summary docs/SOAK.md]

One 3-member etcd cluster serves the whole soak — in network namespaces
(:class:`~etcdfence.testing.netns.NetnsCluster`) when this machine allows it, so member
partitions are on the menu; else a loopback :class:`~etcdfence.testing.EtcdCluster`
without them. Every round gets a fresh key root, an :class:`Observer`, and three
contender processes that campaign for one election and write one resource through the
fence guard (``python -m etcdfence.testing.contender``): two threaded, one asyncio,
each on all endpoints or pinned to one member. The round's schedule, drawn from the seed:

- ``skew`` (40 % of rounds): the asyncio contender runs under libfaketime at a clock rate
  inside the guarantee (x0.9 … x2.0; margin/TTL is 20 % at TTL 1), so every invariant,
  non-overlap included, must hold;
- one or two of: ``pause`` (SIGSTOP the leading contender past its TTL — on waking it
  writes once with its old token), ``kill`` (SIGKILL an etcd member, the raft leader or a
  follower, then restart it), ``partition`` (isolate the raft leader or a follower, cut a
  leader–follower link both ways or one way, or flap it, for 1.5–4 s), ``compaction``
  (compact etcd's history up to the revision the observer has seen);
- leadership also moves on its own in half of the rounds (``--term 1.5``).

After the faults the network heals, members are restored, some contender must lead and
write again, the round runs on for 1–2.5 s, and the checker runs on the round's history:
no stale token accepted, accepted tokens never decrease, no acknowledged write lost,
believed-leadership intervals never overlap, tokens unique and increasing, no phantom
leader. The seed fixes
the schedule (faults, targets, durations, rates); the timing of a real cluster does not
repeat exactly. Exit status 1 if any round had a violation.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import etcdfence as ef
from chaos.conftest import (
    ASYNC_CONTENDER,
    Contenders,
    ScenarioRecord,
    finish,
)
from etcdfence.history import Layout, Observer
from etcdfence.testing import EtcdCluster
from etcdfence.testing.netns import NetnsCluster, netns_unavailable

TTL = 1
PAUSE = 2 * TTL + 0.5
SKEW_RATES = [0.9, 0.95, 1.25, 1.5, 2.0]  # inside margin/TTL = 20 % (bound x0.8), slack 0.1
PARTITIONS = ["isolate-leader", "isolate-follower", "cut", "oneway", "flap"]
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@dataclass
class Plan:
    """One round's schedule, drawn from the seed before anything runs."""

    faults: list[tuple[str, dict[str, Any]]]
    skew: float | None
    term: float
    pins: list[int | None]  # per contender: a member index, or None for all endpoints
    settle: float  # seconds to keep running after recovery (late effects, hand-overs)


@dataclass
class Totals:
    rounds: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    terms: int = 0
    writes: int = 0
    accepted: int = 0
    stale_attempted: int = 0
    stale_accepted: int = 0
    violations: int = 0
    ack_lost: int = 0
    stalls: int = 0
    errors: int = 0
    failed_rounds: list[int] = field(default_factory=list)


def draw(rng: random.Random, netns: bool, skew_ok: bool) -> Plan:
    pool = ["pause", "kill", "compaction"] + (["partition"] * 2 if netns else [])
    faults: list[tuple[str, dict[str, Any]]] = []
    for name in rng.sample(pool, rng.choice([1, 2])):
        if name == "pause":
            faults.append(("pause", {}))
        elif name == "kill":
            faults.append(("kill", {"role": rng.choice(["leader", "follower"]),
                                    "down": round(rng.uniform(0.5, 2.0), 2)}))  # fmt: skip
        elif name == "partition":
            faults.append(("partition", {"kind": rng.choice(PARTITIONS),
                                         "hold": round(rng.uniform(1.5, 4.0), 2),
                                         "period": rng.choice([0.5, 1.5])}))  # fmt: skip
        else:
            faults.append(("compaction", {}))
    skew = rng.choice(SKEW_RATES) if skew_ok and rng.random() < 0.4 else None
    term = rng.choice([0.0, 1.5])
    pins = [rng.choice([None, None, 0, 1, 2]) if netns else None for _ in range(3)]
    settle = round(rng.uniform(1.0, 2.5), 2)
    return Plan(faults, skew, term, pins, settle)


def describe(plan: Plan) -> str:
    parts = []
    for name, args in plan.faults:
        if name == "partition":
            parts.append(f"partition({args['kind']} {args['hold']}s)")
        elif name == "kill":
            parts.append(f"kill({args['role']})")
        else:
            parts.append(name)
    if plan.skew is not None:
        parts.append(f"skew(x{plan.skew})")
    return ", ".join(parts)


def _restore(cluster: Any) -> None:
    if isinstance(cluster, NetnsCluster):
        cluster.heal()
    for index, member in enumerate(cluster.members):
        if member.paused:
            cluster.resume(index)
        if not member.running:
            cluster.restart(index)
    cluster.wait_for_leader(30)


def _inject(
    name: str, args: dict[str, Any], cluster: Any, group: Contenders, client: ef.Client,
    observer: Observer, rng: random.Random,
) -> None:  # fmt: skip
    if name == "pause":
        leader = group.wait_leader(20)
        leader.pause()
        time.sleep(PAUSE)  # the fault's length, not a wait for something
        leader.resume()
    elif name == "kill":
        raft = cluster.wait_for_leader(20)
        victim = raft if args["role"] == "leader" else (raft + 1) % len(cluster)
        cluster.kill(victim)
        time.sleep(args["down"])
        cluster.restart(victim)
    elif name == "partition":
        raft = cluster.wait_for_leader(20)
        follower = (raft + 1) % len(cluster)
        kind = args["kind"]
        if kind == "isolate-leader":
            cluster.isolate(raft)
        elif kind == "isolate-follower":
            cluster.isolate(follower)
        elif kind == "cut":
            cluster.cut(raft, follower)
        elif kind == "oneway":
            cluster.cut_oneway(follower, raft)
        else:
            cluster.flap(raft, follower, args["period"])
        time.sleep(args["hold"])
        cluster.heal()
    elif name == "compaction":
        group.wait_leader(20)
        revision = observer.revision
        if revision > 0:
            client.compact(revision)


def run_round(
    n: int, plan: Plan, rng: random.Random, cluster: Any, client: ef.Client, totals: Totals,
    log_dir: Path, verbose: bool,
) -> None:  # fmt: skip
    started = time.monotonic()
    layout = Layout(f"soak/r{n}-{os.getpid()}")
    round_dir = log_dir / f"r{n}"
    round_dir.mkdir()
    group = Contenders(client, layout, round_dir)
    observer = Observer(client, layout, start_revision=client.revision() + 1).start()
    record = ScenarioRecord(f"round {n}")
    stalled = False
    try:
        endpoints = cluster.endpoints
        for i, pin in enumerate(plan.pins):
            eps = list(endpoints) if pin is None else [endpoints[pin]]
            if pin is None:
                rng.shuffle(eps)
            kwargs: dict[str, Any] = {"ttl": TTL, "term": plan.term}
            if i == 2:
                kwargs["script"] = ASYNC_CONTENDER
                if plan.skew is not None and Path(LIBFAKETIME).exists():
                    kwargs["env"] = dict(
                        os.environ, LD_PRELOAD=LIBFAKETIME, FAKETIME=f"+0 x{plan.skew}"
                    )
                    kwargs["clock_rate"] = plan.skew
            group.start(f"c{i}", eps, **kwargs)
        group.wait_leader(30)
        for name, args in plan.faults:
            _inject(name, args, cluster, group, client, observer, rng)
            totals.faults[name if name != "partition" else f"partition ({args['kind']})"] += 1
        if plan.skew is not None:
            totals.faults["skew"] += 1
        _restore(cluster)
        try:
            group.wait_leader(30)
        except AssertionError:
            stalled = True
            totals.stalls += 1
        time.sleep(plan.settle)  # keep running: late writes, compacted watches, hand-overs
        result = finish(group, observer, client, record)
    except Exception:  # a harness problem, not a verdict: report it and go on
        totals.errors += 1
        totals.failed_rounds.append(n)
        print(f"round {n}: harness error\n{traceback.format_exc()}", flush=True)
        group.stop_all()
        observer.stop()
        _restore(cluster)
        return
    except BaseException:  # SIGTERM / Ctrl-C: leave no contender behind
        group.stop_all()
        observer.stop()
        raise
    observer.stop()
    stats = result.stats
    totals.rounds += 1
    totals.terms += stats["terms"]
    totals.writes += stats["writes"]
    totals.accepted += stats["accepted"]
    totals.stale_attempted += stats["stale_attempted"]
    totals.stale_accepted += stats["stale_accepted"]
    totals.violations += len(result.violations)
    totals.ack_lost += sum(1 for v in result.violations if v.kind == "ack-lost")
    if not result.ok:
        totals.failed_rounds.append(n)
    line = (
        f"round {n}: {describe(plan)}: {stats['terms']} terms, {stats['writes']} writes "
        f"({stats['accepted']} accepted, {stats['rejected']} rejected, {stats['unknown']} "
        f"unknown), stale {stats['stale_attempted']}/{stats['stale_accepted']}, "
        f"{len(result.violations)} violations{' (stalled)' if stalled else ''} "
        f"[{time.monotonic() - started:.1f}s]"
    )
    print(line, flush=True)
    if not result.ok:
        print(result.report(), flush=True)
    elif verbose:
        print(f"  {result}", flush=True)


def summary(totals: Totals, args: argparse.Namespace, cluster_kind: str, seconds: float) -> str:
    faults = sum(totals.faults.values())
    rows = [
        ("Rounds", str(totals.rounds)),
        ("Faults injected", f"{faults} (" + ", ".join(
            f"{name} {count}" for name, count in sorted(totals.faults.items())) + ")"),
        ("Leadership terms", str(totals.terms)),
        ("Guarded writes (accepted)", f"{totals.writes} ({totals.accepted})"),
        ("Stale writes attempted", str(totals.stale_attempted)),
        ("Stale writes accepted", str(totals.stale_accepted)),
        ("Violations", str(totals.violations)),
        ("Acknowledged writes lost", str(totals.ack_lost)),
        ("Rounds without a leader after recovery (liveness)", str(totals.stalls)),
        ("Harness errors", str(totals.errors)),
    ]  # fmt: skip
    lines = [
        f"Soak: `make soak ROUNDS={args.rounds} SEED={args.seed}` — {cluster_kind}, "
        f"{seconds / 60:.1f} min",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
    ]
    if totals.failed_rounds:
        lines.append(f"\nRounds with violations or errors: {totals.failed_rounds}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--summary", type=Path, default=None, help="also write the table here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    # SIGTERM ends the soak through the context managers: members stopped, namespaces gone
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    rng = random.Random(args.seed)
    why = netns_unavailable()
    netns = why is None
    skew_ok = Path(LIBFAKETIME).exists()
    cluster: Any = NetnsCluster(3) if netns else EtcdCluster(3)
    kind = "etcd members in network namespaces" if netns else "loopback etcd cluster"
    print(f"soak: {args.rounds} rounds, seed {args.seed}, {kind}"
          + ("" if netns else f" (no member partitions: {why})")
          + ("" if skew_ok else " (no skew: libfaketime missing)"), flush=True)  # fmt: skip
    totals = Totals()
    started = time.monotonic()
    with cluster, ef.Client(cluster.endpoints, timeout=2.0) as client, \
            tempfile.TemporaryDirectory(prefix="etcdfence-soak-") as tmp:  # fmt: skip
        for n in range(1, args.rounds + 1):
            plan = draw(rng, netns, skew_ok)
            run_round(n, plan, rng, cluster, client, totals, Path(tmp), args.verbose)
    text = summary(totals, args, kind, time.monotonic() - started)
    print("\n" + text, flush=True)
    if args.summary is not None:
        args.summary.write_text(text)
    return 1 if totals.violations or totals.stale_accepted else 0


if __name__ == "__main__":
    sys.exit(main())

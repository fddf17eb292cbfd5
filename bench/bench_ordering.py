"""Within-term ordering (#17): what the (token, epoch) guard costs and what it buys.

Printed side by side in one run:

  (a) guard.put / client.put, sequential (sync) and 64 in flight (async, distinct
      resources), on one durable embedded etcd, the contenders alternating in rounds
      — the guard now carries an epoch; target: unchanged within noise against
      bench/REPORT.md (0.86–0.94× sequential, 0.82× at 64 in flight);
  (b) cut of the holder's member → first acknowledged guarded write, with every
      endpoint given: the follower-isolation scenario of tests/chaos/test_ordering.py
      on a NetnsCluster (members in network namespaces; needs root), the cut landing at
      a random point of the session's keepalive cycle (TTL 3); target ≤ 1.5 s
      (before #17: 5.15 s with timeout 5 s);
  (c) late landings in that scenario over ``--runs`` runs, with ordering (target 0)
      and for the control (the 0.1 guard txn, epoch always 0), runs alternating.

    python bench/bench_ordering.py [--runs 20] [--n 300] [--rounds 7] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # chaos scenarios

from _common import interleave, machine, table, verdict

import etcdfence as ef
from etcdfence.testing import EtcdServer
from etcdfence.testing.netns import NetnsCluster, netns_unavailable

#: bench/REPORT.md before #17 (bench_client.py / bench_throughput.py, fsync)
BEFORE_SEQ = "0.86–0.94×"
BEFORE_64 = "0.82×"


def throughput(n: int, rounds: int) -> tuple[float, float, str]:
    """(a): guarded/plain ratios, sequential and 64 in flight."""
    with EtcdServer() as server:
        client = ef.Client(server.endpoint)
        guard = client.fence("bench/ordering")
        value = b"x" * 64
        token = ef.FencingToken(10**12)  # far above any revision: always accepted

        def plain() -> int:
            for i in range(n):
                client.put(f"bench/p/{i % 64}", value)
            return n

        def guarded() -> int:
            for i in range(n):
                guard.put(token, f"bench/g/{i % 64}", value)
            return n

        loop = asyncio.new_event_loop()
        aclient = ef.AsyncClient(server.endpoint)
        aguards = [aclient.fence(f"bench/r{i}") for i in range(64)]

        async def in_flight(make: object, total: int) -> int:
            sem = asyncio.Semaphore(64)

            async def one(i: int) -> None:
                async with sem:
                    await make(i)  # type: ignore[operator]

            await asyncio.gather(*(one(i) for i in range(total)))
            return total

        def async_plain() -> int:
            return loop.run_until_complete(
                in_flight(lambda i: aclient.put(f"bench/a/{i % 64}", value), n * 4)
            )

        def async_guarded() -> int:
            return loop.run_until_complete(
                in_flight(lambda i: aguards[i % 64].put(token, f"bench/ag/{i % 64}", value), n * 4)
            )

        plain(), guarded(), async_plain(), async_guarded()  # warm up
        seq = interleave({"plain": plain, "guarded": guarded}, rounds)
        par = interleave({"plain": async_plain, "guarded": async_guarded}, rounds)
        loop.run_until_complete(aclient.aclose())
        loop.close()
        client.close()
    detail = (
        f"{seq['guarded']:.0f} vs {seq['plain']:.0f}/s; "
        f"64 in flight {par['guarded']:.0f} vs {par['plain']:.0f}/s"
    )
    return seq["guarded"] / seq["plain"], par["guarded"] / par["plain"], detail


def partitions(runs: int, partition_seconds: float) -> dict[str, list]:  # type: ignore[type-arg]
    """(b) and (c): the follower-isolation scenario, ordered and control alternating."""
    from chaos.test_ordering import follower_isolation

    out: dict[str, list] = {"ordered": [], "control": []}  # type: ignore[type-arg]
    with NetnsCluster(3, election_timeout_ms=500) as cluster:
        for i in range(runs):
            for mode in ("ordered", "control") if i % 2 == 0 else ("control", "ordered"):
                started = time.monotonic()
                run = follower_isolation(
                    cluster,
                    ordered=mode == "ordered",
                    root=f"bench/ordering/{mode}/{i}",
                    partition_seconds=partition_seconds,
                )
                out[mode].append(run)
                first = run.first_ack_after_cut
                print(
                    f"  run {i:2d} {mode:7s} first ack {first or float('nan'):.2f}s after the "
                    f"cut (isolate took {run.cut - run.cut_began:.2f}s), unknown "
                    f"{len(run.unknown)}, late landings {len(run.late)}, checker "
                    f"{'ok' if run.check.ok else 'FAIL'}, kept lock {run.kept_lock} "
                    f"[{time.monotonic() - started:.1f}s]",
                    flush=True,
                )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="partition runs per mode")
    parser.add_argument("--n", type=int, default=300, help="writes per throughput round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--partition", type=float, default=2.5, help="seconds cut off")
    parser.add_argument("--quick", action="store_true", help="5 runs per mode, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds = 5, 3
    started = time.monotonic()
    print(f"# bench_ordering — {machine()}", flush=True)
    seq, par, detail = throughput(args.n, args.rounds)
    rows: list[tuple[str, ...]] = [
        ("guard.put / client.put, sequential", f"{seq:.2f}x", f"≈ {BEFORE_SEQ}", "", detail),
        ("guarded / plain, 64 in flight (async)", f"{par:.2f}x", f"≈ {BEFORE_64}", "", ""),
    ]
    why = netns_unavailable()
    if why is not None:
        rows.append(("partition runs", "skipped", "", "", why))
    else:
        runs = partitions(args.runs, args.partition)
        firsts = [r.first_ack_after_cut for r in runs["ordered"] if r.first_ack_after_cut]
        stuck = [r.stuck_ended for r in runs["ordered"] if r.stuck_ended is not None]
        worst = max(firsts) if firsts else float("inf")
        rows.append(
            (
                "cut → first acked guarded write (worst)",
                f"{worst:.2f} s",
                "<= 1.5 s",
                verdict(worst, 1.5, higher_is_better=False),
                f"median {statistics.median(firsts):.2f} s, min {min(firsts):.2f} s "
                f"over {len(firsts)} runs; stuck write ended as unknown after "
                f"{statistics.median(stuck):.2f} s median (before #17: 5.15 s)",
            )
        )
        for mode, target in (("ordered", 0), ("control", None)):
            done = runs[mode]
            late = sum(len(r.late) for r in done)
            with_late = sum(1 for r in done if r.late)
            unknown = sum(len(r.unknown) for r in done)
            flagged = sum(
                1 for r in done if any(v.kind == "late-write" for v in r.check.violations)
            )
            rows.append(
                (
                    f"late landings, {mode}, {len(done)} runs",
                    f"{late}",
                    "0" if target == 0 else "(control) > 0",
                    verdict(-late, 0) if target == 0 else ("shown" if late else "NOT shown"),
                    f"{with_late}/{len(done)} runs; {unknown} writes unknown; checker "
                    f"flagged {flagged}; lock kept in {sum(r.kept_lock for r in done)}",
                )
            )
    print()
    print(table(rows, ("measure", "value", "target", "verdict", "detail")))
    print(f"# {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

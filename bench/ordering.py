"""Within-term ordering under a member partition (#17): the fail-over time of a holder's
guarded writes and the late landings the ordering rule prevents.

The follower-isolation scenario of ``tests/chaos/test_ordering.py`` on a 3-member
``NetnsCluster`` (members in network namespaces; needs root; skipped otherwise):
session TTL 3, client timeout 5 s, every endpoint given, a follower first; the follower
is isolated at a random point of the session's keepalive cycle, the holder writes back
to back for ``--partition`` seconds through the cut, then the heal. Runs alternate
between the guard *with* ordering and the control (the 0.1 guard txn sent raw, epoch
always 0), ``--runs`` each:

* cut of the holder's member → first acknowledged guarded write (target ≤ 1.5 s; before
  #17: 5.15 s with timeout 5 s);
* late landings — a write of the term applied after a later acknowledged one — with
  ordering (target 0) and in the control (must show them, or the scenario proves
  nothing).

What the (token, epoch) guard costs next to a plain write is measured with every other
guarded write in the throughput topic.

    python -m bench.ordering [--quick] [--runs 20] [--partition 2.5] [--render-only]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import Json, Part, Stopwatch, md_table, run_topic, save_data, topic_args

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # chaos scenarios

from etcdfence.testing.netns import NetnsCluster, netns_unavailable

MODES = ("ordered", "control")


def _summary(run: Any) -> Json:
    """The numbers of one scenario run that the report uses."""
    return {
        "first_ack_after_cut_s": run.first_ack_after_cut,
        "isolate_s": round(run.cut - run.cut_began, 3),
        "stuck_ended_s": run.stuck_ended,
        "unknown": len(run.unknown),
        "late": len(run.late),
        "checker_ok": run.check.ok,
        "late_write_flagged": any(v.kind == "late-write" for v in run.check.violations),
        "kept_lock": run.kept_lock,
    }


def partitions(runs: int, partition_seconds: float) -> dict[str, list[Json]]:
    """The follower-isolation scenario, ordered and control alternating."""
    from chaos.test_ordering import follower_isolation

    out: dict[str, list[Json]] = {mode: [] for mode in MODES}
    with NetnsCluster(3, election_timeout_ms=500) as cluster:
        for i in range(runs):
            for mode in MODES if i % 2 == 0 else tuple(reversed(MODES)):
                started = time.monotonic()
                run = follower_isolation(
                    cluster,
                    ordered=mode == "ordered",
                    root=f"bench/ordering/{mode}/{i}",
                    partition_seconds=partition_seconds,
                )
                got = _summary(run)
                out[mode].append(got)
                first = got["first_ack_after_cut_s"]
                print(
                    f"  run {i:2d} {mode:7s} first ack {first or float('nan'):.2f}s after the "
                    f"cut (isolate took {got['isolate_s']:.2f}s), unknown {got['unknown']}, "
                    f"late landings {got['late']}, checker "
                    f"{'ok' if got['checker_ok'] else 'FAIL'}, kept lock {got['kept_lock']} "
                    f"[{time.monotonic() - started:.1f}s]",
                    flush=True,
                )
    return out


def measure(quick: bool, *, runs: int | None = None, partition: float = 2.5) -> Json:
    """Partition runs per mode (or why they were skipped); writes ``results/ordering.json``."""
    runs = runs or (5 if quick else 20)
    clock = Stopwatch()
    data: Json = {"runs": runs, "partition_s": partition, "ttl": 3, "timeout_s": 5}
    why = netns_unavailable()
    if why is not None:
        print(f"  partition runs skipped: {why}", flush=True)
        data["skipped"] = why
    else:
        data["modes"] = partitions(runs, partition)
    return save_data("ordering", data, clock)


def _late_row(part: Part, mode: str, done: list[Json]) -> list[str]:
    late = sum(r["late"] for r in done)
    with_late = sum(1 for r in done if r["late"])
    unknown = sum(r["unknown"] for r in done)
    flagged = sum(1 for r in done if r["late_write_flagged"])
    kept = sum(1 for r in done if r["kept_lock"])
    detail = (
        f"{late} in {len(done)} runs ({with_late} runs with any; {unknown} writes "
        f"outcome-unknown; the checker's `late-write` flagged {flagged}; lock kept in {kept})"
    )
    if mode == "ordered":
        ok = late == 0
        part.add("late", "late landings, follower isolated, with ordering", detail, ok, "0")
        return ["late landings, with ordering", "1 per run", detail, "0", _verdict(ok)]
    ok = late > 0
    part.add("control", "late landings, control (ordering off)", detail, ok, "shown (> 0)")
    return ["late landings, control (ordering off)", "—", detail, "shown", _verdict(ok, "shown")]


def _verdict(ok: bool, word: str = "met") -> str:
    return f"**{word}**" if ok else f"**NOT {word}**"


def render(data: Json) -> Part:
    """The ordering section: fail-over time and late landings, ordered vs control."""
    part = Part("ordering", "Within-term ordering (#17)", "", machine=data.get("machine"))
    intro = (
        f"The follower-isolation scenario of `tests/chaos/test_ordering.py` on a 3-member "
        f"`NetnsCluster` (session TTL {data['ttl']}, client timeout {data['timeout_s']} s, "
        "every endpoint given, a follower first; the follower is isolated at a random point "
        f"of the keepalive cycle, the holder writes back to back for {data['partition_s']} s "
        f"through the cut, then the heal), {data['runs']} runs with ordering and "
        f"{data['runs']} control runs (the 0.1 guard txn sent raw, epoch always 0), "
        "alternating. The guard's cost next to a plain write is in the throughput section."
    )
    if "modes" not in data:
        part.section = f"{intro}\n\nNot measured: {data.get('skipped', 'no runs')}.\n"
        return part
    ordered = data["modes"]["ordered"]
    firsts = [r["first_ack_after_cut_s"] for r in ordered if r["first_ack_after_cut_s"]]
    stuck = [r["stuck_ended_s"] for r in ordered if r["stuck_ended_s"] is not None]
    worst = max(firsts) if firsts else float("inf")
    measured = (
        f"worst {worst:.2f} s, median {statistics.median(firsts):.2f} s, min "
        f"{min(firsts):.2f} s ({len(firsts)} runs); the stuck write ended as unknown after "
        f"{statistics.median(stuck):.2f} s median"
        if firsts and stuck
        else "no acknowledged write after the cut"
    )
    ok = worst <= 1.5
    part.add("failover", "cut of the holder's member → first acked guarded write", measured,
             ok, "≤ 1.5 s")  # fmt: skip
    rows = [
        [
            "cut of the holder's member → first acknowledged guarded write",
            "5.15 s (timeout 5 s)",
            measured,
            "≤ 1.5 s",
            _verdict(ok),
        ],
        _late_row(part, "ordered", ordered),
        _late_row(part, "control", data["modes"]["control"]),
    ]
    part.section = "\n".join(
        [
            intro,
            "",
            md_table(["measure", "before #17", "measured", "target", "verdict"], rows),
            "",
            EXPLAINED,
        ]
    )
    return part


EXPLAINED = (
    "The fail-over time is the keepalive's: the session sends a keepalive every TTL/3 and "
    "gives an endpoint TTL/6 to answer, then closes its channel, which ends the write stuck "
    "on it as outcome-unknown; the guard fences that attempt off through the next member "
    "and the next write is acknowledged a few ms later. So the time lies between TTL/6 and "
    "TTL/3 + TTL/6 (0.5–1.5 s at TTL 3) depending on where in the keepalive cycle the cut "
    "lands.\n"
)


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--runs", type=int, default=None, help="runs per mode (20; quick 5)")
    parser.add_argument("--partition", type=float, default=2.5, help="seconds cut off")
    args = parser.parse_args(argv)
    return run_topic(
        "ordering",
        lambda: measure(args.quick, runs=args.runs, partition=args.partition),
        render,
        args.render_only,
    )


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: run every benchmark against a fresh embedded etcd, then write
``bench/REPORT.md`` and the PNG plots (``bench/report.py``).

    python bench/run_all.py            # everything, ≲ 10 min on 2 cores
    python bench/run_all.py --quick    # fewer rounds and samples, ≲ 2 min (or QUICK=1,
                                       # as in `make bench QUICK=1`)
    python bench/run_all.py --only drain,handoff    # a subset (then the report)
    python bench/run_all.py --report-only           # redraw from bench/out/*.json

Each benchmark is its own process and starts its own etcd. The curve benchmarks
(``bench_drain``, ``bench_handoff``, ``bench_throughput``, ``bench_hold``,
``bench_failover``, ``bench_cluster``) write ``bench/out/<name>.json``; the table benchmarks
(``bench_client``, ``bench_locks``, ``bench_sql``, ``bench_ordering``) print tables, kept in
``bench/out/<name>.txt`` and quoted in the report's appendix. ``bench/out/run.json``
records what ran, how long it took and the load average before and after each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

#: (name, default arguments, --quick arguments); curve benches take --quick themselves.
CURVES: list[tuple[str, list[str], list[str]]] = [
    ("drain", [], ["--quick"]),
    ("handoff", [], ["--quick"]),
    ("throughput", [], ["--quick"]),
    ("hold", [], ["--quick"]),
    ("failover", [], ["--quick"]),
    ("cluster", [], ["--quick", "--sizes", "3"]),
]
TABLES: list[tuple[str, list[str], list[str]]] = [
    ("client", [], ["--n", "100", "--rounds", "3"]),
    ("locks", [], ["--rounds", "2"]),
    ("sql", [], ["--n", "300"]),
    ("ordering", [], ["--quick"]),
]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(name: str, args: list[str], capture: bool) -> dict[str, object]:
    script = HERE / f"bench_{name}.py"
    entry: dict[str, object] = {"bench": name, "args": args, "load_before": _load()}
    if not script.exists():
        entry.update(status="missing", seconds=0.0, load_after=_load())
        print(f"# ===== bench_{name}.py: not present, skipped", flush=True)
        return entry
    print(f"\n# ===== bench_{name}.py {' '.join(args)}", flush=True)
    started = time.monotonic()
    command = [sys.executable, str(script), *args]
    if capture:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        code = proc.wait()
        (OUT / f"{name}.txt").write_text("".join(lines))
    else:
        code = subprocess.call(command)
    entry.update(
        status="ok" if code == 0 else f"failed (exit {code})",
        seconds=round(time.monotonic() - started, 1),
        load_after=_load(),
    )
    print(f"# ----- bench_{name}.py: {entry['status']} in {entry['seconds']} s", flush=True)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds: ≲ 2 minutes")
    parser.add_argument("--only", default="", help="comma-separated bench names to run")
    parser.add_argument("--report-only", action="store_true", help="just redraw the report")
    args = parser.parse_args()
    args.quick = args.quick or os.environ.get("QUICK", "") not in ("", "0")
    OUT.mkdir(parents=True, exist_ok=True)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    started = time.monotonic()
    entries: list[dict[str, object]] = []
    failed = False
    if not args.report_only:
        # The table benches come from other issues; --quick keeps the report's
        # curves and skips them (their own targets are printed by them).
        plan = [(n, a, q, False) for n, a, q in CURVES]
        if not args.quick:
            plan = [(n, a, q, True) for n, a, q in TABLES] + plan
        for name, default, quick, capture in plan:
            if only and name not in only:
                continue
            entry = run(name, quick if args.quick else default, capture)
            entries.append(entry)
            failed |= entry["status"] not in ("ok", "missing")
        meta = {
            "quick": args.quick,
            "only": sorted(only),
            "seconds": round(time.monotonic() - started, 1),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "benches": entries,
        }
        previous = OUT / "run.json"
        if only and previous.exists():
            # a partial re-run: keep the other benches' entries (their JSON is still there)
            old = json.loads(previous.read_text())
            rerun = {e["bench"] for e in entries}
            kept = [e for e in old.get("benches", []) if e["bench"] not in rerun]
            meta["benches"] = kept + entries
            meta["seconds"] = old.get("seconds", meta["seconds"])
            meta["quick"] = old.get("quick", args.quick)
            meta["rerun"] = sorted(rerun)
        (OUT / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    print("\n# ===== report.py", flush=True)
    failed |= subprocess.call([sys.executable, str(HERE / "report.py")]) != 0
    print(f"# total {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

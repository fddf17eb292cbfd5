"""`make bench`: measure and render every topic, each in its own process with its own
etcd, then assemble ``bench/REPORT.md`` (``bench/report.py``).

    python -m bench.run_all                          # every topic, ≲ 10 min on 2 cores
    python -m bench.run_all --quick                  # fewer rounds and sizes (or QUICK=1)
    python -m bench.run_all --topics drain,handoff   # a subset (or TOPICS=drain,handoff);
                                                     # the other topics' parts stay
    python -m bench.run_all --render-only            # redraw every part from its raw data
    python -m bench.run_all --report-only            # only reassemble the report

``make bench QUICK=1 TOPICS=drain,handoff`` passes both. Each topic writes
``bench/results/<topic>.json`` (raw), ``<topic>.part.json`` (rendered) and its plots;
``bench/results/run.json`` records what ran, how long it took and the load average
before and after each topic (a partial run keeps the other topics' entries).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench._common import ROOT, TOPICS, loadavg, python_child_env, results_dir


def run(topic: str, args: list[str]) -> dict[str, object]:
    entry: dict[str, object] = {"topic": topic, "args": args, "load_before": loadavg()}
    print(f"\n# ===== {topic}.py {' '.join(args)}", flush=True)
    started = time.monotonic()
    code = _module(f"bench.{topic}", *args)
    entry.update(
        status="ok" if code == 0 else f"failed (exit {code})",
        seconds=round(time.monotonic() - started, 1),
        load_after=loadavg(),
    )
    print(f"# ----- {topic}.py: {entry['status']} in {entry['seconds']} s", flush=True)
    return entry


def _module(name: str, *args: str) -> int:
    """Run ``python -m <name> <args>`` from the checkout's root; its exit status."""
    return subprocess.call([sys.executable, "-m", name, *args], cwd=ROOT, env=python_child_env())


def record(out: Path, entries: list[dict[str, object]], quick: bool, seconds: float) -> None:
    """Write run.json; a partial run keeps the entries of the topics it did not run."""
    meta: dict[str, object] = {
        "quick": quick,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "topics": entries,
    }
    previous = out / "run.json"
    ran = {e["topic"] for e in entries}
    if previous.exists() and ran != set(TOPICS):
        old = json.loads(previous.read_text())
        kept = [e for e in old.get("topics", []) if e["topic"] not in ran]
        meta.update(
            topics=sorted(kept + entries, key=lambda e: TOPICS.index(str(e["topic"]))),
            seconds=old.get("seconds", meta["seconds"]),
            quick=old.get("quick", quick),
            finished=old.get("finished", meta["finished"]),
            rerun=sorted({str(t) for t in old.get("rerun", [])} | {str(t) for t in ran}),
        )
    out.mkdir(parents=True, exist_ok=True)
    previous.write_text(json.dumps(meta, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sizes")
    parser.add_argument("--topics", default=os.environ.get("TOPICS", ""), help="a,b,c")
    parser.add_argument("--render-only", action="store_true", help="redraw from raw data")
    parser.add_argument("--report-only", action="store_true", help="just reassemble REPORT.md")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("QUICK", "") not in ("", "0")
    chosen = [t.strip() for t in args.topics.split(",") if t.strip()] or list(TOPICS)
    unknown = [t for t in chosen if t not in TOPICS]
    if unknown:
        parser.error(f"unknown topics {unknown}; the topics are {', '.join(TOPICS)}")
    started = time.monotonic()
    failed = False
    if not args.report_only:
        flags = ["--render-only"] if args.render_only else (["--quick"] if quick else [])
        entries = [run(topic, flags) for topic in chosen]
        failed = any(e["status"] != "ok" for e in entries)
        if not args.render_only:
            record(results_dir(), entries, quick, time.monotonic() - started)
    print("\n# ===== report.py", flush=True)
    failed |= _module("bench.report") != 0
    print(f"# total {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

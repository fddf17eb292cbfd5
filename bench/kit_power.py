"""How often does the conformance kit catch a store that does not fence? (issue #21)

Each flawed store in ``tests/conformance_adapters.py`` has the one flaw a scenario is
there for: tokens compared as text (``token-digits``), a fencing mark that expires
(``zombie-wakes-late``: Redis ``SET ... EX 3``), a check-then-write in two Redis round
trips and one in two SQLite transactions, the mark going back or never going back
(``concurrent-writers``, writer processes released together by a start barrier). Each
is run ``--runs`` times (20; quick 8) on its scenario, next to a correct store run as
many times on the same scenario: the detection rate of the flawed store (target: at
least 19 of 20) and the correct store's failures (target: none).

The test suite keeps a few runs of each (tests/test_conformance_power.py: the kit must
catch each flawed store in nearly every run and never fail the correct one); the rate
over many runs is measured here.

    python -m bench.kit_power [--quick] [--runs 20] [--render-only]
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench._common import (
    ROOT,
    Json,
    Part,
    Stopwatch,
    md_table,
    quiet,
    run_topic,
    save_data,
    start_etcd,
    topic_args,
)

sys.path.insert(0, str(ROOT / "tests"))  # conformance_adapters: the flawed and correct stores

from etcdfence.conformance import Report, run_conformance

#: Detection rate a flawed store must reach (19 of 20 runs).
TARGET = 0.95


@dataclass(frozen=True)
class Case:
    """A flawed store and the correct one it is measured next to, on one scenario."""

    scenario: str
    flaw: str
    flawed: tuple[str, ...]  # factories in conformance_adapters
    correct: str
    parallel: int  # runs at once (0: all of them: the late zombies share their sleep)
    redis: bool = False


CASES = (
    Case("token-digits", "tokens compared as text", ("text_tokens",), "toy", 1),
    Case("zombie-wakes-late", "a mark that expires (Redis EX 3)", ("redis_expiring",),
         "redis_script", 0, redis=True),
    Case("concurrent-writers", "check-then-write in two Redis round trips",
         ("redis_check_then_write",), "redis_script", 4, redis=True),
    Case("concurrent-writers", "check-then-write in two SQLite transactions (mark back, max)",
         ("check_then_write", "check_then_write_max"), "toy", 5),
)  # fmt: skip


def _runs(spec: str, endpoints: list[str], scenario: str, runs: int, parallel: int) -> Json:
    """``runs`` kit runs of one store on ``scenario``: how many failed, and with what."""

    def one(_: int) -> Report:
        return run_conformance(f"conformance_adapters:{spec}", endpoints, only=[scenario])

    started = time.monotonic()
    with ThreadPoolExecutor(parallel or runs) as pool:
        reports = list(pool.map(one, range(runs)))
    kinds = sorted({f.kind for r in reports for res in r.results for f in res.findings})
    failed = sum(1 for r in reports if not r.ok)
    print(f"  {scenario:20} {spec:24} NOT FENCED in {failed}/{runs}", flush=True)
    return {
        "spec": spec,
        "runs": runs,
        "failed": failed,
        "kinds": kinds,
        "seconds": round(time.monotonic() - started, 1),
    }


def _redis_ready() -> str | None:
    """Why the Redis cases cannot run (no client, no server), or None."""
    try:
        import redis
        from conformance_adapters import redis_address

        host, port = redis_address()
        redis.Redis(host=host, port=port, socket_connect_timeout=2).ping()
    except Exception as err:  # ImportError, ConnectionError: the cases are skipped
        return repr(err)
    return None


def _forget_redis(name: str) -> None:
    """Delete the resource's mark and keys from the test Redis."""
    import redis
    from conformance_adapters import redis_address

    host, port = redis_address()
    client = redis.Redis(host=host, port=port, socket_timeout=5)
    client.delete(f"etcdfence:fence:{{{name}}}", *client.scan_iter(match=f"{{{name}}}:*"))
    client.close()


def _case(case: Case, endpoints: list[str], runs: int) -> Json:
    """One case in a fresh SQLite file and a fresh Redis resource (the stores read both
    from ``CONFORMANCE_TOY_DB`` and ``CONFORMANCE_REDIS``; writer processes inherit them)."""
    name = f"kit-power-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="kit-power-") as tmp:
        os.environ["CONFORMANCE_TOY_DB"] = os.path.join(tmp, "toy.db")
        os.environ["CONFORMANCE_REDIS"] = name
        try:
            stores = [*case.flawed, case.correct]
            with ThreadPoolExecutor(len(stores) if case.parallel == 0 else 1) as pool:
                got = list(
                    pool.map(
                        lambda spec: _runs(spec, endpoints, case.scenario, runs, case.parallel),
                        stores,
                    )
                )
        finally:
            if case.redis:
                _forget_redis(name)
    return {
        "scenario": case.scenario,
        "flaw": case.flaw,
        "flawed": got[:-1],
        "correct": got[-1],
    }


def measure(quick: bool, runs: int | None = None) -> Json:
    """Every case, ``runs`` kit runs per store, on one etcd."""
    quiet()
    runs = runs or (8 if quick else 20)
    clock = Stopwatch()
    why = _redis_ready()
    cases = [c for c in CASES if not (c.redis and why)]
    with start_etcd() as etcd:
        results = [_case(case, etcd.endpoints, runs) for case in cases]
    skipped = [f"{c.scenario}: {c.flaw} (Redis: {why})" for c in CASES if c not in cases]
    return save_data("kit_power", {"runs": runs, "cases": results, "skipped": skipped}, clock)


def render(data: Json) -> Part:
    """The kit's detection rates: a table and one target row per flawed store."""
    part = Part("kit_power", "The conformance kit's power", "", machine=data.get("machine"))
    rows = []
    for case in data["cases"]:
        correct = case["correct"]
        for store in case["flawed"]:
            n, caught = store["runs"], store["failed"]
            rows.append([f"`{case['scenario']}`", case["flaw"], f"`{store['spec']}`",
                         f"{caught}/{n}", ", ".join(store["kinds"]) or "—",
                         f"`{correct['spec']}` {correct['failed']}/{correct['runs']}",
                         f"{store['seconds']:.0f} s"])  # fmt: skip
            needed = math.ceil(TARGET * n)
            part.add(
                store["spec"],
                f"kit catches `{store['spec']}` on `{case['scenario']}`; correct store passes",
                f"{caught}/{n} caught; `{correct['spec']}` failed {correct['failed']}/"
                f"{correct['runs']}",
                caught >= needed and correct["failed"] == 0,
                f"≥ {needed}/{n}, 0 failed",
            )
    headers = ["scenario", "flaw", "flawed store", "judged NOT FENCED", "findings",
               "correct store failed", "runtime"]  # fmt: skip
    lines = [
        f"Each flawed store of `tests/conformance_adapters.py` run {data['runs']} times on "
        "the scenario that is there for its flaw, next to a correct store run as many "
        "times on the same scenario (on one etcd; the late zombies run all at once and "
        "share their 10 s sleep). The test suite keeps a few runs of each "
        "(`tests/test_conformance_power.py`); the rate is measured here.",
        "",
        md_table(headers, rows),
        "",
    ]
    lines += [f"Not run: {why}." for why in data.get("skipped", [])]
    part.section = "\n".join(lines)
    return part


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--runs", type=int, default=None, help="kit runs per store (20; quick 8)")
    args = parser.parse_args(argv)
    return run_topic("kit_power", lambda: measure(args.quick, args.runs), render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

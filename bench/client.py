"""The client against python3-etcd3, and asyncio against sequential calls, measured
side by side against one embedded etcd.

Ratios (targets from the client issue):

* etcdfence ``Client.put`` vs python3-etcd3 ``put``, sequential          ≥ 1.0×
* ``AsyncClient``, 64 puts in flight vs sequential ``Client.put``          ≥ 3.0×

The contenders alternate in rounds of ``n`` operations (ratio of the medians of their
per-round throughput). Each comparison runs twice: against a durable etcd (every write
fsynced — what production sees, where the disk dominates) and against
``--unsafe-no-fsync`` (where the client's own CPU cost shows). What a *guarded* write
costs next to a plain one is the throughput topic's (every concurrency level, sync and
asyncio, against raw gRPC).

    python -m bench.client [--quick] [--n 300] [--rounds 7] [--render-only]
"""

from __future__ import annotations

import asyncio
import sys

import etcd3

import etcdfence as ef
from bench._common import (
    MODE_TEXT,
    Json,
    Part,
    Stopwatch,
    host_port,
    interleave,
    md_table,
    ratio,
    run_topic,
    save_data,
    start_etcd,
    topic_args,
)

#: (key of the ratio, numerator, denominator, goal)
RATIOS = (
    ("Client.put / python3-etcd3 put", "etcdfence Client.put", "python3-etcd3 put", 1.0),
    ("AsyncClient 64 in flight / sequential Client.put", "AsyncClient 64 in flight",
     "etcdfence Client.put", 3.0),
)  # fmt: skip


def run_mode(fsync: bool, n: int, rounds: int) -> Json:
    """One side-by-side run on a fresh etcd; median ops/s per contender."""
    with start_etcd(fsync=fsync) as server:
        host, port = host_port(server.endpoint)
        legacy = etcd3.client(host=host, port=port)
        client = ef.Client(server.endpoint)
        value = b"x" * 64

        def ef_put() -> int:
            for i in range(n):
                client.put(f"bench/ef/{i % 64}", value)
            return n

        def etcd3_put() -> int:
            for i in range(n):
                legacy.put(f"bench/e3/{i % 64}", value)
            return n

        loop = asyncio.new_event_loop()
        aclient = ef.AsyncClient(server.endpoint)

        async def in_flight(total: int) -> int:
            sem = asyncio.Semaphore(64)

            async def one(i: int) -> None:
                async with sem:
                    await aclient.put(f"bench/a/{i % 64}", value)

            await asyncio.gather(*(one(i) for i in range(total)))
            return total

        def async_plain() -> int:
            return loop.run_until_complete(in_flight(n * 4))

        ef_put(), etcd3_put(), async_plain()  # warm up channels
        seq = interleave({"ef": ef_put, "etcd3": etcd3_put}, rounds)
        par = interleave({"async64": async_plain}, rounds)
        loop.run_until_complete(aclient.aclose())
        loop.close()
        client.close()
        legacy.close()
    ops = {
        "etcdfence Client.put": round(seq["ef"], 1),
        "python3-etcd3 put": round(seq["etcd3"], 1),
        "AsyncClient 64 in flight": round(par["async64"], 1),
    }
    print(f"  {MODE_TEXT['fsync' if fsync else 'no-fsync']}: {ops}", flush=True)
    return {"ops_per_s": ops}


def measure(quick: bool, *, n: int | None = None, rounds: int | None = None) -> Json:
    """Both ratios on a durable and a no-fsync etcd; writes ``results/client.json``."""
    n = n or (100 if quick else 300)
    rounds = rounds or (3 if quick else 7)
    clock = Stopwatch()
    data: Json = {"n": n, "rounds": rounds, "modes": {}}
    for mode in ("fsync", "no-fsync"):
        data["modes"][mode] = run_mode(mode == "fsync", n, rounds)
    return save_data("client", data, clock)


def render(data: Json) -> Part:
    """One table per etcd mode: the ratios, their goals and the rates behind them."""
    title = "The client vs python3-etcd3; asyncio vs sequential"
    part = Part("client", title, "", machine=data.get("machine"))
    parts = [
        f"Sequential puts of 64-byte values, {data['n']} per round, the contenders "
        f"alternating for {data['rounds']} rounds (ratio of medians); the asyncio side keeps "
        f"64 puts in flight ({4 * data['n']} per round). The guard's cost next to a plain "
        "write is in the throughput section.",
        "",
    ]
    for mode, cell in data["modes"].items():
        ops = cell["ops_per_s"]
        rows = []
        for name, num, den, goal in RATIOS:
            r = ops[num] / ops[den]
            rows.append([name, ratio(r), f"≥ {goal}×", f"{ops[num]:.0f} vs {ops[den]:.0f} ops/s"])
            measured = f"{ratio(r)} ({rows[-1][-1]})"
            part.add("client", f"{name} ({mode})", measured, r >= goal, f"≥ {goal}×")
        parts += [
            f"**{MODE_TEXT[mode]}**",
            "",
            md_table(["comparison", "ratio", "goal", "measured"], rows),
            "",
        ]
    part.section = "\n".join(parts)
    return part


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--n", type=int, default=None, help="operations per round (300)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (7)")
    args = parser.parse_args(argv)
    return run_topic(
        "client",
        lambda: measure(args.quick, n=args.n, rounds=args.rounds),
        render,
        args.render_only,
    )


if __name__ == "__main__":
    sys.exit(main())

"""Per-request etcd CPU on a 3- and a 5-member cluster: what the scale model
(``docs/SCALING.md``) multiplies by the load of S services × E elections × C candidates.

All members run on this machine, so absolute throughput means nothing here (every
member and the client share 2 cores); what is measured is *CPU seconds per
request* on the raft leader and on each follower (``/proc/<pid>/stat``), for:

* ``plain put`` — ``AsyncClient.put``, 64 in flight;
* ``guarded write`` — ``AsyncFenceGuard.put``, 64 in flight (one txn: check, mark, write);
* ``keepalive`` — 300 idle sessions of TTL 2 s (≈ 450 keepalives/s) on one client:
  the leader serves them (keepalives are not raft entries; a follower forwards them);
* ``idle`` — the same time with nothing running, the baseline subtracted from all.

The client talks to the leader's endpoint. The write workloads alternate in rounds;
durable etcd (default fsync).

    python -m bench.cluster [--quick] [--sizes 3,5] [--rounds 3] [--render-only]
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import etcdfence as ef
from bench._common import (
    Json,
    Part,
    Stopwatch,
    cpu_seconds,
    md_table,
    median,
    pyplot,
    real_token,
    run_topic,
    save_data,
    save_plot,
    topic_args,
)
from etcdfence.testing import EtcdCluster

VALUE = b"x" * 64
IN_FLIGHT = 64


def _cpu(pids: list[int]) -> list[float]:
    return [cpu_seconds(pid) for pid in pids]


async def _writes(client: ef.AsyncClient, kind: str, seconds: float, token: Any) -> int:
    guards = [client.fence(f"cluster/r{w}") for w in range(IN_FLIGHT)]
    deadline = time.monotonic() + seconds

    async def worker(w: int) -> int:
        n = 0
        key = f"cluster/k{w}"
        while time.monotonic() < deadline:
            if kind == "guarded write":
                await guards[w].put(token, key, VALUE)
            else:
                await client.put(key, VALUE)
            n += 1
        return n

    return sum(await asyncio.gather(*(worker(w) for w in range(IN_FLIGHT))))


async def _measure(
    endpoint: str, pids: list[int], leader: int, rounds: int, slice_s: float
) -> Json:
    per: dict[str, list[list[float]]] = {"plain put": [], "guarded write": []}
    rates: dict[str, list[float]] = {"plain put": [], "guarded write": [], "keepalive": []}
    token = real_token(endpoint)  # below etcd's revision: no token from the future
    async with ef.AsyncClient(endpoint) as client:
        await _writes(client, "plain put", 0.3, token)  # warm up
        await _writes(client, "guarded write", 0.3, token)
        # idle baseline: CPU per second per member with nothing running
        before, t0 = _cpu(pids), time.monotonic()
        await asyncio.sleep(slice_s * 2)
        idle = [(b - a) / (time.monotonic() - t0) for a, b in zip(before, _cpu(pids), strict=True)]
        for rnd in range(rounds):
            kinds = ["plain put", "guarded write"]
            for kind in kinds if rnd % 2 == 0 else list(reversed(kinds)):
                before, t0 = _cpu(pids), time.monotonic()
                ops = await _writes(client, kind, slice_s, token)
                wall = time.monotonic() - t0
                used = [b - a - i * wall for a, b, i in zip(before, _cpu(pids), idle, strict=True)]
                per[kind].append([u / ops * 1e6 for u in used])
                rates[kind].append(ops / wall)
        sessions = [client.session(2) for _ in range(300)]
        await asyncio.gather(*(s.open() for s in sessions))
        await asyncio.sleep(1.0)
        sent = sum(s.keepalives_sent for s in sessions)
        before, t0 = _cpu(pids), time.monotonic()
        await asyncio.sleep(max(4.0, slice_s * 2))  # ~2,000 keepalives: 10 ms CPU ticks vanish
        wall = time.monotonic() - t0
        kas = sum(s.keepalives_sent for s in sessions) - sent
        used = [b - a - i * wall for a, b, i in zip(before, _cpu(pids), idle, strict=True)]
        per["keepalive"] = [[u / kas * 1e6 for u in used]]
        rates["keepalive"].append(kas / wall)
        await asyncio.gather(*(s.aclose() for s in sessions))
    out: Json = {"idle_cpu_pct": [round(i * 100, 2) for i in idle]}
    for kind, samples in per.items():
        members = list(zip(*samples, strict=True))
        med = [median(list(m)) for m in members]
        followers = [v for i, v in enumerate(med) if i != leader]
        out[kind] = {
            "per_s": round(median(rates[kind]), 1),
            "leader_us": round(med[leader], 1),
            "follower_us": round(sum(followers) / len(followers), 1),
            "total_us": round(sum(med), 1),
        }
    return out


def run_size(size: int, rounds: int, slice_s: float) -> Json:
    with EtcdCluster(size) as cluster:
        leader = cluster.wait_for_leader()
        pids: list[Any] = [m.pid for m in cluster.members]
        endpoint = cluster.members[leader].endpoint
        result = asyncio.run(_measure(endpoint, pids, leader, rounds, slice_s))
    parts = [
        f"{k}: leader {result[k]['leader_us']:.0f} µs, follower {result[k]['follower_us']:.0f} µs"
        for k in ("plain put", "guarded write", "keepalive")
    ]
    print(f"  {size} members: " + "  ".join(parts), flush=True)
    return result


def measure(quick: bool, *, sizes: list[int] | None = None, rounds: int | None = None) -> Json:
    """CPU per request on each cluster size; writes ``results/cluster.json``."""
    rounds = rounds or (2 if quick else 3)
    slice_s = 1.0 if quick else 1.5
    clock = Stopwatch()
    data: Json = {"rounds": rounds, "slice_s": slice_s, "in_flight": IN_FLIGHT, "sizes": {}}
    for size in sizes or ([3] if quick else [3, 5]):
        data["sizes"][str(size)] = run_size(size, rounds, slice_s)
    return save_data("cluster", data, clock)


def render(data: Json) -> Part:
    """The cluster section: etcd CPU per request by member role, per cluster size."""
    part = Part(
        "cluster",
        "Per-request etcd CPU on 3- and 5-member clusters",
        "",
        machine=data.get("machine"),
    )
    sizes = list(data["sizes"])
    kinds = ("plain put", "guarded write", "keepalive")
    fig, ax = pyplot().subplots(figsize=(8, 3.8))
    width = 0.8 / (2 * len(sizes))
    for i, size in enumerate(sizes):
        for j, role in enumerate(("leader_us", "follower_us")):
            xs = [k + (2 * i + j - len(sizes) + 0.5) * width for k in range(len(kinds))]
            ys = [data["sizes"][size][kind][role] for kind in kinds]
            label = f"{size} members, {'leader' if j == 0 else 'each follower'}"
            ax.bar(
                xs,
                ys,
                width,
                label=label,
                alpha=0.9 if j == 0 else 0.5,
                color="tab:blue" if i == 0 else "tab:orange",
            )
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set(ylabel="etcd CPU µs per request", title="etcd CPU per request, by member role")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    png = save_plot(fig, "cluster.png")
    rows = []
    for size in sizes:
        for kind in kinds:
            c = data["sizes"][size][kind]
            rows.append(
                [
                    f"{size}",
                    kind,
                    f"{c['per_s']:.0f}",
                    f"{c['leader_us']:.0f}",
                    f"{c['follower_us']:.0f}",
                    f"{c['total_us']:.0f}",
                ]
            )
    part.section = "\n".join(
        [
            f"![cluster]({png})",
            "",
            "All members share this machine's 2 cores with the client, so the rate column "
            "is not a capacity; the CPU columns are what `docs/SCALING.md` multiplies by the "
            f"load. Writes: {data['in_flight']} in flight to the leader's endpoint, plain and "
            f"guarded alternating, {data['rounds']} rounds of {data['slice_s']} s; keepalives: "
            "300 idle sessions of TTL 2 s. Each member's idle CPU is subtracted; durable etcd.",
            "",
            md_table(
                [
                    "members",
                    "request",
                    "rate here, /s",
                    "leader µs",
                    "follower µs (each)",
                    "all members µs",
                ],
                rows,
            ),
            "",
        ]
    )
    return part


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--sizes", default=None, help="member counts (default 3,5; quick 3)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)

    def run() -> Json:
        sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else None
        return measure(args.quick, sizes=sizes, rounds=args.rounds)

    return run_topic("cluster", run, render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

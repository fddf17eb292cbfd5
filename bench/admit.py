"""What token admission costs (#24): a guarded put on a bound resource (binding and the
future check on) next to an unbound one, and the verifier per new and per cached token.

* ``guarded put`` — ``FenceGuard.put`` / ``AsyncFenceGuard.put`` with ``lock=`` vs
  without, one real lock token, batches alternating (AB BA …) on one etcd
  (``--unsafe-no-fsync``, so the client's CPU shows rather than the disk); async with 16
  writes in flight, sync from one thread. Target: bound ≥ 0.95× unbound (the normal
  path sends no extra request: the revision compare is against what the client has
  seen already).
* ``verifier`` — ``Verifier(client)``: a token it has not seen (a new sequencer: one
  linearizable Range of the holder's key) vs one it has (a dict lookup).

    python -m bench.admit [--quick] [--render-only]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

import etcdfence as ef
from bench._common import (
    Json,
    Part,
    Stopwatch,
    md_table,
    ratio,
    run_topic,
    save_data,
    start_etcd,
    topic_args,
)
from etcdfence.fence._sync.admit import Verifier

TARGET = 0.95
IN_FLIGHT = 16


def _sync_rates(client: Any, token: ef.FencingToken, n: int, rounds: int) -> dict[str, float]:
    guards = {
        "unbound": client.fence("bench/admit/u"),
        "bound": client.fence("bench/admit/b", lock="bench/lock"),
    }
    rates: dict[str, list[float]] = {name: [] for name in guards}
    for i in range(rounds):
        order = list(guards) if i % 2 == 0 else list(reversed(guards))
        for name in order:
            guard = guards[name]
            start = time.perf_counter()
            for _ in range(n):
                guard.put(token, "bench/admit/k", "v")
            rates[name].append(n / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


async def _async_rates(endpoints: list[str], token: Any, n: int, rounds: int) -> dict[str, float]:
    async with ef.AsyncClient(endpoints) as client:
        guards = {
            "unbound": client.fence("bench/admit/au"),
            "bound": client.fence("bench/admit/ab", lock="bench/lock"),
        }
        for guard in guards.values():
            await guard.put(token, "bench/admit/k", "v")
        rates: dict[str, list[float]] = {name: [] for name in guards}

        async def worker(guard: Any, count: int) -> None:
            for _ in range(count):
                await guard.put(token, "bench/admit/k", "v")

        for i in range(rounds):
            order = list(guards) if i % 2 == 0 else list(reversed(guards))
            for name in order:
                start = time.perf_counter()
                per = n // IN_FLIGHT
                await asyncio.gather(*(worker(guards[name], per) for _ in range(IN_FLIGHT)))
                rates[name].append(per * IN_FLIGHT / (time.perf_counter() - start))
        return {name: statistics.median(r) for name, r in rates.items()}


def _verifier_costs(client: Any, token: ef.FencingToken, n: int) -> Json:
    """µs per call: new sequencers (one per revision the hold has lasted) vs one cached."""
    top = int(client.status()["revision"])
    values = [v for v in range(token.value, top + 1)][:n]
    verifier = Verifier(client, cache_size=len(values) + 1)
    start = time.perf_counter()
    for v in values:
        verifier(
            ef.FencingToken(
                v,
                key=token.key,
                create_revision=token.create_revision,
                lease_id=token.lease_id,
                cluster_id=token.cluster_id,
            )
        )
    new_us = (time.perf_counter() - start) / len(values) * 1e6
    reads = verifier.reads
    start = time.perf_counter()
    for _ in range(n * 10):
        verifier(token)
    cached_us = (time.perf_counter() - start) / (n * 10) * 1e6
    return {"new_us": new_us, "cached_us": cached_us, "new_n": len(values), "reads": reads}


def measure(quick: bool) -> Json:
    clock = Stopwatch()
    n, rounds = (300, 6) if quick else (1000, 10)
    with (
        start_etcd(fsync=False) as etcd,
        ef.Client(etcd.endpoints) as client,
        client.session(ttl=60) as session,
    ):
        lock = session.lock("bench/lock")
        token = lock.acquire()
        sync = _sync_rates(client, token, n, rounds)
        aio = asyncio.run(_async_rates(etcd.endpoints, token, n, rounds))
        verifier = _verifier_costs(client, token, n)
        lock.release()
    return save_data(
        "admit",
        {
            "quick": quick,
            "n": n,
            "rounds": rounds,
            "sync": sync,
            "async": aio,
            "verifier": verifier,
        },
        clock,
    )


def render(data: Json) -> Part:
    part = Part("admit", "What token admission costs", "", machine=data.get("machine"))
    if data.get("quick"):
        part.note = f"quick run: {data['n']} writes per batch, {data['rounds']} batches a side"
    rows = []
    for mode in ("sync", "async"):
        r = data[mode]
        share = r["bound"] / r["unbound"]
        label = "sync, 1 thread" if mode == "sync" else f"async, {IN_FLIGHT} in flight"
        rows.append([label, f"{r['unbound']:.0f}", f"{r['bound']:.0f}", ratio(share)])
        part.add(
            f"admit_{mode}", f"guarded put, bound / unbound, {label}", ratio(share),
            share >= TARGET, f"≥ {TARGET}×",
        )  # fmt: skip
    v = data["verifier"]
    part.section = "\n".join(
        [
            "`FenceGuard.put` on a resource bound with `lock=` (binding and the future "
            "check on) vs an unbound one, one real lock token, batches alternating, on "
            "etcd `--unsafe-no-fsync`; medians of the batches' writes/s.",
            "",
            md_table(["mode", "unbound /s", "bound /s", "bound / unbound"], rows),
            "",
            f"`Verifier(client)`: {v['new_us']:.0f} µs per new sequencer "
            f"({v['reads']} etcd reads for {v['new_n']} new tokens), "
            f"{v['cached_us']:.2f} µs per cached one.",
            "",
        ]
    )
    return part


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    args = parser.parse_args(argv)
    return run_topic("admit", lambda: measure(args.quick), render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

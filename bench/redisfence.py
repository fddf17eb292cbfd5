"""What does fencing cost a Redis write? ``RedisFence.put`` (one EVALSHA: check the mark,
raise it, SET) vs a plain ``SET``, sync and asyncio, measured side by side.

    python -m bench.redisfence             # --n 20000 writes per side and mode
    python -m bench.redisfence --quick     # --n 4000 (make bench QUICK=1 TOPICS=redisfence)
    python -m bench.redisfence --address 127.0.0.1:6379 --render-only

(The topic is ``redisfence``, not ``redis``: a name that reads as the ``redis`` package,
and shadowed it in the days ``bench/`` ran as scripts.)

* sync: one client, one connection, one write after the other (latency-bound);
* async: 64 writes in flight (64 tasks on one ``redis.asyncio`` client, 64 pooled
  connections; throughput-bound, mostly by the client's CPU).

Batches of guarded and plain writes alternate (AB BA AB ...) on the same client and the
same Redis, so drift (other work on the machine, CPU frequency) hits both sides alike;
the guarded side uses one token for the whole run, as a leader within one term. Target:
guarded throughput >= 0.8x plain, in both modes. The Redis at ``--address`` must answer;
its keys are under a fresh hash tag and deleted afterwards.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench._common import Json, Part, Stopwatch, md_table, ratio, run_topic, save_data, topic_args

ADDRESS = "127.0.0.1:6379"
TARGET = 0.8
IN_FLIGHT = 64
TOKEN = 1_000_000
VALUE = b"x" * 64


@dataclass
class Result:
    mode: str  # "sync" or "async"
    in_flight: int
    n: int  # writes per side
    plain_ops: float  # writes per second over all batches
    guarded_ops: float
    ratio_median: float  # median over batch pairs of guarded/plain throughput
    plain_us: float  # mean microseconds per write (sync) or per write's share (async)
    guarded_us: float


def _alternate(run: Callable[[str, int], float], n: int, batch: int) -> dict[str, Any]:
    """AB BA AB ...; ``run(side, count)`` returns the seconds ``count`` writes took."""
    times = {"guarded": 0.0, "plain": 0.0}
    ratios = []
    done = pair = 0
    while done < n:
        count = min(batch, n - done)
        order = ("guarded", "plain") if pair % 2 == 0 else ("plain", "guarded")
        took = {side: run(side, count) for side in order}
        for side, seconds in took.items():
            times[side] += seconds
        ratios.append(took["plain"] / took["guarded"])  # throughput ratio of this pair
        done += count
        pair += 1
    return {"times": times, "ratios": ratios}


def _result(mode: str, in_flight: int, n: int, runs: dict[str, Any]) -> Result:
    times = runs["times"]
    return Result(
        mode,
        in_flight,
        n,
        plain_ops=n / times["plain"],
        guarded_ops=n / times["guarded"],
        ratio_median=statistics.median(runs["ratios"]),
        plain_us=times["plain"] / n * 1e6,
        guarded_us=times["guarded"] / n * 1e6,
    )


def bench_sync(address: str, n: int, batch: int, tag: str) -> Result:
    import redis

    from etcdfence.redis import RedisFence

    host, port = address.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=5)
    fence = RedisFence(client, tag)
    key = fence.key_for("latest")
    try:

        def run(side: str, count: int) -> float:
            start = time.perf_counter()
            if side == "guarded":
                for _ in range(count):
                    fence.put(TOKEN, key, VALUE)
            else:
                for _ in range(count):
                    client.set(key, VALUE)
            return time.perf_counter() - start

        run("guarded", min(200, n))  # warm-up: connection, script loaded, caches
        run("plain", min(200, n))
        return _result("sync", 1, n, _alternate(run, n, batch))
    finally:
        client.delete(fence.key, fence.version_key, key)
        client.close()


def bench_async(address: str, n: int, batch: int, tag: str) -> Result:
    import redis.asyncio

    from etcdfence.redis import AsyncRedisFence

    host, port = address.rsplit(":", 1)
    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis(host=host, port=int(port), socket_timeout=5)
    fence = AsyncRedisFence(client, tag)
    keys = [fence.key_for(f"w{i}") for i in range(IN_FLIGHT)]
    ops: dict[str, Callable[[str], Awaitable[Any]]] = {
        "guarded": lambda k: fence.put(TOKEN, k, VALUE),
        "plain": lambda k: client.set(k, VALUE),
    }

    async def worker(op: Callable[[str], Awaitable[Any]], i: int, count: int) -> None:
        for _ in range(i, count, IN_FLIGHT):
            await op(keys[i])

    async def side(name: str, count: int) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(worker(ops[name], i, count) for i in range(IN_FLIGHT)))
        return time.perf_counter() - start

    def run(name: str, count: int) -> float:
        return loop.run_until_complete(side(name, count))

    try:
        run("guarded", min(2000, n))  # warm-up: 64 connections, the script loaded
        run("plain", min(2000, n))
        return _result("async", IN_FLIGHT, n, _alternate(run, n, batch))
    finally:
        loop.run_until_complete(client.delete(fence.key, fence.version_key, *keys))
        loop.run_until_complete(client.aclose())
        loop.close()


def measure(quick: bool, *, n: int | None = None, address: str = ADDRESS) -> Json:
    """Guarded vs plain writes, sync and async; writes ``results/redisfence.json``."""
    n = n or (4000 if quick else 20000)
    clock = Stopwatch()
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    results = [
        bench_sync(address, n, 500, tag),
        bench_async(address, n, 500, tag),
    ]
    for r in results:
        print(
            f"  {r.mode:5} plain {r.plain_ops:8.0f}/s  guarded {r.guarded_ops:8.0f}/s  "
            f"guarded/plain {r.guarded_ops / r.plain_ops:.2f}x "
            f"(median of batches {r.ratio_median:.2f}x)",
            flush=True,
        )
    redis_version = _redis_version(address)
    data: Json = {"n": n, "quick": quick, "redis": redis_version,
                  "results": [asdict(r) for r in results]}  # fmt: skip
    return save_data("redisfence", data, clock)


def _redis_version(address: str) -> str:
    import redis

    host, port = address.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port))
    try:
        info = client.info("server")
        persistence = client.config_get("appendonly").get("appendonly", "?")
        return f"{info.get('redis_version', '?')} (appendonly {persistence})"
    finally:
        client.close()


def render(data: Json) -> Part:
    """One row per mode: writes/s plain and guarded, the ratio (overall and median)."""
    part = Part("redisfence", "What fencing costs a Redis write", "", machine=data.get("machine"))
    if data.get("quick"):
        part.note = f"quick run: {data['n']} writes per side and mode"
    rows = []
    for r in data["results"]:
        overall = r["guarded_ops"] / r["plain_ops"]
        label = (
            "sync, 1 connection" if r["mode"] == "sync" else f"async, {r['in_flight']} in flight"
        )
        rows.append(
            [
                label,
                str(r["n"]),
                f"{r['plain_ops']:.0f}",
                f"{r['guarded_ops']:.0f}",
                f"{r['plain_us']:.1f}",
                f"{r['guarded_us']:.1f}",
                ratio(overall),
                ratio(r["ratio_median"]),
            ]
        )
        part.add(f"redis_{r['mode']}", f"RedisFence.put / plain SET throughput, {label}",
                 ratio(overall), overall >= TARGET, f"≥ {TARGET}×")  # fmt: skip
    headers = ["mode", "n", "plain /s", "guarded /s", "plain µs", "guarded µs",
               "guarded / plain", "median of batches"]  # fmt: skip
    part.section = "\n".join(
        [
            "`RedisFence.put` (one `EVALSHA`: compare the `(token, epoch)` mark, raise it, "
            "`SET`) vs a plain `SET` of the same 64-byte value through redis-py, on one "
            f"Redis {data.get('redis', '')}. Batches alternate (AB BA AB …) so drift hits "
            "both sides alike; one token for the whole run. µs per write is the wall time "
            "divided by the writes (for async: per write's share of 64 in flight).",
            "",
            md_table(headers, rows),
        ]
    )
    part.section += "\n"
    return part


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--n", type=int, default=None, help="writes per side (20000; quick 4000)")
    parser.add_argument("--address", default=ADDRESS, help="host:port of the Redis")
    args = parser.parse_args(argv)
    return run_topic(
        "redisfence", lambda: measure(args.quick, n=args.n, address=args.address), render,
        args.render_only,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

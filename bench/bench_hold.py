"""The cost of holding N locks on one session (N = 1, 100, 1,000, 10,000), and of N
waiters queued behind them.

Each N runs in a fresh child process (so memory numbers are not polluted by the
previous N), against one etcd started with ``--unsafe-no-fsync`` (acquisition speed
is not what is measured here; durable numbers are in the throughput bench):

1. **hold** — one ``AsyncSession`` (TTL ``--ttl``) acquires N locks with the async
   API, at most 256 acquires in flight; then the process sits idle for ``--idle``
   seconds while we read: keepalives sent per second (``session.keepalives_sent``),
   the streams and RPCs the client opened/sent meanwhile (it must be one keepalive
   stream and nothing else), the client's CPU % (``time.process_time``, all
   threads), its RSS, and etcd's CPU % and RSS (``/proc/<pid>``).
2. **wait** — a second session queues on all N locks (N pending ``acquire`` calls,
   started 256 at a time: N watches, one per waiter, on the key ahead); same idle
   measurements. The RSS
   differences give the memory per waiter in the client and in etcd.

Keepalives are expected at 3/TTL per second whatever N is: one lease, one stream.

3. **keepalive cost** — 300 sessions of TTL 2 s on one client (≈ 450 keepalives/s):
   etcd's and the client's CPU per keepalive.
4. **db growth** — etcd's database size in use (``Status.dbSizeInUse``) per guarded
   write and per term (campaign + resign) before compaction, and after compaction
   and defragmentation.

    python bench/bench_hold.py [--quick] [--counts 1,100,1000,10000] [--ttl 3] [--idle 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_curves import (
    Counter,
    Json,
    Stopwatch,
    bench_args,
    count_etcdfence,
    cpu_seconds,
    python_child_env,
    rss_bytes,
    save,
    start_etcd,
    threads_of,
)

import etcdfence as ef

IN_FLIGHT = 256


async def _idle(session: ef.AsyncSession, counter: Counter, etcd_pid: int, seconds: float) -> Json:
    """Sit idle for ``seconds`` and report what it cost."""
    gc.collect()
    await asyncio.sleep(0.3)
    before = counter.snapshot()
    keepalives = session.keepalives_sent
    cpu, etcd_cpu, t0 = cpu_seconds(), cpu_seconds(etcd_pid), time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - t0
    after = counter.snapshot()
    after.subtract(before)
    return {
        "keepalives_per_s": round((session.keepalives_sent - keepalives) / wall, 3),
        "requests_while_idle": {k: v for k, v in after.items() if v},
        "client_cpu_pct": round((cpu_seconds() - cpu) / wall * 100, 3),
        "etcd_cpu_pct": round((cpu_seconds(etcd_pid) - etcd_cpu) / wall * 100, 3),
        "client_rss_mb": round(rss_bytes() / 2**20, 2),
        "etcd_rss_mb": round(rss_bytes(etcd_pid) / 2**20, 2),
        "client_threads": threads_of(),
    }


async def _child(endpoint: str, n: int, ttl: int, idle: float, etcd_pid: int, wait: bool) -> Json:
    counter = Counter()
    out: Json = {"n": n, "rss_at_start_mb": round(rss_bytes() / 2**20, 2)}
    async with ef.AsyncClient(endpoint) as client:
        count_etcdfence(client, counter)
        holder = client.session(ttl)
        await holder.open()
        locks = [holder.lock(f"hold/{n}/{i}") for i in range(n)]
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def take(lock: ef.AsyncLock) -> None:
            async with gate:
                await lock.acquire()

        started = time.monotonic()
        await asyncio.gather(*(take(lock) for lock in locks))
        out["acquire_s"] = round(time.monotonic() - started, 3)
        out["acquire_requests"] = dict(counter.snapshot())
        out["hold"] = await _idle(holder, counter, etcd_pid, idle)
        out["keepalive_streams_opened"] = counter.snapshot()["stream:LeaseKeepAlive"]
        if wait:
            waiter = client.session(ttl)
            await waiter.open()
            watches = counter.snapshot()["stream:Watch"]
            started = time.monotonic()
            pending: list[asyncio.Future[Any]] = []
            for first in range(0, n, IN_FLIGHT):  # queue them in batches, like the acquires
                batch = locks[first : first + IN_FLIGHT]
                pending += [asyncio.ensure_future(waiter.lock(lk.name).acquire()) for lk in batch]
                deadline = time.monotonic() + 60
                while counter.snapshot()["stream:Watch"] - watches < len(pending):
                    if time.monotonic() > deadline or waiter.expired or holder.expired:
                        raise TimeoutError(f"waiters did not queue ({len(pending)} of {n})")
                    await asyncio.sleep(0.01)
            out["queue_s"] = round(time.monotonic() - started, 3)
            out["wait"] = await _idle(waiter, counter, etcd_pid, idle)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await waiter.aclose()
        await holder.aclose()
    return out


async def _sessions_child(endpoint: str, s: int, ttl: int, idle: float, etcd_pid: int) -> Json:
    """S sessions on one client, nothing else: the cost of keepalives on both sides."""
    async with ef.AsyncClient(endpoint) as client:
        sessions = [client.session(ttl) for _ in range(s)]
        await asyncio.gather(*(session.open() for session in sessions))
        await asyncio.sleep(ttl / 3 + 0.3)  # let the keepalive phases spread out
        sent = sum(session.keepalives_sent for session in sessions)
        cpu, etcd_cpu, t0 = cpu_seconds(), cpu_seconds(etcd_pid), time.monotonic()
        await asyncio.sleep(idle)
        wall = time.monotonic() - t0
        rate = (sum(session.keepalives_sent for session in sessions) - sent) / wall
        out = {
            "sessions": s,
            "ttl": ttl,
            "keepalives_per_s": round(rate, 1),
            "client_cpu_pct": round((cpu_seconds() - cpu) / wall * 100, 2),
            "etcd_cpu_pct": round((cpu_seconds(etcd_pid) - etcd_cpu) / wall * 100, 2),
            "expired": sum(session.expired for session in sessions),
        }
        await asyncio.gather(*(session.aclose() for session in sessions))
    return out


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_hold.py child")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--ttl", type=int, required=True)
    parser.add_argument("--idle", type=float, required=True)
    parser.add_argument("--etcd-pid", type=int, required=True)
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--sessions", type=int, default=0, help="keepalive-cost mode")
    args = parser.parse_args(argv)
    if args.sessions:
        result = asyncio.run(
            _sessions_child(args.endpoint, args.sessions, args.ttl, args.idle, args.etcd_pid)
        )
    else:
        result = asyncio.run(
            _child(args.endpoint, args.n, args.ttl, args.idle, args.etcd_pid, args.wait)
        )
    print(json.dumps(result), flush=True)
    return 0


def run_child(args: list[str]) -> Any:
    command = [sys.executable, str(Path(__file__).resolve()), "child", *args]
    done = subprocess.run(
        command, env=python_child_env(), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def db_in_use(client: ef.Client) -> int:
    time.sleep(0.25)  # etcd commits its backend every 100 ms
    size: int = client.status()["db_size_in_use"]
    return size


def db_growth(endpoint: str, k: int) -> Json:
    """Bytes of etcd's database (in use) per guarded write and per term (campaign +
    resign) before compaction, and what compaction + defragmentation gives back."""
    with ef.Client(endpoint) as client:
        out: Json = {"k": k}
        guard = client.fence("growth/resource")
        token = ef.FencingToken(10**12)
        start = db_in_use(client)
        for i in range(k):
            guard.put(token, f"growth/data/{i % 16}", b"x" * 64)
        after_writes = db_in_use(client)
        out["bytes_per_guarded_write"] = round((after_writes - start) / k, 1)
        with client.session(ttl=30) as session:
            election = session.election("growth/election")
            for _ in range(k):
                election.campaign(b"node-a")
                election.resign()
        after_terms = db_in_use(client)
        out["bytes_per_term"] = round((after_terms - after_writes) / k, 1)
        out["revisions_per_term"] = 2  # the campaign's put and the resign's delete
        out["revisions_per_guarded_write"] = 1  # one txn: mark and data in one revision
        client.compact(client.revision())
        client.defragment(timeout=30)
        out["in_use_before_mb"] = round(after_terms / 2**20, 2)
        out["in_use_after_compact_defrag_mb"] = round(db_in_use(client) / 2**20, 2)
        return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child_main(argv[1:])
    parser = bench_args(__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,100,1000,10000")
    parser.add_argument("--ttl", type=int, default=None, help="session TTL (default 3)")
    parser.add_argument("--idle", type=float, default=None, help="idle seconds (5; quick 2)")
    parser.add_argument(
        "--wait-max", type=int, default=None, help="largest N that also queues N waiters"
    )
    parser.add_argument("--sessions", type=int, default=300, help="sessions for keepalive cost")
    args = parser.parse_args(argv)
    ttl = args.ttl or 3
    idle = args.idle or (2.0 if args.quick else 5.0)
    args.wait_max = args.wait_max or (1000 if args.quick else 10000)
    counts = [int(x) for x in args.counts.split(",")]
    clock = Stopwatch()
    results: list[Json] = []
    with start_etcd(fsync=False) as server:
        assert server.pid is not None
        for n in counts:
            extra = ["--wait"] if n <= args.wait_max else []
            where = ["--endpoint", server.endpoint, "--etcd-pid", str(server.pid)]
            result = run_child(
                [*where, "--n", str(n), "--ttl", str(ttl), "--idle", str(idle), *extra]
            )
            results.append(result)
            hold = result["hold"]
            print(
                f"  N={n:6}  acquire {result['acquire_s']:6.2f}s  keepalives/s "
                f"{hold['keepalives_per_s']:.2f}  client CPU {hold['client_cpu_pct']:.2f}%  "
                f"RSS {hold['client_rss_mb']:.1f} MB  etcd CPU {hold['etcd_cpu_pct']:.2f}%"
                + (
                    f"  | {n} waiting: client CPU {result['wait']['client_cpu_pct']:.2f}% "
                    f"RSS {result['wait']['client_rss_mb']:.1f} MB "
                    f"etcd RSS {result['wait']['etcd_rss_mb']:.1f} MB"
                    if "wait" in result
                    else ""
                ),
                flush=True,
            )
        keepalive = run_child(["--endpoint", server.endpoint, "--n", "0", "--ttl", "2",
                               "--idle", str(idle), "--etcd-pid", str(server.pid),
                               "--sessions", str(args.sessions)])  # fmt: skip
        print(
            f"  {args.sessions} sessions, TTL 2 s: {keepalive['keepalives_per_s']} keepalives/s, "
            f"client CPU {keepalive['client_cpu_pct']}%, etcd CPU {keepalive['etcd_cpu_pct']}%",
            flush=True,
        )
        growth = db_growth(server.endpoint, 1000 if args.quick else 3000)
        print(f"  db growth: {growth}", flush=True)
    data: Json = {"ttl": ttl, "idle_s": idle, "in_flight": IN_FLIGHT, "results": results,
                  "keepalive_cost": keepalive, "db_growth": growth}  # fmt: skip
    data["expected_keepalives_per_s"] = round(3 / ttl, 3)
    data.update(clock.result())
    save("hold", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

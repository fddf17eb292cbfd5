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
4. **1,000 locks vs 1,000 puts** — 1,000 locks acquired on one session with all in flight
   vs 1,000 plain async puts on the same client, alternating rounds (ratio of medians,
   target ≤ 2×); the client's call log (``client.on_call``) must show one lease and one
   keepalive stream for them.
5. **db growth** — etcd's database size in use (``Status.dbSizeInUse``) per guarded
   write and per term (campaign + resign) before compaction, and after compaction
   and defragmentation.

    python -m bench.hold [--quick] [--counts 1,100,1000,10000] [--ttl 3] [--idle 5]
    python -m bench.hold --render-only
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import etcdfence as ef
from bench._common import (
    Counter,
    Json,
    Part,
    Stopwatch,
    count_etcdfence,
    cpu_seconds,
    md_table,
    plain_axis,
    pyplot,
    python_child_env,
    ratio,
    real_token,
    rss_bytes,
    run_topic,
    save_data,
    save_plot,
    start_etcd,
    threads_of,
    topic_args,
)
from etcdfence._txn import range_request

WATCH_MEMORY_URL = "https://etcd.io/docs/v3.5/benchmarks/etcd-3-watch-memory-benchmark/"
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
            started = time.monotonic()
            pending: list[asyncio.Future[Any]] = []
            for first in range(0, n, IN_FLIGHT):  # queue them in batches, like the acquires
                batch = locks[first : first + IN_FLIGHT]
                pending += [asyncio.ensure_future(waiter.lock(lk.name).acquire()) for lk in batch]
                await _queued(client, f"hold/{n}/", n + len(pending), waiter, holder)
            out["queue_s"] = round(time.monotonic() - started, 3)
            out["wait"] = await _idle(waiter, counter, etcd_pid, idle)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await waiter.aclose()
        await holder.aclose()
    return out


async def _queued(client: ef.AsyncClient, prefix: str, keys: int, waiter: Any, holder: Any) -> None:
    """Wait until ``keys`` lock keys exist under ``prefix`` (holders' and queued
    waiters'): waiters queue on the client's one shared Watch stream, so counting
    streams says nothing; counting their keys in etcd does."""
    deadline = time.monotonic() + 60
    request = range_request(prefix.encode(), prefix=True, count_only=True)
    while (await client.connection.call("Range", request, idempotent=True)).count < keys:
        if time.monotonic() > deadline or waiter.expired or holder.expired:
            raise TimeoutError(f"waiters did not queue (want {keys} keys under {prefix!r})")
        await asyncio.sleep(0.01)


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
    parser = argparse.ArgumentParser(prog="hold.py child")
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
    command = [sys.executable, "-m", "bench.hold", "child", *args]
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
        token = real_token(endpoint)  # below etcd's revision: not from the future
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


async def _measure_many_locks(endpoint: str, rounds: int, n: int) -> Json:
    """``n`` locks on one session, all in flight, vs ``n`` async puts, alternating."""
    async with ef.AsyncClient(endpoint) as client:
        calls: collections.Counter[str] = collections.Counter()
        client.on_call(lambda record: calls.update([record.method]))
        session = client.session(ttl=30)
        await session.open()
        lock_times: list[float] = []
        put_times: list[float] = []
        for r in range(rounds):
            names = [f"bench/many/{r}/{i}" for i in range(n)]
            started = time.perf_counter()
            tokens = await asyncio.gather(*(session.lock(x).acquire() for x in names))
            lock_times.append(time.perf_counter() - started)
            assert {t.lease_id for t in tokens} == {session.lease_id}

            started = time.perf_counter()
            await asyncio.gather(*(client.put(f"bench/puts/{r}/{i}", b"") for i in range(n)))
            put_times.append(time.perf_counter() - started)
            await asyncio.gather(*(session.lock(x).release() for x in names))
        streams = calls["stream:LeaseKeepAlive"]
        grants = calls["LeaseGrant"]
        alive = not session.expired
        await session.aclose()
    return {
        "n": n,
        "rounds": rounds,
        "lock_ms": [round(x * 1000, 2) for x in lock_times],
        "put_ms": [round(x * 1000, 2) for x in put_times],
        "median_lock_ms": round(statistics.median(lock_times) * 1000, 2),
        "median_put_ms": round(statistics.median(put_times) * 1000, 2),
        "keepalive_streams": streams,
        "lease_grants": grants,
        "session_alive": alive,
    }


# --------------------------------------------------------------------------- measure


def measure(
    quick: bool,
    *,
    counts: list[int] | None = None,
    ttl: int | None = None,
    idle: float | None = None,
    wait_max: int | None = None,
    sessions: int = 300,
    many: int = 1000,
    many_rounds: int | None = None,
) -> Json:
    """Hold / wait / keepalive cost / db growth on a no-fsync etcd, the many-locks
    ratio on a durable one; writes ``results/hold.json``."""
    ttl = ttl or 3
    idle = idle or (2.0 if quick else 5.0)
    wait_max = wait_max or (1000 if quick else 10000)
    counts = counts or [1, 100, 1000, 10000]
    clock = Stopwatch()
    results: list[Json] = []
    with start_etcd(fsync=False) as server:
        assert server.pid is not None
        for n in counts:
            extra = ["--wait"] if n <= wait_max else []
            where = ["--endpoint", server.endpoint, "--etcd-pid", str(server.pid)]
            result = run_child(
                [*where, "--n", str(n), "--ttl", str(ttl), "--idle", str(idle), *extra]
            )
            results.append(result)
            _print_n(n, result)
        keepalive = run_child(["--endpoint", server.endpoint, "--n", "0", "--ttl", "2",
                               "--idle", str(idle), "--etcd-pid", str(server.pid),
                               "--sessions", str(sessions)])  # fmt: skip
        print(
            f"  {sessions} sessions, TTL 2 s: {keepalive['keepalives_per_s']} keepalives/s, "
            f"client CPU {keepalive['client_cpu_pct']}%, etcd CPU {keepalive['etcd_cpu_pct']}%",
            flush=True,
        )
        growth = db_growth(server.endpoint, 1000 if quick else 3000)
        print(f"  db growth: {growth}", flush=True)
    with start_etcd(fsync=True) as server:
        rounds = many_rounds or (2 if quick else 7)
        locks = asyncio.run(_measure_many_locks(server.endpoint, rounds, many))
        print(
            f"  {many} locks {locks['median_lock_ms']:.0f} ms vs {many} puts "
            f"{locks['median_put_ms']:.0f} ms; streams/leases "
            f"{locks['keepalive_streams']}/{locks['lease_grants']}",
            flush=True,
        )
    data: Json = {"ttl": ttl, "idle_s": idle, "in_flight": IN_FLIGHT, "results": results,
                  "keepalive_cost": keepalive, "db_growth": growth,
                  "many_locks": locks}  # fmt: skip
    data["expected_keepalives_per_s"] = round(3 / ttl, 3)
    return save_data("hold", data, clock)


def _print_n(n: int, result: Json) -> None:
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


# --------------------------------------------------------------------------- render


def _pair(ax: Any, res: list[Json], key: str, label: str, style: str = "o-") -> None:
    """Plot ``key`` of the hold phase and, where measured, of the wait phase vs N."""
    waited = [r for r in res if "wait" in r]
    ax.plot([r["n"] for r in res], [r["hold"][key] for r in res], style, label=f"{label}holding N")
    ax.plot(
        [r["n"] for r in waited],
        [r["wait"][key] for r in waited],
        "s--",
        label=f"{label}+ N waiters" + ("" if label else " (their session)"),
    )


def _etcd_line(ax: Any, res: list[Json], key: str, phase: str, style: str, color: str) -> None:
    rows = [r for r in res if phase in r]
    label = "etcd, holding N" if phase == "hold" else "etcd, + N waiters"
    ax.plot([r["n"] for r in rows], [r[phase][key] for r in rows], style, color=color, label=label)


def _plots(data: Json) -> str:
    """Keepalives/s, idle CPU and memory vs N, holding and with N waiters."""
    res = data["results"]
    ns = [r["n"] for r in res]
    expected = data["expected_keepalives_per_s"]
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    _pair(ax, res, "keepalives_per_s", "")
    ax.axhline(expected, color="gray", linewidth=0.8, label=f"3/TTL = {expected}/s")
    ax.set(
        xscale="log",
        xlabel="locks held on one session",
        ylabel="keepalive RPCs/s",
        title=f"Keepalives (TTL {data['ttl']} s)",
    )
    ax.set_ylim(0, max(1.5, 2 * expected))
    ax = axes[1]
    _pair(ax, res, "client_cpu_pct", "client, ")
    _etcd_line(ax, res, "etcd_cpu_pct", "hold", "^:", "tab:red")
    ax.axhline(1.0, color="tab:red", linewidth=0.8, alpha=0.6, label="1 % target")
    ax.set(xscale="log", xlabel="locks", ylabel="CPU % of one core, idle", title="Idle CPU")
    ax.set_ylim(bottom=0)
    ax = axes[2]
    _pair(ax, res, "client_rss_mb", "client, ")
    _etcd_line(ax, res, "etcd_rss_mb", "hold", "^:", "tab:red")
    _etcd_line(ax, res, "etcd_rss_mb", "wait", "v:", "tab:orange")
    ax.set(xscale="log", yscale="log", xlabel="locks", ylabel="RSS, MB", title="Memory")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        plain_axis(ax, "x", ns)
    plain_axis(axes[2], "y", minor=True)
    return save_plot(fig, "hold.png")


HOLD_COLUMNS = [
    "N",
    "acquire N",
    "keepalives/s",
    "keepalive streams",
    "RPCs while idle",
    "client CPU",
    "client RSS",
    "etcd CPU",
    "etcd RSS",
    "+N waiters: client CPU",
    "client RSS",
    "etcd RSS",
]


def _row(r: Json) -> list[str]:
    """One N's row of the hold table."""
    h, w = r["hold"], r.get("wait")
    return [
        f"{r['n']:,}",
        f"{r['acquire_s']:.2f} s",
        f"{h['keepalives_per_s']:.2f}",
        str(r["keepalive_streams_opened"]),
        ", ".join(f"{k} {v}" for k, v in h["requests_while_idle"].items()) or "none",
        f"{h['client_cpu_pct']:.2f} %",
        f"{h['client_rss_mb']:.0f} MB",
        f"{h['etcd_cpu_pct']:.2f} %",
        f"{h['etcd_rss_mb']:.0f} MB",
        "—" if w is None else f"{w['client_cpu_pct']:.2f} %",
        "—" if w is None else f"{w['client_rss_mb']:.0f} MB",
        "—" if w is None else f"{w['etcd_rss_mb']:.0f} MB",
    ]


def _memory_per_waiter(waited: list[Json]) -> list[str]:
    """Memory per held lock and per queued waiter, from the smallest and largest N waited."""
    if len(waited) < 2:
        return []
    lo, hi = waited[0], waited[-1]
    dn = hi["n"] - lo["n"]
    client_kb = (hi["wait"]["client_rss_mb"] - hi["hold"]["client_rss_mb"]) * 1024 / hi["n"]
    etcd_kb = (hi["wait"]["etcd_rss_mb"] - hi["hold"]["etcd_rss_mb"]) * 1024 / hi["n"]
    held_kb = (hi["hold"]["client_rss_mb"] - lo["hold"]["client_rss_mb"]) * 1024 / dn
    return [
        f"Memory per held lock in the client ≈ {held_kb:.1f} KB; per queued waiter ≈ "
        f"{client_kb:.0f} KB in the client and ≈ {etcd_kb:.0f} KB in etcd (each waiter "
        f"opens its own gRPC watch stream; N = {hi['n']:,}).",
        "",
    ]


def _keepalive_cost(ka: Json | None, by_n: dict[int, Json]) -> list[str]:
    """etcd's and the client's CPU per keepalive, when measured."""
    if not ka:
        return []
    base = by_n[min(by_n)]["hold"]["etcd_cpu_pct"] if by_n else 0.0
    per = (ka["etcd_cpu_pct"] - base) / 100 / ka["keepalives_per_s"] * 1e6
    return [
        f"Keepalive cost: {ka['sessions']} sessions of TTL {ka['ttl']} s on one client "
        f"sent {ka['keepalives_per_s']:.0f} keepalives/s; etcd used "
        f"{ka['etcd_cpu_pct']:.1f} % of a core (idle baseline {base:.1f} %), i.e. ≈ "
        f"{per:.0f} µs of etcd CPU per keepalive; the client used "
        f"{ka['client_cpu_pct']:.1f} % (≈ "
        f"{ka['client_cpu_pct'] / 100 / ka['keepalives_per_s'] * 1e6:.0f} µs each). "
        f"Sessions expired meanwhile: {ka['expired']}.",
        "",
    ]


def _db_growth(growth: Json | None) -> list[str]:
    """etcd's database growth per guarded write and per term, when measured."""
    if not growth:
        return []
    return [
        f"etcd database growth before compaction ({growth['k']:,} operations each): "
        f"{growth['bytes_per_guarded_write']:.0f} B per guarded write (64-byte value), "
        f"{growth['bytes_per_term']:.0f} B per term (campaign + resign, 2 revisions); "
        f"{growth['in_use_before_mb']} MB in use → {growth['in_use_after_compact_defrag_mb']}"
        " MB after compaction and defragmentation.",
        "",
    ]


def _hold_target(part: Part, by_n: dict[int, Json]) -> None:
    """The target row: 10,000 (else the largest N) locks, one stream, idle CPU < 1 %."""
    top = by_n.get(10000) or by_n[max(by_n)]
    h = top["hold"]
    ok = (
        top["keepalive_streams_opened"] == 1
        and not h["requests_while_idle"]
        and h["client_cpu_pct"] < 1.0
    )
    part.add(
        "hold",
        f"{top['n']:,} locks on one session: one keepalive stream, idle CPU < 1 %",
        f"{top['keepalive_streams_opened']} stream, {h['keepalives_per_s']:.2f} keepalives/s, "
        f"RPCs while idle: {h['requests_while_idle'] or 'none'}, CPU {h['client_cpu_pct']:.2f} %",
        ok,
        "1 stream, < 1 %",
    )


def render(data: Json) -> Part:
    """The hold section: keepalives, idle CPU and memory vs N, the cost lines, targets."""
    part = Part("hold", "Cost of holding N locks on one session", "", machine=data.get("machine"))
    res = data["results"]
    png = _plots(data)
    parts = [
        f"![hold]({png})",
        "",
        f"Each N in a fresh child process against etcd `--unsafe-no-fsync`; one "
        f"`AsyncSession` (TTL {data['ttl']} s) acquires N locks with the async API, "
        f"{data['in_flight']} acquires in flight; then {data['idle_s']} s idle. Then a "
        "second session queues one waiter on each of the N locks (each waiter = one watch "
        "on the key ahead) and the process idles again. CPU is `time.process_time()` (all "
        "threads) over wall time (etcd: `/proc/<pid>/stat`, 10 ms ticks, so ±0.3 % over a "
        "few seconds); RSS from `/proc/<pid>/statm`.",
        "",
        md_table(HOLD_COLUMNS, [_row(r) for r in res]),
        "",
    ]
    by_n = {r["n"]: r for r in res}
    parts += _memory_per_waiter([r for r in res if "wait" in r])
    parts += _keepalive_cost(data.get("keepalive_cost"), by_n)
    parts += _db_growth(data.get("db_growth"))
    parts += _many_locks(part, data.get("many_locks"))
    _hold_target(part, by_n)
    part.section = "\n".join(parts)
    part.findings = FINDINGS
    return part


def _many_locks(part: Part, many: Json | None) -> list[str]:
    """The 1,000-locks-vs-1,000-puts ratio (durable etcd), when it was measured."""
    if not many:
        return []
    ours, theirs = many["median_lock_ms"], many["median_put_ms"]
    r = ours / theirs
    part.add(
        "many",
        f"{many['n']:,} locks on one session (async, all in flight) / {many['n']:,} async puts",
        f"{ratio(r)} ({ours:.0f} vs {theirs:.0f} ms); keepalive streams / leases "
        f"{many['keepalive_streams']} / {many['lease_grants']}",
        r <= 2.0
        and many["keepalive_streams"] == 1
        and many["lease_grants"] == 1
        and many["session_alive"],
        "≤ 2×, 1 stream / 1 lease",
    )
    return [
        f"{many['n']:,} locks acquired on one session with all in flight vs {many['n']:,} "
        f"plain async puts on the same client, durable etcd, {many['rounds']} alternating "
        f"rounds: {ours:.0f} vs {theirs:.0f} ms (medians), {ratio(r)}; the client opened "
        f"{many['keepalive_streams']} keepalive stream and {many['lease_grants']} lease for "
        "them.",
        "",
    ]


FINDINGS = f"""### Holding and waiting at scale

Held locks cost nothing but memory: one lease, one keepalive stream, no RPCs while idle, \
whatever N is. Waiters are the expensive part: each pending `acquire` opens its own gRPC \
Watch stream, which costs etcd a stream (the etcd project's watch-memory benchmark puts a \
stream at ~18 KB and a watching on a shared stream at ~350 B, {WATCH_MEMORY_URL}) and the \
client a grpc.aio call and a task. Recommendation for the library: multiplex a client's \
waits on one Watch stream (as Go's clientv3 does).

Found while building this bench: starting 10,000 `acquire` calls that all have to wait \
*at once* on one TTL-3 s session made that session miss its local deadline (the event loop \
was busy opening 10,000 streams for > 2.7 s) and every waiter got `SessionExpired` — \
fail-safe, but a cliff. Queued 256 at a time (as here) it is fine. Bound the number of \
concurrent waits per process, or use a longer TTL for sessions that queue many waiters.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child_main(argv[1:])
    parser = topic_args(__doc__)
    parser.add_argument("--counts", default="1,100,1000,10000")
    parser.add_argument("--ttl", type=int, default=None, help="session TTL (default 3)")
    parser.add_argument("--idle", type=float, default=None, help="idle seconds (5; quick 2)")
    parser.add_argument(
        "--wait-max", type=int, default=None, help="largest N that also queues N waiters"
    )
    parser.add_argument("--sessions", type=int, default=300, help="sessions for keepalive cost")
    parser.add_argument("--many", type=int, default=1000, help="locks vs puts, all in flight")
    parser.add_argument("--many-rounds", type=int, default=None, help="(default 7; quick 2)")
    args = parser.parse_args(argv)

    def run() -> Json:
        return measure(
            args.quick,
            counts=[int(x) for x in args.counts.split(",")],
            ttl=args.ttl,
            idle=args.idle,
            wait_max=args.wait_max,
            sessions=args.sessions,
            many=args.many,
            many_rounds=args.many_rounds,
        )

    return run_topic("hold", run, render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

"""Guarded vs plain write throughput vs concurrency (1, 4, 16, 64, 256 in flight),
sync (threads) and asyncio, against raw gRPC puts as the ceiling for Python here.

Eight contenders, all writing 64-byte values to one etcd:

* ``raw grpc.aio`` — a bare ``grpc.aio`` channel's ``unary_unary`` on
  ``/etcdserverpb.KV/Put`` with etcdfence's wire messages: no retries, no error
  translation, no validation — the ceiling this machine allows from asyncio Python;
* ``raw grpc.aio guard txn`` — the same bare channel on ``/etcdserverpb.KV/Txn``
  sending the guard's txn (built by ``etcdfence._txn.fence_txn``): what a fenced
  write costs at the protocol level, so ``async guarded`` / this = library overhead;
* ``async plain`` — ``AsyncClient.put``;
* ``async guarded`` — ``AsyncFenceGuard.put`` (one txn: fence check, mark, write);
* ``raw grpc (threads)``, ``raw grpc guard txn (threads)``, ``sync plain``
  (``Client.put``), ``sync guarded`` (``FenceGuard.put``) — the same from threads.

"c in flight" is c workers (tasks or threads) each writing back to back; worker w
writes its own key and, when guarded, fences its own resource (``bench/r<w>``) with
one token, as c independent leaders would. Each contender runs for a fixed time
slice; slices alternate over the contenders, ``rounds`` times per level, and the
median ops/s is kept. etcd's CPU seconds (``/proc/<pid>/stat``) and the client
process's CPU seconds per slice give the CPU cost per write on both sides.

Run against a durable etcd and against ``--unsafe-no-fsync``.

    python -m bench.throughput [--quick] [--rounds 7] [--slice 0.3] [--render-only]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

import etcdfence as ef
from bench._common import (
    MODE_TEXT,
    Json,
    Part,
    Stopwatch,
    cpu_seconds,
    fsync_label,
    host_port,
    md_table,
    median,
    pyplot,
    ratio,
    real_token,
    run_topic,
    save_data,
    save_plot,
    start_etcd,
    topic_args,
)
from etcdfence import _txn
from etcdfence._wire import messages as m

LEVELS = (1, 4, 16, 64, 256)
ASYNC = ("raw grpc.aio", "raw grpc.aio guard txn", "async plain", "async guarded")
SYNC = ("raw grpc (threads)", "raw grpc guard txn (threads)", "sync plain", "sync guarded")
CONTENDERS = ASYNC + SYNC
VALUE = b"x" * 64
PUT = "/etcdserverpb.KV/Put"
TXN = "/etcdserverpb.KV/Txn"


class Bench:
    def __init__(self, endpoint: str, etcd_pid: int) -> None:
        self.etcd_pid = etcd_pid
        host, port = host_port(endpoint)
        target = f"{host}:{port}"
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.aclient = ef.AsyncClient(endpoint)
        self.client = ef.Client(endpoint)
        self.achannel = grpc.aio.insecure_channel(target)
        self.channel = grpc.insecure_channel(target)
        serialize, parse = m.PutRequest.SerializeToString, m.PutResponse.FromString
        self.araw = self.achannel.unary_unary(
            PUT, request_serializer=serialize, response_deserializer=parse
        )
        self.raw = self.channel.unary_unary(
            PUT, request_serializer=serialize, response_deserializer=parse
        )
        self.araw_txn = self.achannel.unary_unary(
            TXN,
            request_serializer=m.TxnRequest.SerializeToString,
            response_deserializer=m.TxnResponse.FromString,
        )
        self.raw_txn = self.channel.unary_unary(
            TXN,
            request_serializer=m.TxnRequest.SerializeToString,
            response_deserializer=m.TxnResponse.FromString,
        )
        n = max(LEVELS)
        # one real lock token for every guard: each writes as its own term's holder
        self.token = real_token(endpoint)
        self.aguards = [self.aclient.fence(f"bench/r{w}") for w in range(n)]
        self.guards = [self.client.fence(f"bench/r{w}") for w in range(n)]
        self.keys = [f"bench/k{w}".encode() for w in range(n)]
        self.fence_keys = [guard.key for guard in self.aguards]
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None

    # -- the operations -------------------------------------------------------------

    def guard_txn(self, w: int) -> Any:
        """The txn ``guard.put`` sends, built by the library's own pure builder."""
        ops = [_txn.op_put(self.keys[w], VALUE)]
        return _txn.fence_txn(self.fence_keys[w], self.token.value, ops)

    def async_op(self, name: str) -> Callable[[int], Awaitable[Any]]:
        if name == "raw grpc.aio":
            return lambda w: self.araw(m.PutRequest(key=self.keys[w], value=VALUE), timeout=5)
        if name == "raw grpc.aio guard txn":
            return lambda w: self.araw_txn(self.guard_txn(w), timeout=5)
        if name == "async plain":
            return lambda w: self.aclient.put(self.keys[w], VALUE)
        return lambda w: self.aguards[w].put(self.token, self.keys[w], VALUE)

    def sync_op(self, name: str) -> Callable[[int], Any]:
        if name == "raw grpc (threads)":
            return lambda w: self.raw(m.PutRequest(key=self.keys[w], value=VALUE), timeout=5)
        if name == "raw grpc guard txn (threads)":
            return lambda w: self.raw_txn(self.guard_txn(w), timeout=5)
        if name == "sync plain":
            return lambda w: self.client.put(self.keys[w], VALUE)
        return lambda w: self.guards[w].put(self.token, self.keys[w], VALUE)

    # -- one time slice ------------------------------------------------------------------

    def slice(self, name: str, c: int, seconds: float) -> tuple[int, float]:
        """Run ``name`` with ``c`` in flight for ``seconds``; (ops, elapsed)."""
        start = time.monotonic()
        deadline = start + seconds
        if name in ASYNC:
            op = self.async_op(name)

            async def worker(w: int) -> int:
                n = 0
                while time.monotonic() < deadline:
                    await op(w)
                    n += 1
                return n

            async def everyone() -> int:
                return sum(await asyncio.gather(*(worker(w) for w in range(c))))

            ops = self.loop.run_until_complete(everyone())
        else:
            sop = self.sync_op(name)
            assert self.pool is not None

            def sworker(w: int) -> int:
                n = 0
                while time.monotonic() < deadline:
                    sop(w)
                    n += 1
                return n

            ops = sum(f.result() for f in [self.pool.submit(sworker, w) for w in range(c)])
        return ops, time.monotonic() - start

    def level(self, c: int, rounds: int, seconds: float) -> dict[str, dict[str, Any]]:
        self.pool = concurrent.futures.ThreadPoolExecutor(c, thread_name_prefix=f"c{c}")
        try:
            for name in CONTENDERS:  # warm up: threads, channels, code paths
                self.slice(name, c, 0.05)
            out: dict[str, dict[str, Any]] = {
                name: {"ops_per_s": [], "etcd_cpu_us_per_op": [], "client_cpu_us_per_op": []}
                for name in CONTENDERS
            }
            for rnd in range(rounds):
                order = CONTENDERS if rnd % 2 == 0 else tuple(reversed(CONTENDERS))
                for name in order:
                    etcd0, me0 = cpu_seconds(self.etcd_pid), cpu_seconds()
                    ops, elapsed = self.slice(name, c, seconds)
                    etcd1, me1 = cpu_seconds(self.etcd_pid), cpu_seconds()
                    cell = out[name]
                    cell["ops_per_s"].append(round(ops / elapsed, 1))
                    cell["etcd_cpu_us_per_op"].append(round((etcd1 - etcd0) / ops * 1e6, 1))
                    cell["client_cpu_us_per_op"].append(round((me1 - me0) / ops * 1e6, 1))
            for cell in out.values():
                for key in list(cell):
                    cell["median_" + key] = median(cell[key])
            return out
        finally:
            self.pool.shutdown(wait=True)
            self.pool = None

    def close(self) -> None:
        self.loop.run_until_complete(self.aclient.aclose())
        self.loop.run_until_complete(self.achannel.close())
        self.loop.close()
        self.client.close()
        self.channel.close()


def run_mode(fsync: bool, rounds: int, seconds: float, levels: list[int]) -> Json:
    with start_etcd(fsync=fsync) as server:
        assert server.pid is not None
        bench = Bench(server.endpoint, server.pid)
        try:
            out: Json = {}
            for c in levels:
                out[str(c)] = cell = bench.level(c, rounds, seconds)
                print(
                    f"  {fsync_label(fsync):8} c={c:3} "
                    + "  ".join(f"{n}: {cell[n]['median_ops_per_s']:7.0f}/s" for n in CONTENDERS),
                    flush=True,
                )
            return out
        finally:
            bench.close()


# --------------------------------------------------------------------------- measure


def measure(
    quick: bool,
    *,
    rounds: int | None = None,
    seconds: float | None = None,
    modes: list[str] | None = None,
    levels: list[int] | None = None,
) -> Json:
    """Every contender at every level, per etcd mode; writes ``results/throughput.json``."""
    rounds = rounds or (2 if quick else 7)
    seconds = seconds or (0.15 if quick else 0.3)
    levels = levels or list(LEVELS)
    clock = Stopwatch()
    data: Json = {"levels": levels, "contenders": list(CONTENDERS), "rounds": rounds,
                  "slice_s": seconds, "modes": {}}  # fmt: skip
    for mode in modes or ["fsync", "no-fsync"]:
        print(f"# throughput, {mode} etcd", flush=True)
        data["modes"][mode] = run_mode(mode == "fsync", rounds, seconds, levels)
    return save_data("throughput", data, clock)


# --------------------------------------------------------------------------- render

COLORS = {
    "raw grpc.aio": "black",
    "raw grpc.aio guard txn": "tab:gray",
    "async plain": "tab:green",
    "async guarded": "tab:blue",
    "raw grpc (threads)": "black",
    "raw grpc guard txn (threads)": "tab:gray",
    "sync plain": "tab:green",
    "sync guarded": "tab:blue",
}


def _curves(data: Json) -> str:
    """Writes/s vs writes in flight, one panel per API (async, sync) and etcd mode."""
    levels, modes, names = data["levels"], list(data["modes"]), data["contenders"]
    fig, axes = pyplot().subplots(len(modes), 2, figsize=(11, 3.8 * len(modes)), squeeze=False)
    for row, mode in zip(axes, modes, strict=True):
        for ax, group in zip(row, ("async", "sync"), strict=True):
            for name in names:
                is_async = "aio" in name or name.startswith("async")
                if is_async != (group == "async"):
                    continue
                ys = [data["modes"][mode][str(c)][name]["median_ops_per_s"] for c in levels]
                dashed = name.startswith("raw")
                ax.plot(
                    levels,
                    ys,
                    marker="o",
                    label=name,
                    color=COLORS[name],
                    linestyle=":" if dashed else "-",
                )
            _log_levels(ax, levels, "writes/s (median)", f"{group}, {MODE_TEXT[mode]}")
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
    return save_plot(fig, "throughput.png")


def _log_levels(ax: Any, levels: list[int], ylabel: str, title: str) -> None:
    """A log x axis of the in-flight levels, labelled as plain numbers, with a grid."""
    ax.set(xscale="log", xlabel="writes in flight", ylabel=ylabel, title=title)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.grid(alpha=0.3)


#: The ratio curves: (numerator, denominator, line style, colour).
RATIO_CURVES = (
    ("async guarded", "async plain", "o-", "tab:blue"),
    ("sync guarded", "sync plain", "s-", "tab:green"),
    ("async guarded", "raw grpc.aio", "o--", "black"),
    ("async guarded", "raw grpc.aio guard txn", "o:", "tab:gray"),
    ("sync guarded", "raw grpc guard txn (threads)", "s:", "tab:olive"),
)


def _ratio_label(a: str, b: str) -> str:
    return f"{a} / {b} put" if b == "raw grpc.aio" else f"{a} / {b}"


def _ratios(data: Json) -> str:
    """Guarded ÷ plain (and ÷ the bare gRPC contenders) vs writes in flight, per mode."""
    levels, modes = data["levels"], list(data["modes"])
    fig, axes = pyplot().subplots(1, len(modes), figsize=(5.5 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        lv = data["modes"][mode]
        for a, b, style, color in RATIO_CURVES:
            ys = [
                lv[str(c)][a]["median_ops_per_s"] / lv[str(c)][b]["median_ops_per_s"]
                for c in levels
            ]
            ax.plot(levels, ys, style, color=color, label=_ratio_label(a, b))
        for y in (0.8, 0.9):
            ax.axhline(y, color="tab:red", linewidth=0.8, alpha=0.6)
        _log_levels(ax, levels, "ratio of medians", f"Ratios, {MODE_TEXT[mode]}")
        ax.set_ylim(0, 1.4)
        ax.legend(fontsize=7, loc="lower left")
    return save_plot(fig, "throughput_ratio.png")


def _mode_tables(mode: str, lv: Json, levels: list[int], names: list[str]) -> list[str]:
    """One etcd mode's writes/s table and, when measured, its CPU per write at 64."""
    rows = [[str(c)] + [f"{lv[str(c)][n]['median_ops_per_s']:.0f}" for n in names] for c in levels]
    out = [f"**{MODE_TEXT[mode]}** — writes/s", "", md_table(["in flight", *names], rows), ""]
    c64 = lv.get("64")
    if c64 is not None:
        rows = []
        for n in names:
            etcd_us = c64[n]["median_etcd_cpu_us_per_op"]
            client_us = c64[n]["median_client_cpu_us_per_op"]
            rows.append([n, f"{etcd_us:.0f}", f"{client_us:.0f}", f"{etcd_us + client_us:.0f}"])
        out += [
            f"CPU per write at 64 in flight ({mode}), µs (etcd and client share 2 cores):",
            "",
            md_table(["contender", "etcd µs/write", "client µs/write", "sum"], rows),
            "",
        ]
    return out


def _mode_targets(part: Part, mode: str, lv: Json) -> None:
    """One etcd mode's rows of the targets table (1 and 64 in flight)."""

    def med(c: int, n: str) -> float:
        value: float = lv[str(c)][n]["median_ops_per_s"]
        return value

    sync64 = ratio(med(64, "sync guarded") / med(64, "sync plain"))
    txn64 = ratio(med(64, "async guarded") / med(64, "raw grpc.aio guard txn"))
    rows = (  # key, what, guarded, plain, in flight, goal, what else to show
        ("sync", "guarded/plain, sync, 1 in flight", "sync guarded", "sync plain", 1, 0.9, ""),
        ("c64", "guarded/plain, 64 in flight, async", "async guarded", "async plain", 64, 0.8,
         f"; sync {sync64}"),
        ("raw", "async guarded / raw grpc.aio put, 64 in flight", "async guarded",
         "raw grpc.aio", 64, 0.8, f"; vs raw guard txn {txn64}"),
    )  # fmt: skip
    for key, what, a, b, c, goal, more in rows:
        r = med(c, a) / med(c, b)
        part.add(
            key,
            f"{what} ({mode})",
            f"{ratio(r)} ({med(c, a):.0f} vs {med(c, b):.0f}/s{more})",
            r >= goal,
            f"≥ {goal}×",
        )


def render(data: Json) -> Part:
    """The throughput section: curves, ratio curves, tables, CPU per write, targets."""
    title = "Guarded vs plain write throughput vs concurrency"
    part = Part("throughput", title, "", machine=data.get("machine"))
    png, png_ratio = _curves(data), _ratios(data)
    parts = [
        f"![throughput]({png})",
        "",
        f"![throughput ratios]({png_ratio})",
        "",
        "c writers (asyncio tasks or threads) write back to back, each its own key and, "
        "when guarded, its own fenced resource with one token (c independent leaders). "
        "`raw grpc.aio` is a bare `grpc.aio` channel's `unary_unary` on "
        "`/etcdserverpb.KV/Put` with etcdfence's wire messages — no retries, no error "
        "translation: the ceiling for Python here. `raw grpc.aio guard txn` sends the "
        "guard's txn the same bare way, so `async guarded` ÷ it is the library's own "
        f"overhead. Fixed {data['slice_s']} s slices alternate over all contenders, "
        f"{data['rounds']} rounds per level; medians. CPU per write comes from "
        "`/proc/<pid>/stat` of etcd and `time.process_time()` of the client around each "
        "slice.",
        "",
    ]
    for mode, lv in data["modes"].items():
        parts += _mode_tables(mode, lv, data["levels"], data["contenders"])
        _mode_targets(part, mode, lv)
    part.section = "\n".join(parts)
    part.findings = _findings(data)
    return part


def _mode_findings(mode: str, c64: Json) -> tuple[str, list[str]]:
    """One etcd mode at 64 in flight: the txn's cost against a bare put, the library's
    against the bare txn (a findings line), and the verdicts that follow from them."""

    def g(n: str, k: str) -> float:
        value: float = c64[n][k]
        return value

    raw, txn = "raw grpc.aio", "raw grpc.aio guard txn"
    ops = "median_ops_per_s"
    protocol = g(txn, ops) / g(raw, ops)
    library = g("async guarded", ops) / g(txn, ops)
    line = (
        f"- {MODE_TEXT[mode]}, 64 in flight: a bare grpc.aio client sending the guard's "
        f"txn gets {g(txn, ops):.0f}/s, {ratio(protocol)} of bare puts "
        f"({g(raw, ops):.0f}/s); etcdfence's `guard.put` gets {ratio(library)} of that "
        f"bare txn. Per write, etcd spends {g(txn, 'median_etcd_cpu_us_per_op'):.0f} µs "
        f"on the txn vs {g(raw, 'median_etcd_cpu_us_per_op'):.0f} µs on a put, the "
        f"client {g(txn, 'median_client_cpu_us_per_op'):.0f} vs "
        f"{g(raw, 'median_client_cpu_us_per_op'):.0f} µs (bigger request and response); "
        "both processes share 2 cores, so the sum decides the rate."
    )
    total = g("async guarded", ops) / g(raw, ops)
    split = (
        f"{mode}: guarded / raw put {ratio(total)} = the txn's own cost "
        f"{ratio(protocol)} × the library's overhead {ratio(library)}"
    )
    if total >= 0.8:
        verdict = split
    elif protocol < 0.8:
        verdict = (
            split + " — a bare client sending the same txn is already below 0.8×, so "
            "no Python client reaches the target here: the limit is the txn (etcd's "
            "compare, read under the write lock and response ops, and a bigger message "
            "for gRPC to move)"
        )
    else:
        verdict = (
            split + f" — the txn alone leaves {ratio(protocol)}, so a library overhead "
            f"of {(1 - library) * 100:.0f} % is what stands between it and 0.8×; that "
            "overhead is the call path profiled above (guard checks, coroutine layers, "
            "the connection's deadline and error handling)"
        )
    sync_async = g("sync plain", "median_client_cpu_us_per_op") / g(
        "async plain", "median_client_cpu_us_per_op"
    )
    threads = (
        f"{mode}: at 64 threads the sync client spends {ratio(sync_async)} the CPU per "
        "write of the asyncio client (the GIL and a thread per call)"
    )
    return line, [verdict, threads]


PROFILE = (
    "Profile (py-spy, 64 async guarded writes in flight, `--unsafe-no-fsync`): the "
    "client's time goes to grpc.aio's call machinery (`UnaryUnaryCall._invoke` and "
    "`__init__`, ~30 % of samples) and asyncio scheduling; building the guard txn "
    "(`_txn.fence_txn`: a compare, a range and two puts as nested protobuf messages) "
    "was ~7 % — 5.2 µs per write against 0.6 µs for a `PutRequest` — and the guard's "
    "own checks (token, ops, key) ~1.5 µs. `AsyncClient.put` runs level with a bare "
    "grpc.aio put, so the connection layer costs nothing measurable."
)

CHANGED = (
    "**Changed** (`etcdfence/_txn.py`, `fence_txn`): the txn is now built in place "
    "with `add()` on its repeated fields instead of constructing nested messages and "
    "passing them to their parents, which copied each one: 5.2 → 2.2 µs per guarded "
    "write (9.8 → 3.4 µs with `require_owner=True`), sync and asyncio alike; the "
    "bytes on the wire are identical (checked over 72 combinations of key, token, "
    "ops and owner, on protobuf 7.36 and 5.27). That is ~2–3 % of a guarded write's "
    "total CPU here. Tried, not kept: a txn that skips re-writing an unchanged mark "
    "(`If(value(mark) == token) Then(Put(data)) Else(<the guard txn>)`) — etcd's CPU "
    "per write did not drop (66 vs 64 µs): the cost is the txn machinery, not the "
    "second put. Registering the gRPC methods (`_registered_method=True`) changed "
    "nothing measurable either."
)


def _findings(thr: Json) -> str:
    lines = ["### Guarded writes: what limits them", ""]
    verdicts = []
    for mode, lv in thr["modes"].items():
        c64 = lv.get("64")
        if c64 is None:
            continue
        line, more = _mode_findings(mode, c64)
        lines.append(line)
        verdicts += more
    lines += [
        "",
        PROFILE,
        "",
        CHANGED,
        "",
        "In this run: " + "; ".join(verdicts) + ". Use the asyncio API for many concurrent "
        "writers. On a real disk, where an fsync costs 1–10 ms instead of well under a "
        "millisecond on this VM, the fsync is expected to dominate each durable write "
        "and the guarded / plain ratios to move toward 1.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--slice", type=float, default=None, help="seconds per time slice")
    parser.add_argument("--modes", default="fsync,no-fsync")
    parser.add_argument("--levels", default=None, help="in-flight levels (default 1,4,16,64,256)")
    args = parser.parse_args(argv)

    def run() -> Json:
        levels = [int(x) for x in args.levels.split(",")] if args.levels else None
        return measure(
            args.quick,
            rounds=args.rounds,
            seconds=args.slice,
            modes=args.modes.split(","),
            levels=levels,
        )

    return run_topic("throughput", run, render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

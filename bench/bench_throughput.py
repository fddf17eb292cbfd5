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

    python bench/bench_throughput.py [--quick] [--rounds 7] [--slice 0.3]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
import grpc.aio
from bench_curves import (
    Json,
    Stopwatch,
    bench_args,
    cpu_seconds,
    fsync_label,
    host_port,
    median,
    save,
    start_etcd,
)

import etcdfence as ef
from etcdfence import _txn
from etcdfence._wire import messages as m

LEVELS = (1, 4, 16, 64, 256)
ASYNC = ("raw grpc.aio", "raw grpc.aio guard txn", "async plain", "async guarded")
SYNC = ("raw grpc (threads)", "raw grpc guard txn (threads)", "sync plain", "sync guarded")
CONTENDERS = ASYNC + SYNC
VALUE = b"x" * 64
TOKEN = ef.FencingToken(10**12)  # far above any revision: always accepted
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
        self.aguards = [self.aclient.fence(f"bench/r{w}") for w in range(n)]
        self.guards = [self.client.fence(f"bench/r{w}") for w in range(n)]
        self.keys = [f"bench/k{w}".encode() for w in range(n)]
        self.fence_keys = [guard.key for guard in self.aguards]
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None

    # -- the operations -------------------------------------------------------------

    def guard_txn(self, w: int) -> Any:
        """The txn ``guard.put`` sends, built by the library's own pure builder."""
        return _txn.fence_txn(self.fence_keys[w], TOKEN.value, [_txn.op_put(self.keys[w], VALUE)])

    def async_op(self, name: str) -> Callable[[int], Awaitable[Any]]:
        if name == "raw grpc.aio":
            return lambda w: self.araw(m.PutRequest(key=self.keys[w], value=VALUE), timeout=5)
        if name == "raw grpc.aio guard txn":
            return lambda w: self.araw_txn(self.guard_txn(w), timeout=5)
        if name == "async plain":
            return lambda w: self.aclient.put(self.keys[w], VALUE)
        return lambda w: self.aguards[w].put(TOKEN, self.keys[w], VALUE)

    def sync_op(self, name: str) -> Callable[[int], Any]:
        if name == "raw grpc (threads)":
            return lambda w: self.raw(m.PutRequest(key=self.keys[w], value=VALUE), timeout=5)
        if name == "raw grpc guard txn (threads)":
            return lambda w: self.raw_txn(self.guard_txn(w), timeout=5)
        if name == "sync plain":
            return lambda w: self.client.put(self.keys[w], VALUE)
        return lambda w: self.guards[w].put(TOKEN, self.keys[w], VALUE)

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


def run_mode(fsync: bool, rounds: int, seconds: float) -> Json:
    with start_etcd(fsync=fsync) as server:
        assert server.pid is not None
        bench = Bench(server.endpoint, server.pid)
        try:
            levels: Json = {}
            for c in LEVELS:
                levels[str(c)] = cell = bench.level(c, rounds, seconds)
                print(
                    f"  {fsync_label(fsync):8} c={c:3} "
                    + "  ".join(f"{n}: {cell[n]['median_ops_per_s']:7.0f}/s" for n in CONTENDERS),
                    flush=True,
                )
            return levels
        finally:
            bench.close()


def main() -> int:
    parser = bench_args(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--slice", type=float, default=None, help="seconds per time slice")
    parser.add_argument("--modes", default="fsync,no-fsync")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 7)
    seconds = args.slice or (0.15 if args.quick else 0.3)
    clock = Stopwatch()
    data: Json = {"levels": list(LEVELS), "contenders": list(CONTENDERS), "rounds": rounds,
                  "slice_s": seconds, "modes": {}}  # fmt: skip
    for mode in args.modes.split(","):
        print(f"# throughput, {mode} etcd", flush=True)
        data["modes"][mode] = run_mode(mode == "fsync", rounds, seconds)
    data.update(clock.result())
    save("throughput", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

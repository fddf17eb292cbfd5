"""Lock drain time vs number of waiters, etcdfence vs python3-etcd3's ``Lock``.

N waiters queue on one lock held by a holder; the holder releases; every waiter
acquires, then releases at once. *Drain time* is from the holder's release to the
last waiter's release returning. *Requests per handoff* counts what etcd must serve
in that window (unary RPCs plus watch creations; see ``bench_curves.requests_of``)
divided by the N handoffs.

Contenders (each waiter is its own client with its own lease, as separate processes
would be; waiters of the sync APIs are threads):

* ``etcdfence`` — ``ef.Client`` + ``session.lock(name)`` (threads);
* ``etcdfence-async`` — one ``ef.AsyncClient``, one session per waiter (tasks);
* ``python3-etcd3`` — ``etcd3.client(host, port).lock(name, ttl=30)`` (threads).
  Its ``acquire`` retries a put-if-absent txn after *every* delete of the lock key,
  with a fresh lease each time, and all waiters watch that one key: a herd.

As a cross-check independent of both clients, etcd's own counter of received gRPC
messages (``grpc_server_msg_received_total`` on its ``/metrics``, keepalives
excluded) is read around each drain: that total also covers the holder's acquire and
every waiter's enqueueing, so it is reported per waiter, not per handoff.

Rounds alternate the contenders (the order flips every round) for every N, against
a durable etcd and against ``--unsafe-no-fsync``; the result is the median per N.

    python bench/bench_drain.py [--quick] [--rounds 3] [--waiters 5,10,20,50]
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import etcd3
from bench_curves import (
    Counter,
    Json,
    Stopwatch,
    bench_args,
    count_etcd3,
    count_etcdfence,
    fsync_label,
    host_port,
    median,
    requests_of,
    save,
    start_etcd,
    wait_until,
)

# From the lock bench of the same suite: etcd's own request counters (its /metrics),
# and silencing python3-etcd3's watcher threads, which die with NameError on close.
from bench_locks import quiet, server_messages

import etcdfence as ef

SETTLE = 0.2  # after every waiter issued its watch, before the release (not timed)
LIBS = ("etcdfence", "etcdfence-async", "python3-etcd3")


class Outcome:
    def __init__(self, seconds: float, counts: collections.Counter[str], n: int) -> None:
        self.seconds = seconds
        self.counts = counts
        self.per_handoff = requests_of(counts) / n
        self.server_per_handoff = 0.0


def _server_requests(endpoint: str) -> int:
    """Requests and stream messages etcd received so far, keepalive pings excluded."""
    counts = server_messages(endpoint)
    return sum(n for method, n in counts.items() if method != "LeaseKeepAlive")


def _delta(after: collections.Counter[str], before: collections.Counter[str]) -> Any:
    out = collections.Counter(after)
    out.subtract(before)
    return collections.Counter({k: v for k, v in out.items() if v})


def _threaded_drain(
    release: Callable[[], Any],
    pass_through: Callable[[int], None],
    n: int,
    counter: Any,
    watch_key: str,
    what: str,
) -> Outcome:
    """Start ``n`` waiter threads (``pass_through(i)``: acquire, then release), wait
    until each has its watch open, then ``release`` the held lock and time the drain.
    Both threaded contenders go through this one procedure."""
    finished: list[float] = []
    start_watches = counter.snapshot()[watch_key]

    def waiter(i: int) -> None:
        pass_through(i)
        finished.append(time.monotonic())

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(1, n + 1)]
    for thread in threads:
        thread.start()
    wait_until(lambda: counter.snapshot()[watch_key] - start_watches >= n, 30, what)
    time.sleep(SETTLE)
    before = counter.snapshot()
    t0 = time.monotonic()
    release()
    for thread in threads:
        thread.join()
    return Outcome(max(finished) - t0, _delta(counter.snapshot(), before), n)


class EtcdfenceSync:
    """Waiters are threads, each with its own ``ef.Client`` and session."""

    def __init__(self, endpoint: str, nmax: int) -> None:
        self.counter = Counter()
        self.clients = [ef.Client(endpoint) for _ in range(nmax + 1)]
        for client in self.clients:
            count_etcdfence(client, self.counter)
        self.sessions = [client.session(ttl=30) for client in self.clients]
        for session in self.sessions:
            session.open()

    def _pass_through(self, name: str, i: int) -> None:
        lock = self.sessions[i].lock(name)
        lock.acquire()
        lock.release()

    def drain(self, name: str, n: int) -> Outcome:
        holder = self.sessions[0].lock(name)
        holder.acquire()
        return _threaded_drain(
            holder.release,
            lambda i: self._pass_through(name, i),
            n,
            self.counter,
            "stream:Watch",
            "etcdfence waiters to queue",
        )

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        for client in self.clients:
            client.close()


class EtcdfenceAsync:
    """Waiters are tasks on one ``ef.AsyncClient``, one session (lease) each."""

    def __init__(self, endpoint: str, nmax: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.counter = Counter()
        self.client = ef.AsyncClient(endpoint)
        count_etcdfence(self.client, self.counter)

        async def open_all() -> list[ef.AsyncSession]:
            sessions = [self.client.session(ttl=30) for _ in range(nmax + 1)]
            for session in sessions:
                await session.open()
            return sessions

        self.sessions = self.loop.run_until_complete(open_all())

    def drain(self, name: str, n: int) -> Outcome:
        return self.loop.run_until_complete(self._drain(name, n))

    async def _drain(self, name: str, n: int) -> Outcome:
        holder = self.sessions[0].lock(name)
        await holder.acquire()
        finished: list[float] = []
        start_watches = self.counter.snapshot()["stream:Watch"]

        async def waiter(i: int) -> None:
            lock = self.sessions[i].lock(name)
            await lock.acquire()
            await lock.release()
            finished.append(time.monotonic())

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(1, n + 1)]
        deadline = time.monotonic() + 30
        while self.counter.snapshot()["stream:Watch"] - start_watches < n:
            if time.monotonic() > deadline:
                raise TimeoutError("etcdfence-async waiters did not queue")
            await asyncio.sleep(0.01)
        await asyncio.sleep(SETTLE)
        before = self.counter.snapshot()
        t0 = time.monotonic()
        await holder.release()
        await asyncio.gather(*tasks)
        return Outcome(max(finished) - t0, _delta(self.counter.snapshot(), before), n)

    def close(self) -> None:
        async def close_all() -> None:
            for session in self.sessions:
                await session.aclose()
            await self.client.aclose()

        self.loop.run_until_complete(close_all())
        self.loop.close()


class Etcd3Locks:
    """python3-etcd3: waiters are threads, each with its own ``etcd3.client``."""

    def __init__(self, endpoint: str, nmax: int) -> None:
        host, port = host_port(endpoint)
        self.counter = Counter()
        self.clients = [etcd3.client(host=host, port=port) for _ in range(nmax + 1)]
        for client in self.clients:
            count_etcd3(client, self.counter)

    def _pass_through(self, name: str, i: int) -> None:
        lock = self.clients[i].lock(name, ttl=30)
        assert lock.acquire(timeout=None)
        lock.release()

    def drain(self, name: str, n: int) -> Outcome:
        holder = self.clients[0].lock(name, ttl=30)
        assert holder.acquire(timeout=None)
        return _threaded_drain(
            holder.release,
            lambda i: self._pass_through(name, i),
            n,
            self.counter,
            "watch:create",
            "python3-etcd3 waiters to queue",
        )

    def close(self) -> None:
        for client in self.clients:
            client.close()


def run_mode(fsync: bool, waiters: list[int], rounds: int, libs: tuple[str, ...]) -> Json:
    results: dict[str, dict[str, Any]] = {
        lib: {
            str(n): {
                "seconds": [],
                "requests_per_handoff": [],
                "server_requests_per_waiter": [],
                "by_method": {},
            }
            for n in waiters
        }
        for lib in libs
    }
    with start_etcd(fsync=fsync) as server:
        nmax = max(waiters)
        makers = {"etcdfence": EtcdfenceSync, "etcdfence-async": EtcdfenceAsync,
                  "python3-etcd3": Etcd3Locks}  # fmt: skip
        sides: dict[str, Any] = {lib: makers[lib](server.endpoint, nmax) for lib in libs}
        try:
            for lib, side in sides.items():  # warm up channels and code paths
                side.drain(f"warmup/{lib}", 2)
            for rnd in range(rounds):
                order = list(libs) if rnd % 2 == 0 else list(reversed(libs))
                for n in waiters:
                    for lib in order:
                        seen = _server_requests(server.endpoint)
                        out = sides[lib].drain(f"drain/{lib}/{n}/{rnd}", n)
                        served = _server_requests(server.endpoint) - seen
                        # etcd also served the holder's acquire and the waiters' enqueueing
                        # (before the release): report the server's total per waiter
                        out.server_per_handoff = served / n
                        cell = results[lib][str(n)]
                        cell["seconds"].append(round(out.seconds, 5))
                        cell["requests_per_handoff"].append(round(out.per_handoff, 2))
                        cell["server_requests_per_waiter"].append(round(out.server_per_handoff, 2))
                        cell["by_method"] = {k: round(v / n, 2) for k, v in out.counts.items()}
                        print(
                            f"  {fsync_label(fsync):8} round {rnd} n={n:3} {lib:16} "
                            f"{out.seconds * 1000:9.1f} ms  {out.per_handoff:7.1f} req/handoff",
                            flush=True,
                        )
        finally:
            for side in sides.values():
                side.close()
    for lib in libs:
        for n in waiters:
            cell = results[lib][str(n)]
            cell["median_seconds"] = median(cell["seconds"])
            cell["median_requests_per_handoff"] = median(cell["requests_per_handoff"])
            cell["median_server_requests_per_waiter"] = median(cell["server_requests_per_waiter"])
    return results


def main() -> int:
    parser = bench_args(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--waiters", default="5,10,20,50")
    parser.add_argument("--modes", default=None, help="fsync,no-fsync (quick: fsync only)")
    args = parser.parse_args()
    quiet()
    rounds = args.rounds or (1 if args.quick else 3)
    modes = (args.modes or ("fsync" if args.quick else "fsync,no-fsync")).split(",")
    waiters = [int(x) for x in args.waiters.split(",")]
    clock = Stopwatch()
    data: Json = {"waiters": waiters, "rounds": rounds, "libs": list(LIBS), "modes": {}}
    for mode in modes:
        print(f"# drain, {mode} etcd", flush=True)
        data["modes"][mode] = run_mode(mode == "fsync", waiters, rounds, LIBS)
    data.update(clock.result())
    save("drain", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Locks and elections, measured side by side in one run on one embedded etcd.

What is printed (targets from the issue "Sessions, locks, elections and LeaderElector"):

1. **Drain**: 20 waiters (threads, one client each — 20 "processes") start together on
   one lock; each acquires, releases and is done. Wall time until all 20 are through,
   etcdfence ``Lock`` vs python3-etcd3 ``Lock`` (``etcd3.client(host, port).lock(name,
   ttl)``), alternating rounds, ratio of medians. Target <= 0.25x. etcdfence's time
   includes each waiter's session (lease grant, keepalive stream, revoke on close);
   etcd3 grants a lease on every attempt and watches the single lock key, so every
   release wakes every waiter (thundering herd). A second row runs the etcdfence
   waiters as asyncio tasks (20 ``AsyncClient`` s, one loop) against the same etcd3
   rounds. Exclusion is checked: at most one holder at any time.
2. **Requests per handoff** with 5/20/50 queued waiters: etcdfence's client-side count
   (``client.on_call``: every request and stream open) during the drain, divided by the
   number of handoffs; the whole life of a waiter (session open .. close) per waiter;
   and, for both libraries, the requests and stream messages etcd itself received
   (``grpc_server_msg_received_total`` from etcd's /metrics) per handoff. Target:
   etcdfence's count does not grow with the queue (O(1) per handoff).
3. **Graceful handoff p50**: the leader is told to step down and the next candidate
   announces leadership. Fair harness for both: two *processes* each — ``etcdctl elect
   NAME v`` vs a 10-line etcdfence script — the bench waits until the candidate is
   queued, starts the clock, sends SIGINT to the leader (both resign on SIGINT) and stops
   the clock when the candidate's first stdout line arrives. Process start-up is
   outside the measurement; the same pipe and signal costs are inside for both.
   (A *killed* leader is not comparable: ``etcdctl elect`` has no --ttl, its session
   lease is 60 s, so the handoff would be the TTL.) Also printed: the in-process p50
   (``resign()`` -> the other thread's ``campaign()`` returns). Target: <= 1.0x etcdctl.
4. **1,000 locks on one session** (async, all in flight) vs 1,000 plain async puts on
   the same client, alternating rounds. Target <= 2x. Confirms one keepalive stream.

Run: ``python bench/bench_locks.py [--rounds 7] [--no-fsync]`` (``BENCH_DEBUG=1`` also
prints the raw drain samples).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import etcd3  # python3-etcd3
import structlog
from _common import machine, table, verdict

import etcdfence as ef
from etcdfence.testing import EtcdServer, find_etcdctl

Row = tuple[str, ...]

#: an etcdfence leader/candidate process for the handoff harness: campaign, print the
#: key once elected, resign on SIGINT
ELECT_PROC = """
import signal, sys, threading
import structlog
import etcdfence as ef
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
with ef.Client(sys.argv[1]) as client, client.session(ttl=10) as session:
    election = session.election(sys.argv[2])
    token = election.campaign(sys.argv[3])
    print(token.key, flush=True)
    stop.wait()
    election.resign()
"""


def quiet() -> None:
    """Keep the output to the table: the library logs through structlog, and
    python3-etcd3 0.13's watcher thread dies with ``NameError: six`` whenever one of its
    clients is closed (harmless here: the client is done)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    default = threading.excepthook

    def hook(args: Any) -> None:
        name = args.thread.name if args.thread is not None else ""
        if not (args.exc_type is NameError and name.startswith("etcd3_watch")):
            default(args)

    threading.excepthook = hook


def server_messages(endpoint: str) -> collections.Counter[str]:
    """Requests and stream messages etcd has received so far, by gRPC method."""
    text = urllib.request.urlopen(endpoint + "/metrics", timeout=5).read().decode()
    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("grpc_server_msg_received_total{"):
            labels, value = line.rsplit(" ", 1)
            method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
            out[method] += int(float(value))
    return out


def delta(after: collections.Counter[str], before: collections.Counter[str]) -> int:
    return sum((after - before).values())


def count_calls(client: Any) -> collections.Counter[str]:
    """Count an etcdfence client's requests (retries included) and stream opens."""
    counter: collections.Counter[str] = collections.Counter()
    client.on_call(lambda record: counter.update([record.method]))
    return counter


# ----------------------------------------------------------------------------- 1. drain


class Exclusive:
    """Checks that the lock really excludes: at most one holder at any time."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self.holders = 0
        self.violations = 0
        self.order: list[int] = []

    def enter(self, who: int) -> None:
        with self._guard:
            self.holders += 1
            self.violations += self.holders > 1
            self.order.append(who)

    def leave(self) -> None:
        with self._guard:
            self.holders -= 1


def drain_once(workers: list[Callable[[Exclusive, int], None]]) -> tuple[float, Exclusive]:
    """Start every worker at once (barrier); seconds until the last is through."""
    check = Exclusive()
    barrier = threading.Barrier(len(workers) + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            workers[i](check, i)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    assert len(check.order) == len(workers)
    return elapsed, check


def bench_drain(server: EtcdServer, rounds: int, n: int = 20) -> list[Row]:
    host, port = server.endpoint.rsplit("//", 1)[-1].split(":")
    ef_clients = [ef.Client(server.endpoint) for _ in range(n)]
    e3_clients = [etcd3.client(host=host, port=int(port)) for _ in range(n)]
    for c in ef_clients:
        c.revision()  # connect now, not inside the timed region (same for etcd3 below)
    for c3 in e3_clients:
        c3.get("warmup")

    def ef_worker(r: int) -> Callable[[Exclusive, int], None]:
        def work(check: Exclusive, i: int) -> None:
            with ef_clients[i].session(ttl=10) as session:
                lock = session.lock(f"bench/drain/{r}")
                lock.acquire()
                check.enter(i)
                check.leave()
                lock.release()

        return work

    def e3_worker(r: int) -> Callable[[Exclusive, int], None]:
        def work(check: Exclusive, i: int) -> None:
            lock = e3_clients[i].lock(f"bench-drain-{r}", ttl=10)
            assert lock.acquire(timeout=None)
            check.enter(i)
            check.leave()
            lock.release()

        return work

    loop = asyncio.new_event_loop()
    async_clients = [ef.AsyncClient(server.endpoint) for _ in range(n)]
    for ac in async_clients:
        loop.run_until_complete(ac.revision())

    def ef_async_drain(r: int) -> tuple[float, Exclusive]:
        check = Exclusive()

        async def work(i: int) -> None:
            async with async_clients[i].session(ttl=10) as session:
                lock = session.lock(f"bench/adrain/{r}")
                await lock.acquire()
                check.enter(i)
                check.leave()
                await lock.release()

        async def drain() -> float:
            started = time.perf_counter()
            await asyncio.gather(*(work(i) for i in range(n)))
            return time.perf_counter() - started

        return loop.run_until_complete(drain()), check

    contenders: dict[str, Callable[[int], tuple[float, Exclusive]]] = {
        "etcdfence": lambda r: drain_once([ef_worker(r)] * n),
        "etcd3": lambda r: drain_once([e3_worker(r)] * n),
        "etcdfence-async": ef_async_drain,
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    violations = 0
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            elapsed, check = contenders[name](r)
            times[name].append(elapsed)
            violations += check.violations
    for c in ef_clients:
        c.close()
    for c3 in e3_clients:
        c3.close()
    for ac in async_clients:
        loop.run_until_complete(ac.aclose())
    loop.close()
    assert violations == 0, f"mutual exclusion violated {violations} times"
    if os.environ.get("BENCH_DEBUG"):
        print({k: [round(x * 1000) for x in v] for k, v in times.items()})
    theirs = statistics.median(times["etcd3"])
    rows: list[Row] = []
    for name, label in (("etcdfence", "threads"), ("etcdfence-async", "asyncio tasks")):
        ours = statistics.median(times[name])
        ratio = ours / theirs
        rows.append(
            (
                f"{n} waiters drain one lock, {label}",
                f"{ours * 1000:.0f} ms",
                f"etcd3 Lock (threads) {theirs * 1000:.0f} ms",
                f"{ratio:.2f}x",
                "<= 0.25x",
                verdict(ratio, 0.25, higher_is_better=False),
            )
        )
    return rows


def e3_handoffs(server: EtcdServer, n: int) -> float:
    """Server-side messages per handoff for python3-etcd3's Lock, n waiters queued."""
    host, port = server.endpoint.rsplit("//", 1)[-1].split(":")
    clients = [etcd3.client(host=host, port=int(port)) for _ in range(n + 1)]
    name = f"bench-e3-queue-{n}"
    holder = clients[0].lock(name, ttl=30)
    assert holder.acquire(timeout=None)
    done = threading.Barrier(n + 1)

    def wait(i: int) -> None:
        lock = clients[i].lock(name, ttl=30)
        assert lock.acquire(timeout=None)
        lock.release()
        done.wait()

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(1, n + 1)]
    for thread in threads:
        thread.start()
    time.sleep(0.5 + n * 0.01)  # every waiter is watching the lock key by now
    before = server_messages(server.endpoint)
    holder.release()
    done.wait()
    after = server_messages(server.endpoint)
    for thread in threads:
        thread.join()
    for c in clients:
        c.close()
    return (delta(after, before) - 1) / n  # less the holder's release, as for etcdfence


# ----------------------------------------------------------------------------- 2. requests


async def ef_handoffs(endpoint: str, n: int) -> tuple[float, float, float]:
    """``n`` waiters queue behind a holder, then drain (each acquires and releases).

    Returns client calls per handoff during the drain (unary calls + stream opens, less
    the holder's release), client calls per waiter over its whole life (session open
    .. close), and what etcd received per handoff during the drain."""
    async with ef.AsyncClient(endpoint) as client:
        calls = count_calls(client)
        name = f"bench/queue/{n}"
        holder = client.session(ttl=30)
        await holder.open()
        await holder.lock(name).acquire()
        baseline = sum(calls.values())
        sessions = [client.session(ttl=30) for _ in range(n)]
        for session in sessions:
            await session.open()

        async def waiter(session: Any) -> None:
            lock = session.lock(name)
            await lock.acquire()
            await lock.release()

        tasks = [asyncio.ensure_future(waiter(s)) for s in sessions]
        while calls["stream:Watch"] < n:  # every waiter parked on its watch
            await asyncio.sleep(0.01)
        queued = sum(calls.values())
        before = server_messages(endpoint)
        await holder.lock(name).release()
        await asyncio.gather(*tasks)
        after = server_messages(endpoint)
        drained = sum(calls.values()) - queued - 1
        for session in sessions:
            await session.aclose()
        whole = sum(calls.values()) - baseline - 1
        await holder.aclose()
        return drained / n, whole / n, (delta(after, before) - 1) / n


def bench_requests(server: EtcdServer) -> list[Row]:
    rows: list[Row] = []
    per: dict[int, float] = {}
    for n in (5, 20, 50):
        drain, whole, server_side = asyncio.run(ef_handoffs(server.endpoint, n))
        theirs = e3_handoffs(server, n)
        per[n] = drain
        rows.append(
            (
                f"requests per handoff, {n} waiters",
                f"{drain:.1f} calls ({whole:.1f}/waiter life); etcd saw {server_side:.1f}",
                f"etcd3 Lock: etcd saw {theirs:.1f}",
                f"{server_side / theirs:.2f}x",
                "O(1) in queue",
                "",
            )
        )
    flat = max(per.values()) - min(per.values()) <= 0.5
    rows[-1] = (*rows[-1][:5], "met" if flat else "NOT met")
    return rows


# ----------------------------------------------------------------------------- 3. handoff


class Proc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def interrupt(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_keys(client: ef.Client, prefix: str, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(client.get_prefix(prefix)) != count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} keys under {prefix} not seen in time")
        time.sleep(0.005)


def handoff_round(client: ef.Client, start: Callable[[str, str], Proc], name: str) -> float:
    leader = start(name, "leader")
    candidate: Proc | None = None
    try:
        assert leader.line()  # elected
        candidate = start(name, "candidate")
        wait_keys(client, name + "/", 2)
        started = time.perf_counter()
        leader.proc.send_signal(signal.SIGINT)
        assert candidate.line()  # the successor announces leadership
        return time.perf_counter() - started
    finally:
        leader.interrupt()
        if candidate is not None:
            candidate.interrupt()


def bench_handoff(server: EtcdServer, rounds: int) -> list[Row]:
    etcdctl = find_etcdctl()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
    env["ETCDCTL_API"] = "3"

    def ctl(name: str, value: str) -> Proc:
        return Proc([etcdctl, f"--endpoints={server.endpoint}", "elect", name, value], env)

    def fence(name: str, value: str) -> Proc:
        return Proc([sys.executable, "-c", ELECT_PROC, server.endpoint, name, value])

    samples: dict[str, list[float]] = {"etcdctl": [], "etcdfence": []}
    with ef.Client(server.endpoint) as client:
        for r in range(rounds * 3):
            samples["etcdctl"].append(handoff_round(client, ctl, f"bench/elect-ctl/{r}"))
            samples["etcdfence"].append(handoff_round(client, fence, f"bench/elect-ef/{r}"))
        in_process = in_process_handoffs(client, rounds * 6)
    ours, theirs = statistics.median(samples["etcdfence"]), statistics.median(samples["etcdctl"])
    ratio = ours / theirs
    return [
        (
            "graceful handoff p50 (2 processes, SIGINT)",
            f"{ours * 1000:.1f} ms",
            f"etcdctl elect {theirs * 1000:.1f} ms",
            f"{ratio:.2f}x",
            "<= 1.0x",
            verdict(ratio, 1.0, higher_is_better=False),
        ),
        (
            "graceful handoff p50 (in-process API)",
            f"{statistics.median(in_process) * 1000:.1f} ms",
            "",
            "",
            "",
            "",
        ),
    ]


def in_process_handoffs(client: ef.Client, rounds: int) -> list[float]:
    """resign() in one thread -> campaign() returns in another, same process."""
    out: list[float] = []
    for r in range(rounds):
        name = f"bench/elect-inproc/{r}"
        with client.session(ttl=10) as a, client.session(ttl=10) as b:
            a.election(name).campaign(b"a")
            stamp: list[float] = []

            def campaign(session: Any = b, name: str = name, stamp: list[float] = stamp) -> None:
                session.election(name).campaign(b"b")
                stamp.append(time.perf_counter())

            thread = threading.Thread(target=campaign)
            thread.start()
            wait_keys(client, name + "/", 2)
            started = time.perf_counter()
            a.election(name).resign()
            thread.join(10)
            out.append(stamp[0] - started)
    return out


# ----------------------------------------------------------------------------- 4. 1,000 locks


async def many_locks(endpoint: str, rounds: int, n: int = 1000) -> list[Row]:
    async with ef.AsyncClient(endpoint) as client:
        calls = count_calls(client)
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
    ours, theirs = statistics.median(lock_times), statistics.median(put_times)
    ratio = ours / theirs
    one_stream = streams == 1 and grants == 1 and alive
    return [
        (
            f"{n:,} locks on one session (async)",
            f"{ours * 1000:.0f} ms",
            f"{n:,} async puts {theirs * 1000:.0f} ms",
            f"{ratio:.2f}x",
            "<= 2x",
            verdict(ratio, 2.0, higher_is_better=False),
        ),
        (
            "  keepalive streams / leases for them",
            f"{streams} / {grants}",
            "",
            "",
            "1 / 1",
            "met" if one_stream else "NOT met",
        ),
    ]


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds per pair")
    parser.add_argument("--no-fsync", action="store_true", help="start etcd with --unsafe-no-fsync")
    args = parser.parse_args()
    quiet()
    extra = ["--unsafe-no-fsync"] if args.no_fsync else []
    rows: list[Row] = []
    started = time.perf_counter()
    with EtcdServer(extra_args=extra) as server:
        print(f"# bench_locks — {machine()}, etcd {'.'.join(map(str, server.version))}"
              f"{' (no fsync)' if args.no_fsync else ''}", flush=True)  # fmt: skip
        rows += bench_drain(server, args.rounds)
        rows += bench_requests(server)
        rows += bench_handoff(server, args.rounds)
        rows += asyncio.run(many_locks(server.endpoint, args.rounds))
    print(
        table(rows, ("measure", "etcdfence", "baseline (same run)", "ratio", "target", "verdict"))
    )
    print(f"# {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

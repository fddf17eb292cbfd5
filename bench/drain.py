"""Lock drain time vs number of waiters, etcdfence vs python3-etcd3's ``Lock``.

N waiters queue on one lock held by a holder; the holder releases; every waiter
acquires, then releases at once. *Drain time* is from the holder's release to the
last waiter's release returning. *Requests per handoff* counts what etcd must serve
in that window (unary RPCs plus watch creations; see ``_common.requests_of``)
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

    python -m bench.drain [--quick] [--rounds 3] [--waiters 5,10,20,50] [--render-only]
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import etcd3

import etcdfence as ef
from bench._common import (
    MODE_TEXT,
    STYLE,
    Counter,
    Json,
    Part,
    Stopwatch,
    count_etcd3,
    count_etcdfence,
    fsync_label,
    host_port,
    md_table,
    median,
    ms,
    plain_axis,
    pyplot,
    quiet,
    ratio,
    requests_of,
    rounds_waiters_main,
    save_data,
    save_plot,
    server_messages,
    start_etcd,
)
from etcdfence.testing.procs import wait_until

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
    queued: Callable[[], bool],
    what: str,
) -> Outcome:
    """Start ``n`` waiter threads (``pass_through(i)``: acquire, then release), wait
    until all are ``queued`` (waiting on a watch), then ``release`` the held lock and
    time the drain. Both threaded contenders go through this one procedure."""
    finished: list[float] = []

    def waiter(i: int) -> None:
        pass_through(i)
        finished.append(time.monotonic())

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(1, n + 1)]
    for thread in threads:
        thread.start()
    wait_until(queued, 30, what)
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
            # each waiter has its own client; a client's stream opens once, so count the
            # waiters' keys (each waits on its watch once its key is queued)
            lambda: len(self.clients[0].get_prefix(name + "/")) >= n + 1,
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

        async def waiter(i: int) -> None:
            lock = self.sessions[i].lock(name)
            await lock.acquire()
            await lock.release()
            finished.append(time.monotonic())

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(1, n + 1)]
        deadline = time.monotonic() + 30
        # one client: its waiters share one watch stream (and, past the first, one view
        # of the queue), so count the queued keys, not stream opens
        while len(await self.client.get_prefix(name + "/")) < n + 1:
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
            self._queued(n),
            "python3-etcd3 waiters to queue",
        )

    def _queued(self, n: int) -> Callable[[], bool]:
        """Whether all ``n`` waiters opened their watch (etcd3 creates one per attempt)."""
        start = self.counter.snapshot()["watch:create"]
        return lambda: self.counter.snapshot()["watch:create"] - start >= n

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


# --------------------------------------------------------------------------- measure


def measure(
    quick: bool,
    *,
    rounds: int | None = None,
    waiters: list[int] | None = None,
    modes: list[str] | None = None,
) -> Json:
    """Drain curves for every contender, per etcd mode; writes ``results/drain.json``."""
    quiet()
    rounds = rounds or (1 if quick else 3)
    modes = modes or (["fsync"] if quick else ["fsync", "no-fsync"])
    waiters = waiters or [5, 10, 20, 50]
    clock = Stopwatch()
    data: Json = {"waiters": waiters, "rounds": rounds, "libs": list(LIBS), "modes": {}}
    for mode in modes:
        print(f"# drain, {mode} etcd", flush=True)
        data["modes"][mode] = run_mode(mode == "fsync", waiters, rounds, LIBS)
    return save_data("drain", data, clock)


# --------------------------------------------------------------------------- render

COLORS = {"etcdfence": "tab:blue", "etcdfence-async": "tab:cyan", "python3-etcd3": "tab:red"}


def _plot(data: Json) -> str:
    waiters, libs = data["waiters"], data["libs"]
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for mode, results in data["modes"].items():
        for lib in libs:
            ys = [results[lib][str(n)]["median_seconds"] * 1000 for n in waiters]
            rq = [results[lib][str(n)]["median_requests_per_handoff"] for n in waiters]
            label = f"{lib} ({mode})"
            kw = {"color": COLORS[lib], "linestyle": STYLE[mode], "marker": "o"}
            left.plot(waiters, ys, label=label, **kw)
            right.plot(waiters, rq, label=label, **kw)
    left.set(xlabel="waiters queued on one lock", ylabel="drain time, ms (median)", yscale="log")
    left.set_title("Drain: release → last waiter through")
    right.set(xlabel="waiters queued on one lock", ylabel="etcd requests per handoff")
    right.set_title("Requests per handoff (unary + watch creates)")
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.set_xticks(waiters)
        ax.grid(alpha=0.3)
    plain_axis(left, "y", minor=True)
    left.legend(fontsize=7)
    return save_plot(fig, "drain.png")


def _mode_table(part: Part, data: Json, mode: str, results: Json) -> list[str]:
    waiters, libs = data["waiters"], data["libs"]
    rows = []
    for n in waiters:
        cell = {lib: results[lib][str(n)] for lib in libs}
        e3 = cell["python3-etcd3"]["median_seconds"]
        rows.append(
            [str(n)]
            + [ms(cell[lib]["median_seconds"] * 1000) for lib in libs]
            + [ratio(cell["etcdfence"]["median_seconds"] / e3)]
            + [f"{cell[lib]['median_requests_per_handoff']:.1f}" for lib in libs]
        )
    n20 = results["etcdfence"].get("20")
    if n20 is not None:
        r = n20["median_seconds"] / results["python3-etcd3"]["20"]["median_seconds"]
        part.add(
            "drain",
            f"drain at 20 waiters, etcdfence / python3-etcd3 ({mode})",
            ratio(r),
            r <= 0.25,
            "≤ 0.25×",
        )
    per = [results["etcdfence"][str(n)]["median_requests_per_handoff"] for n in waiters]
    theirs = " … ".join(
        f"{results['python3-etcd3'][str(n)]['median_requests_per_handoff']:.1f}"
        for n in (waiters[0], waiters[-1])
    )
    part.add(
        "flat",
        f"etcdfence requests per handoff flat in N ({mode})",
        f"{min(per):.1f} … {max(per):.1f} for N = {waiters[0]} … {waiters[-1]} "
        f"(python3-etcd3: {theirs})",
        max(per) / min(per) <= 1.25,
        "max/min ≤ 1.25",
    )
    headers = ["waiters", *[f"{lib} drain" for lib in libs], "etcdfence / etcd3"]
    headers += [f"{lib} req/handoff" for lib in libs]
    return [f"**{MODE_TEXT[mode]}**", "", md_table(headers, rows), ""]


def render(data: Json) -> Part:
    """The drain section: curves, one table per etcd mode, targets, the herd finding."""
    part = Part("drain", "Lock drain vs number of waiters", "", machine=data.get("machine"))
    waiters, libs = data["waiters"], data["libs"]
    parts = [
        f"![drain]({_plot(data)})",
        "",
        "N waiters (each its own client and lease; threads for the sync APIs) queue on one "
        "lock; the holder releases; each waiter acquires and releases at once. Drain time "
        "= holder's release → last waiter's release returned. Requests per handoff = what "
        "etcd had to serve in that window ÷ N: etcdfence's unary RPCs (counted with "
        "`client.on_call`) plus its watch streams (each stream open is reported; each "
        "carries one watch create); python3-etcd3's unary RPCs plus the `create`/`cancel` "
        "messages on its watch stream (a gRPC client interceptor installed on its channel, "
        "`grpc.intercept_channel`). Keepalive pings are excluded on both sides. "
        f"Contenders alternate in every round (order flipped each round), "
        f"{data['rounds']} round(s); medians shown.",
        "",
    ]
    for mode, results in data["modes"].items():
        parts += _mode_table(part, data, mode, results)
    first = next(iter(data["modes"]))
    example = data["modes"][first]
    big = str(waiters[-1])
    if "median_server_requests_per_waiter" in example["etcdfence"][big]:
        served = ", ".join(
            f"{lib} "
            + " / ".join(
                f"{example[lib][str(n)]['median_server_requests_per_waiter']:.1f}" for n in waiters
            )
            for lib in libs
        )
        parts += [
            "Cross-check from etcd's side (its `grpc_server_msg_received_total` on "
            "`/metrics`, keepalives excluded), requests per waiter over the whole drain — "
            "enqueueing included, so not per handoff — for N = "
            + " / ".join(map(str, waiters))
            + f": {served}.",
            "",
        ]
    parts += [
        f"Per-handoff breakdown at {big} waiters ({first}, last round): "
        f"etcdfence `{example['etcdfence'][big]['by_method']}`; "
        f"python3-etcd3 `{example['python3-etcd3'][big]['by_method']}`.",
        "",
    ]
    part.section = "\n".join(parts)
    part.findings = FINDINGS
    return part


FINDINGS = """### Drain: why python3-etcd3 is slower and grows

python3-etcd3's `Lock.acquire` is put-if-absent on one key: every waiter watches that key, \
every release wakes all of them, and each retries with a *new lease* (`LeaseGrant`, never \
revoked) plus a txn, then a new watch that starts in the past — an unsynced watch, which etcd \
catches up only every 100 ms. Its requests per handoff grow with the queue. etcdfence's waiter \
watches only the key ahead: a handoff costs the next waiter's re-read txn, its release txn and \
the watch it had opened (the `by_method` breakdown above), whatever the queue length.
"""


def main(argv: list[str] | None = None) -> int:
    return rounds_waiters_main("drain", __doc__, measure, render, argv, "5,10,20,50")


if __name__ == "__main__":
    sys.exit(main())

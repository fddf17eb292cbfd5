"""The recipes' handoffs vs the mutex's: read-write lock and semaphore (issue #25).

Everything runs in one process on one event loop, each contender with its own
``ef.AsyncClient`` and session (as separate processes would have: a lone waiter per
client, watching the key ahead, not a crowd sharing one client's view of the prefix).

*Handoff latency*: a fresh name per sample; the holders acquire, the waiters queue one
after another (each once the previous one's key exists, so the order is known), then
after ``SETTLE_HANDOFF`` one holder calls ``release()``; the sample is the time from
that call to the (last) waiter's ``acquire()`` returning. The cases, alternating in
every round (order flipped each round):

* ``mutex``: holder → the next waiter (the baseline, as ``handoff``'s in-process side);
* ``rwlock W→W``: a writer releases → the queued writer;
* ``rwlock W→3R``: a writer releases → three queued readers (the last one admitted);
* ``rwlock 3R→W``: three readers hold, a writer queued; two release untimed, the
  timed release is the last reader's → the writer (the reader-to-writer handoff);
* ``semaphore(2)``/``semaphore(3)``: all permits held, a waiter queued; the oldest
  holder releases → the waiter.

*Requests per handoff vs N*: the holders (one, or all permits of a ``semaphore(2)``)
hold; N waiters queue; after ``SETTLE_DRAIN`` the holders release and every waiter
acquires, then releases at once. What the *waiters'* clients send from the release
on (unary requests plus watch creations, ``_common.requests_of``, counted with
``client.on_call``) ÷ N; the holders' own releases are not counted (a semaphore has
two of them). Flat in N means a release wakes only the waiters it admits.

    python -m bench.recipes [--quick] [--rounds 40] [--waiters 5,20,50] [--render-only]
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from dataclasses import dataclass
from typing import Any

import etcdfence as ef
from bench._common import (
    MODE_TEXT,
    Counter,
    Json,
    Part,
    Stopwatch,
    count_etcdfence,
    fsync_label,
    md_table,
    median,
    ms,
    pct,
    quiet,
    ratio,
    requests_of,
    rounds_waiters_main,
    save_data,
    start_etcd,
)

SETTLE_HANDOFF = 0.05  # every waiter queued → the timed release (as handoff's in-process)
SETTLE_DRAIN = 0.2  # every waiter queued → the holders release (as drain)
#: The largest flat ratio (max/min of requests per handoff over N) called flat.
FLAT = 1.25


@dataclass(frozen=True)
class Case:
    """One handoff: who holds, who waits, how many holders release before the timed one
    (untimed), whose release is timed (``holders[early]``); later holders keep holding."""

    label: str
    holders: tuple[str, ...]
    waiters: tuple[str, ...]
    early: int = 0


CASES = (
    Case("mutex", ("mutex",), ("mutex",)),
    Case("rwlock W→W", ("write",), ("write",)),
    Case("rwlock W→3R", ("write",), ("read",) * 3),
    Case("rwlock 3R→W", ("read",) * 3, ("write",), early=2),
    Case("semaphore(2)", ("sem2",) * 2, ("sem2",)),
    Case("semaphore(3)", ("sem3",) * 3, ("sem3",)),
)
#: Recipe → holders that make every waiter wait, for the requests-per-handoff runs.
DRAINS = {"mutex": ("mutex",), "rwlock writers": ("write",), "semaphore(2)": ("sem2",) * 2}
DRAIN_WAITER = {"mutex": "mutex", "rwlock writers": "write", "semaphore(2)": "sem2"}


def contender(session: ef.AsyncSession, kind: str, name: str) -> Any:
    """The lock-like object of ``kind`` on ``name``: acquire() / release()."""
    if kind == "mutex":
        return session.lock(name)
    if kind == "write":
        return session.rwlock(name).write()
    if kind == "read":
        return session.rwlock(name).read()
    return session.semaphore(name, permits=int(kind.removeprefix("sem")))


class Pool:
    """Clients with one session each (each client with its own request counter), and an
    uncounted observer client that watches the queue form."""

    def __init__(self) -> None:
        self.clients: list[ef.AsyncClient] = []
        self.sessions: list[ef.AsyncSession] = []
        self.counters: list[Counter] = []
        self.observer: ef.AsyncClient | None = None

    async def open(self, endpoint: str, k: int) -> None:
        self.observer = ef.AsyncClient(endpoint)
        for _ in range(k):
            client = ef.AsyncClient(endpoint)
            counter = Counter()
            count_etcdfence(client, counter)
            session = client.session(ttl=30)
            await session.open()
            self.clients.append(client)
            self.counters.append(counter)
            self.sessions.append(session)

    async def queued(self, name: str, keys: int) -> None:
        """Wait until ``keys`` keys exist under ``name/`` (holders plus queued waiters)."""
        assert self.observer is not None
        deadline = time.monotonic() + 30
        while len(await self.observer.get_prefix(name + "/")) < keys:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{keys} contenders of {name} did not queue")
            await asyncio.sleep(0.005)

    def counts(self, first: int, last: int) -> collections.Counter[str]:
        total: collections.Counter[str] = collections.Counter()
        for counter in self.counters[first:last]:
            total.update(counter.snapshot())
        return total

    async def close(self) -> None:
        for session in self.sessions:
            await session.aclose()
        for client in [*self.clients, *([self.observer] if self.observer else [])]:
            await client.aclose()


# --------------------------------------------------------------------------- handoff latency


async def handoff(pool: Pool, case: Case, name: str) -> float:
    """One sample of ``case`` on a fresh ``name``: seconds from the timed release to the
    last waiter's acquire returning."""
    holders = [contender(pool.sessions[i], k, name) for i, k in enumerate(case.holders)]
    base = len(holders)
    waiters = [contender(pool.sessions[base + i], k, name) for i, k in enumerate(case.waiters)]
    for lock in holders:
        await lock.acquire()
    won: list[float] = []

    async def wait(lock: Any) -> None:
        await lock.acquire()
        won.append(time.monotonic())

    tasks = []
    for i, lock in enumerate(waiters):
        tasks.append(asyncio.ensure_future(wait(lock)))
        await pool.queued(name, base + i + 1)
    for lock in holders[: case.early]:
        await lock.release()
    await asyncio.sleep(SETTLE_HANDOFF)
    assert not won, f"{case.label}: a waiter got through before the timed release"
    sent = time.monotonic()
    await holders[case.early].release()
    await asyncio.gather(*tasks)
    took = max(won) - sent
    for lock in [*holders[case.early + 1 :], *waiters]:
        await lock.release()
    return took


def summary(values: list[float]) -> Json:
    return {
        "samples_ms": [round(x * 1000, 3) for x in values],
        "p50_ms": round(pct(values, 0.5) * 1000, 3),
        "p90_ms": round(pct(values, 0.9) * 1000, 3),
        "max_ms": round(max(values) * 1000, 3),
    }


async def handoffs(pool: Pool, rounds: int, label: str) -> Json:
    """``rounds`` samples of every case, the cases alternating (order flipped each round);
    round -1 warms up."""
    samples: dict[str, list[float]] = {case.label: [] for case in CASES}
    for rnd in range(-1, rounds):
        order = CASES if rnd % 2 == 0 else tuple(reversed(CASES))
        for case in order:
            took = await handoff(pool, case, f"recipes/h/{case.label}/{rnd + 1}")
            if rnd >= 0:
                samples[case.label].append(took)
    for case_label, values in samples.items():
        print(
            f"  {label:8} handoff {case_label:14} p50 {pct(values, 0.5) * 1000:6.2f} ms  "
            f"p90 {pct(values, 0.9) * 1000:6.2f} ms  ({len(values)})",
            flush=True,
        )
    return {case_label: summary(values) for case_label, values in samples.items()}


# --------------------------------------------------------------------------- requests vs N


async def drain(pool: Pool, recipe: str, n: int, name: str) -> tuple[float, Any]:
    """Holders hold, ``n`` waiters queue, the holders release; every waiter acquires and
    releases. Returns (seconds to drain, the waiters' requests by method)."""
    holders = [contender(pool.sessions[i], k, name) for i, k in enumerate(DRAINS[recipe])]
    base = len(holders)
    for lock in holders:
        await lock.acquire()
    finished: list[float] = []

    async def waiter(i: int) -> None:
        lock = contender(pool.sessions[base + i], DRAIN_WAITER[recipe], name)
        await lock.acquire()
        await lock.release()
        finished.append(time.monotonic())

    tasks = [asyncio.ensure_future(waiter(i)) for i in range(n)]
    await pool.queued(name, base + n)
    await asyncio.sleep(SETTLE_DRAIN)
    before = pool.counts(base, base + n)
    t0 = time.monotonic()
    await asyncio.gather(*(lock.release() for lock in holders))
    await asyncio.gather(*tasks)
    after = pool.counts(base, base + n)
    after.subtract(before)
    return max(finished) - t0, collections.Counter({k: v for k, v in after.items() if v})


async def drains(pool: Pool, waiters: list[int], rounds: int, label: str) -> Json:
    """Requests per handoff and drain time per recipe and N (medians over rounds)."""
    out: Json = {r: {str(n): {"per_handoff": [], "seconds": []} for n in waiters} for r in DRAINS}
    for recipe in DRAINS:  # warm-up
        await drain(pool, recipe, 2, f"recipes/d/warm/{recipe}")
    for rnd in range(rounds):
        order = list(DRAINS) if rnd % 2 == 0 else list(reversed(DRAINS))
        for n in waiters:
            for recipe in order:
                seconds, counts = await drain(pool, recipe, n, f"recipes/d/{recipe}/{n}/{rnd}")
                cell = out[recipe][str(n)]
                cell["per_handoff"].append(round(requests_of(counts) / n, 2))
                cell["seconds"].append(round(seconds, 5))
                cell["by_method"] = {k: round(v / n, 2) for k, v in counts.items()}
                print(
                    f"  {label:8} round {rnd} n={n:3} {recipe:15} {seconds * 1000:8.1f} ms  "
                    f"{requests_of(counts) / n:5.2f} req/handoff",
                    flush=True,
                )
    for recipe in DRAINS:
        for n in waiters:
            cell = out[recipe][str(n)]
            cell["median_per_handoff"] = median(cell["per_handoff"])
            cell["median_seconds"] = median(cell["seconds"])
    return out


# --------------------------------------------------------------------------- measure


async def run_mode(
    endpoint: str, label: str, rounds: int, drain_rounds: int, waiters: list[int]
) -> Json:
    pool = Pool()
    try:
        await pool.open(endpoint, max(waiters) + 2)
        return {
            "handoff": await handoffs(pool, rounds, label),
            "drain": await drains(pool, waiters, drain_rounds, label),
        }
    finally:
        await pool.close()


def measure(
    quick: bool,
    *,
    rounds: int | None = None,
    waiters: list[int] | None = None,
    modes: list[str] | None = None,
) -> Json:
    """Handoff latencies and requests per handoff per etcd mode; writes
    ``results/recipes.json``."""
    quiet()
    rounds = rounds or (20 if quick else 40)
    drain_rounds = 1 if quick else 3
    waiters = waiters or [5, 20, 50]
    modes = modes or (["fsync"] if quick else ["fsync", "no-fsync"])
    clock = Stopwatch()
    data: Json = {
        "rounds": rounds,
        "drain_rounds": drain_rounds,
        "waiters": waiters,
        "cases": [case.label for case in CASES],
        "recipes": list(DRAINS),
        "modes": {},
    }
    for mode in modes:
        print(f"# recipes, {mode} etcd", flush=True)
        with start_etcd(fsync=mode == "fsync") as server:
            data["modes"][mode] = asyncio.run(
                run_mode(
                    server.endpoint, fsync_label(mode == "fsync"), rounds, drain_rounds, waiters
                )
            )
    return save_data("recipes", data, clock)


# --------------------------------------------------------------------------- render


def _handoff_table(part: Part, mode: str, cells: Json) -> list[str]:
    base = cells["mutex"]
    rows = [
        [
            label,
            ms(c["p50_ms"]),
            ms(c["p90_ms"]),
            ratio(c["p50_ms"] / base["p50_ms"]),
            ratio(c["p90_ms"] / base["p90_ms"]),
            str(len(c["samples_ms"])),
        ]
        for label, c in cells.items()
    ]
    r2w = cells["rwlock 3R→W"]["p50_ms"] / base["p50_ms"]
    sem = max(cells[k]["p50_ms"] for k in ("semaphore(2)", "semaphore(3)")) / base["p50_ms"]
    part.add(
        "recipe-handoff",
        f"rwlock reader→writer and semaphore handoff p50 vs the mutex's ({mode})",
        f"reader→writer {ratio(r2w)}, semaphore ≤ {ratio(sem)} (mutex {ms(base['p50_ms'])})",
        None,
        "measured (#25)",
    )
    headers = ["handoff", "p50", "p90", "p50 / mutex", "p90 / mutex", "samples"]
    return [f"**Handoff latency, {MODE_TEXT[mode]}**", "", md_table(headers, rows), ""]


def flat_verdicts(data: Json, results: Json) -> dict[str, tuple[float, float, bool]]:
    """Per recipe: (min, max) requests per handoff over N and whether max/min ≤ FLAT."""
    out = {}
    for recipe in data["recipes"]:
        per = [results[recipe][str(n)]["median_per_handoff"] for n in data["waiters"]]
        out[recipe] = (min(per), max(per), max(per) / min(per) <= FLAT)
    return out


def _drain_table(part: Part, data: Json, mode: str, results: Json) -> list[str]:
    recipes, waiters = data["recipes"], data["waiters"]
    rows = [
        [str(n)]
        + [f"{results[r][str(n)]['median_per_handoff']:.2f}" for r in recipes]
        + [ms(results[r][str(n)]["median_seconds"] * 1000) for r in recipes]
        for n in waiters
    ]
    verdicts = flat_verdicts(data, results)
    for recipe, (lo, hi, ok) in verdicts.items():
        part.add(
            "recipe-flat",
            f"{recipe} requests per handoff flat in N ({mode})",
            f"{lo:.2f} … {hi:.2f} for N = {waiters[0]} … {waiters[-1]}",
            ok,
            f"max/min ≤ {FLAT}",
        )
    flat = all(ok for _, _, ok in verdicts.values())
    headers = ["waiters", *[f"{r} req/handoff" for r in recipes], *[f"{r} drain" for r in recipes]]
    big = str(waiters[-1])
    return [
        f"**Requests per handoff vs N, {MODE_TEXT[mode]}**",
        "",
        md_table(headers, rows),
        "",
        f"flat: {'yes' if flat else 'no'} ("
        + "; ".join(f"{r} max/min {hi / lo:.2f}" for r, (lo, hi, _) in verdicts.items())
        + f"; flat = max/min ≤ {FLAT}).",
        "",
        f"Per handoff at N = {big}, by method: "
        + "; ".join(f"{r} `{results[r][big].get('by_method', {})}`" for r in recipes)
        + ".",
        "",
    ]


def render(data: Json) -> Part:
    """The recipes section: handoff latencies vs the mutex, requests per handoff vs N."""
    part = Part(
        "recipes", "Recipes: RW lock and semaphore vs the mutex", "", machine=data.get("machine")
    )
    parts = [
        "One process, one event loop, every contender with its own `AsyncClient` and "
        "session (a lone waiter per client, as separate processes). Handoff latency: "
        "the holders hold, the waiters queue one by one, "
        f"{SETTLE_HANDOFF * 1000:.0f} ms later one holder's `release()` is timed to the "
        "(last) waiter's `acquire()` returning; a fresh name per sample, "
        f"{data['rounds']} samples per case, the cases alternating. `W→3R`: a writer's "
        "release admits three queued readers (time to the last); `3R→W`: three readers "
        "hold, a writer waits, two readers release untimed, the last reader's release is "
        "timed (the reader-to-writer handoff); `semaphore(P)`: all P permits held, the "
        "oldest holder releases to the one waiter.",
        "",
    ]
    for mode, results in data["modes"].items():
        parts += _handoff_table(part, mode, results["handoff"])
    parts += [
        "Requests per handoff: N waiters queue behind the holders (one for the mutex and "
        "the writers, two for `semaphore(2)`); the holders release; each waiter acquires "
        "and releases at once. The *waiters'* requests from the release on (unary + "
        "watch creations, `client.on_call`) ÷ N; the holders' releases are not counted. "
        f"{data['drain_rounds']} round(s), medians.",
        "",
    ]
    for mode, results in data["modes"].items():
        parts += _drain_table(part, data, mode, results["drain"])
    part.section = "\n".join(parts)
    return part


def main(argv: list[str] | None = None) -> int:
    return rounds_waiters_main("recipes", __doc__, measure, render, argv, "5,20,50")


if __name__ == "__main__":
    sys.exit(main())

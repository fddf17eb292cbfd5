"""etcdfence.apscheduler: leader-only APScheduler 3.x against a real etcd (and Redis).

The fault tests run two real replicas (tests/_aps_proc.py), each a LeaderScheduler with
an interval job that writes through a fence and records a history; the leader is
SIGSTOPped past its TTL and resumed, or SIGKILLed. The history checker
(:mod:`etcdfence.history`) judges the runs; the control runs the same pause with
fencing off and must see the stale write land.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_SUBMITTED
from apscheduler.executors.pool import ProcessPoolExecutor, ThreadPoolExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler, BlockingScheduler
from apscheduler.schedulers.base import STATE_PAUSED
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from conftest import clean_env

import etcdfence as ef
from etcdfence.apscheduler import (
    SLOTS_PREFIX,
    AsyncLeaderScheduler,
    LeaderScheduler,
    SchedulerStateError,
    current_stop,
    current_token,
)
from etcdfence.history import Event, History, Layout, Observer, check, parse_events
from etcdfence.testing.procs import LineReader, stop

HELPER = Path(__file__).resolve().parent / "_aps_proc.py"
TTL = 2
#: How soon after the leader's loss (its SIGSTOP/SIGKILL) the standby must run jobs.
TAKEOVER = TTL + 2.0

# ----------------------------------------------------------------------------- bad input


def test_importing_etcdfence_does_not_import_apscheduler() -> None:
    code = "import sys, etcdfence; assert 'apscheduler' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_env(), timeout=60)


def test_refuses_what_is_not_an_apscheduler_3_scheduler() -> None:
    client = ef.Client("http://127.0.0.1:2379")
    try:
        with pytest.raises(ef.InvalidTypeError, match=r"APScheduler 3\.x BackgroundScheduler"):
            LeaderScheduler(client, "jobs", scheduler=object())  # type: ignore[arg-type]
        with pytest.raises(ef.InvalidTypeError, match="use AsyncLeaderScheduler"):
            LeaderScheduler(client, "jobs", scheduler=AsyncIOScheduler())  # type: ignore[arg-type]
        with pytest.raises(ef.InvalidTypeError, match="takes a BackgroundScheduler"):
            LeaderScheduler(client, "jobs", scheduler=BlockingScheduler())
        with pytest.raises(ef.InvalidArgumentError, match=r"(?i)ttl"):
            LeaderScheduler(client, "jobs", ttl=0)
        with pytest.raises(ef.InvalidTypeError, match="advance"):
            LeaderScheduler(client, "jobs", fence="reports")
        with pytest.raises(ef.InvalidTypeError, match="AsyncClient"):
            AsyncLeaderScheduler(client, "jobs")  # type: ignore[arg-type]
        running = BackgroundScheduler()
        running.start(paused=True)
        try:
            with pytest.raises(SchedulerStateError, match="unstarted"):
                LeaderScheduler(client, "jobs", scheduler=running)
        finally:
            running.shutdown(wait=False)
    finally:
        client.close()


def test_refuses_bad_jobs() -> None:
    client = ef.Client("http://127.0.0.1:2379")
    leader = LeaderScheduler(client, "jobs")
    try:

        async def coroutine(token: ef.FencingToken) -> None: ...

        def needs(x: int, token: ef.FencingToken) -> None: ...

        with pytest.raises(ef.InvalidTypeError, match="AsyncLeaderScheduler"):
            leader.add_job(coroutine, "interval", seconds=1)
        with pytest.raises(ef.InvalidArgumentError, match="token is passed in"):
            leader.add_job(needs, "interval", args=[1], kwargs={"token": 5}, seconds=1)
        with pytest.raises(ef.InvalidArgumentError, match="x"):
            leader.add_job(needs, "interval", seconds=1)  # x missing; token is not
        job = leader.add_job(needs, "interval", args=[1], seconds=1, id="ok")
        assert job.name.endswith("needs")
        with pytest.raises(SchedulerStateError, match="not started"):
            leader.shutdown()
        with pytest.raises(ef.NotLeaderError):
            current_token()
    finally:
        client.close()


def test_unreachable_etcd_is_a_clear_error_at_start() -> None:
    client = ef.Client("http://127.0.0.1:1", timeout=0.5)
    scheduler = BackgroundScheduler()
    leader = LeaderScheduler(client, "jobs", scheduler=scheduler)
    try:
        with pytest.raises(ef.UnavailableError):
            leader.start()
        assert not scheduler.running
    finally:
        client.close()


def test_refuses_async_hooks_and_fences_in_the_sync_flavour(etcd_endpoints: list[str]) -> None:
    client = ef.Client("http://127.0.0.1:2379")
    async_client = ef.AsyncClient(etcd_endpoints, timeout=5.0)

    async def hook(*_: object) -> None: ...

    try:
        with pytest.raises(ef.InvalidTypeError, match=r"async.*AsyncLeaderScheduler"):
            LeaderScheduler(client, "jobs", fence=async_client.fence("res"))
        with pytest.raises(ef.InvalidTypeError, match=r"on_elected.*AsyncLeaderScheduler"):
            LeaderScheduler(client, "jobs", on_elected=hook)
        with pytest.raises(ef.InvalidTypeError, match=r"on_lost.*AsyncLeaderScheduler"):
            LeaderScheduler(client, "jobs", on_lost=hook)
        with pytest.raises(ef.InvalidTypeError, match="on_lost"):
            LeaderScheduler(client, "jobs", on_lost="page the on-call")  # type: ignore[arg-type]
        with pytest.raises(ef.InvalidArgumentError, match="identity"):
            LeaderScheduler(client, "jobs", identity="")
    finally:
        client.close()
        asyncio.run(async_client.aclose())


def test_refuses_a_deprecated_unbound_sql_fence() -> None:
    import sqlite3

    from etcdfence.sql import SQLFence

    client, connection = ef.Client("http://127.0.0.1:2379"), sqlite3.connect(":memory:")
    try:
        with pytest.warns(DeprecationWarning):
            unbound = SQLFence(connection)
        with pytest.raises(ef.InvalidTypeError, match=r"SQLFence\(connection, resource\)"):
            LeaderScheduler(client, "jobs", fence=unbound)
    finally:
        connection.close()
        client.close()


class AsyncCallable:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    async def __call__(self, token: ef.FencingToken) -> None:
        self.tokens.append(int(token))


def test_refuses_bad_references_async_callables_and_foreign_jobs() -> None:
    client = ef.Client("http://127.0.0.1:2379")
    try:
        leader = LeaderScheduler(client, "jobs")
        for ref in ("no_such_module_xyz:job", "not a reference", "os:no_such_name"):
            with pytest.raises(ef.InvalidArgumentError, match=ref):
                leader.add_job(ref, "interval", seconds=1)
        with pytest.raises(ef.InvalidTypeError, match="async __call__"):
            leader.add_job(AsyncCallable(), "interval", seconds=1)
        # jobs put on the scheduler itself would run with no term: refused
        scheduler = BackgroundScheduler()
        scheduler.add_job(print, "interval", seconds=1)
        with pytest.raises(ef.InvalidArgumentError, match="add_job"):
            LeaderScheduler(client, "jobs", scheduler=scheduler)
        leader.scheduler.add_job(print, "interval", seconds=1, id="foreign")
        with pytest.raises(ef.InvalidArgumentError, match="foreign"):
            leader.start()
        assert not leader.scheduler.running
    finally:
        client.close()


def test_refuses_a_persistent_job_store() -> None:
    """A persistent store keeps the bare function's reference (APScheduler's obj_to_ref
    names the wrapped function) and would run it with no term: refused, also when the
    store is added after the job."""
    pytest.importorskip("redis")
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.jobstores.redis import RedisJobStore

    client = ef.Client("http://127.0.0.1:2379")
    suffix = uuid.uuid4().hex[:8]
    store = RedisJobStore(jobs_key=f"aps-jobs-{suffix}", run_times_key=f"aps-times-{suffix}")
    try:
        leader = LeaderScheduler(client, "jobs", scheduler=BackgroundScheduler())
        leader.scheduler.add_jobstore(store, "redis")
        with pytest.raises(ef.InvalidArgumentError, match="'redis' is a RedisJobStore"):
            leader.add_job(persisted, "interval", seconds=1, jobstore="redis")
        later = LeaderScheduler(client, "jobs", scheduler=BackgroundScheduler())
        later.scheduler.add_jobstore(MemoryJobStore(), "late")
        later.add_job(persisted, "interval", seconds=1, jobstore="late")
        later.scheduler.remove_jobstore("late")  # swapped for a persistent one
        later.scheduler.add_jobstore(store, "late")
        with pytest.raises(ef.InvalidArgumentError, match="'late' is a RedisJobStore"):
            later.start()
    finally:
        client.close()


def persisted() -> None:
    """A module-level job: what a persistent job store could store a reference to."""


# ------------------------------------------------------------------------ in-process


@pytest.mark.integration
def test_jobs_get_the_token_after_the_fence_was_advanced(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    guard = etcd_client.fence(f"{etcd_namespace}/res")
    seen: list[tuple[int, int, int, bool]] = []

    def job(token: ef.FencingToken, stop: Any) -> None:
        seen.append((int(token), int(current_token()), guard.current(), stop is current_stop()))

    leader = LeaderScheduler(etcd_client, f"{etcd_namespace}/sched", ttl=TTL, fence=guard)
    leader.add_job(job, "interval", seconds=0.2, id="job")
    with pytest.raises(SchedulerStateError, match="already started"), leader:
        wait(lambda: len(seen) >= 2, 10, "two runs")
        leader.start()
    token = seen[0][0]
    assert all(s == (token, token, token, True) for s in seen), seen
    assert not leader.scheduler.running and etcd_client.leader(f"{etcd_namespace}/sched") is None
    leader.shutdown()  # a second shutdown is a no-op


@pytest.mark.integration
def test_a_run_due_while_standing_by_runs_once_within_misfire_grace_time(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    """Misfires across a failover follow APScheduler's rule: the standby's paused scheduler
    keeps the due times; once elected, a run within misfire_grace_time runs once (missed
    interval runs coalesced), one past it is skipped."""
    name, ran = f"{etcd_namespace}/sched", list[str]()
    standby = LeaderScheduler(etcd_client, name, identity="standby", ttl=TTL)
    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=0.3)
    for label, grace in (("graced", 30), ("strict", 1)):
        standby.add_job(
            ran.append, "date", args=[label], run_date=soon, id=label, misfire_grace_time=grace
        )
    standby.add_job(
        ran.append, "interval", args=["every"], seconds=0.2, misfire_grace_time=30, id="every"
    )
    with etcd_client.session(ttl=TTL) as session:
        election = session.election(name)
        election.campaign(b"the other leader")  # leads through the due times and more
        standby.start()
        time.sleep(1.8)  # "graced" and "strict" fall due; "every" misses ~8 runs
        assert ran == [] and not standby.is_leader()
        election.resign()
    try:
        wait(lambda: "graced" in ran and "every" in ran, TAKEOVER, "the new leader's runs")
        time.sleep(0.1)  # less than the interval: coalesced runs would all be in by now
        assert sorted(ran) == ["every", "graced"], ran
    finally:
        standby.shutdown()


@pytest.mark.integration
async def test_asyncio_flavour_leads_one_at_a_time_and_hands_over(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    name, guard = f"{etcd_namespace}/sched", async_etcd_client.fence(f"{etcd_namespace}/res")
    runs: dict[str, list[int]] = {"a": [], "b": []}
    cancelled: list[str] = []

    def replica(me: str, hold: float) -> AsyncLeaderScheduler:
        async def job(token: ef.FencingToken) -> None:
            await guard.put(token, f"{etcd_namespace}/data", me)
            runs[me].append(int(current_token()))
            holding.add(me)
            try:
                await asyncio.sleep(hold)
            except asyncio.CancelledError:
                cancelled.append(me)
                raise
            finally:
                holding.discard(me)

        leader = AsyncLeaderScheduler(
            async_etcd_client, name, identity=me, ttl=TTL, fence=guard, scheduler=AsyncIOScheduler()
        )
        leader.add_job(job, "interval", seconds=0.2, id="job")
        return leader

    holding: set[str] = set()
    a, b = replica("a", 5.0), replica("b", 0.05)  # a's runs last long: the loss cancels one
    await a.start()
    await await_(lambda: "a" in holding, 10, "a running a job")
    await b.start()
    await asyncio.sleep(0.6)
    assert not runs["b"], "the standby ran a job while the other led"
    # a's lease is revoked behind its back: a stops at once, its running job is cancelled
    revoked = time.monotonic()
    await async_etcd_client.lease_revoke(await a.elector.session.lease())
    await await_(lambda: cancelled == ["a"], 2, "a's running job cancelled")
    await await_(lambda: len(runs["b"]) >= 2, TAKEOVER, "b takes over")
    assert time.monotonic() - revoked < TAKEOVER
    assert not a.is_leader() and b.is_leader() and a.scheduler.state == STATE_PAUSED
    assert min(runs["b"]) > max(runs["a"]) and await guard.current() == runs["b"][0]
    count_a = len(runs["a"])
    await b.shutdown()  # resigns: a (campaigning again) takes over within a second
    await await_(lambda: len(runs["a"]) > count_a, 3, "a back after b resigned")
    await a.shutdown(wait=False)
    assert cancelled == ["a", "a"]  # shutdown(wait=False) cancels the running job too
    assert not a.scheduler.running and not b.scheduler.running


class LateAsyncFence:
    """A fence whose sync-looking advance() hands back a coroutine (a wrapper of an
    async fence): the sync flavour must not drop it and run jobs unfenced."""

    def __init__(self) -> None:
        self.advanced: list[int] = []

    def advance(self, token: ef.FencingToken) -> Any:
        async def advance() -> None:
            self.advanced.append(int(token))

        return advance()


@pytest.mark.integration
def test_an_awaitable_from_a_fence_gives_up_the_term_and_no_job_runs(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name, ran, fence = f"{etcd_namespace}/sched", list[int](), LateAsyncFence()
    leader = LeaderScheduler(etcd_client, name, ttl=TTL, fence=fence, retry_interval=0.2)
    leader.add_job(lambda: ran.append(1), "interval", seconds=0.1, id="append")
    with leader:
        wait(lambda: leader.error is not None, 10, "the campaign's end")
        time.sleep(0.3)  # three intervals: a resumed scheduler would have run the job
        assert isinstance(leader.error, ef.InvalidTypeError), leader.error
        assert "AsyncLeaderScheduler" in str(leader.error)
        assert ran == [] and fence.advanced == [] and not leader.is_leader()
        assert etcd_client.leader(name) is None  # the term was given up (resigned)


@pytest.mark.integration
def test_a_sync_job_returning_a_coroutine_is_a_job_error_not_dropped(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    job, errors = AsyncCallable(), list[BaseException]()
    leader = LeaderScheduler(etcd_client, f"{etcd_namespace}/sched", ttl=TTL)
    leader.scheduler.add_listener(lambda e: errors.append(e.exception), EVENT_JOB_ERROR)
    leader.add_job(lambda: job(ef.FencingToken(1)), "interval", seconds=0.1, id="coroutine")
    with leader:
        wait(lambda: errors, 10, "a job error")
    assert isinstance(errors[0], ef.InvalidTypeError) and "awaitable" in str(errors[0])
    assert job.tokens == []


@pytest.mark.integration
async def test_async_flavour_awaits_a_callable_with_an_async_call(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    job = AsyncCallable()
    leader = AsyncLeaderScheduler(async_etcd_client, f"{etcd_namespace}/sched", ttl=TTL)
    leader.add_job(job, "interval", seconds=0.1, id="job")
    async with leader:
        await await_(lambda: job.tokens, 10, "a run")
        assert job.tokens[0] == int(leader.token or 0)


@pytest.mark.integration
def test_a_failing_on_lost_does_not_stop_the_replica_from_leading_again(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    runs, calls = list[float](), list[float]()

    def on_lost() -> None:
        calls.append(time.monotonic())
        raise RuntimeError("the alerting webhook is down")

    leader = LeaderScheduler(
        etcd_client, f"{etcd_namespace}/sched", ttl=TTL, on_lost=on_lost, retry_interval=0.2
    )
    leader.add_job(lambda: runs.append(time.monotonic()), "interval", seconds=0.1, id="tick")
    with leader:
        wait(lambda: runs, 10, "a run")
        etcd_client.lease_revoke(leader.elector.session.lease())  # the term is lost
        lost = time.monotonic()
        wait(lambda: calls, 5, "on_lost")
        wait(lambda: runs[-1] > lost + 0.3, TAKEOVER, "runs of a new term")
        assert leader.error is None and leader.elector.terms >= 2


@pytest.mark.integration
async def test_async_shutdown_waits_for_plain_jobs_on_threads(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    name, started, finished = f"{etcd_namespace}/sched", threading.Event(), threading.Event()
    seen: list[object] = []

    def job() -> None:  # a plain function: run on the loop's default executor
        started.set()
        time.sleep(0.8)
        seen.append(f"{etcd_namespace}/sched")
        finished.set()

    leader = AsyncLeaderScheduler(async_etcd_client, name, ttl=TTL)
    leader.add_job(job, "interval", seconds=0.1, max_instances=1, id="job")
    await leader.start()
    await await_(started.is_set, 10, "the job running")
    await leader.shutdown(wait=True)
    done_before_resign = finished.is_set()
    await await_(finished.is_set, 5, "the job's end")  # either way, before the test ends
    assert done_before_resign, "shutdown(wait=True) resigned while a job ran on a thread"
    assert await async_etcd_client.leader(name) is None


@pytest.mark.integration
def test_a_handover_does_not_repeat_the_slot_the_old_leader_ran(
    etcd_endpoints: list[str], etcd_client: ef.Client, etcd_namespace: str
) -> None:
    """Both replicas hold the same cron slots; a resigns right after running one (a
    rolling deploy). b's paused scheduler still has that slot due within its grace, but
    a recorded it in etcd with its token: b skips it and runs the next one."""
    name = f"{etcd_namespace}/sched"
    slots: dict[str, list[Any]] = {"a": [], "b": []}
    clients = [ef.Client(etcd_endpoints, timeout=5.0) for _ in range(2)]

    def replica(me: str, client: ef.Client) -> LeaderScheduler:
        leader = LeaderScheduler(client, name, identity=me, ttl=TTL, retry_interval=0.2)
        leader.add_job(lambda: None, "cron", second="*", id="tick", misfire_grace_time=5)
        leader.scheduler.add_listener(
            lambda e: slots[me].append(e.scheduled_run_time), EVENT_JOB_EXECUTED
        )
        return leader

    a, b = replica("a", clients[0]), replica("b", clients[1])
    try:
        a.start()
        wait(a.is_leader, 10, "a leading")
        b.start()
        wait(lambda: slots["a"], 10, "a running a slot")
        a.shutdown()  # resigns right after its run; b (slot due, graced 5 s) takes over
        wait(lambda: slots["b"], 5, "b running a slot")
        b.shutdown()
        ran_a, ran_b = set(slots["a"]), set(slots["b"])
        assert not ran_a & ran_b, f"slot(s) run by both: {sorted(ran_a & ran_b)}"
        assert min(ran_b) > max(ran_a), (slots["a"], slots["b"])
        kv = etcd_client.get(f"{SLOTS_PREFIX}{name}/last/tick")
        assert kv is not None, "b's slot was not recorded"
        assert datetime.datetime.fromisoformat(json.loads(kv.value)["slot"]) == max(ran_b)
    finally:
        for c in clients:
            c.close()


# ------------------------------------------------------------------------ fault tests


class Replica:
    """One helper process and its history events (parsed as they arrive)."""

    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        self.proc, self.name = proc, name
        self.reader = LineReader(proc.stdout, name=f"aps-{name}")

    @property
    def events(self) -> list[Event]:
        return parse_events(self.reader.lines)

    def first(self, kind: str, after: float = 0.0, detail: str = "") -> Event | None:
        for e in self.events:
            if e.kind == kind and e.t > after and detail in (e.detail or ""):
                return e
        return None


@pytest.fixture
def run_root(etcd_client: ef.Client, etcd_namespace: str) -> Iterator[str]:
    root = f"{etcd_namespace}/aps"
    yield root
    etcd_client.delete(root + "/", prefix=True)


def start_replica(
    procs: list[subprocess.Popen[str]], env: dict[str, str], root: str, name: str, *extra: str
) -> Replica:
    proc = subprocess.Popen(
        [
            *(sys.executable, str(HELPER), "--endpoints", env["ETCDFENCE_ENDPOINTS"]),
            *("--root", root, "--id", name, "--ttl", str(TTL), *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    procs.append(proc)
    return Replica(proc, name)


def wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


async def await_(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def two_replicas(
    procs: list[subprocess.Popen[str]], env: dict[str, str], root: str, *extra: str
) -> tuple[Replica, Replica]:
    """Start A, wait for its first accepted write, start B: (leader, standby)."""
    a = start_replica(procs, env, root, "a", *extra)
    wait(lambda: a.first("accepted") is not None, 20, "a's first accepted write")
    b = start_replica(procs, env, root, "b", *extra)
    wait(lambda: b.first("campaign") is not None, 20, "b campaigning")
    return a, b


def pause_mid_run(a: Replica) -> float:
    """SIGSTOP ``a`` right after the first step of a run was accepted (the rest of the
    run is then a late write); returns the stop time."""
    seen = len(a.events)
    wait(
        lambda: any(
            e.kind == "accepted" and (e.detail or "").endswith("step 0") for e in a.events[seen:]
        ),
        10,
        "a run's first step",
    )
    a.proc.send_signal(signal.SIGSTOP)
    return time.monotonic()


def judge(replicas: list[Replica], observer: Observer | None, client: ef.Client) -> Any:
    for r in replicas:
        stop(r.proc)
    events = [e for r in replicas for e in parse_events(r.reader.join())]
    history = History.collect(events, observer)
    if observer is not None:
        observer.stop()
        history.read_final(client)
    return check(history)


def pause_and_resume(
    procs: list[subprocess.Popen[str]], env: dict[str, str], root: str, *extra: str
) -> tuple[Replica, Replica, float, float]:
    """The SIGSTOP scenario: returns (a, b, a's stop time, a's resume time)."""
    a, b = two_replicas(procs, env, root, *extra)
    stopped = pause_mid_run(a)
    wait(lambda: b.first("accepted") is not None, TAKEOVER + 3, "b's first accepted write")
    took_over = b.first("accepted")
    assert took_over is not None
    assert took_over.t - stopped <= TAKEOVER, took_over.t - stopped
    # a stays frozen until b has written more than once, then resumes as a zombie
    wait(lambda: sum(e.kind == "accepted" for e in b.events) >= 3, 5, "b's writes")
    a.proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    wait(lambda: a.first("lost", after=stopped) is not None, 5, "a noticing its loss")
    time.sleep(1.5)  # a's scheduler stays paused: it must run no new job in this time
    return a, b, stopped, resumed


def assert_zombie_was_fenced(a: Replica, b: Replica, stopped: float, result: Any) -> None:
    assert result.ok, result.report()
    assert result.stats["stale_accepted"] == 0
    late = [e for e in a.events if e.t > stopped and e.kind in ("accepted", "rejected")]
    assert late and all(e.kind == "rejected" for e in late), [e.describe() for e in late]
    new_runs = [e for e in a.events if e.kind == "note" and e.t > stopped]
    assert not new_runs, f"a started runs after its loss: {[e.describe() for e in new_runs]}"
    # accepted writes: one writer per token, two terms, and tokens never go back in time
    accepted = sorted((e for e in a.events + b.events if e.kind == "accepted"), key=lambda e: e.t)
    writers: dict[int | None, set[str]] = {}
    for e in accepted:
        writers.setdefault(e.token, set()).add(e.contender)
    assert len(writers) == 2 and all(len(w) == 1 for w in writers.values()), writers
    tokens = [e.token or 0 for e in accepted]
    assert tokens == sorted(tokens)


@pytest.mark.integration
def test_paused_leader_is_fenced_and_the_standby_takes_over(
    procs: list[subprocess.Popen[str]], env: dict[str, str], etcd_client: ef.Client, run_root: str
) -> None:
    layout = Layout(run_root)
    with Observer(etcd_client, layout, start_revision=etcd_client.revision() + 1) as observer:
        a, b, stopped, _ = pause_and_resume(procs, env, run_root)
        result = judge([a, b], observer, etcd_client)
    assert_zombie_was_fenced(a, b, stopped, result)


@pytest.mark.integration
@pytest.mark.redis
def test_paused_leader_is_fenced_by_a_redis_fence(
    procs: list[subprocess.Popen[str]], env: dict[str, str], etcd_client: ef.Client, run_root: str
) -> None:
    redis = pytest.importorskip("redis")
    from etcdfence.redis import RedisFence

    resource = f"aps-{uuid.uuid4().hex[:8]}"
    r = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5)
    fence = RedisFence(r, resource)
    try:
        a, b, stopped, _ = pause_and_resume(procs, env, run_root, "--redis", resource)
        result = judge([a, b], None, etcd_client)
        assert_zombie_was_fenced(a, b, stopped, result)
        assert fence.current() == max(e.token or 0 for e in b.events if e.kind == "accepted")
    finally:
        r.delete(fence.key, fence.version_key, fence.key_for("data"))
        r.close()


@pytest.mark.integration
def test_control_without_fencing_the_paused_leaders_write_lands(
    procs: list[subprocess.Popen[str]], env: dict[str, str], etcd_client: ef.Client, run_root: str
) -> None:
    """The same pause with fencing off (plain puts, no mark advanced): the resumed
    leader's late write is accepted after the new leader's, and the checker says so —
    so the test above would fail without fencing."""
    layout = Layout(run_root)
    with Observer(etcd_client, layout, start_revision=etcd_client.revision() + 1) as observer:
        a, b, stopped, _ = pause_and_resume(procs, env, run_root, "--no-fence")
        result = judge([a, b], observer, etcd_client)
    late = [e for e in a.events if e.t > stopped and e.kind == "accepted"]
    assert late, "the control saw no late write at all"
    assert not result.ok and result.stats["stale_accepted"] >= 1, result.report()
    assert "stale-accepted" in {v.kind for v in result.violations}


@pytest.mark.integration
def test_killed_leader_standby_takes_over_within_ttl(
    procs: list[subprocess.Popen[str]], env: dict[str, str], etcd_client: ef.Client, run_root: str
) -> None:
    a, b = two_replicas(procs, env, run_root)
    a.proc.kill()
    killed = time.monotonic()
    a.proc.wait(10)
    wait(lambda: b.first("accepted") is not None, TAKEOVER + 3, "b's first accepted write")
    took_over = b.first("accepted")
    assert took_over is not None
    assert took_over.t - killed <= TAKEOVER, took_over.t - killed
    result = judge([a, b], None, etcd_client)
    assert result.ok, result.report()
    assert result.stats["stale_accepted"] == 0


# ----------------------------------------- what a replica-independent schedule needs


class Reports:
    def daily(self) -> None: ...


def test_refuses_ids_that_depend_on_the_order_jobs_are_added() -> None:
    """Without ``id=`` only a module-level function is named by itself: the default
    name of a partial / lambda / bound method / nested function depends on the order of
    adds, and replicas that add in another order would swap recorded slots. ``id=""``
    would become a random uuid per replica."""
    client = ef.Client("http://127.0.0.1:1")
    try:
        leader = LeaderScheduler(client, "jobs")

        def nested() -> None: ...

        for func in (functools.partial(print, "x"), lambda: None, Reports().daily, nested):
            with pytest.raises(ef.InvalidArgumentError, match="explicit id="):
                leader.add_job(func, "interval", seconds=1)
        for bad in ("", 5):
            with pytest.raises(ef.InvalidArgumentError, match="non-empty str"):
                leader.add_job(persisted, "interval", seconds=1, id=bad)
        assert leader.add_job(persisted, "interval", seconds=1).id == (
            f"{persisted.__module__}:persisted"
        )
        with pytest.raises(ef.InvalidArgumentError, match="already added without an id"):
            leader.add_job(persisted, "interval", seconds=2)  # a '#2' would depend on order
        job = leader.add_job(functools.partial(print, "x"), "interval", seconds=1, id="px")
        assert job.id == "px"
    finally:
        client.close()


def test_refuses_triggers_whose_run_times_differ_per_replica_or_never_advance() -> None:
    """``jitter`` is drawn per replica, so the slot a leader records is not the one the
    next leader computes (a handover would repeat it); a non-positive interval never
    advances; a bad trigger argument is a clear error, not APScheduler's TypeError."""
    client = ef.Client("http://127.0.0.1:1")
    try:
        leader = LeaderScheduler(client, "jobs")
        with pytest.raises(ef.InvalidArgumentError, match="jitter"):
            leader.add_job(persisted, "cron", second="*/2", jitter=1.5, id="a")
        with pytest.raises(ef.InvalidArgumentError, match="jitter"):
            leader.add_job(persisted, "interval", seconds=2, jitter=1, id="b")
        either = OrTrigger([CronTrigger(second="*"), IntervalTrigger(seconds=3, jitter=2)])
        with pytest.raises(ef.InvalidArgumentError, match="jitter"):
            leader.add_job(persisted, either, id="c")
        for seconds in (-1, 0):
            with pytest.raises(ef.InvalidArgumentError, match="positive period"):
                leader.add_job(persisted, "interval", seconds=seconds, id="d")
        with pytest.raises(ef.InvalidArgumentError, match="bad trigger"):
            leader.add_job(persisted, "interval", bogus=1, id="e")
        assert leader.scheduler.get_jobs() == [], "a refused job was added anyway"
    finally:
        client.close()


def test_refuses_executors_that_would_run_the_bare_function_and_unknown_aliases() -> None:
    """A process pool pickles the job by reference (the bare function: no admission,
    no token), so only thread pools and asyncio executors are accepted, at add_job and
    again at start(); an alias the scheduler lacks is refused at add_job (APScheduler
    would raise a KeyError from start() or drop the job at its first run)."""
    client = ef.Client("http://127.0.0.1:1")
    try:
        scheduler = BackgroundScheduler(executors={"pp": ProcessPoolExecutor(1)})
        leader = LeaderScheduler(client, "jobs", scheduler=scheduler)
        with pytest.raises(ef.InvalidArgumentError, match="'pp' is a ProcessPoolExecutor"):
            leader.add_job(persisted, "interval", seconds=1, executor="pp")
        with pytest.raises(ef.InvalidArgumentError, match="executor 'nope' is not one"):
            leader.add_job(persisted, "interval", seconds=1, executor="nope")
        with pytest.raises(ef.InvalidArgumentError, match="job store 'nope' is not one"):
            leader.add_job(persisted, "interval", seconds=1, jobstore="nope")
        scheduler.add_executor(ThreadPoolExecutor(2), "threads")
        leader.add_job(persisted, "interval", seconds=1, executor="threads")
        scheduler.remove_executor("threads")  # swapped for a process pool after the add
        scheduler.add_executor(ProcessPoolExecutor(1), "threads")
        with pytest.raises(ef.InvalidArgumentError, match="'threads' is a ProcessPoolExecutor"):
            leader.start()
    finally:
        client.close()


# ------------------------------------------------------- slots recorded at admission


@pytest.mark.integration
def test_overlapping_runs_of_one_job_record_their_slots_in_order(
    etcd_endpoints: list[str], etcd_client: ef.Client, etcd_namespace: str
) -> None:
    """With ``max_instances`` > 1 several runs of a job overlap; each records the slot
    it was submitted for when it starts, oldest first, so the record ends at the last
    slot run and never goes back to an earlier one."""
    name = f"{etcd_namespace}/sched"
    submitted: list[datetime.datetime] = []
    started = threading.Semaphore(0)
    client = ef.Client(etcd_endpoints, timeout=5.0)
    leader = LeaderScheduler(client, name, ttl=TTL, retry_interval=0.2)

    def slow() -> None:
        started.release()
        time.sleep(0.45)

    leader.add_job(slow, "interval", seconds=0.1, id="slow", max_instances=4)
    leader.scheduler.add_listener(
        lambda e: submitted.extend(e.scheduled_run_times), EVENT_JOB_SUBMITTED
    )
    try:
        leader.start()
        for _ in range(8):
            assert started.acquire(timeout=10), "runs did not start"
        leader.shutdown()  # waits for the runs already submitted
    finally:
        client.close()
    kv = etcd_client.get(f"{SLOTS_PREFIX}{name}/last/slow")
    assert kv is not None, "no slot recorded"
    assert datetime.datetime.fromisoformat(json.loads(kv.value)["slot"]) == max(submitted)


DATES = Path(__file__).resolve().parent / "_aps_dates_proc.py"


class DateReplica:
    """A tests/_aps_dates_proc.py replica: one-shot jobs d0..dN; prints each run."""

    def __init__(
        self, procs: list[Any], env: dict[str, str], name: str, me: str, *extra: str
    ) -> None:
        self.me = me
        self.proc = subprocess.Popen(
            [
                *(sys.executable, str(DATES), "--endpoints", env["ETCDFENCE_ENDPOINTS"]),
                *("--name", name, "--id", me, "--ttl", str(TTL), *extra),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        procs.append(self.proc)
        self.reader = LineReader(self.proc.stdout, name=f"aps-dates-{me}")

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.reader.lines) if line.startswith("{")]

    def has(self, key: str) -> bool:
        return any(key in e for e in self.events())


@pytest.mark.integration
def test_a_run_queued_when_the_term_ends_runs_once_on_the_next_leader(
    procs: list[Any], env: dict[str, str], etcd_namespace: str
) -> None:
    """a's one worker is busy (job 0 holds it 4 s), so the runs of jobs 1.. queue on a;
    a is frozen past its TTL and b takes over. The queued runs are refused at start on
    a (its term is over) and, since a slot is recorded only when its run is admitted,
    b finds them unrecorded and runs them: every slot runs, on one replica."""
    name, count, gap = f"{etcd_namespace}/sched", 20, 0.25
    t0 = time.time() + 4
    dates = ("--start", str(t0), "--count", str(count), "--gap", str(gap))
    a = DateReplica(procs, env, name, "a", *dates, "--workers", "1", "--hold", "0:4")
    wait(lambda: a.has("elected"), 15, "a elected")
    b = DateReplica(procs, env, name, "b", *dates)
    wait(lambda: b.has("started"), 15, "b started")
    wait(lambda: time.time() > t0 + 1.1, 10, "jobs 1-4 queued on a")
    a.proc.send_signal(signal.SIGSTOP)
    wait(lambda: b.has("elected"), TTL + 5, "b taking over")
    a.proc.send_signal(signal.SIGCONT)
    wait(lambda: time.time() > t0 + count * gap + 3, 20, "every slot due and handled")
    for r in (a, b):
        stop(r.proc)
        r.reader.join()
    ran: dict[int, list[str]] = {}
    for r in (a, b):
        for e in r.events():
            if "ran" in e:
                ran.setdefault(e["ran"], []).append(r.me)
    never = [k for k in range(count) if k not in ran]
    assert not never, f"slots run by no replica: {never} (runs: {ran})"
    assert all(ran[k] == ["b"] for k in range(1, 5)), f"queued runs 1-4: {ran}"
    assert any("apscheduler_job_skipped" in str(e.get("log", "")) for e in a.events()), (
        "a's queued runs were not refused at start"
    )
    twice = {k: who for k, who in ran.items() if len(who) > 1}
    assert not twice, f"slots run twice: {twice}"


@pytest.mark.integration
async def test_async_flavour_records_each_slot_before_the_job_body(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    """In AsyncLeaderScheduler an ``async def`` job records its slot on the loop, a
    plain job from its executor thread (through the loop): in both, the slot is in etcd
    under the term's token when the body starts."""
    name = f"{etcd_namespace}/sched"
    prefix = f"{SLOTS_PREFIX}{name}/last/"
    seen: dict[str, list[Any]] = {"coro": [], "plain": []}
    leader = AsyncLeaderScheduler(
        async_etcd_client, name, ttl=TTL, retry_interval=0.2, scheduler=AsyncIOScheduler()
    )
    loop = asyncio.get_running_loop()

    async def coro() -> None:
        seen["coro"].append((await async_etcd_client.get(prefix + "coro"), current_token()))

    def plain() -> None:
        kv = asyncio.run_coroutine_threadsafe(async_etcd_client.get(prefix + "plain"), loop)
        seen["plain"].append((kv.result(5), current_token()))

    slots: dict[str, list[Any]] = {"coro": [], "plain": []}
    leader.add_job(coro, "interval", seconds=0.3, id="coro")
    leader.add_job(plain, "interval", seconds=0.3, id="plain")
    leader.scheduler.add_listener(
        lambda e: slots[e.job_id].append(e.scheduled_run_time), EVENT_JOB_EXECUTED
    )
    async with leader:
        await await_(lambda: all(len(v) >= 2 for v in slots.values()), 15, "two runs each")
    for job_id, runs in seen.items():
        for kv, token in runs:
            assert kv is not None, f"{job_id}: the body started before its slot was recorded"
            record = json.loads(kv.value)
            assert record["token"] == token.value, (job_id, record, token)
        recorded = await async_etcd_client.get(prefix + job_id)
        assert recorded is not None
        last = datetime.datetime.fromisoformat(json.loads(recorded.value)["slot"])
        assert last == max(slots[job_id]), (job_id, last, slots[job_id])


@pytest.mark.integration
@pytest.mark.parametrize("how", ["add_job", "scheduled_job", "modify_job", "job_store"])
def test_jobs_put_on_the_wrapped_scheduler_after_start_never_run(
    etcd_client: ef.Client, etcd_namespace: str, how: str
) -> None:
    """A job added straight to ``leader.scheduler`` once the leader runs (bypassing the
    wrapper: no term check, no token) is refused with a clear error — ``add_job``,
    ``scheduled_job``, ``modify_job(func=...)`` — or, slipped into the job store below
    them, removed as it is added: the bare function never runs, the wrapped job does."""
    from apscheduler.job import Job

    bare: list[float] = []
    wrapped: list[int] = []

    def bare_job() -> None:
        bare.append(time.time())

    def job(token: ef.FencingToken) -> None:
        wrapped.append(int(token))

    leader = LeaderScheduler(etcd_client, f"{etcd_namespace}/sched", ttl=TTL)
    leader.add_job(job, "interval", seconds=0.2, id="job")
    with leader:
        wait(lambda: wrapped, 10, "the wrapped job runs")
        inner = leader.scheduler
        if how == "job_store":
            trigger = IntervalTrigger(seconds=0.1)
            slipped = Job(
                inner, id="slipped", func=bare_job, trigger=trigger, executor="default",
                args=(), kwargs={}, name="slipped", misfire_grace_time=1, coalesce=True,
                max_instances=1, next_run_time=datetime.datetime.now(datetime.timezone.utc),
            )  # fmt: skip
            inner._real_add_job(slipped, "default", False)
            assert inner.get_job("slipped") is None
        else:
            with pytest.raises(ef.InvalidArgumentError, match=r"LeaderScheduler\.add_job"):
                if how == "add_job":
                    inner.add_job(bare_job, "interval", seconds=0.1, id="bare")
                elif how == "scheduled_job":
                    inner.scheduled_job("interval", seconds=0.1, id="bare")(bare_job)
                else:
                    inner.modify_job("job", func=bare_job)
        seen = len(wrapped)
        wait(lambda: len(wrapped) >= seen + 3, 10, "the wrapped job runs on")
        assert [j.id for j in inner.get_jobs()] == ["job"]
    assert bare == [], f"a job put on the wrapped scheduler ran with no term: {bare}"

"""One answer to "am I still the holder?" (issue #21, items 5 and 10).

A process frozen past its session's local deadline (SIGSTOP, a blocked event loop or
thread) must, the moment it runs again, read the same answer from ``session.expired``,
``session.check()``, a lock's or election's ``token`` and an elector's ``is_leader()`` /
``token`` — before the keepalive hub's deadline worker had its turn. And a term that
ended because ``on_elected`` raised leaves no monitor thread or task behind.
Real etcd, real processes and signals; both twins.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _contender_proc import Api, LineReader, api_fixture, poll, stop_process, twins

import etcdfence as ef
from etcdfence import metrics

pytestmark = pytest.mark.integration

api = api_fixture()

HOLDER = Path(__file__).with_name("_paused_holder.py")


def _agree(reads: dict[str, Any]) -> None:
    """Every read says "expired / not holding", as check() does."""
    assert reads["check"] == "expired" and reads["elector_check"] == "expired", reads
    assert reads["expired"] is True, reads
    assert reads["elector_session_expired"] is True, reads
    assert reads["expiry_reason"] is not None, reads
    assert not reads["lock_token"] and not reads["election_token"], reads
    assert not reads["elector_token"] and not reads["elector_is_leader"], reads


@pytest.mark.parametrize("twin", twins())
def test_a_process_frozen_past_its_deadline_reads_one_answer_everywhere(
    twin: str, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """SIGSTOP a holder past its deadlines, SIGCONT it: its first reads, taken in the
    signal handler before the library's workers run, all agree with check()."""
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), twin, etcd_endpoints[0], etcd_namespace],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(HOLDER.parent),
    )
    try:
        out = LineReader(proc.stdout)
        assert out.wait_for(lambda line: line == "ready", 30), out.lines
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(3.0)  # TTL 2, margin 0.2: every deadline is more than a second behind
        os.kill(proc.pid, signal.SIGCONT)
        line = out.wait_for(lambda line: line.startswith("{"), 15)
        assert line, out.lines
        _agree(json.loads(line))
    finally:
        stop_process(proc)


def _idle_work(api: Api) -> Callable[..., Any]:
    """A leader's work that runs until its term ends."""
    if api.is_async:

        async def awork(token: Any, stop: Any) -> None:
            await asyncio.sleep(3600)

        return awork

    def work(token: Any, stop: Any) -> None:
        stop.wait(30)

    return work


def _freeze_until(moment: float) -> None:
    """Hold the interpreter until ``moment``: a busy loop that never gives the GIL away
    (a huge switch interval), so neither the event loop nor any library thread runs."""
    while time.monotonic() < moment:
        pass


async def test_reads_right_after_a_blocked_loop_or_thread_agree_with_check(
    api: Api, etcd_namespace: str
) -> None:
    session = await api.open_session(2, margin=0.2)
    lock = session.lock(etcd_namespace + "/lock")
    await api(lock.acquire, 5.0)
    election = session.election(etcd_namespace + "/election")
    await api(election.campaign, "me", 5.0)
    elected = threading.Event()
    elector = api.Elector(
        api.client,
        etcd_namespace + "/elector",
        identity="me",
        ttl=2,
        margin=0.2,
        on_elected=lambda token: elected.set(),
    )
    work = _idle_work(api)
    runner = api.spawn(elector.run, work)
    try:
        await poll(elected.is_set, 10, "elected")
        moment = max(session.deadline, elector.session.deadline) + 0.3
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        try:
            _freeze_until(moment)
            expired = session.expired  # first: before anything else could run
            reads = {
                "expired": expired,
                "elector_session_expired": elector.session.expired,
                "lock_token": lock.token is not None,
                "election_token": election.token is not None,
                "elector_token": elector.token is not None,
                "elector_is_leader": elector.is_leader(),
                "expiry_reason": session.expiry_reason,
            }
        finally:
            sys.setswitchinterval(interval)
        for name, target in (("check", session), ("elector_check", elector.session)):
            try:
                target.check()
                reads[name] = "ok"
            except ef.SessionExpiredError:
                reads[name] = "expired"
        _agree(reads)
    finally:
        elector.stop()
        await asyncio.wait_for(runner, 15)
        await api.close(session)


async def test_a_term_ended_by_a_raising_on_elected_leaves_no_monitor(
    api: Api, etcd_namespace: str
) -> None:
    """on_elected raises: run() ends with it, and the term's monitor (thread or task)
    and its watch are gone by then."""
    client = await api.new_client()

    def on_elected(token: Any) -> None:
        raise RuntimeError("boom")

    elector = api.Elector(
        client, etcd_namespace + "/el", identity="me", ttl=5, on_elected=on_elected
    )
    work = _idle_work(api)
    for _ in range(3):  # each term: a fresh monitor, started just before on_elected
        with pytest.raises(RuntimeError, match="boom"):
            await api(elector.run, work)
        monitors = [t.name for t in threading.enumerate() if t.name.startswith("etcdfence-term-")]
        assert monitors == []
        if api.is_async:
            tasks = [
                t.get_name()
                for t in asyncio.all_tasks()
                if t.get_name().startswith("etcdfence-term-") and not t.done()
            ]
            assert tasks == []
        assert len(client.connection.watches) == 0  # the term's watch left the hub too


async def test_an_async_session_read_from_another_thread_expires_on_its_loop(
    async_etcd_client: ef.AsyncClient,
) -> None:
    """A health thread reads an AsyncSession past its deadline while the loop is busy:
    the answer is "expired" at once, and the expiry (its callbacks) runs on the loop,
    never in the reading thread (asyncio objects are not thread-safe)."""
    session = async_etcd_client.session(2, margin=0.2)
    await session.open()
    ran_on: list[str] = []
    session.on_expired(lambda: ran_on.append(threading.current_thread().name))
    answers: list[Any] = []

    def health() -> None:
        answers.append((session.expired, session.expiry_reason))
        try:
            session.check()
        except ef.SessionExpiredError as exc:
            answers.append(str(exc))

    try:
        time.sleep(max(0.0, session.deadline - time.monotonic()) + 0.3)  # the loop is busy
        reader = threading.Thread(target=health, name="health")
        reader.start()
        reader.join(10)
        assert answers == [
            (True, "local deadline passed"),
            "session expired: local deadline passed",
        ]
        assert ran_on == []  # not in the health thread: the loop has not run yet
        await asyncio.wait_for(session.wait_expired(), 5)
        assert ran_on == [threading.current_thread().name]
    finally:
        await session.aclose()


def _frozen(moment: float) -> None:
    """Hold the interpreter until ``moment`` (see :func:`_freeze_until`), switch
    interval restored afterwards."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        _freeze_until(moment)
    finally:
        sys.setswitchinterval(interval)


async def test_held_gauges_scraped_past_the_deadline_say_zero(
    api: Api, etcd_namespace: str
) -> None:
    """etcdfence_is_leader / etcdfence_lock_held are answered at scrape time by the
    holder's own answer: a scrape right after the loop (async) or every thread (sync)
    was frozen past the session's deadline says 0, before the expiry path ran."""
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics.enable_metrics(registry)
    session = await api.open_session(2, margin=0.2)
    lock = session.lock(etcd_namespace + "/glock")
    elected = threading.Event()
    elector = api.Elector(
        api.client,
        etcd_namespace + "/gelector",
        identity="me",
        ttl=2,
        margin=0.2,
        on_elected=lambda token: elected.set(),
    )
    runner = None
    try:
        await api(lock.acquire, 5.0)
        runner = api.spawn(elector.run, _idle_work(api))
        await poll(elected.is_set, 10, "elected")

        def gauges() -> dict[str, Any]:
            get = registry.get_sample_value
            return {
                "is_leader": get("etcdfence_is_leader", {"election": etcd_namespace + "/gelector"}),
                "lock": get(
                    "etcdfence_lock_held", {"kind": "lock", "name": etcd_namespace + "/glock"}
                ),
                "term": get(
                    "etcdfence_lock_held",
                    {"kind": "election", "name": etcd_namespace + "/gelector"},
                ),
            }

        assert gauges() == {"is_leader": 1.0, "lock": 1.0, "term": 1.0}  # held: 1
        _frozen(max(session.deadline, elector.session.deadline) + 0.3)
        assert gauges() == {"is_leader": 0.0, "lock": 0.0, "term": 0.0}  # first thing after
        assert session.expired and elector.token is None  # and every other read agrees
    finally:
        if runner is not None:
            elector.stop()
            await asyncio.wait_for(runner, 15)
        await api.close(session)
        metrics.disable_metrics()


async def test_work_never_gets_a_term_that_on_elected_outlived(
    api: Api, etcd_namespace: str
) -> None:
    """on_elected holds the loop (async) or every thread (sync) past the session's
    deadline: the term ends as lost (on_lost runs) and work is never called with its
    token; the elector campaigns again and the next term's work runs."""
    client = await api.new_client()
    elected: list[Any] = []
    worked: list[Any] = []
    losses: list[bool] = []
    elector: Any = None

    def on_elected(token: Any) -> None:
        elected.append(token)
        if len(elected) == 1:
            _frozen(elector.session.deadline + 0.3)

    def on_lost() -> None:
        losses.append(True)

    elector = api.Elector(
        client,
        etcd_namespace + "/outlived",
        identity="me",
        ttl=2,
        margin=0.2,
        on_elected=on_elected,
        on_lost=on_lost,
    )
    if api.is_async:

        async def awork(token: Any, stop: Any) -> None:
            worked.append((token, stop.is_set()))
            await stop.wait()

        work: Any = awork
    else:

        def work(token: Any, stop: Any) -> None:
            worked.append((token, stop.is_set()))
            stop.wait(30)

    runner = api.spawn(elector.run, work)
    try:
        await poll(lambda: len(worked) >= 1, 30, "a term's work started")
        assert len(elected) >= 2, (elected, worked)
        assert worked[0][0] == elected[1]  # the first term's token never reached work
        assert all(token != elected[0] for token, _ in worked), (elected, worked)
        assert losses  # the outlived term ended as a loss
    finally:
        elector.stop()
        await asyncio.wait_for(runner, 15)

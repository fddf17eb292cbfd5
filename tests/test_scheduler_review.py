"""Regression tests from the third hostile review of the fenced schedulers.

* Celery: a beat with an ``etcdfence_advance`` hook while the workers keep the default
  etcd fence did not advance that fence at a new term, yet pruned the old term's slot
  keys: a late copy of a pruned slot with the old token was applied a second time (6 of
  6). The beat now always advances the default fence itself (the hook runs after), and a
  ``etcdfence_fence_factory`` without an advance hook is refused at start.
* APScheduler: a job store that already held a job, added to the wrapped scheduler after
  start, ran that bare function with no term (3 of 3); a process pool added after start
  took a wrapped job off its runs (3 of 3). Both are refused now.
"""

from __future__ import annotations

import collections
import json
import os
import signal

import pytest
from test_celery import (  # noqa: F401  (fixtures)
    Run,
    _hand_over,
    broker,
    run,
)

import etcdfence as ef
from etcdfence.fence.ops import Create, Put
from etcdfence.testing.procs import wait_until


@pytest.mark.serial  # TTL-bound hand-overs and freezes on a loaded machine
@pytest.mark.integration
@pytest.mark.parametrize("hook", ["builtins:id", None], ids=["advance-hook", "control"])
def test_an_advance_hook_with_the_default_fence_never_lets_a_pruned_slot_apply_twice(
    run: Run,  # noqa: F811
    etcd_client: ef.Client,
    hook: str | None,
) -> None:
    """With or without a hook (one that does not touch the etcd fence), the workers'
    default etcd fence is advanced at B's election, so the late copy of a pruned slot
    with A's token is refused stale."""
    window = 3.0
    run.env["CELERY_TEST_CONF"] = json.dumps(
        {
            "etcdfence_catchup": 30,
            "etcdfence_resend_window": window,
            # a hook for "my other store"; the workers keep the default etcd fence
            **({"etcdfence_advance": hook} if hook else {}),
        }
    )
    worker = run.spawn("worker")
    a = run.spawn("beat")
    wait_until(lambda: len(run.events("applied")) >= 7, 40, f"A's slots apply\n{run.output()}")
    os.kill(worker.pid, signal.SIGSTOP)  # B's own tasks stay queued: the mark stays at A's
    try:
        b, took_over = _hand_over(run, etcd_client, a)
        last_sent = {e["slot"]: e["time"] for e in run.events("sent", a.pid)}
        old = {slot for slot, at in last_sent.items() if at < took_over - window - 1.0}
        assert len(old) >= 2, last_sent
        slots = f"/{run.ns}/slots/"

        def keys() -> set[str]:
            return {kv.key.decode()[len(slots) :] for kv in etcd_client.get_prefix(slots)}

        wait_until(lambda: not old & keys(), 15, f"B prunes A's old slot keys\n{run.output()}")
        a_token = ef.FencingToken.from_text(run.events("sent", a.pid)[0]["token"])
        b_token = ef.FencingToken.from_text(run.events("sent", b.pid)[0]["token"])
        fence = etcd_client.fence(f"{run.ns}/workers", lock=f"{run.ns}/beat")
        mark = fence.current()
        victim = sorted(old)[0]
        # what a worker's Fenced.apply does for a late copy of the victim with A's token
        # (an acks_late redelivery, a zombie A's copy): Create(slot key) + the effect
        applied_again = True
        try:
            fence.txn(
                a_token,
                [
                    Create(f"{slots}{victim}", json.dumps({"token": a_token.value})),
                    Put(
                        f"/{run.ns}/effects/{victim}/late",
                        json.dumps({"token": a_token.value, "slot": victim}),
                    ),
                ],
            )
        except (ef.StaleTokenError, ef.KeyExistsError):
            applied_again = False
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    per_slot = collections.Counter(slot for _, slot, _ in run.effects(etcd_client))
    assert not applied_again and per_slot[victim] == 1, (
        f"workers' mark {mark} < B's token {b_token.value} after B took office; "
        f"slot {victim} key pruned and applied {per_slot[victim]} times"
    )


# -- APScheduler: what reaches the wrapped scheduler after start -------------------------


@pytest.mark.integration
@pytest.mark.parametrize("how", ["jobstore_with_jobs", "executor_process_pool"])
def test_apscheduler_refuses_stores_and_executors_added_after_start(
    etcd_client: ef.Client, etcd_namespace: str, how: str
) -> None:
    """After start: (a) a job store added to ``leader.scheduler`` that already holds a
    job (a persistent store from an earlier deploy; here a memory store) -- add_jobstore
    fires EVENT_JOBSTORE_ADDED, not EVENT_JOB_ADDED, so the guard's listener never sees the
    job; (b) ``add_executor(ProcessPoolExecutor)`` then ``modify_job(id, executor=...)``
    -- modify_job only checked ``func``. Both are refused now."""
    import datetime
    import time

    from apscheduler.executors.pool import ProcessPoolExecutor
    from apscheduler.job import Job
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.triggers.interval import IntervalTrigger

    from etcdfence.apscheduler import LeaderScheduler

    wrapped: list[int] = []

    def job(token: ef.FencingToken) -> None:
        wrapped.append(int(token))

    leader = LeaderScheduler(etcd_client, f"{etcd_namespace}/sched", ttl=5)
    leader.add_job(job, "interval", seconds=0.2, id="job")
    with leader:
        deadline = time.time() + 10
        while not wrapped and time.time() < deadline:
            time.sleep(0.05)
        assert wrapped
        inner = leader.scheduler
        if how == "jobstore_with_jobs":
            store = MemoryJobStore()
            bare = Job(
                inner, id="bare", func=_bare_job, trigger=IntervalTrigger(seconds=0.1),
                executor="default", args=(), kwargs={}, name="bare", misfire_grace_time=1,
                coalesce=True, max_instances=1,
                next_run_time=datetime.datetime.now(datetime.timezone.utc),
            )  # fmt: skip
            store.add_job(bare)
            refused = False
            try:
                inner.add_jobstore(store, "late")
            except ef.InvalidArgumentError:
                refused = True
            time.sleep(1.5)
            ids = sorted(j.id for j in inner.get_jobs())
            assert not _BARE_RUNS, f"a bare job ran with no term: {len(_BARE_RUNS)} runs"
            assert refused or ids == ["job"], f"bare job kept after start: {ids}"
        else:
            refused = False
            try:
                inner.add_executor(ProcessPoolExecutor(1), "pp")
                inner.modify_job("job", executor="pp")
            except ef.InvalidArgumentError:
                refused = True
            seen = len(wrapped)
            time.sleep(1.5)
            assert len(wrapped) > seen, "the wrapped job stopped running (moved executor)"
            executor = inner.get_job("job").executor
            assert refused or executor != "pp", f"the wrapped job moved to executor {executor!r}"


_BARE_RUNS: list[float] = []


def _bare_job() -> None:
    _BARE_RUNS.append(1.0)

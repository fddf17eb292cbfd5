"""etcdfence.celery with real ``celery beat`` and ``celery worker`` processes on RabbitMQ and
Redis, two beats competing, real faults: a beat that freezes (SIGSTOP) past its TTL
holding a message and resumes; a beat SIGKILLed between publishing a slot and recording
it. Invariants: every slot's effect applied exactly once, slots contiguous, 0 stale
effects accepted (tokens never go backwards in the store), the stale beat's late message
refused and counted, the standby sending within TTL + 2 s of the leader's loss. Each
scenario runs again with fencing switched off (``etcdfence_fencing = False``) and must
observe the violation (a slot applied twice).

Each test uses its own queue and etcd namespace and deletes them after. When a broker is
down the tests skip, unless ``ETCDFENCE_REQUIRE_BROKERS=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

import etcdfence as ef
from etcdfence.celery._slots import parse_time
from etcdfence.testing.procs import start, stop, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.broker]

HERE = Path(__file__).resolve().parent
REQUIRE_BROKERS = os.environ.get("ETCDFENCE_REQUIRE_BROKERS") == "1"
TTL = 2
BROKERS = {
    "amqp": ("amqp://guest:guest@127.0.0.1:5672//", ("127.0.0.1", 5672)),
    "redis": ("redis://127.0.0.1:6379/14", ("127.0.0.1", 6379)),
}


def _down(address: tuple[str, int]) -> str | None:
    try:
        socket.create_connection(address, timeout=2).close()
    except OSError as exc:
        return f"broker at {address[0]}:{address[1]} is down: {exc}"
    return None


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> str:
    """A broker URL (both kinds); skip when it is down (fail under the CI variable)."""
    url, address = BROKERS[request.param]
    reason = _down(address)
    if reason and REQUIRE_BROKERS:
        pytest.fail(f"{reason} (ETCDFENCE_REQUIRE_BROKERS=1)")
    if reason:
        pytest.skip(reason)
    return url


def delete_queue(url: str, queue: str) -> None:
    """Remove the test's queue from the broker; on Redis also its exchange bindings and
    its messages in kombu's shared ``unacked`` hash and ``unacked_index`` set."""
    from kombu.connection import Connection

    with Connection(url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]
        channel = conn.default_channel
        if url.startswith("redis"):
            client = channel.client
            client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
            for key in client.scan_iter(match="_kombu.binding.*"):
                for member in client.smembers(key):
                    if member.decode("utf-8", "replace").endswith("\x06\x16" + queue):
                        client.srem(key, member)
            _delete_unacked(client, queue)
        else:
            channel.queue_delete(queue)


def _delete_unacked(client: Any, queue: str) -> None:
    """Drop the entries of ``queue``'s messages from kombu's ``unacked`` hash (tag ->
    ``[message, exchange, routing key]``) and ``unacked_index`` sorted set."""
    mine = []
    for tag, raw in client.hscan_iter("unacked"):
        try:
            _message, _exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if routing_key == queue:
            mine.append(tag)
    if mine:
        client.hdel("unacked", *mine)
        client.zrem("unacked_index", *mine)


@dataclass
class Run:
    """One scenario: its namespace, queue, log, processes."""

    broker: str
    ns: str
    env: dict[str, str]
    log: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def spawn(self, role: str, **extra: str) -> subprocess.Popen[str]:
        if role == "worker":
            args = ["worker", "-P", "solo", "--without-mingle", "--without-gossip"]
            args += ["--without-heartbeat", "-Q", self.env["CELERY_TEST_QUEUE"]]
        else:
            args = ["beat", "--scheduler", "etcdfence.celery:LeaderScheduler"]
            args += ["--schedule", os.devnull]
        out = open(self.log.with_suffix(f".{role}.{len(self.procs)}.out"), "w")  # noqa: SIM115
        proc = start(
            [sys.executable, "-m", "celery", "-A", "_celery_app", *args, "-l", "info"],
            env={**self.env, **extra},
            cwd=HERE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def events(self, kind: str | None = None, pid: int | None = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [
            e
            for e in lines
            if (kind is None or e["event"] == kind) and (pid is None or e["pid"] == pid)
        ]

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}"
            for p in sorted(self.log.parent.glob(self.log.name.replace(".jsonl", ".*.out")))
        )

    def effects(self, client: ef.Client) -> list[tuple[int, str, int]]:
        """``(revision, slot, token)`` of every effect applied, in revision order."""
        kvs = client.get_prefix(f"/{self.ns}/effects/")
        found = [(kv.mod_revision, json.loads(kv.value)) for kv in kvs]
        return sorted((rev, v["slot"], v["token"]) for rev, v in found)


@pytest.fixture
def run(
    broker: str, env: dict[str, str], etcd_namespace: str, tmp_path: Path, etcd_client: ef.Client
) -> Iterator[Run]:
    queue = f"etcdfence-test-{uuid.uuid4().hex[:12]}"
    log = tmp_path / "events.jsonl"
    scenario = Run(
        broker,
        etcd_namespace,
        clean_env(
            ETCDFENCE_ENDPOINTS=env["ETCDFENCE_ENDPOINTS"],
            CELERY_TEST_BROKER=broker,
            CELERY_TEST_QUEUE=queue,
            CELERY_TEST_NS=etcd_namespace,
            CELERY_TEST_LOG=str(log),
            CELERY_TEST_TTL=str(TTL),
            PYTHONPATH=str(HERE),
        ),
        log,
    )
    try:
        yield scenario
    finally:
        for proc in scenario.procs:
            stop(proc, signal.SIGKILL)
        delete_queue(broker, queue)
        etcd_client.delete(f"/{etcd_namespace}/", prefix=True)
        etcd_client.delete(f"/etcdfence/fence/{etcd_namespace}/", prefix=True)
        etcd_client.delete(f"{etcd_namespace}/", prefix=True)


def candidates(client: ef.Client, run: Run) -> int:
    return len(client.get_prefix(f"{run.ns}/beat/"))


def start_two_beats(run: Run, client: ef.Client, **first_env: str) -> tuple[Any, Any]:
    """A worker, then beat A (elected, sending) and beat B (campaigning behind it)."""
    run.spawn("worker")
    a = run.spawn("beat", **first_env)
    wait_until(lambda: run.events("sent", a.pid), 30, f"beat A sends\n{run.output()}")
    b = run.spawn("beat")
    wait_until(lambda: candidates(client, run) == 2, 30, f"beat B campaigns\n{run.output()}")
    return a, b


def finish(run: Run, beats: list[Any], client: ef.Client) -> None:
    """Stop the beats, let the worker drain every sent message, stop it."""
    for beat in beats:
        stop(beat)

    def drained() -> bool:
        sent = len(run.events("sent"))
        return sent <= len(run.events("applied")) + len(run.events("refused"))

    wait_until(drained, 30, f"the worker drains the queue\n{run.output()}")
    for proc in run.procs:  # the worker: every message was handled (its warm shutdown
        stop(proc, signal.SIGKILL)  # on amqp takes seconds; nothing is left to lose)


def check_invariants(run: Run, client: ef.Client) -> dict[str, int]:
    """Every sent slot applied once, contiguous slots, tokens never backwards; returns the
    counts (for the control, which must see a slot applied twice)."""
    effects = run.effects(client)
    per_slot = collections.Counter(slot for _, slot, _ in effects)
    sent = {e["slot"] for e in run.events("sent")}
    assert sent and set(per_slot) == sent, f"slots sent but never applied: {sent - set(per_slot)}"
    tokens = [token for _, _, token in effects]
    times = sorted(parse_time(slot.split("@", 1)[1]).timestamp() for slot in per_slot)
    gaps = [b - a for a, b in itertools.pairwise(times) if b - a != 1.0]
    assert not gaps, f"slots skipped: {gaps}"
    return {
        "slots": len(per_slot),
        "duplicates": sum(n - 1 for n in per_slot.values()),
        "backwards": sum(1 for a, b in itertools.pairwise(tokens) if b < a),
    }


def failover_seconds(run: Run, lost_at: float, new_pid: int) -> float:
    first = wait_until(lambda: run.events("sent", new_pid), TTL + 10, "the standby sends")[0]
    return float(first["time"]) - lost_at


# ---------------------------------------------------------------------------------


@pytest.mark.serial  # the standby sends within TTL + 2 s
@pytest.mark.parametrize("fencing", [True, False], ids=["fenced", "control"])
def test_a_beat_frozen_holding_a_message_past_its_ttl(
    run: Run, etcd_client: ef.Client, fencing: bool
) -> None:
    """Beat A freezes (SIGSTOP, by itself, after its leadership check and before its
    3rd publish) past its TTL; B takes over and sends the slot; A resumes and publishes
    its held message with the old token after B's: the worker refuses it as stale."""
    if not fencing:
        run.env["CELERY_TEST_FENCING"] = "0"
    a, b = start_two_beats(run, etcd_client, CELERY_TEST_PAUSE_AT="3")
    paused = wait_until(lambda: run.events("pausing", a.pid), 30, "beat A freezes")[0]
    held = paused["slot"]
    took = failover_seconds(run, paused["time"], b.pid)
    assert took <= TTL + 2, f"the standby sent {took:.2f}s after the leader froze"
    wait_until(lambda: held in {e["slot"] for e in run.events("applied")}, 20, "B's slot applied")
    a.send_signal(signal.SIGCONT)  # A publishes its held message now, after B's
    wait_until(lambda: run.events("resumed", a.pid), 10, "beat A resumes")
    time.sleep(2.5)  # B keeps sending; A (fenced off) must not
    finish(run, [a, b], etcd_client)
    counts = check_invariants(run, etcd_client)
    late = [e for e in run.events("sent", a.pid) if e["slot"] == held]
    assert len(late) == 1, "A published its held message after resuming"
    if fencing:
        assert counts == {"slots": counts["slots"], "duplicates": 0, "backwards": 0}, counts
        refused = [e for e in run.events("refused") if e["slot"] == held]
        assert [e["reason"] for e in refused] == ["stale"], refused
        assert (
            int(refused[0]["token"].split(";")[0])
            < etcd_client.fence(f"{run.ns}/workers").current()
        )
        assert not [e for e in run.events("sent", a.pid) if e["time"] > paused["time"] + 0.01][
            1:
        ], "A sent more than its held message after resuming"
    else:  # the control: without the mark and the slot key, the slot is applied twice
        assert counts["duplicates"] >= 1, f"the control saw no violation: {counts}"


@pytest.mark.serial  # the standby sends within TTL + 2 s
@pytest.mark.parametrize(
    ("fencing", "window"),
    [(True, None), (True, 0), (False, None)],
    ids=["fenced", "pruning", "control"],
)
def test_a_beat_killed_between_publish_and_record(
    run: Run, etcd_client: ef.Client, fencing: bool, window: int | None
) -> None:
    """Beat A is SIGKILLed right after publishing its 3rd slot, before recording it; B
    takes over, finds the slot unrecorded and sends it again: the worker's slot key
    applies it once (the resend is counted as a duplicate). ``pruning``: with a resend
    window of 0, B prunes the slot keys of A's slots at once — but not the unrecorded
    slot's, which B sends again."""
    if not fencing:
        run.env["CELERY_TEST_FENCING"] = "0"
    if window is not None:
        run.env["CELERY_TEST_CONF"] = json.dumps({"etcdfence_resend_window": window})
    a, b = start_two_beats(run, etcd_client, CELERY_TEST_KILL_AFTER="3")
    killed = wait_until(lambda: run.events("killing", a.pid), 30, "beat A dies")[0]
    took = failover_seconds(run, killed["time"], b.pid)
    assert took <= TTL + 2, f"the standby sent {took:.2f}s after the leader died"
    resent = wait_until(
        lambda: [e for e in run.events("sent", b.pid) if e["slot"] == killed["slot"]],
        10,
        "B resends the unrecorded slot",
    )
    assert resent
    time.sleep(1.5)
    finish(run, [a, b], etcd_client)
    counts = check_invariants(run, etcd_client)
    if fencing:
        assert counts == {"slots": counts["slots"], "duplicates": 0, "backwards": 0}, counts
        refused = [e for e in run.events("refused") if e["slot"] == killed["slot"]]
        assert [e["reason"] for e in refused] == ["duplicate"], refused
        if window == 0:  # A's recorded slots were pruned, the killed one kept
            keys = {kv.key.decode() for kv in etcd_client.get_prefix(f"/{run.ns}/slots/")}
            kept = {k.rsplit("/", 1)[1] for k in keys}
            a_slots = {e["slot"] for e in run.events("sent", a.pid)}
            assert killed["slot"] in kept and not (a_slots - {killed["slot"]}) & kept, kept
    else:
        assert counts["duplicates"] >= 1, f"the control saw no violation: {counts}"


def _supervised_beat(run: Run, election: str) -> subprocess.Popen[str]:
    out = open(run.log.with_suffix(".supervisor.out"), "w")  # noqa: SIM115
    beat = [sys.executable, "-m", "celery", "-A", "_celery_app", "beat", "-l", "info"]
    beat += ["--scheduler", "etcdfence.celery:LeaderScheduler", "--schedule", os.devnull]
    supervise = [sys.executable, "-m", "etcdfence", "run", election, "--id", "sup"]
    supervisor = start(
        [*supervise, "--ttl", str(TTL), "--", *beat],
        env=run.env,
        cwd=HERE,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    run.procs.append(supervisor)
    return supervisor


@pytest.mark.serial  # TTL-bound hand-overs and freezes on a loaded machine
def test_a_beat_under_etcdfence_run_takes_the_supervisors_token(
    run: Run, etcd_client: ef.Client
) -> None:
    """``etcdfence run NAME -- celery beat --scheduler ...``: the beat does not campaign
    itself; it stamps the supervisor's token, advances the workers' mark with it, and
    ends with the supervisor."""
    election = f"{run.ns}/beat"
    run.spawn("worker")
    supervisor = _supervised_beat(run, election)
    wait_until(lambda: len(run.events("applied")) >= 2, 30, f"slots applied\n{run.output()}")
    assert candidates(etcd_client, run) == 1, "only the supervisor campaigns"
    tokens = {e["token"] for e in run.events("sent")}
    assert len(tokens) == 1
    token = ef.FencingToken.from_text(tokens.pop())
    assert token.lock == election
    leader = etcd_client.leader(election)
    assert leader is not None and token.key == leader.key
    assert etcd_client.fence(f"{run.ns}/workers").current() == token.value
    finish(run, [supervisor], etcd_client)
    counts = check_invariants(run, etcd_client)
    assert counts["duplicates"] == 0 and counts["backwards"] == 0
    assert etcd_client.leader(election) is None, "the supervisor resigned"


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.mark.serial  # TTL-bound hand-overs and freezes on a loaded machine
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_supervised_beat_stops_publishing_at_its_lease_deadline(
    run: Run, etcd_client: ef.Client
) -> None:
    """``etcdfence run -- celery beat``: the whole tree freezes (a paused host) past the
    TTL, so the supervisor's lease expires; the beat resumes first, its supervisor and
    reaper still frozen (nothing kills it yet). It must publish no slot due after the
    freeze: it reads the supervisor's lease (``ETCDFENCE_LEASE``) once past its local
    deadline and finds it gone. (Before: the beat trusted the supervisor's kill and
    sent every slot due during the pause.)"""
    supervisor = _supervised_beat(run, f"{run.ns}/beat")
    sent = wait_until(lambda: run.events("sent"), 30, f"the beat sends\n{run.output()}")
    beat = sent[0]["pid"]
    reaper = _ppid(beat)
    assert _ppid(reaper) == supervisor.pid
    frozen = [supervisor.pid, reaper, beat]
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        froze = time.time()
        time.sleep(TTL + 2.5)  # the lease expires in etcd
        os.kill(beat, signal.SIGCONT)
        time.sleep(3.0)  # three 1 s slots due, nobody to kill the beat
        late = [
            e["slot"]
            for e in run.events("sent", beat)
            if parse_time(e["slot"].split("@", 1)[1]).timestamp() > froze
        ]
        assert late == [], f"the beat published past its lease: {late}\n{run.output()}"
        assert "etcdfence.celery_lease_gone" in run.output()
    finally:
        for pid in reversed(frozen):  # a resumed supervisor or reaper may kill the beat:
            with contextlib.suppress(ProcessLookupError):  # and the reaper reap it
                os.kill(pid, signal.SIGCONT)
    wait_until(  # the supervisor sees the loss and stops the frozen term's beat
        lambda: not Path(f"/proc/{beat}").exists(), 30, f"the beat is stopped\n{run.output()}"
    )


# -- a failover with the old term's tasks still queued ------------------------------------


def _term_token(run: Run, pid: int) -> int:
    return ef.FencingToken.from_text(run.events("sent", pid)[0]["token"]).value


def _settle(run: Run, a_pid: int, b_pid: int) -> set[str]:
    """With B still leading: wait until B sent (resent, or caught up on) every slot A
    sent, then until every slot sent so far is applied; then kill every process (a beat
    stopped here would leave its pending resends to the next leader). Returns the slots
    that had to be applied."""
    a_sent = {e["slot"] for e in run.events("sent", a_pid)}
    wait_until(
        lambda: a_sent <= {e["slot"] for e in run.events("sent", b_pid)},
        30,
        f"B resends A's slots\n{run.output()}",
    )
    sent = {e["slot"] for e in run.events("sent")}
    wait_until(
        lambda: sent <= {e["slot"] for e in run.events("applied")},
        30,
        f"every slot sent is applied\n{run.output()}",
    )
    for proc in run.procs:
        stop(proc, signal.SIGKILL)
    return sent


def _counts(run: Run, client: ef.Client, sent: set[str]) -> dict[str, int]:
    """check_invariants for a run cut short: the slots ``sent`` all applied, the applied
    slots contiguous; the number of duplicate applications."""
    per_slot = collections.Counter(slot for _, slot, _ in run.effects(client))
    assert sent <= set(per_slot), f"slots sent but never applied: {sent - set(per_slot)}"
    times = sorted(parse_time(slot.split("@", 1)[1]).timestamp() for slot in per_slot)
    gaps = [b - a for a, b in itertools.pairwise(times) if b - a != 1.0]
    assert not gaps, f"slots skipped: {gaps}"
    return {"slots": len(per_slot), "duplicates": sum(n - 1 for n in per_slot.values())}


@pytest.mark.parametrize(
    ("fault", "fencing"),
    [(signal.SIGTERM, True), (signal.SIGKILL, True), (signal.SIGKILL, False)],
    ids=["term", "kill", "control"],
)
def test_queued_tasks_of_the_previous_term_are_applied_once(
    run: Run, etcd_client: ef.Client, fault: signal.Signals, fencing: bool
) -> None:
    """No worker runs while beat A sends and records its slots; A stops (SIGTERM: it
    resigns) or dies (SIGKILL); B takes over and advances the workers' mark, so A's
    queued messages are refused as stale — and B resends A's recorded slots with its own
    token. The worker then starts on the backlog: every slot applied exactly once, none
    with A's token. The control (fencing off) applies A's messages and B's resends: a
    slot applied twice."""
    if not fencing:
        run.env["CELERY_TEST_FENCING"] = "0"
    run.env["CELERY_TEST_CONF"] = json.dumps({"etcdfence_catchup": 30})  # a slow machine
    a = run.spawn("beat")
    wait_until(lambda: len(run.events("sent", a.pid)) >= 3, 30, f"A sends\n{run.output()}")
    b = run.spawn("beat")
    wait_until(lambda: candidates(etcd_client, run) == 2, 30, "beat B campaigns")
    stop(a, fault, timeout=15)
    wait_until(lambda: len(run.events("sent", b.pid)) >= 2, 30, f"B sends\n{run.output()}")
    run.spawn("worker")  # the worker catches up on its backlog
    counts = _counts(run, etcd_client, _settle(run, a.pid, b.pid))
    if not fencing:
        assert counts["duplicates"] >= 1, f"the control saw no violation: {counts}"
        return
    assert counts["duplicates"] == 0, counts
    b_token = _term_token(run, b.pid)
    old = [(slot, token) for _, slot, token in run.effects(etcd_client) if token < b_token]
    assert old == [], f"effects applied with the old term's token: {old}"
    refused = collections.Counter(e["reason"] for e in run.events("refused"))
    assert set(refused) == {"stale"}, refused  # A's queued tasks (the resends: not applied)


@pytest.mark.parametrize("broker", ["amqp"], indirect=True)
def test_a_task_redelivered_after_a_failover_is_applied_once(
    run: Run, etcd_client: ef.Client
) -> None:
    """``task_acks_late``: the worker is SIGKILLed in the middle of a slot of A's term,
    RabbitMQ redelivers it (with A's token), A stops and B takes over in between. The
    redelivery is refused as stale and B's resend of the slot applies it, once."""
    run.env["CELERY_TEST_CONF"] = json.dumps(
        {"task_acks_late": True, "worker_prefetch_multiplier": 1, "etcdfence_catchup": 30}
    )
    run.env["CELERY_TEST_TASK_SLEEP"] = "2"
    a = run.spawn("beat")
    wait_until(lambda: run.events("sent", a.pid), 30, f"A sends\n{run.output()}")
    b = run.spawn("beat")
    wait_until(lambda: candidates(etcd_client, run) == 2, 30, "beat B campaigns")
    worker = run.spawn("worker")
    started = wait_until(lambda: run.events("started", worker.pid), 30, f"\n{run.output()}")
    worker.send_signal(signal.SIGKILL)  # mid-task: sleeping before its effect, unacked
    worker.wait(10)
    killed = started[0]["slot"]
    stop(a, signal.SIGTERM, timeout=15)
    wait_until(lambda: run.events("sent", b.pid), 30, f"B sends\n{run.output()}")
    run.spawn("worker")
    wait_until(
        lambda: [e for e in run.events("refused") if e["slot"] == killed],
        30,
        f"the redelivery is handled\n{run.output()}",
    )
    counts = _counts(run, etcd_client, _settle(run, a.pid, b.pid))
    assert counts["duplicates"] == 0, counts
    applied = [e for e in run.events("applied") if e["slot"] == killed]
    assert len(applied) == 1 and applied[0]["token"] == _term_token(run, b.pid), applied
    redelivered = [e for e in run.events("refused") if e["slot"] == killed]
    assert "stale" in {e["reason"] for e in redelivered}, redelivered


# -- the beat's elector never dies silently -----------------------------------------------


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_beat_whose_advance_hook_failed_once_campaigns_again(
    run: Run, etcd_client: ef.Client
) -> None:
    """The ``etcdfence_advance`` hook raises ``ConnectionError`` at the beat's first
    election (its store briefly down): the term is given up and the beat campaigns
    again, advances and sends."""
    run.env["CELERY_TEST_ADVANCE"] = "fail:1"
    beat = run.spawn("beat")
    wait_until(lambda: run.events("advance_failed", beat.pid), 30, f"fails\n{run.output()}")
    sent = wait_until(lambda: run.events("sent", beat.pid), 15, f"sends\n{run.output()}")
    advances = run.events("advance", beat.pid)
    assert len(advances) == 2 and advances[1]["token"] > advances[0]["token"], advances
    assert ef.FencingToken.from_text(sent[0]["token"]).value == advances[1]["token"]
    assert beat.poll() is None


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_beat_whose_elector_thread_died_exits_non_zero(run: Run, etcd_client: ef.Client) -> None:
    """The advance hook raises ``SystemExit``, which ends the elector thread: the beat
    process exits with a non-zero status (for a supervisor to restart it) instead of
    living on without ever scheduling again."""
    run.env["CELERY_TEST_ADVANCE"] = "exit"
    beat = run.spawn("beat")
    wait_until(lambda: run.events("advance", beat.pid), 30, f"elected\n{run.output()}")
    code = beat.wait(15)
    assert code != 0, run.output()
    assert "ElectorDiedError" in run.output()
    assert run.events("sent", beat.pid) == []


# -- the resend window: what was SENT, by send time ---------------------------------------


def _slots(run: Run, kind: str, pid: int | None = None) -> set[str]:
    return {e["slot"] for e in run.events(kind, pid)}


def _drain(run: Run, expect: set[str], timeout: float = 20) -> set[str]:
    """Start a worker; wait until ``expect`` is applied or the queue went quiet (4 s
    without any event); return the slots applied."""
    run.spawn("worker")
    deadline = time.monotonic() + timeout
    last, quiet = -1, 0
    while time.monotonic() < deadline and not expect <= _slots(run, "applied"):
        n = len(run.events())
        quiet = quiet + 1 if n == last else 0
        if quiet >= 8:
            break
        last = n
        time.sleep(0.5)
    return _slots(run, "applied")


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_two_failovers_keep_the_slots_the_middle_term_resent(
    run: Run, etcd_client: ef.Client
) -> None:
    """A sends (no worker up), dies; B takes over and resends A's unapplied slots with
    B's token, recording them as sent again. B resigns; C advances the mark (B's
    resends now stale) and resends every slot sent within the window — A's included,
    though B's own slots outnumber ``etcdfence_catchup`` (2) — so the worker applies
    them all. (Review round 2: resends were not recorded and ``catchup`` bounded them.)"""
    run.env["CELERY_TEST_CONF"] = json.dumps({"etcdfence_catchup": 2})
    a = run.spawn("beat")
    wait_until(lambda: len(run.events("sent", a.pid)) >= 3, 30, f"A sends\n{run.output()}")
    b = run.spawn("beat")
    wait_until(lambda: candidates(etcd_client, run) == 2, 30, "B campaigns")
    stop(a, signal.SIGKILL, timeout=15)
    a_sent = _slots(run, "sent", a.pid)
    wait_until(  # B resent A's slots (same slot ids, B's token) and sent slots of its own
        lambda: (
            len(_slots(run, "sent", b.pid) - a_sent) >= 2 and _slots(run, "sent", b.pid) & a_sent
        ),
        30,
        f"B resends and sends\n{run.output()}",
    )
    c = run.spawn("beat")
    wait_until(lambda: candidates(etcd_client, run) == 2, 30, "C campaigns")
    b_resent = _slots(run, "sent", b.pid) & a_sent
    stop(b, signal.SIGTERM, timeout=15)  # B resigns: C leads at once
    wait_until(lambda: len(run.events("sent", c.pid)) >= 2, 30, f"C sends\n{run.output()}")
    applied = _drain(run, b_resent)
    lost = sorted(b_resent - applied)
    assert not lost, (
        f"slots A sent and B resent, never applied after C took over: {lost}; "
        f"C sent {sorted(_slots(run, 'sent', c.pid))}"
    )


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_after_a_schedule_change_only_sent_slots_are_resent(
    run: Run, etcd_client: ef.Client
) -> None:
    """A runs a 2 s entry (slots at even seconds) and resigns; B starts with the entry
    changed to 1 s. B resends only what A sent (its SENT records), never the odd
    seconds up to A's last slot, which no beat sent. (Review round 2: the resend list
    was recomputed from the current schedule.)"""
    run.env["CELERY_TEST_CONF"] = json.dumps({"etcdfence_catchup": 30})
    two_seconds = {"tick": {"task": "_celery_app.tick", "schedule": 2.0}}
    conf = {"beat_schedule": two_seconds, "etcdfence_catchup": 30}
    a = run.spawn("beat", CELERY_TEST_CONF=json.dumps(conf))
    wait_until(lambda: len(run.events("sent", a.pid)) >= 3, 30, f"A sends\n{run.output()}")
    stop(a, signal.SIGTERM, timeout=15)
    a_sent = _slots(run, "sent", a.pid)
    # A's last *recorded* slot: B resumes after it. (A stop between a publish and its
    # record leaves the last sent slot unrecorded; B then rightly sends the new
    # schedule's slots after the recorded one — one CI run saw that.)
    state = etcd_client.get(f"/{run.ns}/schedule/tick")
    assert state is not None, run.output()
    a_last = parse_time(json.loads(state.value)["slot"])
    b = run.spawn("beat")  # the 1 s schedule of _celery_app
    wait_until(lambda: len(run.events("sent", b.pid)) >= 4, 30, f"B sends\n{run.output()}")
    b_sent = _slots(run, "sent", b.pid)
    assert b_sent & a_sent, f"B resent none of A's unapplied slots: {sorted(b_sent)}"
    phantom = sorted(s for s in b_sent - a_sent if parse_time(s.split("@", 1)[1]) <= a_last)
    applied = _drain(run, set(phantom))
    assert not phantom, (
        f"B 'resent' slots at or before A's last recorded slot that no beat sent: {phantom}; "
        f"applied: {sorted(set(phantom) & applied)}; A sent {sorted(a_sent)}"
    )


def _hand_over(run: Run, client: ef.Client, leader: Any) -> tuple[Any, float]:
    """Start beat B behind ``leader``, stop ``leader`` (SIGTERM: it resigns, B leads at
    once); return B and the time of the hand-over once B sent."""
    b = run.spawn("beat")
    wait_until(lambda: candidates(client, run) == 2, 30, "B campaigns")
    stop(leader, signal.SIGTERM, timeout=15)
    cut = time.time()
    wait_until(lambda: run.events("sent", b.pid), 30, f"B sends\n{run.output()}")
    return b, cut


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_catch_up_slots_sent_just_before_a_failover_are_resent(
    run: Run, etcd_client: ef.Client
) -> None:
    """The resend window counts from when a slot was SENT, not when it was scheduled:
    a beat catching up after a 12 s outage sends slots scheduled long ago; it fails
    over seconds later (no worker through the queue yet) and the next leader resends
    those copies, refused as stale otherwise. (Window 5 s, catch-up 30, 1 s entry.)"""
    window = 5.0
    run.env["CELERY_TEST_CONF"] = json.dumps(
        {"etcdfence_catchup": 30, "etcdfence_resend_window": window}
    )
    a = run.spawn("beat")
    wait_until(lambda: len(run.events("sent", a.pid)) >= 2, 30, f"A sends\n{run.output()}")
    stop(a, signal.SIGKILL, timeout=15)
    time.sleep(12)  # every beat down: an outage (a deploy)
    a2 = run.spawn("beat")
    wait_until(lambda: len(run.events("sent", a2.pid)) >= 10, 30, f"A2 catches up\n{run.output()}")
    _b, cut = _hand_over(run, etcd_client, a2)
    a2_sent = {e["slot"]: e["time"] for e in run.events("sent", a2.pid)}
    applied = _drain(run, set(a2_sent))
    lost = sorted(s for s in a2_sent if s not in applied)
    recent = [s for s in lost if cut - a2_sent[s] < window]
    assert not recent, (
        f"slots published less than {window} s before the failover, never applied: {recent} "
        f"(sent at -{[round(cut - a2_sent[s], 1) for s in recent]} s)"
    )
    # B, still leading and recording a slot a second, prunes the SENT records past the window
    records = etcd_client.get_prefix(f"/{run.ns}/sent/")
    now = time.time()
    old = [kv.key for kv in records if now - json.loads(kv.value)["sent"] > window + 2.5]
    assert records and not old, f"SENT records kept past the {window} s window: {old}"


# -- publisher confirms on RabbitMQ ------------------------------------------------------


@pytest.mark.parametrize("broker", ["amqp"], indirect=True)
def test_a_publish_rabbitmq_refused_is_not_recorded_as_sent(
    run: Run, etcd_client: ef.Client
) -> None:
    """The test's queue refuses every publish (``x-max-length`` 0, ``reject-publish``)
    and the app leaves ``confirm_publish`` unset: the beat turns publisher confirms on,
    so each refused publish raises and is tried again on a later tick — never recorded
    as sent (no SENT record, no last slot), so a new leader would still send it.
    (Without confirms the dropped publish was recorded as sent: lost for good.)"""
    run.env["CELERY_TEST_QUEUE_ARGS"] = json.dumps(
        {"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    run.env["CELERY_TEST_CONF"] = json.dumps(
        {"broker_transport_options": {}, "task_publish_retry_policy": {"max_retries": 0}}
    )
    try:
        beat = run.spawn("beat")
        wait_until(lambda: len(run.events("sent", beat.pid)) >= 3, 30, f"tries\n{run.output()}")
        assert etcd_client.get_prefix(f"/{run.ns}/sent/") == [], "a refused publish recorded"
        assert etcd_client.get_prefix(f"/{run.ns}/schedule/") == []
        assert "etcdfence.celery_publish_failed" in run.output()
        assert beat.poll() is None
    finally:
        _delete_exchange(run.broker, run.env["CELERY_TEST_QUEUE"])


@pytest.mark.parametrize("broker", ["amqp"], indirect=True)
def test_a_beat_on_rabbitmq_with_confirms_off_does_not_start(
    run: Run, etcd_client: ef.Client
) -> None:
    """``confirm_publish`` set to False on RabbitMQ: the beat refuses to start, with an
    error naming the setting (a dropped publish would be recorded as sent)."""
    run.env["CELERY_TEST_CONF"] = json.dumps(
        {"broker_transport_options": {"confirm_publish": False}}
    )
    beat = run.spawn("beat")
    code = beat.wait(30)
    assert code != 0, run.output()
    assert "confirm_publish" in run.output() and "CeleryConfigError" in run.output()
    assert run.events("sent", beat.pid) == []


def _delete_exchange(url: str, name: str) -> None:
    from kombu.connection import Connection

    with Connection(url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]
        conn.default_channel.exchange_delete(name)


# -- pruning the workers' slot keys ------------------------------------------------------


@pytest.mark.serial  # TTL-bound hand-overs and freezes on a loaded machine
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_the_next_leader_prunes_the_old_terms_slot_keys_and_none_applies_again(
    run: Run, etcd_client: ef.Client
) -> None:
    """Beat A sends slots, the worker applies them (one slot key each); A resigns and B
    leads. B deletes the slot keys of A's slots sent longer than the resend window
    (3 s) before it took over — no message a worker accepts can name them any more —
    and keeps its own and the recent ones. A late copy of a pruned slot with A's token
    (the old term's message) is refused as stale: every slot applied exactly once.
    (Before: slot keys were never deleted, one per slot forever.)"""
    window = 3.0
    run.env["CELERY_TEST_CONF"] = json.dumps(
        {"etcdfence_catchup": 30, "etcdfence_resend_window": window}
    )
    run.spawn("worker")
    a = run.spawn("beat")
    wait_until(lambda: len(run.events("applied")) >= 7, 40, f"A's slots apply\n{run.output()}")
    b, took_over = _hand_over(run, etcd_client, a)
    last_sent = {e["slot"]: e["time"] for e in run.events("sent", a.pid)}
    old = {slot for slot, at in last_sent.items() if at < took_over - window - 1.0}
    assert len(old) >= 2, last_sent
    slots = f"/{run.ns}/slots/"

    def keys() -> set[str]:
        return {kv.key.decode()[len(slots) :] for kv in etcd_client.get_prefix(slots)}

    wait_until(lambda: not old & keys(), 15, f"B prunes A's old slot keys\n{run.output()}")
    b_token = _term_token(run, b.pid)
    b_applied = wait_until(
        lambda: {e["slot"] for e in run.events("applied") if e["token"] == b_token},
        15,
        f"B's slots apply\n{run.output()}",
    )
    assert b_applied <= keys(), "B pruned slot keys of its own term"
    recent = {slot for slot, at in last_sent.items() if at > took_over - window + 1.0}
    wait_until(
        lambda: recent <= _slots(run, "applied"), 20, f"A's recent slots apply\n{run.output()}"
    )
    assert recent <= keys(), f"slot keys pruned within the resend window: {recent - keys()}"
    a_token = run.events("sent", a.pid)[0]["token"]
    victim = sorted(old)[0]
    _send_by_hand(run, a_token, victim)  # the old term's late copy of a pruned slot
    wait_until(
        lambda: [e for e in run.events("refused") if e["slot"] == victim],
        20,
        f"the late copy is refused\n{run.output()}",
    )
    assert [e["reason"] for e in run.events("refused") if e["slot"] == victim] == ["stale"]
    per_slot = collections.Counter(slot for _, slot, _ in run.effects(etcd_client))
    assert per_slot[victim] == 1 and max(per_slot.values()) == 1, per_slot


def _send_by_hand(run: Run, token: str, slot: str) -> None:
    from celery import Celery

    app = Celery("etcdfence_test", broker=run.broker)
    try:
        app.send_task(
            "_celery_app.tick",
            queue=run.env["CELERY_TEST_QUEUE"],
            headers={"fencing-token": token, "etcdfence-slot": slot},
        )
    finally:
        app.close()

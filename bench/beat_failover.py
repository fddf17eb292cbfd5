"""Celery beat failover: ``etcdfence.celery:LeaderScheduler`` vs celery-redbeat's
``redbeat.RedBeatScheduler``, side by side on one Redis broker (issue #26, "Measured").

Each round runs two real ``celery beat`` processes of one scheduler with one entry every
``INTERVAL`` = 1 s, and one fault on the leading beat:

* ``kill``: SIGKILL (a crashed host);
* ``stop``: SIGSTOP for TTL + 2 s, then SIGCONT (a paused VM, a GC or swap storm): the
  lock runs out while the leader is frozen, the standby takes over, the old leader wakes
  up believing it still leads. The signal lands at a random moment, which is nearly
  always while the beat sleeps between ticks;
* ``publish-stop``: the same pause, but *inside* a publish — after the leader's schedule
  decided to send and before the message left (the beat stops itself in
  ``before_task_publish`` once the bench arms it; ``bench/_beat_app.py``): a frozen beat
  holding a message, which it sends when it wakes up. This is the window a lock without
  a token cannot close; a random SIGSTOP rarely hits it (a publish takes milliseconds
  of each 1 s tick).

The lock's lifetime is the same for both: TTL = 3 s. redbeat: ``redbeat_lock_timeout = 3``;
the leader extends the lock on every tick, at most every ``beat_max_loop_interval`` = 1 s,
and the standby retries the lock (redis-py's ``Lock.acquire(sleep=max_interval)``) every
1 s. etcdfence: a session of TTL 3 s, kept alive every TTL/3 = 1 s, the standby watching
the leader's key. So on both sides the lock was last renewed ≤ 1 s before the fault and
expires ≤ 3 s after it; the standby finds it free within ≤ 1 s (redbeat's poll) or at
once (etcd's watch; etcd's lessor revokes expired leases every 0.5 s).

One ``celery worker`` (solo pool) serves both schedulers' queues for the whole run; it
logs every message it *receives* (``task_received``) and every effect it *applies*, to
Redis lists (``bench/_beat_app.py``). Every beat stamps ``bench-sent`` (wall clock at
publish) into its messages' headers; ``origin`` (``gen<pid>@host``) says which beat
sent it. Measured per round:

* failover = fault → ``bench-sent`` of the first message the *other* beat published;
* duplicates: etcdfence — slots (by the slot id header) published more than once;
  redbeat — its messages carry no slot, so a duplicate is two messages of the entry whose
  send times fall in the same 1 s slot (``floor(sent / INTERVAL)``; one beat never sends
  twice in one slot: celery's interval schedule waits a full interval after each send);
* stale sends: messages the old leader published after the fault (after its SIGCONT);
* applied duplicates at the worker: for etcdfence the fenced task (a slot's effect applied
  twice; target 0); redbeat's task is a plain task (nothing can refuse), so every
  duplicate received is applied.

Rounds interleave ABAB (the scheduler order flips every round, faults alternate) so the
noise of a shared machine hits both alike. Each round uses fresh keys (redbeat's schedule
and lock, etcdfence's election and schedule state); the leader is the beat started first,
the standby starts once the leader has published, and the fault lands a random 0.1 s …
1.1 s after the standby settled (a random point of the tick and keepalive cycles).

    python -m bench.beat_failover [--quick] [--rounds 5] [--faults kill,stop]
                                  [--schedulers redbeat,etcdfence] [--render-only]

Redis at ``127.0.0.1:6379`` database 14 must answer; every key of the run is under a
fresh ``bench-beat-<hex>`` prefix and deleted afterwards.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import (
    ROOT,
    Json,
    Part,
    Stopwatch,
    md_table,
    median,
    pyplot,
    python_child_env,
    ratio,
    run_topic,
    save_data,
    save_plot,
    start_etcd,
    topic_args,
)
from etcdfence.testing import procs

BROKER = "redis://127.0.0.1:6379/14"
TTL = 3
INTERVAL = 1.0
STOP_EXTRA = 2.0  # SIGSTOP lasts TTL + this
SETTLE = 2.0  # after the standby's "beat: Starting...", before the fault
OBSERVE = 4.0  # after the takeover (and the SIGCONT), watching for stale sends
DEADLINE = 30.0  # no takeover within this of the fault: the round failed
SCHEDULERS = {
    "redbeat": "redbeat.RedBeatScheduler",
    "etcdfence": "etcdfence.celery:LeaderScheduler",
}
LABEL = {"redbeat": "celery-redbeat", "etcdfence": "etcdfence"}
FAULTS = ("kill", "stop", "publish-stop")
FAULT_TEXT = {
    "kill": "leader SIGKILLed",
    "stop": f"leader SIGSTOPped for TTL + {STOP_EXTRA:g} s",
    "publish-stop": f"leader SIGSTOPped inside a publish for TTL + {STOP_EXTRA:g} s",
}


def pid_of(origin: str | None) -> int | None:
    """The PID in Celery's ``origin`` header (``gen<pid>@<host>``)."""
    if not origin or not origin.startswith("gen"):
        return None
    try:
        return int(origin[3:].split("@", 1)[0])
    except ValueError:
        return None


class Log:
    """One of the worker's Redis lists (received or applied), read incrementally."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self.records: list[Json] = []

    def poll(self) -> list[Json]:
        raw = self.client.lrange(self.key, len(self.records), -1)
        self.records += [json.loads(item) for item in raw]
        return self.records

    def of(self, *beats: Beat) -> list[Json]:
        """The records of messages these beats sent (a PID can come back in a later
        round: a record counts only if it was sent after that beat started)."""
        started = {beat.pid: beat.started for beat in beats}

        def mine(record: Json) -> bool:
            since = started.get(pid_of(record.get("origin")) or 0, math.inf)
            return float(record.get("bench-sent") or 0) >= since

        return [r for r in self.poll() if mine(r)]


@dataclass
class Beat:
    """One ``celery beat`` process and its output."""

    proc: subprocess.Popen[str]
    reader: procs.LineReader
    log: Path
    started: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int | None:
        code = procs.stop(self.proc, signal.SIGTERM, timeout=10)
        self.log.write_text("\n".join(self.reader.join(2)) + "\n")
        return code


@dataclass
class Run:
    """What every round of one run shares: the prefix, etcd, the worker, the logs."""

    prefix: str
    etcd: str
    tmp: Path
    client: Any
    received: Log = field(init=False)
    applied: Log = field(init=False)
    refused: Log = field(init=False)
    paused: Log = field(init=False)
    worker: subprocess.Popen[str] | None = None

    def __post_init__(self) -> None:
        self.received = Log(self.client, self.prefix + ":received")
        self.applied = Log(self.client, self.prefix + ":applied")
        self.refused = Log(self.client, self.prefix + ":refused")
        self.paused = Log(self.client, self.prefix + ":paused")

    def env(self, scheduler: str, round_prefix: str = "", pause_key: str = "") -> dict[str, str]:
        env = python_child_env()
        env.update(
            BENCH_BEAT_BROKER=BROKER,
            BENCH_BEAT_PREFIX=self.prefix,
            BENCH_BEAT_SCHEDULER=scheduler,
            BENCH_BEAT_ROUND=round_prefix or self.prefix + ":none",
            BENCH_BEAT_TTL=str(TTL),
            BENCH_BEAT_INTERVAL=str(INTERVAL),
            BENCH_BEAT_ETCD=self.etcd,
            BENCH_BEAT_PAUSE_KEY=pause_key,
        )
        return env

    def start_worker(self, schedulers: list[str]) -> None:
        queues = ",".join(f"{self.prefix}-{s}" for s in schedulers)
        args = [sys.executable, "-m", "celery", "-A", "bench._beat_app", "worker"]
        args += ["--pool", "solo", "-Q", queues, "-l", "warning"]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        out = (self.tmp / "worker.log").open("w")
        self.worker = procs.start(args, env=self.env(schedulers[0]), stdout=out, stderr=out)

    def start_beat(self, scheduler: str, round_prefix: str, name: str, fault: str) -> Beat:
        args = [sys.executable, "-m", "celery", "-A", "bench._beat_app", "beat"]
        args += ["-S", SCHEDULERS[scheduler], "-l", "info", "--max-interval", str(int(INTERVAL))]
        args += ["-s", str(self.tmp / f"{name}.schedule")]
        proc = procs.start(
            args,
            env=self.env(scheduler, round_prefix, _pause_key(round_prefix, fault)),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        return Beat(proc, procs.LineReader(proc.stdout), self.tmp / f"{name}.log")

    def cleanup(self) -> int:
        if self.worker is not None:
            procs.stop(self.worker, signal.SIGTERM, timeout=15)
        keys = list(self.client.scan_iter(match=self.prefix + "*", count=1000))
        if keys:
            self.client.delete(*keys)
        return len(keys)


# --------------------------------------------------------------------------- one round


def _first_from(run: Run, beat: Beat, timeout: float) -> Json:
    def first() -> Json | None:
        got = run.received.of(beat)
        if got:
            return min(got, key=lambda r: float(r["bench-sent"]))
        if beat.proc.poll() is not None:
            raise AssertionError(f"beat {beat.pid} exited: {beat.reader.lines[-15:]}")
        return None

    return procs.wait_until(first, timeout, f"a message from beat {beat.pid}", 0.05)


def _pause_key(round_prefix: str, fault: str) -> str:
    """The key that arms a ``publish-stop`` fault ("" for the other faults)."""
    return round_prefix + ":pause" if fault == "publish-stop" else ""


def _start_pair(run: Run, scheduler: str, round_prefix: str, fault: str) -> tuple[Beat, Beat]:
    """The leader (started first, published once), then the standby, settled."""
    name = round_prefix.rsplit(":", 1)[-1]
    leader = run.start_beat(scheduler, round_prefix, name + "-a", fault)
    try:
        _first_from(run, leader, DEADLINE)
        standby = run.start_beat(scheduler, round_prefix, name + "-b", fault)
    except BaseException:
        leader.stop()
        raise
    try:
        standby.reader.wait_for(lambda line: "beat: Starting" in line, DEADLINE)
        time.sleep(SETTLE)
    except BaseException:
        leader.stop()
        standby.stop()
        raise
    return leader, standby


def _inject(run: Run, leader: Beat, fault: str, pause_key: str) -> float:
    """Fault the leader; the wall-clock time of the fault."""
    if fault == "publish-stop":  # armed now; the leader stops itself in its next publish
        run.client.set(pause_key, "1")
        paused = procs.wait_until(
            lambda: run.paused.of(leader), DEADLINE, "the leader's pause", 0.02
        )
        return float(paused[0]["paused"])
    time.sleep(random.uniform(0.1, INTERVAL + 0.1))
    faulted = time.time()
    leader.proc.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    return faulted


def _fault_and_watch(run: Run, leader: Beat, standby: Beat, fault: str, pause_key: str) -> Json:
    """Fault the leader; watch until the standby published and OBSERVE more seconds
    passed (after the SIGCONT too); the times of the fault, the SIGCONT, the takeover."""
    faulted = _inject(run, leader, fault, pause_key)
    resume_at = faulted + TTL + STOP_EXTRA if fault != "kill" else None
    resumed = None
    takeover: float | None = None
    deadline = faulted + DEADLINE
    while time.time() < deadline:
        now = time.time()
        if resume_at is not None and resumed is None and now >= resume_at:
            leader.proc.send_signal(signal.SIGCONT)
            resumed = time.time()
        if takeover is None:
            got = run.received.of(standby)
            if got:
                takeover = min(float(r["bench-sent"]) for r in got)
        # watch OBSERVE s past the takeover, and past the SIGCONT of a stopped leader
        pending = takeover is None or (resume_at is not None and resumed is None)
        if not pending and now >= max(takeover or 0.0, resumed or 0.0) + OBSERVE:
            break
        time.sleep(0.05)
    if resume_at is not None and resumed is None:
        leader.proc.send_signal(signal.SIGCONT)
        resumed = time.time()
    return {"faulted": faulted, "resumed": resumed, "takeover": takeover}


def _duplicates(records: list[Json], slot_header: str | None) -> dict[str, int]:
    """Slots published (or applied) more than once: by slot id where the messages carry
    one, else by the 1 s slot of the send time."""
    by_bucket = Counter(math.floor(float(r["bench-sent"]) / INTERVAL) for r in records)
    out = {"by_send_slot": sum(1 for n in by_bucket.values() if n > 1)}
    if slot_header is not None:
        by_slot = Counter(str(r.get(slot_header)) for r in records if r.get(slot_header))
        out["by_slot_id"] = sum(1 for n in by_slot.values() if n > 1)
    return out


def analyse(run: Run, leader: Beat, standby: Beat, times: Json, slot_header: str | None) -> Json:
    """One round's figures from the worker's logs (only this round's two beats)."""
    received = run.received.of(leader, standby)
    applied = run.applied.of(leader, standby)
    refused = run.refused.of(leader, standby)
    faulted = float(times["faulted"])
    takeover = times["takeover"]
    stale = [r for r in received if pid_of(r["origin"]) == leader.pid and r["bench-sent"] > faulted]
    return {
        "failover_s": None if takeover is None else round(takeover - faulted, 3),
        "published": len(received),
        "applied": len(applied),
        "stale_sends": len(stale),
        "duplicates": _duplicates(received, slot_header),
        "applied_duplicates": _duplicates(applied, slot_header),
        "refused": len(refused),
        "refused_reasons": dict(Counter(str(r.get("reason")) for r in refused)),
        "unaccounted": len(received) - len(applied) - len(refused),
    }


def one_round(run: Run, scheduler: str, fault: str, rnd: int, slot_header: str | None) -> Json:
    """Two beats of ``scheduler``, one ``fault`` on the leader; the round's figures."""
    round_prefix = f"{run.prefix}:r{rnd}-{fault}-{scheduler}"
    leader, standby = _start_pair(run, scheduler, round_prefix, fault)
    try:
        times = _fault_and_watch(run, leader, standby, fault, _pause_key(round_prefix, fault))
        time.sleep(0.5)  # the worker logs what is still in flight
    finally:
        alive = leader.proc.poll() is None
        codes = {"leader": leader.stop(), "standby": standby.stop()}
    out = analyse(run, leader, standby, times, slot_header)
    out.update(round=rnd, scheduler=scheduler, fault=fault, exit_codes=codes)
    out["old_leader_after_resume"] = _after_resume(leader, fault, alive)
    return out


def _after_resume(leader: Beat, fault: str, alive: bool) -> str:
    """What the resumed leader did, for the report."""
    if fault == "kill":
        return "killed"
    lines = leader.reader.lines
    if any("LockNotOwnedError" in line for line in lines):
        return "exited: redis LockNotOwnedError on its next lock extend"
    said = ""
    for line in lines:
        if "lease_lost" in line and "reason=" in line:
            said = "lease lost: " + line.split("reason=", 1)[1].split("(", 1)[0].strip()
        elif "term_ended" in line or "fenced_off" in line:
            said = said or line.split("]", 1)[-1].strip()[:120]
    state = "kept running as a standby" if alive else "exited"
    return state + (f" ({said})" if said else "")


# --------------------------------------------------------------------------- the run


def slot_header_of(scheduler: str) -> str | None:
    """The header etcdfence puts a task's slot id in (read from etcdfence.celery)."""
    if scheduler != "etcdfence":
        return None
    from etcdfence import celery as ef_celery

    return str(ef_celery.SLOT_HEADER)


def available(scheduler: str) -> str | None:
    """Why a scheduler cannot run here (None: it can)."""
    try:
        if scheduler == "redbeat":
            import redbeat  # type: ignore[import-untyped]  # noqa: F401
        else:
            from etcdfence import celery as ef_celery

            ef_celery.LeaderScheduler  # noqa: B018 - the attribute must exist
    except (ImportError, AttributeError) as exc:
        return f"{exc.__class__.__name__}: {exc}"
    return None


def measure(quick: bool, *, rounds: int | None, faults: list[str], schedulers: list[str]) -> Json:
    """Rounds × faults × schedulers, interleaved; writes ``results/beat_failover.json``."""
    import redis

    rounds = rounds or (2 if quick else 4)
    clock = Stopwatch()
    missing = {s: why for s in schedulers if (why := available(s)) is not None}
    runnable = [s for s in schedulers if s not in missing]
    for name, why in missing.items():
        print(f"  {name}: not measured ({why})", flush=True)
    samples: list[Json] = []
    prefix = f"bench-beat-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(BROKER)
    with tempfile.TemporaryDirectory(prefix="bench-beat-") as tmp, start_etcd() as server:
        run = Run(prefix, server.endpoint, Path(tmp), client)
        try:
            run.start_worker(runnable)
            for rnd in range(rounds):
                for i, fault in enumerate(faults):
                    order = runnable if (rnd + i) % 2 == 0 else list(reversed(runnable))
                    for scheduler in order:
                        got = one_round(run, scheduler, fault, rnd, slot_header_of(scheduler))
                        samples.append(got)
                        _progress(got)
        finally:
            print(f"  cleaned up {run.cleanup()} keys under {prefix}", flush=True)
            client.close()
    data: Json = {
        "ttl_s": TTL,
        "interval_s": INTERVAL,
        "stop_s": TTL + STOP_EXTRA,
        "rounds": rounds,
        "faults": faults,
        "schedulers": runnable,
        "not_measured": missing,
        "slot_header": {s: slot_header_of(s) for s in runnable},
        "samples": samples,
        "summary": summarise(samples, runnable, faults),
    }
    return save_data("beat_failover", data, clock)


def _progress(got: Json) -> None:
    failover = got["failover_s"]
    shown = "none" if failover is None else f"{failover:.2f}s"
    print(
        f"  round {got['round']} {got['fault']:<4} {got['scheduler']:<9} failover {shown}"
        f"  published {got['published']} stale {got['stale_sends']}"
        f"  dup {got['duplicates']} applied dup {got['applied_duplicates']}"
        f"  old leader: {got['old_leader_after_resume']}",
        flush=True,
    )


def _dup_of(sample: Json, which: str, scheduler: str) -> int:
    counts = sample[which]
    return int(counts["by_slot_id"] if scheduler == "etcdfence" else counts["by_send_slot"])


def summarise(samples: list[Json], schedulers: list[str], faults: list[str]) -> Json:
    """Median / min / max failover, duplicates per failover, per fault and scheduler."""
    out: Json = {}
    for fault in faults:
        out[fault] = {}
        for scheduler in schedulers:
            mine = [s for s in samples if s["fault"] == fault and s["scheduler"] == scheduler]
            times = [float(s["failover_s"]) for s in mine if s["failover_s"] is not None]
            n = max(len(mine), 1)
            out[fault][scheduler] = {
                "failover_samples_s": times,
                "no_takeover": len(mine) - len(times),
                "median_s": round(median(times), 3) if times else None,
                "min_s": round(min(times), 3) if times else None,
                "max_s": round(max(times), 3) if times else None,
                "duplicates": sum(_dup_of(s, "duplicates", scheduler) for s in mine),
                "duplicates_per_failover": round(
                    sum(_dup_of(s, "duplicates", scheduler) for s in mine) / n, 2
                ),
                "duplicates_by_send_slot": sum(s["duplicates"]["by_send_slot"] for s in mine),
                "applied_duplicates": sum(
                    _dup_of(s, "applied_duplicates", scheduler) for s in mine
                ),
                "stale_sends": sum(int(s["stale_sends"]) for s in mine),
                "refused": sum(int(s["refused"]) for s in mine),
                "refused_reasons": dict(
                    sum((Counter(s["refused_reasons"]) for s in mine), Counter())
                ),
                "rounds": len(mine),
            }
    return out


# --------------------------------------------------------------------------- rendering


def _span(c: Json) -> str:
    if c["median_s"] is None:
        return "no takeover"
    return f"{c['median_s']:.2f} s ({c['min_s']:.2f} … {c['max_s']:.2f})"


def _rows(data: Json, fault: str) -> list[list[str]]:
    rows = []
    for scheduler in data["schedulers"]:
        c = data["summary"][fault][scheduler]
        fenced = scheduler == "etcdfence"
        rows.append(
            [
                LABEL[scheduler],
                _span(c),
                " ".join(f"{x:.2f}" for x in c["failover_samples_s"]),
                f"{c['duplicates']} ({c['duplicates_per_failover']:g} per failover)"
                + (" by slot id" if fenced else " by send slot"),
                str(c["stale_sends"]),
                f"{c['applied_duplicates']}" + (_refusals(c) if fenced else ""),
            ]
        )
    return rows


def _load(data: Json, key: str) -> str:
    return " / ".join(str(x) for x in data.get(key) or []) or "?"


def _refusals(c: Json) -> str:
    reasons = ", ".join(f"{why} {n}" for why, n in sorted(c["refused_reasons"].items()))
    return f" ({c['refused']} refused" + (f": {reasons})" if reasons else ")")


def _ratio_line(data: Json, fault: str) -> str:
    summary = data["summary"][fault]
    if not {"etcdfence", "redbeat"} <= set(summary):
        return ""
    ours, theirs = summary["etcdfence"]["median_s"], summary["redbeat"]["median_s"]
    if not ours or not theirs:
        return ""
    return f"Median failover, etcdfence ÷ redbeat: **{ratio(ours / theirs)}**."


def _plot(data: Json) -> str:
    fig, ax = pyplot().subplots(figsize=(6.4, 4))
    colors = {"redbeat": "tab:orange", "etcdfence": "tab:blue"}
    faults = data["faults"]
    for i, fault in enumerate(faults):
        for j, scheduler in enumerate(data["schedulers"]):
            ys = data["summary"][fault][scheduler]["failover_samples_s"]
            x = i + (j - 0.5) * 0.3
            first = i == 0
            ax.scatter(
                [x] * len(ys),
                ys,
                color=colors[scheduler],
                alpha=0.6,
                zorder=3,
                label=LABEL[scheduler] if first else None,
            )
            if ys:
                ax.hlines(median(ys), x - 0.1, x + 0.1, color=colors[scheduler], lw=2)
    ax.axhline(TTL, color="gray", ls=":", label=f"TTL {TTL} s")
    ax.axhline(TTL + 2, color="tab:red", ls="--", label="TTL + 2 s (issue #26)")
    ticks = [
        FAULT_TEXT[f].replace(" for ", "\nfor ").replace(" inside", "\ninside") for f in faults
    ]
    ax.set_xticks(range(len(faults)), ticks, fontsize=7)
    ax.set(ylabel="fault → first task from the new leader, s", title="Celery beat failover")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_plot(fig, "beat_failover.png")


def render(data: Json) -> Part:
    """The beat failover section: a table per fault, the ratio, the targets."""
    part = Part(
        "beat_failover",
        "Celery beat failover: etcdfence vs celery-redbeat",
        "",
        machine=data.get("machine"),
    )
    parts = [
        f"![beat failover]({_plot(data)})" if data["schedulers"] else "",
        "",
        f"Two real `celery beat` processes per round, one entry every {data['interval_s']:g} s, "
        f"the lock's lifetime {data['ttl_s']} s on both sides (`redbeat_lock_timeout = "
        f"{data['ttl_s']}`, `beat_max_loop_interval = {data['interval_s']:g}`: the leader extends "
        f"every ≤ 1 s, the standby retries every 1 s; etcdfence: session TTL {data['ttl_s']} s, "
        "keepalive every TTL/3, the standby watches). Broker: Redis 127.0.0.1:6379, one "
        "`celery worker` (solo pool) logging every message received and every effect applied. "
        f"{data['rounds']} round(s) per fault and scheduler, interleaved ABAB; fresh keys per "
        "round. Failover = fault → the `bench-sent` stamp of the new leader's first message. "
        f"Load average (1/5/15 min) {_load(data, 'load_before')} before, "
        f"{_load(data, 'load_after')} after: the 2 cores were shared with other work (other "
        "engineers' test runs), which both schedulers saw alike (interleaved rounds).",
        "",
    ]
    for name, why in data.get("not_measured", {}).items():
        parts += [f"*{LABEL.get(name, name)}: not measured in this run ({why}).*", ""]
    headers = [
        "scheduler",
        "failover median (min … max)",
        "samples, s",
        "duplicate slots",
        "stale sends",
        "duplicates applied at the worker",
    ]
    for fault in data["faults"]:
        parts += [f"**{FAULT_TEXT[fault]}**", "", md_table(headers, _rows(data, fault)), ""]
        line = _ratio_line(data, fault)
        if line:
            parts += [line, ""]
    parts += [_definitions(), ""]
    part.section = "\n".join(parts)
    _targets(part, data)
    part.findings = _findings(data)
    return part


def _definitions() -> str:
    return (
        "*Duplicate slots*: etcdfence — slot ids (the slot header: entry + scheduled time) "
        "published more than once; redbeat's messages carry no slot, so a duplicate is two "
        "messages of the entry whose send times fall in the same 1 s slot (one beat never "
        "sends twice in one slot). *Stale sends*: messages the old leader published after "
        "the fault. *Applied*: redbeat's task is a plain Celery task, so whatever arrives "
        "is applied; etcdfence's is the fenced worker task, which refuses a stale term's "
        "message and applies a slot once."
    )


def _targets(part: Part, data: Json) -> None:
    for fault in data["faults"]:
        for scheduler in data["schedulers"]:
            c = data["summary"][fault][scheduler]
            worst = c["max_s"]
            ok = worst is not None and c["no_takeover"] == 0 and worst <= data["ttl_s"] + 2
            part.add(
                f"beat_failover_{scheduler}_{fault}",
                f"beat failover, {LABEL[scheduler]}, {FAULT_TEXT[fault]} (worst of {c['rounds']})",
                "no takeover" if worst is None else f"{worst:.2f} s (median {c['median_s']:.2f} s)",
                ok if scheduler == "etcdfence" else None,
                f"≤ TTL + 2 s = {data['ttl_s'] + 2} s" if scheduler == "etcdfence" else "measured",
            )
        if "etcdfence" in data["schedulers"]:
            c = data["summary"][fault]["etcdfence"]
            part.add(
                f"beat_dup_{fault}",
                f"beat duplicates applied at a fenced worker, {FAULT_TEXT[fault]}",
                f"{c['applied_duplicates']} in {c['rounds']} failovers",
                c["applied_duplicates"] == 0,
                "0",
            )


def _findings(data: Json) -> str:
    lines = ["### Celery beat failover", ""]
    outcomes = Counter(
        s["old_leader_after_resume"] for s in data["samples"] if s["fault"] != "kill"
    )
    by_scheduler: dict[str, Counter[str]] = {}
    for s in data["samples"]:
        if s["fault"] != "kill":
            by_scheduler.setdefault(s["scheduler"], Counter())[s["old_leader_after_resume"]] += 1
    if outcomes:
        lines.append("What the SIGCONTed old leader did, per scheduler:")
        lines.append("")
        for scheduler, counts in by_scheduler.items():
            said = "; ".join(f"{what} ({n}×)" for what, n in counts.most_common())
            lines.append(f"* {LABEL[scheduler]}: {said}")
        lines.append("")
    lines += _publish_stop_lines(data)
    lines.append(
        "After a failover the etcdfence leader resumes from the last *recorded* slot and "
        "sends the slots missed during the outage (at most `etcdfence_catchup`, 10), so its "
        "first message is an older slot; redbeat's new leader resumes from the entry's "
        "last run and sends one message for the missed slots. The failover time is the "
        "same notion for both: fault → the new leader's first publish.\n\n"
        "redbeat's standby retries the lock every `beat_max_loop_interval` (1 s here; Celery's "
        "default is 300 s, which makes a redbeat failover take minutes unless it is lowered), "
        "so its failover is the lock's remaining life (≤ TTL) plus up to one retry period; an "
        "etcd standby is woken by its watch when the lessor revokes the lease (checked every "
        "0.5 s)."
    )
    return "\n".join(lines) + "\n"


def _publish_stop_lines(data: Json) -> list[str]:
    """What became of the message a frozen leader held (the publish-stop fault)."""
    summary = data["summary"].get("publish-stop")
    if not summary:
        return []
    out = []
    if "redbeat" in summary:
        c = summary["redbeat"]
        out.append(
            f"* celery-redbeat, publish-stop: {c['stale_sends']} stale message(s) in "
            f"{c['rounds']} failovers reached the worker after the new leader had taken over "
            f"and were applied ({c['applied_duplicates']} of them in a 1 s slot the new "
            "leader had already sent): redbeat checks its lock once per tick, before it "
            "sends, and nothing downstream can tell a deposed beat's message from the "
            "leader's."
        )
    if "etcdfence" in summary:
        c = summary["etcdfence"]
        out.append(
            f"* etcdfence, publish-stop: {c['stale_sends']} stale message(s) in {c['rounds']} "
            f"failovers; the worker refused {c['refused']} message(s) "
            f"({', '.join(f'{k} {n}' for k, n in sorted(c['refused_reasons'].items()))}) "
            f"and applied {c['applied_duplicates']} slot twice: the new leader advanced the "
            "workers' mark before its first publish, so the old term's token is below it"
            + (
                f"; the new leader re-sent {c['duplicates']} held slot(s) (the frozen beat "
                "had not recorded them): duplicates by slot id, each applied once."
                if c["duplicates"]
                else "."
            )
        )
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--rounds", type=int, default=None, help="per fault and scheduler")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--schedulers", default="redbeat,etcdfence")
    args = parser.parse_args(argv)

    def run() -> Json:
        return measure(
            args.quick,
            rounds=args.rounds,
            faults=[f for f in args.faults.split(",") if f],
            schedulers=[s for s in args.schedulers.split(",") if s],
        )

    return run_topic("beat_failover", run, render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

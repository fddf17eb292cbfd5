"""The kit's machinery: terms from real etcd, recorded writes to the user's resource,
and one scenario's verdict from the history checker and the scenario's own checks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import Client, FencingToken
from ..errors import EtcdfenceError
from ..testing.history import (
    Change,
    History,
    Layout,
    PendingWrite,
    Recorder,
    check,
    describe_events,
    parse_write_value,
)
from ._adapter import Adapter, build
from ._report import Finding, ScenarioResult, Status
from ._writers import KitError, ProcessWriter, ThreadWriter, Writer

__all__ = ["Holder", "Kit", "Run", "Scenario", "run_scenario"]

#: What each history-checker violation means for a resource, in the kit's words.
HINTS = {
    "stale-accepted": "the resource accepted a write with a lower token after a higher "
    "token's write was acknowledged: it does not fence",
    "token-regression": "the stored data went back to a lower token",
    "rejected-applied": "a write the resource reported as rejected was stored anyway",
    "ack-lost": "an acknowledged write is not what the resource holds",
    "late-write": "an earlier write of a writer landed after its later acknowledged write",
}
#: Lease TTL of terms that end by release, not expiry (seconds).
HOLD_TTL = 20
#: How the detail of an outcome the kit made unknown on purpose starts.
KIT_UNKNOWN = "kit: "
#: Lines of history shown at most per scenario.
HISTORY_LINES = 150


class Holder:
    """One term of the scenario's lock: its own etcd session; ``token`` fences its writes."""

    def __init__(self, name: str, session: Any, token: FencingToken, recorder: Recorder) -> None:
        self.name = name
        self.session = session
        self.token = token
        self.recorder = recorder

    def release(self) -> None:
        """End the term now (the next holder gets a higher token at once)."""
        self.recorder.lost("released")
        self.close()

    def pause(self) -> None:
        """Stop renewing the lease, as a process frozen by a GC pause or SIGSTOP would:
        etcd expires it after its TTL, and the next holder gets in. The holder keeps
        its token, as a zombie does."""
        self.recorder.note("paused: no more keepalives, etcd will expire the lease")
        self.session.orphan()

    def close(self) -> None:
        """Close the session (revokes the lease unless it already ran out)."""
        try:
            self.session.close()
        except EtcdfenceError:
            pass  # the lease runs out by itself


@dataclass(frozen=True)
class Scenario:
    """One conformance scenario: ``run(run)`` drives it and returns what happened (the
    explanation when it passes). ``observed``: the kit reads the resource after each
    write and gives the history checker those reads as ground truth; ``needs``: an
    adapter capability the scenario cannot do without (``"restart"``, ``"delay"``)."""

    name: str
    title: str
    run: Callable[[Run], str]
    observed: bool = True
    needs: str | None = None


class Kit:
    """One run of the kit: the etcd client that hands out tokens, the adapter, and
    where concurrent writers come from (``spec``: processes; ``factory``: threads with
    adapters of their own; neither: threads sharing the adapter)."""

    def __init__(
        self,
        adapter: Adapter,
        client: Client,
        endpoints: list[str],
        *,
        spec: str | None = None,
        factory: Callable[[], Any] | None = None,
        ttl: int = 2,
        run_id: str | None = None,
    ) -> None:
        self.adapter = adapter
        self.client = client
        self.endpoints = list(endpoints)
        self.spec = spec
        self.factory = factory
        self.ttl = ttl
        self.layout = Layout(f"etcdfence-conformance/{run_id or uuid.uuid4().hex[:10]}")

    @property
    def writers_are(self) -> str:
        """``"processes"`` or ``"threads"``: how concurrent writers run."""
        return "processes" if self.spec else "threads"

    def writer(self, name: str, env: Mapping[str, str] | None = None) -> Writer:
        """A writer beside the kit (a process when a factory spec was given)."""
        writer: Writer
        if self.spec is not None:
            writer = ProcessWriter(self.spec, name, self.endpoints, env)
        elif self.factory is not None:
            writer = ThreadWriter(build(self.factory, self.endpoints), name, env, owned=True)
        else:
            writer = ThreadWriter(self.adapter, name, env)
        writer.data_prefix = self.layout.data_prefix
        return writer


class Run:
    """What a scenario function works with: keys of its own, terms of its own lock,
    recorded writes through the adapter, reads, writers beside it, and checks."""

    def __init__(self, kit: Kit, scenario: Scenario) -> None:
        self.kit = kit
        self.scenario = scenario
        self.observed = scenario.observed
        self.findings: list[Finding] = []
        self.changes: list[Change] = []
        self._last: dict[str, str | None] = {}
        self._holders: list[Holder] = []
        self._recorders: list[Recorder] = []
        self._writers: list[Writer] = []
        self._lock_name = f"{kit.layout.root}/lock/{scenario.name}"

    def key(self, suffix: str = "") -> str:
        """A key of this scenario (``suffix`` tells several apart)."""
        return self.kit.layout.data_key(self.scenario.name + suffix)

    def resource(self, key: str) -> str:
        """The history's resource name for ``key``."""
        return key[len(self.kit.layout.data_prefix) :]

    def term(self, name: str, *, short: bool = False, timeout: float | None = None) -> Holder:
        """Start a term: a new session acquires the scenario's lock (waiting up to
        ``timeout`` for the previous holder to release or expire). ``short``: a lease
        of the kit's TTL (a holder that will pause); otherwise one of HOLD_TTL, which
        a loaded machine cannot lose by accident (terms end by release)."""
        session = self.kit.client.session(self.kit.ttl if short else HOLD_TTL)
        session.open()
        recorder = Recorder(name, deadline=lambda: float(session.deadline))
        self._recorders.append(recorder)
        recorder.campaign()
        try:
            token = session.lock(self._lock_name).acquire(timeout or 4 * self.kit.ttl + 10)
        except BaseException:
            session.close()
            raise
        recorder.elected(token)
        holder = Holder(name, session, token, recorder)
        self._holders.append(holder)
        return holder

    def recorder(self, name: str) -> Recorder:
        """A recorder for a writer that holds no term (a forged or malformed token)."""
        recorder = Recorder(name)
        self._recorders.append(recorder)
        return recorder

    def write(
        self,
        who: Holder | Recorder,
        key: str,
        token: Any = None,
        *,
        pending: PendingWrite | None = None,
        lost_reply: bool = False,
    ) -> str:
        """One recorded write through the adapter: ``"accepted"``, ``"rejected"`` or
        ``"unknown"``. ``token`` defaults to the holder's; ``pending`` resends an
        earlier write (same id and value); ``lost_reply`` records the outcome as
        unknown, as a writer that never got the reply would."""
        recorder = who.recorder if isinstance(who, Holder) else who
        if token is None and isinstance(who, Holder):
            token = who.token
        if pending is None:
            pending = recorder.write(self.resource(key), key, token)
        outcome, detail = self.kit.adapter.attempt(token, key, pending.value)
        revision = self.observe(key, pending.write_id) if self.observed else None
        if lost_reply:
            recorder.unknown(pending, f"{KIT_UNKNOWN}the kit dropped the reply ({outcome})")
        elif outcome == "accepted":
            recorder.accepted(pending, revision)  # type: ignore[arg-type]
        elif outcome == "rejected":
            recorder.rejected(pending, detail=detail)
        else:
            recorder.unknown(pending, detail or "")  # a finding of _verdict's
        return outcome

    def read(self, key: str) -> str | None:
        """What the resource holds under ``key`` now."""
        return self.kit.adapter.read_text(key)

    def observe(self, key: str, write_id: str | None = None) -> int | None:
        """Read ``key`` into the observed history (a change when it differs from the
        last read); returns the read's revision if it holds ``write_id``'s value."""
        value = self.read(key)
        if value != self._last.get(key) and (value is not None or key in self._last):
            revision = len(self.changes) + 1
            self.changes.append(Change(revision, key, value or "", deleted=value is None))
        self._last[key] = value
        latest = next((c for c in reversed(self.changes) if c.key == key), None)
        parsed = None if latest is None or latest.deleted else parse_write_value(latest.value)
        if latest is not None and parsed is not None and parsed[0] == write_id:
            return latest.revision
        return None

    def writer(self, name: str, env: Mapping[str, str] | None = None) -> Writer:
        """A writer beside the kit (process or thread), closed when the scenario ends."""
        writer = self.kit.writer(name, env)
        self._writers.append(writer)
        return writer

    def expect(self, ok: bool, kind: str, message: str) -> bool:
        """Record a finding unless ``ok``; returns ``ok``."""
        if not ok:
            self.findings.append(Finding(kind, message))
        return ok

    def value_token(self, key: str) -> int | None:
        """The token of the write whose value ``key`` holds now (None: none/foreign)."""
        value = self.read(key)
        parsed = None if value is None else parse_write_value(value)
        return None if parsed is None else parsed[1]

    @property
    def final(self) -> dict[str, str]:
        """What the kit last read from each key that holds a value."""
        return {key: value for key, value in self._last.items() if value is not None}

    def close(self) -> list[Any]:
        """End the writers and terms; return every event recorded."""
        events: list[Any] = []
        for writer in self._writers:
            try:
                writer.close()
            finally:
                events += writer.events()
        for holder in self._holders:
            holder.close()
        for recorder in self._recorders:
            events += recorder.events
        return events


def run_scenario(kit: Kit, scenario: Scenario) -> ScenarioResult:
    """Run one scenario against the kit's adapter and judge it."""
    started = time.monotonic()
    if scenario.needs is not None and getattr(kit.adapter, scenario.needs) is None:
        why = f"the adapter has no {scenario.needs}()"
        return ScenarioResult(scenario.name, scenario.title, "skip", why)
    run = Run(kit, scenario)
    summary = ""
    try:
        summary = scenario.run(run)
    except KitError as err:
        run.expect(False, "kit-error", str(err))
    except EtcdfenceError as err:
        run.expect(False, "kit-error", f"etcd: {type(err).__name__}: {err}")
    except Exception as err:  # the adapter's read (or the user's code) failed
        run.expect(False, "error", f"{type(err).__name__}: {err}")
    finally:
        events = run.close()
    return _verdict(run, scenario, events, summary, time.monotonic() - started)


def _verdict(
    run: Run, scenario: Scenario, events: list[Any], summary: str, seconds: float
) -> ScenarioResult:
    """The history checker over the recorded history, plus the scenario's own findings."""
    layout = run.kit.layout if run.observed else None
    final = run.final if run.observed else None
    history = History(events, run.changes if run.observed else [], final, layout)
    result = check(history)
    findings = _unknown_outcomes(events) + run.findings
    findings += [Finding(v.kind, v.message) for v in result.violations]
    findings = list(dict.fromkeys(findings))  # the same finding once
    lines = describe_events(events)
    if run.observed and run.changes:
        lines.append("what the kit read back after each write (rev = order of reads):")
        lines += [f"  {change.describe()}" for change in run.changes]
    if len(lines) > HISTORY_LINES:
        half = HISTORY_LINES // 2
        lines = [*lines[:half], f"... {len(lines) - HISTORY_LINES} lines ...", *lines[-half:]]
    status: Status
    if findings:
        first = findings[0]
        explanation = HINTS.get(first.kind, first.message)
        if len(findings) > 1:
            explanation += f" ({len(findings)} findings)"
        status = "fail"
    else:
        explanation, status = summary or "ok", "pass"
    return ScenarioResult(
        scenario.name, scenario.title, status, explanation, findings, lines, str(result), seconds
    )


def _unknown_outcomes(events: list[Any]) -> list[Finding]:
    """A write that raised something other than a rejection: the kit cannot judge it."""
    return [
        Finding(
            "adapter-error",
            f"{e.contender}'s write with token {e.token} raised {e.detail}: not a rejection "
            "(declare it in Adapter(rejections=...) if it is one)",
        )
        for e in events
        if e.kind == "unknown" and not (e.detail or "").startswith(KIT_UNKNOWN)
    ]

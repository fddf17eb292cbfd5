"""The kit's machinery: terms from real etcd, recorded writes to the user's resource,
and one scenario's verdict from the history checker and the scenario's own checks."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .. import Client, FencingToken
from ..errors import EtcdfenceError
from ..history import (
    Change,
    History,
    Layout,
    PendingWrite,
    Recorder,
    check,
    describe_events,
    parse_write_value,
)
from ._adapter import Adapter, carried, describe
from ._report import Finding, ScenarioResult, Status
from ._writers import KitError, ProcessWriter, ThreadWriter, Writer

__all__ = ["Holder", "Home", "Kit", "Run", "Scenario", "run_scenario"]

#: What each history-checker violation means for a resource, in the kit's words.
HINTS = {
    "stale-accepted": "the resource accepted a write with a lower token after a higher "
    "token's write was acknowledged: it does not fence",
    "token-regression": "the stored data went back to a lower token",
    "rejected-applied": "a write the resource reported as rejected was stored anyway",
    "ack-lost": "an acknowledged write is not what the resource holds",
    "late-write": "an earlier write of a writer landed after its later acknowledged write",
    "adapter-error": "the adapter raised an error, not a refusal: the kit cannot judge a "
    "write whose outcome it does not know (an error of the adapter or store, not proof of "
    "a fencing violation; see the findings)",
    "limited-token-range": "the resource refused a valid token above 2**53-1: it would "
    "refuse etcd revisions past that point (a limited token range, not a stale write "
    "accepted)",
}
#: Lease TTL of terms that end by release, not expiry (seconds).
HOLD_TTL = 20
#: How the detail of an outcome the kit made unknown on purpose starts.
KIT_UNKNOWN = "kit: "
#: Lines of history shown at most per scenario.
HISTORY_LINES = 150
#: Default seconds an adapter call may take before its outcome is unknown (the deadline).
DEADLINE = 10.0
#: An unanswered write may still land for this many deadlines more before the kit
#: gives up on it (then the resource is stuck: the remaining scenarios fail at once).
SETTLE_FACTOR = 3.0


class Home:
    """The one thread every call of the kit to the adapter runs on. By default a daemon
    thread of its own (an adapter that never answers cannot keep the process alive;
    the kit waits for each call only up to a deadline), where a factory's adapter is
    also built, so a connection that must stay on the thread that opened it
    (sqlite3's default) works. ``thread=False``: the calls wait for :meth:`serve`,
    run by the thread that built the adapter (the caller of ``run_conformance``).

    Adapter code raising a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``) hands the waiter an :class:`AdapterRaised` instead."""

    def __init__(self, *, thread: bool = True) -> None:
        self._calls: queue.Queue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._calls = queue.Queue()
        self.thread: threading.Thread | None = None
        if thread:
            self.thread = threading.Thread(target=self.serve, name="conformance-home", daemon=True)
            self.thread.start()

    def serve(self) -> None:
        """Run the queued calls, one at a time, until :meth:`stop`."""
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as err:  # handed to whoever waits for the call
                future.set_exception(carried(err))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)`` (calls run one at a time, in order)."""
        future: Future[Any] = Future()
        self._calls.put((future, fn, args))
        return future

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float, what: str) -> Any:
        """``fn(*args)`` on this thread; :class:`KitError` if it takes over ``timeout``."""
        future = self.submit(fn, *args)
        if not _wait(future, timeout):
            raise KitError(f"{what} did not return within {timeout:g} s")
        return future.result()

    def stop(self) -> None:
        """Let the thread end once the calls queued before it are done."""
        self._calls.put(None)


def _wait(future: Future[Any], timeout: float) -> bool:
    """Whether ``future`` finished within ``timeout`` seconds."""
    try:
        future.exception(timeout)
    except TimeoutError:
        return False
    return True


def bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()`` on a thread of its own, waited for at most ``timeout`` seconds."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as err:  # handed to the caller
            future.set_exception(carried(err))

    threading.Thread(target=run, name="conformance-bounded", daemon=True).start()
    if not _wait(future, timeout):
        raise KitError(f"{what} did not return within {timeout:g} s")
    return future.result()


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
    adapter capability the scenario cannot do without (``"restart"``, ``"delay"``);
    ``binding``: ``"bound"`` runs only for an adapter that declares its resource bound
    to a lock (``Adapter(bound_lock=...)``), ``"unbound"`` only for one that does not
    (its tokens are bare numbers, which a bound resource refuses).
    ``future_tokens``: it writes only tokens above etcd's revision (skipped for an
    adapter that ``refuses_future``)."""

    name: str
    title: str
    run: Callable[[Run], str]
    observed: bool = True
    needs: str | None = None
    binding: str | None = None
    future_tokens: bool = False


class Kit:
    """One run of the kit: the etcd client that hands out tokens, the adapter, and
    where concurrent writers come from (``spec``: processes; ``factory``: threads with
    adapters of their own; neither: threads sharing the adapter).

    ``deadline``: seconds a call to the adapter may take. A write with no answer by
    then is recorded as indeterminate (outcome unknown: it may still land) and the
    kit goes on; it waits ``SETTLE_FACTOR`` deadlines more where a scenario needs
    the outcome, and past that the resource counts as stuck (the scenarios left
    fail at once, with the reason). ``zombie_delay``: how long the late zombie
    sleeps before its stale write (longer than any mark that expires should live).
    ``home``: the thread the adapter's calls run on (one is started if not given)."""

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
        deadline: float = DEADLINE,
        zombie_delay: float = 10.0,
        home: Home | None = None,
    ) -> None:
        self.adapter = adapter
        self.client = client
        self.endpoints = list(endpoints)
        self.spec = spec
        self.factory = factory
        self.ttl = ttl
        self.deadline = deadline
        self.zombie_delay = zombie_delay
        self.home = home or Home()
        #: Why the resource is stuck (a call that never returned), or None.
        self.stuck: str | None = None
        #: The adapter works only on the thread it was built on: writers beside the
        #: kit send their writes to the home thread too (one at a time).
        self.bound = False
        #: What went wrong that is not about fencing (a close() that raised).
        self.warnings: list[str] = []
        self.layout = Layout(f"etcdfence-conformance/{run_id or uuid.uuid4().hex[:10]}")

    @property
    def settle(self) -> float:
        """Seconds an unanswered write may still take to land once past its deadline."""
        return SETTLE_FACTOR * self.deadline

    def call(self, name: str, *args: Any) -> Any:
        """The adapter's ``name`` callable on the home thread, within the deadline plus
        the settle time (``restart``, ``delay``, ``read``); :class:`KitError` if not."""
        if self.stuck:
            raise KitError(self.stuck)
        try:
            return self.home.call(
                self.adapter.call, name, *args, timeout=self.deadline + self.settle,
                what=f"the adapter's {name}()",
            )  # fmt: skip
        except KitError as err:
            self.stuck = f"the resource is stuck: {err}"
            raise

    def _routed_attempt(self, token: Any, key: str, value: str) -> tuple[str, str | None]:
        """``Adapter.attempt`` on the home thread (a writer's write of a bound adapter)."""
        result: tuple[str, str | None] = self.home.call(
            self.adapter.attempt, token, key, value, timeout=self.deadline + self.settle,
            what="a writer's write",
        )  # fmt: skip
        return result

    @property
    def writers_are(self) -> str:
        """``"processes"`` or ``"threads"``: how concurrent writers run."""
        return "processes" if self.spec else "threads"

    def writer(self, name: str, env: Mapping[str, str] | None = None) -> Writer:
        """A writer beside the kit (a process when a factory spec was given)."""
        writer: Writer
        limit = self.deadline + self.settle
        if self.spec is not None:
            writer = ProcessWriter(self.spec, name, self.endpoints, env)
        elif self.factory is not None:  # built on the writer's thread, which uses it
            writer = ThreadWriter(name, env, factory=self.factory, endpoints=self.endpoints,
                                  timeout=limit)  # fmt: skip
        elif self.bound:  # its writes go to the thread the adapter belongs to
            writer = ThreadWriter(name, env, adapter=self.adapter, timeout=limit,
                                  route=self._routed_attempt)  # fmt: skip
        else:
            writer = ThreadWriter(name, env, adapter=self.adapter, timeout=limit)
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
        self._outsiders: list[Any] = []
        self._recorders: list[Recorder] = []
        self._writers: list[Writer] = []
        #: Writes past their deadline, by write id: (answer, recorder, sent at).
        self.in_flight: dict[str, tuple[Future[Any], Recorder, float]] = {}
        #: The lock whose terms write: the one the resource is bound to, if it is.
        self.lock_name = kit.adapter.bound_lock or f"{kit.layout.root}/lock/{scenario.name}"

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
            token = session.lock(self.lock_name).acquire(timeout or 4 * self.kit.ttl + 10)
        except BaseException:
            session.close()
            raise
        recorder.elected(token)
        holder = Holder(name, session, token, recorder)
        self._holders.append(holder)
        return holder

    def outsider(self, lock: str) -> FencingToken:
        """A live term of another ``lock`` (not the scenario's), held until the scenario
        ends; its token. Not recorded as a term: the history checker orders the terms
        of one lock, and two locks' holders overlap by design."""
        session = self.kit.client.session(HOLD_TTL)
        session.open()
        self._outsiders.append(session)
        token: FencingToken = session.lock(lock).acquire(4 * self.kit.ttl + 10)
        return token

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
        settle: bool = True,
    ) -> str:
        """One recorded write through the adapter: ``"accepted"``, ``"rejected"`` or
        ``"unknown"``. ``token`` defaults to the holder's; ``pending`` resends an
        earlier write (same id and value); ``lost_reply`` records the outcome as
        unknown, as a writer that never got the reply would.

        The write has the kit's deadline: with no answer by then, it is recorded as
        unknown (it may still land). ``settle``: then wait up to the settle time for
        its answer and return that (a write that waited for an earlier one and landed
        after it is ordered, not a failure); ``settle=False`` returns ``"unknown"`` at
        once and leaves the write in flight (:meth:`settled` waits for it later)."""
        recorder = who.recorder if isinstance(who, Holder) else who
        if token is None and isinstance(who, Holder):
            token = who.token
        if pending is None:
            pending = recorder.write(self.resource(key), key, token)
        if self.kit.stuck:
            raise KitError(self.kit.stuck)
        sent = time.monotonic()
        future = self.kit.home.submit(self.kit.adapter.attempt, token, key, pending.value)
        if not _wait(future, self.kit.deadline):
            recorder.unknown(
                pending, f"{KIT_UNKNOWN}no answer within the deadline of "
                f"{self.kit.deadline:g} s: outcome unknown, it may still land",
            )  # fmt: skip
            self.in_flight[pending.write_id] = (future, recorder, sent)
            if not settle:
                return "unknown"
            return self.settled(pending.write_id, key)
        outcome: str
        outcome, detail = future.result()
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

    def settled(self, write_id: str, key: str) -> str:
        """The answer of a write that missed its deadline, waited for up to the settle
        time: ``"accepted"``/``"rejected"`` when it came (noted in the history; the
        outcome stays recorded as unknown), ``"unknown"`` when it did not — then the
        resource is stuck and the scenario gets a ``write-timeout`` finding."""
        future, recorder, sent = self.in_flight.pop(write_id)
        if not _wait(future, self.kit.settle):
            waited = time.monotonic() - sent
            self.kit.stuck = (
                f"the resource is stuck: write {write_id} has not returned after {waited:.0f} s"
            )
            self.expect(False, "write-timeout", f"write {write_id} to {key} got no answer "
                        f"within {waited:.0f} s (deadline {self.kit.deadline:g} s)")  # fmt: skip
            return "unknown"
        outcome: str
        outcome, detail = future.result()
        late = time.monotonic() - sent
        recorder.note(f"write {write_id} answered {outcome} after {late:.1f} s, past the "
                      "deadline" + (f" ({detail})" if detail else ""))  # fmt: skip
        if self.observed:
            self.observe(key)
        if outcome == "unknown":  # the adapter raised something that is not a refusal
            self.expect(False, "adapter-error", f"write {write_id} raised {detail}")
        return outcome

    def attempt(self, token: Any, key: str, value: str) -> tuple[str, str | None]:
        """An unrecorded write (``Adapter.attempt``) within the deadline and settle time."""
        if self.kit.stuck:
            raise KitError(self.kit.stuck)
        future = self.kit.home.submit(self.kit.adapter.attempt, token, key, value)
        if not _wait(future, self.kit.deadline + self.kit.settle):
            self.kit.stuck = "the resource is stuck: a write did not return"
            return "unknown", f"{KIT_UNKNOWN}no answer within the deadline"
        result: tuple[str, str | None] = future.result()
        return result

    def read(self, key: str) -> str | None:
        """What the resource holds under ``key`` now (within the deadline and settle
        time, else :class:`KitError`)."""
        if self.kit.stuck:
            raise KitError(self.kit.stuck)
        try:
            value: str | None = self.kit.home.call(
                self.kit.adapter.read_text, key,
                timeout=self.kit.deadline + self.kit.settle, what=f"read({key!r})",
            )  # fmt: skip
        except KitError as err:
            self.kit.stuck = f"the resource is stuck: {err}"
            raise
        return value

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
        for write_id, (_, recorder, _sent) in list(self.in_flight.items()):
            recorder.note(f"write {write_id} was still in flight when the scenario ended")
        for writer in self._writers:
            try:
                writer.close()
            except Exception as err:  # teardown: a warning, the verdict stands
                self.kit.warnings.append(f"{self.scenario.name}: closing writer "
                                         f"{writer.name}: {describe(err)}")  # fmt: skip
            events += writer.events()
        for holder in self._holders:
            holder.close()
        for session in self._outsiders:
            try:
                session.close()
            except EtcdfenceError:
                pass  # the lease runs out by itself
        for recorder in self._recorders:
            events += recorder.events
        return events


def run_scenario(kit: Kit, scenario: Scenario) -> ScenarioResult:
    """Run one scenario against the kit's adapter and judge it."""
    started = time.monotonic()
    if scenario.needs is not None and getattr(kit.adapter, scenario.needs) is None:
        why = f"the adapter has no {scenario.needs}()"
        return ScenarioResult(scenario.name, scenario.title, "skip", why)
    unbound = _binding_skip(kit.adapter.bound_lock, scenario.binding)
    if unbound is not None:
        return ScenarioResult(scenario.name, scenario.title, "skip", unbound)
    if scenario.future_tokens and kit.adapter.refuses_future:
        why = ("the resource refuses tokens above etcd's revision (FutureTokenError), and "
               "this scenario writes only such tokens")  # fmt: skip
        return ScenarioResult(scenario.name, scenario.title, "skip", why)
    if kit.stuck:  # an earlier call never returned: this one would wait behind it
        finding = Finding("write-timeout", kit.stuck)
        return ScenarioResult(scenario.name, scenario.title, "fail", kit.stuck, [finding])
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


def _binding_skip(bound_lock: str | None, binding: str | None) -> str | None:
    """Why a scenario does not run for this adapter's binding (None: it runs)."""
    if binding == "bound" and bound_lock is None:
        return "the adapter declares no binding (Adapter(bound_lock=...)): nothing to check"
    if binding == "unbound" and bound_lock is not None:
        return (
            f"the resource is bound to lock {bound_lock!r}: it refuses the bare-number "
            "tokens this scenario writes (the bare-number scenario checks that)"
        )
    return None


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
            f"{e.contender}'s write with token {e.token} raised {e.detail}: an error, not a "
            "rejection (declare it in Adapter(rejections=...) if it is one) and not by itself "
            "a fencing violation: the kit cannot judge a write of unknown outcome (retry "
            "errors known to write nothing inside write())",
        )
        for e in events
        if e.kind == "unknown" and not (e.detail or "").startswith(KIT_UNKNOWN)
    ]

"""Record what contenders did and believed, watch what etcd did, and check that fencing held.

Use this to test code built on etcdfence under faults (pauses, partitions, crashes):

- every contender owns a :class:`Recorder` and records ``campaign`` / ``elected`` /
  ``lost`` and, for each write, ``write`` followed by ``accepted``, ``rejected`` or
  ``unknown``, stamped with :func:`time.monotonic` (system-wide on Linux, so events
  of several processes on one machine share one clock). A recorder can write JSON
  lines (:func:`jsonl_sink`) that a parent process reads back with
  :func:`parse_events`;
- an :class:`Observer` watches everything under the :class:`Layout` root — contender
  keys, high-water marks and data — from a revision before the run: the ground truth;
- :func:`check` takes the :class:`History` (events, observed changes, final state) and
  returns a :class:`CheckResult`: ``str(result)`` is a one-line verdict,
  ``result.violations`` the problems, ``result.report()`` the verdict, the
  violations and the offending slice of history.

What the checker asserts (each a :class:`Violation` ``kind``):

``token-regression``
    Per resource, the tokens the resource accepted never decrease, in revision order
    (from the observed high-water marks and data writes).
``stale-accepted``
    Once a write with token T was acknowledged, no write with a lower token attempted
    afterwards is accepted (acknowledged, or applied as seen by the observer).
``rejected-applied``
    A write the resource reported as rejected does not appear in the observed history.
``ack-lost``
    Every acknowledged write is in the observed history at its revision and in the
    final state, unless a later write to the same key superseded it.
``late-write``
    Within a term too, writes are ordered: no write of a contender applied (as seen by
    the observer) after a *later* acknowledged write of that contender to the same
    resource — one sent after the first one's outcome came back. A write whose
    outcome is unknown may apply at any later point, but never after that.
``term-token-duplicate`` / ``term-token-order``
    Each term's token is unique, and tokens increase with the start of the term
    (globally and per contender).
``phantom-leader``
    At the revision of its token, the elected contender's key really was the first
    created under the election prefix.
``leadership-overlap``
    The intervals in which two contenders *believed* they led never overlap. Belief
    starts at ``elected`` and ends at the ``lost`` event or at the session's local
    deadline (the latest ``deadline`` the contender reported), whichever is first: a
    process that is frozen past its deadline does not believe anything, and the
    library guarantees its session expires locally before etcd can expire the lease.

``result.stats`` counts contenders, terms, writes and their outcomes, and the *stale*
writes: attempted with a token below one the resource had already acknowledged before
the attempt started, or rejected by the resource (``stale_attempted``), and how many of
those got in anyway (``stale_accepted``, which any violation-free history has at 0).

Data written by contenders carries its token and a write id in the value
(:func:`write_value`), so a write that bypassed the guard is still attributed.

Clock: events from several processes are compared by ``time.monotonic()``, which on
Linux is one system-wide clock; run contenders on one machine (or bring your own
``clock`` to :class:`Recorder`).
"""

from __future__ import annotations

import bisect
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from .._keys import MARK_WIDTH
from ..errors import (
    CompactedError,
    EtcdfenceError,
    EtcdRequestError,
    EtcdUnavailable,
    NotOwnerError,
    StaleTokenError,
)

__all__ = [
    "Change",
    "CheckResult",
    "Event",
    "History",
    "Layout",
    "LeaderState",
    "Observer",
    "PendingWrite",
    "Recorder",
    "Term",
    "Violation",
    "build_terms",
    "check",
    "describe_events",
    "jsonl_sink",
    "leader_changes",
    "parse_events",
    "parse_write_value",
    "write_value",
]

#: Kinds of :class:`Event` a recorder emits.
EVENT_KINDS = frozenset(
    {"campaign", "elected", "lost", "write", "accepted", "rejected", "unknown", "note"}
)
_OUTCOMES = frozenset({"accepted", "rejected", "unknown"})
_INF = float("inf")


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Event:
    """One thing a contender did or learned, at ``t`` (``time.monotonic()``).

    ``token`` is the term's token for ``elected``/``lost`` and the token offered for a
    write; ``write_id`` ties a ``write`` to its outcome; ``revision`` is the revision of
    an accepted write; ``current`` the mark a rejection reported; ``deadline`` the
    session's local deadline when the event was recorded.
    """

    t: float
    contender: str
    kind: str
    token: int | None = None
    resource: str | None = None
    key: str | None = None
    write_id: str | None = None
    revision: int | None = None
    current: int | None = None
    deadline: float | None = None
    lease: int | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as a dict (what :meth:`to_json` encodes)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_json(self) -> str:
        """One compact JSON line; :func:`parse_events` reads it back."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def describe(self) -> str:
        """A one-line human-readable form, as used in the slice of a report."""
        parts = [f"t={self.t:.3f}", self.contender, self.kind]
        for name in ("token", "resource", "write_id", "revision", "current", "lease"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value:x}" if name == "lease" else f"{name}={value}")
        if self.deadline is not None:
            parts.append(f"deadline={self.deadline:.3f}")
        if self.detail:
            parts.append(f"({self.detail})")
        return " ".join(parts)


@dataclass(frozen=True)
class Change:
    """One key change etcd made, as a watch reported it."""

    revision: int
    key: str
    value: str
    deleted: bool = False
    create_revision: int = 0
    lease: int = 0

    def describe(self) -> str:
        """A one-line human-readable form, as used in the slice of a report."""
        what = "DELETE" if self.deleted else f"PUT {self.value!r}"
        return f"rev={self.revision} {what} {self.key}"


def write_value(write_id: str, token: int) -> str:
    """The value a recorded write stores: its id and token, so the observer can tell
    which write (and which token) the resource accepted, guarded or not."""
    return json.dumps({"w": write_id, "tok": token}, separators=(",", ":"))


def parse_write_value(value: str | bytes) -> tuple[str, int] | None:
    """``(write_id, token)`` of a value made by :func:`write_value`, else ``None``."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not value.startswith("{"):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    write_id, token = data.get("w"), data.get("tok")
    if not isinstance(write_id, str) or not isinstance(token, int):
        return None
    return write_id, token


@dataclass(frozen=True)
class Layout:
    """Where one run keeps its keys, all under ``root/`` so one watch sees them all.

    - the election is ``root/election`` (contender keys ``root/election/<lease hex>``);
    - high-water marks live under ``root/fence/`` (``FenceGuard(..., prefix=...)``);
    - the data of resource ``r`` is the key ``root/data/r``.
    """

    root: str

    @property
    def election(self) -> str:
        """The election name (pass it to ``session.election()`` / ``LeaderElector``)."""
        return f"{self.root}/election"

    @property
    def fence_prefix(self) -> str:
        """The ``prefix=`` for :class:`~etcdfence.FenceGuard`."""
        return f"{self.root}/fence/"

    @property
    def data_prefix(self) -> str:
        """Where the protected data lives."""
        return f"{self.root}/data/"

    @property
    def watch_prefix(self) -> str:
        """The prefix an :class:`Observer` watches: everything of this run."""
        return f"{self.root}/"

    def mark_key(self, resource: str) -> str:
        """The key of ``resource``'s high-water mark."""
        return self.fence_prefix + resource

    def data_key(self, resource: str) -> str:
        """The data key of ``resource``."""
        return self.data_prefix + resource

    def guard(self, client: Any, resource: str, **kwargs: Any) -> Any:
        """``client.fence(resource, prefix=self.fence_prefix)`` (sync or async client)."""
        return client.fence(resource, prefix=self.fence_prefix, **kwargs)

    def classify(self, key: str) -> tuple[str, str] | None:
        """``("election", key)``, ``("mark", resource)``, ``("data", resource)`` or None."""
        if key.startswith(self.election + "/"):
            return ("election", key)
        if key.startswith(self.fence_prefix):
            return ("mark", key[len(self.fence_prefix) :])
        if key.startswith(self.data_prefix):
            return ("data", key[len(self.data_prefix) :])
        return None


# ----------------------------------------------------------------------------- recording


@dataclass(frozen=True)
class PendingWrite:
    """A write attempt returned by :meth:`Recorder.write`; pass it to the outcome."""

    write_id: str
    token: int
    resource: str
    key: str
    value: str


def jsonl_sink(stream: IO[str]) -> Callable[[Event], None]:
    """A recorder sink that prints each event as one JSON line and flushes."""
    lock = threading.Lock()

    def sink(event: Event) -> None:
        line = event.to_json() + "\n"
        with lock:
            stream.write(line)
            stream.flush()

    return sink


def parse_events(lines: Iterable[str]) -> list[Event]:
    """Events from JSON lines (as written by :func:`jsonl_sink`); other lines are skipped."""
    events = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("kind") in EVENT_KINDS and "t" in data:
            events.append(Event.from_dict(data))
    return events


class Recorder:
    """The event log of one contender (thread-safe).

    ``deadline`` is a callable returning the session's local deadline (or ``None``);
    it is sampled into every event, which is how the checker knows until when the
    contender may have believed it led.
    """

    def __init__(
        self,
        contender: str,
        sink: Callable[[Event], None] | None = None,
        *,
        deadline: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.contender = contender
        self.events: list[Event] = []
        self._sink = sink
        self._deadline = deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.term: int | None = None

    def set_deadline_source(self, deadline: Callable[[], float | None] | None) -> None:
        """Change where the session deadline is sampled from (e.g. a new session)."""
        self._deadline = deadline

    def emit(self, kind: str, **fields: Any) -> Event:
        """Record an event of ``kind`` now (the helpers below are the usual way)."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        if "deadline" not in fields and self._deadline is not None:
            fields["deadline"] = self._deadline()
        with self._lock:
            event = Event(t=self._clock(), contender=self.contender, kind=kind, **fields)
            self.events.append(event)
        if self._sink is not None:
            self._sink(event)
        return event

    def campaign(self, **fields: Any) -> Event:
        """About to campaign (or acquire)."""
        return self.emit("campaign", **fields)

    def elected(self, token: Any, **fields: Any) -> Event:
        """Won: a term with ``token`` (a :class:`~etcdfence.FencingToken` or int) starts;
        record it as soon as the campaign returns."""
        value = int(token)
        self.term = value
        key = getattr(token, "key", None)
        lease = getattr(token, "lease_id", None)
        fields.setdefault("key", key)
        fields.setdefault("lease", lease)
        return self.emit("elected", token=value, **fields)

    def lost(self, reason: str = "", **fields: Any) -> Event:
        """The term ended (expired, resigned, revoked): record it *before* resigning."""
        term, self.term = self.term, None
        return self.emit("lost", token=term, detail=reason or None, **fields)

    def note(self, detail: str, **fields: Any) -> Event:
        """Anything else worth seeing in a report (ignored by the checks)."""
        return self.emit("note", detail=detail, **fields)

    def write(self, resource: str, key: str, token: Any, **fields: Any) -> PendingWrite:
        """About to write ``key`` of ``resource`` with ``token``: returns the write, whose
        ``value`` (see :func:`write_value`) is what to store. Record its outcome next."""
        value = int(token)
        with self._lock:
            self._seq += 1
            write_id = f"{self.contender}#{self._seq}"
        pending = PendingWrite(write_id, value, resource, key, write_value(write_id, value))
        self.emit("write", token=value, resource=resource, key=key, write_id=write_id, **fields)
        return pending

    def accepted(self, write: PendingWrite, revision: int, **fields: Any) -> Event:
        """The write was acknowledged at ``revision``."""
        return self._outcome("accepted", write, revision=revision, **fields)

    def rejected(self, write: PendingWrite, current: int | None = None, **fields: Any) -> Event:
        """The resource refused the write (``current``: its mark, if it said)."""
        return self._outcome("rejected", write, current=current, **fields)

    def unknown(self, write: PendingWrite, error: str = "", **fields: Any) -> Event:
        """The outcome is unknown (timeout, connection lost): it may or may not be applied."""
        return self._outcome("unknown", write, detail=error or None, **fields)

    def _outcome(self, kind: str, write: PendingWrite, **fields: Any) -> Event:
        return self.emit(
            kind,
            token=write.token,
            resource=write.resource,
            key=write.key,
            write_id=write.write_id,
            **fields,
        )

    def guarded_put(self, guard: Any, token: Any, key: str, **fields: Any) -> bool | None:
        """Write ``key`` through a sync :class:`~etcdfence.FenceGuard` and record it:
        True if accepted, False if rejected (stale token, or not the owner with
        ``require_owner=True``), None if the outcome is unknown (etcd unavailable or the
        request failed). Other errors (bad arguments, auth) propagate."""
        pending = self.write(guard.resource, key, token, **fields)
        try:
            revision = guard.put(token, key, pending.value)
        except StaleTokenError as err:
            self.rejected(pending, err.current)
            return False
        except NotOwnerError as err:
            self.rejected(pending, detail=f"not the owner: {err}")
            return False
        except (EtcdUnavailable, EtcdRequestError) as err:
            self.unknown(pending, f"{type(err).__name__}: {err}")
            return None
        self.accepted(pending, revision)
        return True


# ----------------------------------------------------------------------------- observing


class Observer:
    """Collect every change under ``layout.watch_prefix`` from ``start_revision``.

    Runs a watch on a sync :class:`~etcdfence.Client` in a daemon thread. Pass a
    ``start_revision`` at or before the first write of the run (``client.revision()``
    taken before it starts, plus one); revision 1 works on a cluster that was never
    compacted. The watch survives broken streams and member failures; if it falls
    behind a compaction, :attr:`error` is set and the history is incomplete.
    """

    def __init__(self, client: Any, layout: Layout, *, start_revision: int = 1) -> None:
        self.layout = layout
        self.start_revision = start_revision
        self._client = client
        self._changes: list[Change] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._revision = start_revision - 1
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def changes(self) -> list[Change]:
        """Every change seen so far, in revision order."""
        with self._lock:
            return list(self._changes)

    @property
    def revision(self) -> int:
        """The highest revision delivered so far."""
        with self._lock:
            return self._revision

    def start(self) -> Observer:
        """Start watching in a daemon thread (also done by ``with``)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="etcdfence-observer", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        watch = self._client.watch(
            self.layout.watch_prefix, prefix=True, start_revision=self.start_revision
        )
        try:
            watch.start()
            while not self._stop.is_set():
                try:
                    batch = watch.get(0.1)
                except TimeoutError:
                    continue
                except StopIteration:
                    return
                changes = [
                    Change(
                        revision=ev.kv.mod_revision or batch.revision,
                        key=ev.kv.key.decode("utf-8", "replace"),
                        value=ev.kv.value.decode("utf-8", "replace"),
                        deleted=ev.type == "delete",
                        create_revision=ev.kv.create_revision,
                        lease=ev.kv.lease_id,
                    )
                    for ev in batch.events
                ]
                with self._cond:
                    self._changes.extend(changes)
                    top = max([c.revision for c in changes] + [batch.revision])
                    self._revision = max(self._revision, top)
                    self._cond.notify_all()
        except (CompactedError, EtcdfenceError) as err:
            self.error = err
            with self._cond:
                self._cond.notify_all()
        finally:
            watch.close()

    def wait_for(self, revision: int, timeout: float = 10.0) -> bool:
        """Wait until changes up to ``revision`` were delivered (needs a change at or
        after it under the root, e.g. a sentinel put); return whether they were."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._revision < revision and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._revision >= revision

    def sync(self, timeout: float = 10.0) -> int:
        """Put a sentinel key under the root and wait until the watch delivered it;
        returns its revision. Raises :class:`TimeoutError` if it does not arrive."""
        revision = int(self._client.put(self.layout.root + "/observer-sync", "sync"))
        if not self.wait_for(revision, timeout):
            raise TimeoutError(
                f"observer did not reach revision {revision} within {timeout}s"
                + (f" ({self.error})" if self.error else "")
            )
        return revision

    def stop(self) -> None:
        """Stop watching; :attr:`changes` stays available."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> Observer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------- checking


@dataclass
class History:
    """Everything the checker looks at.

    ``changes`` (from an :class:`Observer`) and ``final`` (key → value read at the end)
    are optional; checks that need them are skipped without them. ``layout`` tells
    which observed keys are marks, data and contender keys. ``observed_from`` is the
    first revision the observer covered (phantom-leader checks need full coverage).
    """

    events: list[Event]
    changes: list[Change] = field(default_factory=list)
    final: dict[str, str] | None = None
    layout: Layout | None = None
    observed_from: int | None = None

    @classmethod
    def collect(
        cls,
        events: Iterable[Event],
        observer: Observer | None = None,
        final: Mapping[str, str] | None = None,
    ) -> History:
        """A history from events (any order) and, optionally, an observer's changes."""
        ordered = sorted(events, key=lambda e: e.t)
        if observer is None:
            return cls(ordered, final=None if final is None else dict(final))
        return cls(
            ordered,
            observer.changes,
            None if final is None else dict(final),
            observer.layout,
            observer.start_revision,
        )

    def read_final(self, client: Any) -> dict[str, str]:
        """Read the data keys named by the events from a sync client into ``final``."""
        final: dict[str, str] = {}
        for key in sorted({e.key for e in self.events if e.kind == "write" and e.key}):
            kv = client.get(key)
            if kv is not None:
                final[key] = kv.value.decode("utf-8", "replace")
        self.final = final
        return final


@dataclass(frozen=True)
class Violation:
    """One broken invariant, with the events and changes that show it."""

    kind: str
    message: str
    events: tuple[Event, ...] = ()
    changes: tuple[Change, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class Term:
    """One leadership term as the contender believed it: ``[start, end)``."""

    contender: str
    token: int
    start: float
    end: float
    elected: Event
    closed_by: Event | None

    @property
    def believed(self) -> bool:
        """Whether the interval is non-empty (elected before its deadline passed)."""
        return self.end > self.start


@dataclass
class CheckResult:
    """The checker's verdict: ``bool(result)`` / ``result.ok``, ``str(result)`` (one line),
    ``violations``, ``stats``, ``terms``, ``slice`` (the offending part of the history,
    one line per event/change) and :meth:`report`."""

    violations: list[Violation]
    stats: dict[str, int]
    terms: list[Term]
    slice: list[str]

    @property
    def ok(self) -> bool:
        """No violations."""
        return not self.violations

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        s = self.stats
        summary = (
            f"{s['contenders']} contenders, {s['terms']} terms, {s['writes']} writes "
            f"({s['accepted']} accepted, {s['rejected']} rejected, {s['unknown']} unknown), "
            f"stale writes {s['stale_attempted']} attempted / {s['stale_accepted']} accepted"
        )
        if self.ok:
            return f"OK: {summary}, 0 violations"
        kinds = sorted({v.kind for v in self.violations})
        return (
            f"FAIL: {len(self.violations)} violation(s) [{', '.join(kinds)}]; "
            f"first: {self.violations[0]}; {summary}"
        )

    def report(self) -> str:
        """The verdict, every violation and the offending slice of history."""
        lines = [str(self)]
        for violation in self.violations:
            lines.append(f"  - {violation}")
        if self.slice:
            lines.append("offending slice of history:")
            lines.extend(f"    {line}" for line in self.slice)
        return "\n".join(lines)


def _decode_mark(value: str) -> int | None:
    """The token part of a FenceGuard mark (``<token>`` or ``<token>:<epoch>``)."""
    token, _, epoch = value.strip().partition(":")
    if token.isdigit() and len(token) <= MARK_WIDTH and (not epoch or epoch.isdigit()):
        return int(token)
    return None


def build_terms(events: list[Event]) -> list[Term]:
    """Leadership terms per contender from its ``elected``/``lost`` events and the
    latest ``deadline`` it reported while leading."""
    terms: list[Term] = []
    by_contender: dict[str, list[Event]] = {}
    for event in sorted(events, key=lambda e: e.t):
        by_contender.setdefault(event.contender, []).append(event)

    def term(cur: Event, at: float, by: Event | None, deadline: float | None) -> Term:
        end = at if deadline is None else min(at, deadline)
        return Term(cur.contender, cur.token or 0, cur.t, end, cur, by)

    for own in by_contender.values():
        current: Event | None = None
        deadline: float | None = None
        for event in own:
            if event.kind == "elected":
                if current is not None:
                    terms.append(term(current, event.t, event, deadline))
                current, deadline = event, event.deadline
                continue
            if current is None:
                continue
            if event.deadline is not None:
                deadline = event.deadline if deadline is None else max(deadline, event.deadline)
            if event.kind == "lost":
                terms.append(term(current, event.t, event, deadline))
                current, deadline = None, None
        if current is not None:
            terms.append(term(current, _INF, None, deadline))
    terms.sort(key=lambda term: (term.start, term.token))
    return terms


LeaderState = tuple[str, int, str]
"""``(key, create_revision, value)`` of an election's leader."""


def leader_changes(
    changes: Iterable[Change], election: str
) -> list[tuple[int, LeaderState | None]]:
    """The ground-truth leader of ``election`` after each change of its contender keys:
    ``(revision, (key, create_revision, value) or None)``, listed only where the leader
    changed (another key, a new incarnation, a new proclaimed value, or nobody) — the
    same notion of "change" as :meth:`etcdfence.Client.observe`. The first entry is
    the state after the first observed change."""
    prefix = election + "/"
    live: dict[str, Change] = {}
    out: list[tuple[int, LeaderState | None]] = []
    ordered = sorted((c for c in changes if c.key.startswith(prefix)), key=lambda c: c.revision)
    for change in ordered:
        if change.deleted:
            live.pop(change.key, None)
        else:
            live[change.key] = change
        first = min(live.values(), key=lambda c: c.create_revision, default=None)
        state = None if first is None else (first.key, first.create_revision, first.value)
        if not out or state != out[-1][1]:
            out.append((change.revision, state))
    return out


def describe_events(events: Iterable[Event]) -> list[str]:
    """Every event as one line, in time order, a write and its outcome on one line and
    runs of similar writes folded: a whole small history in the form of a report's slice.
    Use it to show what happened when no violation points at a slice (the conformance
    kit's own findings)."""
    ordered = sorted(events, key=lambda e: e.t)
    return _event_lines(ordered, set(range(len(ordered))), set())


def check(history: History, *, context: float = 0.5) -> CheckResult:
    """Check every invariant listed in :mod:`etcdfence.testing.history`.

    ``context`` is how many seconds of events around each violation go into the slice.
    """
    return _Checker(history).run(context)


class _Checker:
    def __init__(self, history: History) -> None:
        self.history = history
        self.events = sorted(history.events, key=lambda e: e.t)
        self.changes = sorted(history.changes, key=lambda c: c.revision)
        self.layout = history.layout
        self.violations: list[Violation] = []
        self.writes = {e.write_id: e for e in self.events if e.kind == "write" and e.write_id}
        self.outcomes: dict[str, Event] = {}
        for event in self.events:
            if event.kind in _OUTCOMES and event.write_id:
                self.outcomes.setdefault(event.write_id, event)
        self.accepted = [e for e in self.events if e.kind == "accepted"]
        self.applied: dict[str, Change] = {}  # write id -> the change that applied it
        self.per_resource: dict[str, list[tuple[int, Change]]] = {}  # resource -> tokens
        self.data_writes: dict[str, list[Change]] = {}  # data key -> changes, revision order
        self.observed = self.layout is not None and bool(self.changes)
        if self.layout is not None:
            for change in self.changes:
                self._index(self.layout, change)
        self.stale_attempted = 0
        self.stale_accepted = 0
        self.late = 0

    def _index(self, layout: Layout, change: Change) -> None:
        kind = layout.classify(change.key)
        if kind is None or kind[0] == "election":
            return
        if kind[0] == "mark":
            token = None if change.deleted else _decode_mark(change.value)
            if token is not None:
                self.per_resource.setdefault(kind[1], []).append((token, change))
            return
        self.data_writes.setdefault(change.key, []).append(change)
        parsed = None if change.deleted else parse_write_value(change.value)
        if parsed is not None:
            self.applied.setdefault(parsed[0], change)
            self.per_resource.setdefault(kind[1], []).append((parsed[1], change))

    def add(self, kind: str, message: str, events: Iterable[Event | None] = (),
            changes: Iterable[Change | None] = ()) -> None:  # fmt: skip
        self.violations.append(
            Violation(
                kind,
                message,
                tuple(e for e in events if e is not None),
                tuple(c for c in changes if c is not None),
            )
        )

    def run(self, context: float) -> CheckResult:
        self.token_regressions()
        self.stale_writes()
        self.acknowledged_writes()
        self.late_writes()
        terms = build_terms(self.events)
        self.term_tokens(terms)
        if self.observed and self.history.observed_from is not None and self.layout:
            self.phantoms(terms, self.layout, self.history.observed_from)
        self.overlaps([term for term in terms if term.believed])
        outcomes = list(self.outcomes.values())
        stats = {
            "contenders": len({e.contender for e in self.events}),
            "terms": len(terms),
            "writes": len(self.writes),
            "accepted": sum(1 for o in outcomes if o.kind == "accepted"),
            "rejected": sum(1 for o in outcomes if o.kind == "rejected"),
            "unknown": sum(1 for o in outcomes if o.kind == "unknown"),
            "stale_attempted": self.stale_attempted,
            "stale_accepted": self.stale_accepted,
            "late_writes": self.late,
            "violations": len(self.violations),
        }
        window = _slice(self.violations, self.events, self.changes, context)
        return CheckResult(self.violations, stats, terms, window)

    def token_regressions(self) -> None:
        """Accepted tokens per resource never decrease (ground truth, revision order)."""
        for resource, seq in sorted(self.per_resource.items()):
            highest: tuple[int, Change] | None = None
            for token, change in seq:
                if highest is not None and token < highest[0]:
                    parsed = parse_write_value(change.value)
                    write_id = "" if parsed is None else parsed[0]
                    self.add(
                        "token-regression",
                        f"resource {resource!r} accepted token {token} at revision "
                        f"{change.revision} after token {highest[0]} at revision "
                        f"{highest[1].revision}",
                        (self.writes.get(write_id), self.outcomes.get(write_id)),
                        (highest[1], change),
                    )
                if highest is None or token > highest[0]:
                    highest = (token, change)

    def stale_writes(self) -> None:
        """Once a token is acknowledged, no lower token attempted later gets in; a write
        reported rejected never gets in."""
        acks = _AckIndex(self.accepted)
        for write_id, write in self.writes.items():
            outcome = self.outcomes.get(write_id)
            rejected = outcome is not None and outcome.kind == "rejected"
            change = self.applied.get(write_id)
            got_in = (outcome is not None and outcome.kind == "accepted") or change is not None
            higher = acks.higher_before(write)
            if higher is None and not rejected:
                continue
            self.stale_attempted += 1
            if not got_in:
                continue
            self.stale_accepted += 1
            if higher is not None:
                self.add(
                    "stale-accepted",
                    f"{write.contender} wrote {write.resource!r} with token {write.token} at "
                    f"t={write.t:.3f}, after {higher.contender}'s token {higher.token} was "
                    f"acknowledged at t={higher.t:.3f}, and the write was accepted"
                    + ("" if change is None else f" (revision {change.revision})"),
                    (higher, write, outcome),
                    (change,),
                )
            if rejected and change is not None:
                self.add(
                    "rejected-applied",
                    f"write {write_id} was reported rejected (stale) but etcd applied it at "
                    f"revision {change.revision}",
                    (write, outcome),
                    (change,),
                )

    def acknowledged_writes(self) -> None:
        """Every acknowledged write is in etcd's history at its revision, and in the final
        state unless a later write to the same key superseded it."""
        final_state = self.history.final
        for ack in self.accepted:
            key = ack.key
            write = self.writes.get(ack.write_id or "")
            if key is None or write is None:
                continue
            if self.observed:
                change = self.applied.get(write.write_id or "")
                if change is None or change.revision != ack.revision:
                    where = (
                        "it never appeared in etcd's history"
                        if change is None
                        else f"etcd applied it at revision {change.revision}"
                    )
                    self.add(
                        "ack-lost",
                        f"{ack.contender}'s write {ack.write_id} to {key} was acknowledged "
                        f"at revision {ack.revision} but {where}",
                        (write, ack),
                        (change,),
                    )
                    continue
                superseded = any(
                    c.revision > (ack.revision or 0) for c in self.data_writes.get(key, [])
                )
            else:
                superseded = any(
                    a.key == key and (a.revision or 0) > (ack.revision or 0) for a in self.accepted
                )
            if final_state is None or superseded:
                continue
            final = final_state.get(key)
            if final != write_value(write.write_id or "", write.token or 0):
                self.add(
                    "ack-lost",
                    f"{ack.contender}'s write {ack.write_id} to {key} (revision "
                    f"{ack.revision}) is the last write, but the final value is {final!r}",
                    (write, ack),
                )

    def late_writes(self) -> None:
        """No write of a contender applied after a later acknowledged write of that
        contender to the same resource (later: sent after the first one's outcome).
        Writes without a recorded outcome were still in flight when the run ended."""
        if not self.observed:
            return
        acks: dict[tuple[str, str | None], list[tuple[float, int, Event]]] = {}
        for ack in self.accepted:
            write = self.writes.get(ack.write_id or "")
            if write is not None and ack.revision is not None:
                acks.setdefault((write.contender, write.resource), []).append(
                    (write.t, ack.revision, ack)
                )
        # per writer: acknowledgements by send time, with the lowest revision among
        # those sent at or after each position
        index: dict[tuple[str, str | None], tuple[list[float], list[tuple[int, Event]]]] = {}
        for writer, entries in acks.items():
            entries.sort(key=lambda entry: entry[0])
            lowest: list[tuple[int, Event]] = []
            for _sent, revision, ack in reversed(entries):
                if not lowest or revision < lowest[-1][0]:
                    lowest.append((revision, ack))
                else:
                    lowest.append(lowest[-1])
            lowest.reverse()
            index[writer] = ([entry[0] for entry in entries], lowest)
        for write_id, change in sorted(self.applied.items(), key=lambda item: item[1].revision):
            write, outcome = self.writes.get(write_id), self.outcomes.get(write_id)
            found = None if write is None else index.get((write.contender, write.resource))
            if write is None or outcome is None or found is None:
                continue
            times, lowest = found
            position = bisect.bisect_right(times, outcome.t)  # sent after the outcome
            if position == len(times) or lowest[position][0] >= change.revision:
                continue
            revision, later = lowest[position]
            self.late += 1
            self.add(
                "late-write",
                f"{write.contender}'s write {write_id} to {write.resource!r} "
                f"({outcome.kind} at t={outcome.t:.3f}) was applied at revision "
                f"{change.revision}, after its later write {later.write_id} was acknowledged "
                f"at revision {revision}",
                (write, outcome, self.writes.get(later.write_id or ""), later),
                (change,),
            )

    def term_tokens(self, terms: list[Term]) -> None:
        """Each term's token is unique and increasing (per contender, and by start)."""
        seen: dict[int, Term] = {}
        last_per_contender: dict[str, Term] = {}
        for term in terms:
            other = seen.setdefault(term.token, term)
            if other is not term:
                self.add(
                    "term-token-duplicate",
                    f"token {term.token} was handed to {other.contender} "
                    f"(t={other.start:.3f}) and to {term.contender} (t={term.start:.3f})",
                    (other.elected, term.elected),
                )
            previous = last_per_contender.get(term.contender)
            if previous is not None and term.token <= previous.token:
                self.add(
                    "term-token-order",
                    f"{term.contender}'s term at t={term.start:.3f} has token {term.token}, "
                    f"not above its previous term's {previous.token}",
                    (previous.elected, term.elected),
                )
            last_per_contender[term.contender] = term
        believed = [term for term in terms if term.believed]
        for earlier, later in itertools.pairwise(believed):
            if later.contender != earlier.contender and later.token < earlier.token:
                self.add(
                    "term-token-order",
                    f"{later.contender}'s term starting t={later.start:.3f} has token "
                    f"{later.token}, below {earlier.contender}'s earlier term's "
                    f"{earlier.token}",
                    (earlier.elected, later.elected),
                )

    def phantoms(self, terms: list[Term], layout: Layout, observed_from: int) -> None:
        """At the revision of its token, an elected contender's key was the first."""
        prefix = layout.election + "/"
        election = [c for c in self.changes if c.key.startswith(prefix)]
        live: dict[str, Change] = {}
        index = 0
        for term in sorted(terms, key=lambda t: t.token):
            if term.token < observed_from or term.elected.key is None:
                continue
            while index < len(election) and election[index].revision <= term.token:
                change = election[index]
                if change.deleted:
                    live.pop(change.key, None)
                else:
                    live[change.key] = change
                index += 1
            first = min(live.values(), key=lambda c: c.create_revision, default=None)
            if first is None or first.key != term.elected.key:
                self.add(
                    "phantom-leader",
                    f"{term.contender} was elected with token {term.token} as "
                    f"{term.elected.key}, but at revision {term.token} etcd's leader was "
                    f"{None if first is None else first.key}",
                    (term.elected,),
                    (first,),
                )

    def overlaps(self, believed: list[Term]) -> None:
        """No two believed-leadership intervals overlap."""
        reach: Term | None = None
        for term in believed:
            if reach is not None and term.start < reach.end:
                self.add(
                    "leadership-overlap",
                    f"{term.contender} believed it led from t={term.start:.3f} (token "
                    f"{term.token}) while {reach.contender} still believed it led until "
                    f"t={reach.end:.3f} (token {reach.token})",
                    (reach.elected, reach.closed_by, term.elected),
                )
            if reach is None or term.end > reach.end:
                reach = term


class _AckIndex:
    """Per resource, the highest token acknowledged up to each moment."""

    def __init__(self, accepted: list[Event]) -> None:
        self._times: dict[str | None, list[float]] = {}
        self._best: dict[str | None, list[Event]] = {}
        for ack in sorted(accepted, key=lambda e: e.t):
            times = self._times.setdefault(ack.resource, [])
            best = self._best.setdefault(ack.resource, [])
            top = best[-1] if best else None
            times.append(ack.t)
            best.append(ack if top is None or (ack.token or 0) > (top.token or 0) else top)

    def higher_before(self, write: Event) -> Event | None:
        """The first acknowledgement of a token above ``write``'s before it started."""
        times = self._times.get(write.resource)
        if not times:
            return None
        index = bisect.bisect_left(times, write.t)  # acknowledgements strictly before
        if index == 0:
            return None
        top = self._best[write.resource][index - 1]
        return top if (top.token or 0) > (write.token or 0) else None


def _slice(
    violations: list[Violation], events: list[Event], changes: list[Change], context: float
) -> list[str]:
    """The part of the history around the violations: the involved contenders' events
    within ``context`` seconds (every contender's elected/lost events too, and the
    election that started each involved term), and the changes near the revisions
    involved. A write and its outcome share one line."""
    if not violations:
        return []
    involved = [e for v in violations for e in v.events]
    chosen = _chosen_events(involved, events, context)
    lines = _event_lines(events, chosen, {id(e) for e in involved})
    lines += _changes_near(violations, involved, changes)
    limit = 120
    if len(lines) > limit:
        half = limit // 2
        lines = [*lines[:half], f"... {len(lines) - limit} lines left out ...", *lines[-half:]]
    return lines


def _chosen_events(involved: list[Event], events: list[Event], context: float) -> set[int]:
    """Indexes into ``events`` worth showing around the ``involved`` events."""
    chosen: set[int] = set()
    if not involved:
        return chosen
    lo = min(e.t for e in involved) - context
    hi = max(e.t for e in involved) + context
    who = {e.contender for e in involved}
    for index, event in enumerate(events):
        if lo <= event.t <= hi and (event.contender in who or event.kind in ("elected", "lost")):
            chosen.add(index)
    for contender in who:
        starts = [
            i
            for i, e in enumerate(events)
            if e.contender == contender and e.kind == "elected" and e.t < lo
        ]
        if starts:
            chosen.add(starts[-1])
    return chosen


def _with_outcome(event: Event, outcome: Event | None) -> str:
    """An event's line; a write's carries its outcome (``-> accepted at t=...``)."""
    line = event.describe()
    if outcome is None:
        return line
    tail = outcome.kind
    if outcome.revision is not None:
        tail += f" revision={outcome.revision}"
    if outcome.current is not None:
        tail += f" current={outcome.current}"
    if outcome.detail:
        tail += f" ({outcome.detail})"
    return f"{line} -> {tail} at t={outcome.t:.3f}"


def _event_lines(events: list[Event], chosen: set[int], key_events: set[int]) -> list[str]:
    """The chosen events as lines, a run of more than three uneventful writes of one
    contender, token and outcome folded to its first and last."""
    outcome_of = {e.write_id: e for e in events if e.kind in _OUTCOMES and e.write_id is not None}
    lines: list[str] = []
    run: list[str] = []  # consecutive uneventful writes of one contender/token/outcome
    run_sig: tuple[str, int | None, str] | None = None

    def flush() -> None:
        if len(run) > 3:
            lines.extend([run[0], f"... {len(run) - 2} similar writes ...", run[-1]])
        else:
            lines.extend(run)
        run.clear()

    for index, event in enumerate(events):
        if index not in chosen or (event.kind in _OUTCOMES and event.write_id is not None):
            continue
        outcome = outcome_of.get(event.write_id or "") if event.kind == "write" else None
        line = _with_outcome(event, outcome)
        plain = (
            event.kind == "write" and id(event) not in key_events and id(outcome) not in key_events
        )
        signature = (event.contender, event.token, "" if outcome is None else outcome.kind)
        if not plain or signature != run_sig:
            flush()
            run_sig = signature if plain else None
        (run if plain else lines).append(line)
    flush()
    return lines


def _changes_near(
    violations: list[Violation], involved: list[Event], changes: list[Change]
) -> list[str]:
    """etcd's changes within two revisions of any revision the violations involve."""
    revisions = sorted(
        {c.revision for v in violations for c in v.changes}
        | {e.revision for e in involved if e.revision}
    )
    shown: set[int] = set()
    for revision in revisions:
        for change in changes:
            if abs(change.revision - revision) <= 2 and id(change) not in shown:
                shown.add(id(change))
    if not shown:
        return []
    return [
        "etcd's history near the revisions involved:",
        *(c.describe() for c in changes if id(c) in shown),
    ]

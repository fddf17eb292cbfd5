"""Record what contenders did and believed, watch what etcd did, and check that fencing held.

Use this package to test code built on etcdfence under faults (pauses, partitions,
crashes) — the chaos suite and the conformance kit (:mod:`etcdfence.conformance`) are
built on it:

- **the recorder** (:mod:`~etcdfence.history.recorder`): every contender owns a
  :class:`Recorder` and records ``campaign`` / ``elected`` / ``lost`` and, for each
  write, ``write`` followed by ``accepted``, ``rejected`` or ``unknown``, stamped with
  :func:`time.monotonic` (system-wide on Linux, so events of several processes on one
  machine share one clock). Use it wherever a contender runs; in a child process give
  it :func:`jsonl_sink` and read the lines back in the parent with :func:`parse_events`
  (the event format, :mod:`~etcdfence.history.events`, is one JSON object per line);
- **the observer** (:mod:`~etcdfence.history.observer`): an :class:`Observer` watches
  everything under the :class:`Layout` root — contender keys, high-water marks and
  data — from a revision before the run: the ground truth. Use it whenever the test
  can reach etcd; without it, only the contenders' own reports are checked;
- **the checker** (:mod:`~etcdfence.history.checker`): at the end of a run,
  :func:`check` takes the :class:`History` (events, observed changes, final state) and
  returns a :class:`CheckResult` (:mod:`~etcdfence.history.report`): ``str(result)``
  is a one-line verdict, ``result.violations`` the problems, ``result.report()`` the
  verdict, the violations and the offending slice of history.

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

Importing this package does not import the gRPC stack: a parent process that only
parses and checks events stays light (the recorder's :meth:`Recorder.guarded_put` and
the observer use whatever client they are given).
"""

from __future__ import annotations

from .checker import History, check
from .events import (
    EVENT_KINDS,
    Change,
    Event,
    jsonl_sink,
    parse_events,
    parse_write_value,
    write_value,
)
from .layout import Layout
from .observer import LeaderState, Observer, leader_changes
from .recorder import PendingWrite, Recorder
from .report import CheckResult, Violation, describe_events
from .terms import Term, build_terms

__all__ = [
    "EVENT_KINDS",
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

"""A contender process that reports what it does as history events (JSON lines).

    python -m etcdfence.testing.contender --endpoints URLS --root ROOT --id ID
        [--api sync|async] [--mode elector|once|naive|hold] [--naive] [--ttl 1]
        [--margin M] [--resource res] [--interval 0.05] [--timeout 2.0] [--term 0]
        [--unsafe] [--value V] [--linger 0]

Use it when a test needs a leader in *another process* — to freeze it (SIGSTOP), cut it
off, skew its clock — and needs to know afterwards what it did and believed. Every step
is one JSON line on stdout (:class:`etcdfence.history.Event`: campaign,
elected, write and its outcome accepted / rejected / unknown, lost, note), which
:class:`~etcdfence.testing.procs.LineReader` and
:func:`~etcdfence.history.parse_events` read back and
:func:`~etcdfence.history.check` judges. Keys follow
:class:`~etcdfence.history.Layout`: it campaigns on ``ROOT/election`` and
writes ``ROOT/data/<resource>`` through a fence guard whose marks live under
``ROOT/fence/`` (``--unsafe``: plain puts, no fencing). The library's log lines go to
stderr. SIGTERM (or SIGINT) resigns and exits 0.

``--api`` picks the twin: ``sync`` (threads) or ``async`` (asyncio). Only the asyncio
twin may run under libfaketime with a clock rate (``FAKETIME="+0 x0.5"``): CPython's
timed thread waits hang there, asyncio's timers do not. Its event times are then in its
own (faked) clock, so the parent has to re-stamp them on arrival.

``--mode`` is how it leads:

- ``elector`` (default): an :class:`~etcdfence.LeaderElector` that re-campaigns after
  every loss; while it leads it writes every ``--interval`` seconds. With ``--term S``
  it steps down after leading S seconds (leadership keeps moving). The sync work loop
  checks ``stop`` only *after* each write, like a worker that finishes the unit of work
  it started: frozen between two writes, the first thing it does on waking is one more
  write with its old token (Kleppmann's client 1) — the resource has to reject it;
- ``once``: campaign once, write until the session expires, then make one more write
  with the old token (the late write of a paused leader, which must bounce) and exit;
- ``hold``: campaign once and write nothing: a bare candidate (campaign, report,
  wait) for the handoff and failover benchmarks, which time its ``elected`` line;
- ``naive``: campaign once and write until stopped, *ignoring the local deadline* — a
  client that trusts its lease until etcd tells it otherwise (a zombie the fence has to
  stop). It reports no session deadline, so the checker takes it to believe it leads
  until it exits. ``--naive`` is ``--mode naive --unsafe``, the control of the
  partition scenarios (no deadline, no guard).

In the single-campaign modes (``once``, ``hold``, ``naive``) SIGTERM/SIGINT also ends
a campaign that is still waiting; a leader resigns, keeps its session ``--linger``
seconds more, then closes it (revoking the lease). ``--value`` is the proposal
(default: the id).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

import etcdfence as ef

from ..history import Layout, PendingWrite, Recorder, jsonl_sink

__all__ = ["main", "parse_args"]

MODES = ("elector", "once", "naive", "hold")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m etcdfence.testing.contender",
        description="a contender process that prints history events as JSON lines",
    )
    parser.add_argument("--endpoints", required=True, help="comma-separated etcd URLs")
    parser.add_argument("--root", required=True, help="the Layout root of the run")
    parser.add_argument("--id", required=True, help="contender name (also its identity)")
    parser.add_argument("--api", choices=["sync", "async"], default="sync")
    parser.add_argument("--mode", choices=MODES, default="elector")
    parser.add_argument("--naive", action="store_true", help="--mode naive --unsafe")
    parser.add_argument("--ttl", type=int, default=1)
    parser.add_argument("--margin", type=float, default=None)
    parser.add_argument("--resource", default="res")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument(
        "--term", type=float, default=0.0, help="step down after leading this long (0: never)"
    )
    parser.add_argument("--unsafe", action="store_true", help="write without the fence guard")
    parser.add_argument("--value", default=None, help="the proposal (default: the id)")
    parser.add_argument(
        "--linger", type=float, default=0.0, help="seconds between resigning and closing"
    )
    args = parser.parse_args(argv)
    if args.naive:
        args.mode, args.unsafe = "naive", True
    args.endpoints = args.endpoints.split(",")
    if args.value is None:
        args.value = args.id
    return args


class _Quit(Exception):
    """Interrupts a campaign that is still waiting when the process is told to stop."""


class _Writes:
    """Writes of the data key, each recorded with its outcome."""

    def __init__(self, args: argparse.Namespace, client: Any, recorder: Recorder) -> None:
        layout = Layout(args.root)
        self.recorder = recorder
        self.client = client
        self.resource = args.resource
        self.key = layout.data_key(args.resource)
        self.guard = layout.guard(client, args.resource)
        self.plain = args.unsafe

    def call(self, token: ef.FencingToken, pending: PendingWrite) -> Any:
        if self.plain:
            return self.client.put(self.key, pending.value)
        return self.guard.put(token, self.key, pending.value)

    def failed(self, pending: PendingWrite, err: ef.EtcdfenceError) -> None:
        if isinstance(err, ef.StaleTokenError):
            self.recorder.rejected(pending, err.current)
        elif isinstance(err, ef.NotOwnerError):
            self.recorder.rejected(pending, detail=f"not the owner: {err}")
        else:
            self.recorder.unknown(pending, f"{type(err).__name__}: {err}")

    def write(self, token: ef.FencingToken) -> None:
        """One write with the sync client."""
        pending = self.recorder.write(self.resource, self.key, token)
        try:
            revision = self.call(token, pending)
        except ef.EtcdfenceError as err:
            self.failed(pending, err)
        else:
            self.recorder.accepted(pending, revision)

    async def awrite(self, token: ef.FencingToken) -> None:
        """One write with the asyncio client (cancelled with its term: outcome unknown)."""
        pending = self.recorder.write(self.resource, self.key, token)
        try:
            revision = await self.call(token, pending)
        except ef.EtcdfenceError as err:
            self.failed(pending, err)
        except asyncio.CancelledError:
            self.recorder.unknown(pending, "cancelled with the term")
            raise
        else:
            self.recorder.accepted(pending, revision)


class _Contender:
    """State shared by both twins: the recorder, the writes, the session of the term."""

    def __init__(self, args: argparse.Namespace, client: Any) -> None:
        self.args = args
        self.layout = Layout(args.root)
        self.session: Any = None
        deadline = None if args.mode == "naive" else self.deadline
        self.recorder = Recorder(args.id, jsonl_sink(sys.stdout), deadline=deadline)
        self.writes = _Writes(args, client, self.recorder)

    def deadline(self) -> float | None:
        session = self.session
        return None if session is None else float(session.deadline)

    def on_lost(self, quitting: Callable[[], bool]) -> None:
        """A term ended (elector mode): record it, and the next campaign."""
        session = self.session
        expired = session is not None and session.expired
        self.recorder.lost(f"session expired={expired}")
        self.session = None
        if not quitting():
            self.recorder.campaign()

    def on_expired(self, wake: Any) -> Callable[[], None]:
        """The callback for the session of a single campaign: record the loss, wake."""

        def expired() -> None:
            if self.args.mode != "naive":
                self.recorder.lost("session expired=True")
                wake.set()

        return expired

    def loops(self, quitting: bool, session: Any) -> bool:
        """Whether a single-campaign loop goes on (naive ignores its deadline)."""
        return not quitting and (self.args.mode == "naive" or not session.expired)


# ----------------------------------------------------------------------------- sync


def _sync_once(state: _Contender, client: ef.Client, quit_: threading.Event) -> None:
    args, recorder = state.args, state.recorder
    wake = threading.Event()  # quit, or (once, hold) the session expired
    _after(quit_, wake.set)
    recorder.campaign()
    with client.session(args.ttl, margin=args.margin) as session:
        state.session = session
        session.on_expired(state.on_expired(wake))
        election = session.election(state.layout.election)
        _after(wake, lambda: session.interrupt_waiters(_Quit()))  # a campaign still waiting
        try:
            token = election.campaign(args.value)
        except (_Quit, ef.EtcdfenceError) as err:
            recorder.note(f"campaign ended: {type(err).__name__}")
            return
        recorder.elected(token)
        if args.mode == "hold":
            wake.wait()
        while state.loops(quit_.is_set(), session) and args.mode != "hold":
            time.sleep(args.interval)
            state.writes.write(token)
        if session.expired and args.mode == "once":
            state.writes.write(token)  # a paused leader's late write: it must bounce
        elif not session.expired or args.mode == "naive":
            recorder.lost("stopped")
            _sync_resign(election, recorder, args.linger)


def _after(event: threading.Event, then: Callable[[], None]) -> None:
    """Call ``then`` in a daemon thread once ``event`` is set."""

    def waiter() -> None:
        event.wait()
        then()

    threading.Thread(target=waiter, name="contender-wake", daemon=True).start()


def _sync_resign(election: ef.Election, recorder: Recorder, linger: float) -> None:
    try:
        election.resign()
    except ef.EtcdfenceError as err:
        recorder.note(f"resign failed: {type(err).__name__}: {err}")
    else:
        recorder.note("resigned")
    time.sleep(linger)


def _sync_elector(state: _Contender, client: ef.Client, quit_: threading.Event) -> None:
    args = state.args

    def on_elected(token: ef.FencingToken) -> None:
        state.session = elector.session  # the term's session: its deadline bounds belief
        state.recorder.elected(token)

    def work(token: ef.FencingToken, stop: threading.Event) -> None:
        until = time.monotonic() + args.term if args.term else float("inf")
        while True:
            time.sleep(args.interval)
            state.writes.write(token)
            if stop.is_set() or time.monotonic() >= until:
                return

    elector = ef.LeaderElector(
        client,
        state.layout.election,
        identity=args.id,
        ttl=args.ttl,
        margin=args.margin,
        on_elected=on_elected,
        on_lost=lambda: state.on_lost(quit_.is_set),
        retry_interval=0.05,
    )
    state.recorder.campaign()
    runner = threading.Thread(target=elector.run, args=(work,), name="elector", daemon=True)
    runner.start()
    while not quit_.wait(0.2):
        if not runner.is_alive():
            break
    elector.stop()
    runner.join(10.0)


def run_sync(args: argparse.Namespace) -> int:
    """The threaded twin."""
    quit_ = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: quit_.set())
    signal.signal(signal.SIGINT, lambda *_: quit_.set())
    with ef.Client(args.endpoints, timeout=args.timeout) as client:
        state = _Contender(args, client)
        if args.mode == "elector":
            _sync_elector(state, client, quit_)
        else:
            _sync_once(state, client, quit_)
        state.recorder.note("exit")
    return 0


# ----------------------------------------------------------------------------- asyncio


async def _async_once(state: _Contender, client: ef.AsyncClient, quit_: asyncio.Event) -> None:
    args, recorder = state.args, state.recorder
    wake = asyncio.Event()  # quit, or (once, hold) the session expired
    waker = asyncio.create_task(quit_.wait())
    waker.add_done_callback(lambda _: wake.set())
    recorder.campaign()
    async with client.session(args.ttl, margin=args.margin) as session:
        state.session = session
        session.on_expired(state.on_expired(wake))
        election = session.election(state.layout.election)
        campaign = asyncio.create_task(election.campaign(args.value))
        woken = asyncio.create_task(wake.wait())
        await asyncio.wait({campaign, woken}, return_when=asyncio.FIRST_COMPLETED)
        if not campaign.done() or campaign.exception() is not None:
            campaign.cancel()
            ended = (await asyncio.gather(campaign, return_exceptions=True))[0]
            recorder.note(f"campaign ended: {type(ended).__name__}")
            woken.cancel()
            waker.cancel()
            return
        token = campaign.result()
        recorder.elected(token)
        if args.mode == "hold":
            await woken
        while state.loops(quit_.is_set(), session) and args.mode != "hold":
            await asyncio.sleep(args.interval)
            await state.writes.awrite(token)
        if session.expired and args.mode == "once":
            await state.writes.awrite(token)  # a paused leader's late write: it must bounce
        elif not session.expired or args.mode == "naive":
            recorder.lost("stopped")
            await _async_resign(election, recorder, args.linger)
        woken.cancel()
        waker.cancel()


async def _async_resign(election: ef.AsyncElection, recorder: Recorder, linger: float) -> None:
    try:
        await election.resign()
    except ef.EtcdfenceError as err:
        recorder.note(f"resign failed: {type(err).__name__}: {err}")
    else:
        recorder.note("resigned")
    await asyncio.sleep(linger)


async def _async_elector(state: _Contender, client: ef.AsyncClient, quit_: asyncio.Event) -> None:
    args = state.args
    loop = asyncio.get_running_loop()

    def on_elected(token: ef.FencingToken) -> None:
        state.session = elector.session
        state.recorder.elected(token)

    async def work(token: ef.FencingToken, stop: asyncio.Event) -> None:
        until = loop.time() + args.term if args.term else float("inf")
        while not stop.is_set() and loop.time() < until:
            await asyncio.sleep(args.interval)
            await state.writes.awrite(token)

    elector = ef.AsyncLeaderElector(
        client,
        state.layout.election,
        identity=args.id,
        ttl=args.ttl,
        margin=args.margin,
        on_elected=on_elected,
        on_lost=lambda: state.on_lost(quit_.is_set),
        retry_interval=0.05,
    )
    state.recorder.campaign()
    runner = asyncio.create_task(elector.run(work))
    stopper = asyncio.create_task(quit_.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    elector.stop()
    try:
        await asyncio.wait_for(runner, 10.0)
    except (asyncio.TimeoutError, ef.EtcdfenceError):
        runner.cancel()
    stopper.cancel()


async def run_async(args: argparse.Namespace) -> int:
    """The asyncio twin (the one that may run under libfaketime)."""
    quit_ = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, quit_.set)
    loop.add_signal_handler(signal.SIGINT, quit_.set)
    async with ef.AsyncClient(args.endpoints, timeout=args.timeout) as client:
        state = _Contender(args, client)
        if args.mode == "elector":
            await _async_elector(state, client, quit_)
        else:
            await _async_once(state, client, quit_)
        state.recorder.note("exit")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one contender until SIGTERM (or, in ``once`` mode, its session's end)."""
    args = parse_args(argv)
    # stdout carries the JSON events: the library's log lines go to stderr
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if args.api == "sync":
        return run_sync(args)
    return asyncio.run(run_async(args))


if __name__ == "__main__":
    sys.exit(main())

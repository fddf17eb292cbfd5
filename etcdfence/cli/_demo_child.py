"""The demo's contender process: campaign, write the fenced config, obey the parent.

``etcdfence demo`` (:mod:`etcdfence.cli.demo`) starts two of these, A and B. Each reports
to the parent in the history event format — one :class:`~etcdfence.history.Event` JSON
line per event on stdout, written by a :class:`~etcdfence.history.Recorder` — so the
parent reads them with :func:`~etcdfence.history.parse_events` and judges the run with
the history checker. Events carry the session's local deadline and, in ``current``, the
fence's mark as read right after the event. Besides ``campaign``, ``elected``, ``lost``
and the writes, the contender reports ``note`` events whose ``detail`` is one of
:data:`STARTED`, :data:`DECIDING`, :data:`EXIT`, ``SEES + leader`` (:data:`NOBODY` for
no leader) or ``CRASHED + error``.

Commands come on stdin, one per line: ``write`` (decide to write the next version and
report it), ``go`` (perform the write decided on — no re-check of leadership, which is
exactly what a paused process does), ``quit``. Run as ``python -m
etcdfence.cli._demo_child --endpoints URL --id A``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from .._sync.client import Client
from .._sync.elector import LeaderElector
from ..errors import EtcdfenceError, StaleTokenError
from ..history import Event, Layout, Recorder, jsonl_sink
from ..token import FencingToken
from ..types import Leader

#: Where the demo keeps its keys: election ``demo/election``, the fence's marks under
#: ``demo/fence/``, the config at ``demo/data/config``.
LAYOUT = Layout("demo")
RESOURCE = "config"
STARTED, DECIDING, EXIT, SEES, NOBODY, CRASHED = (
    "started", "decides to write", "exit", "sees leader ", "sees no leader", "crashed: ",
)  # fmt: skip


class _MarkingRecorder(Recorder):
    """A recorder that puts the fence's mark, read right after each event, in ``current``
    (unless the event sets it, as a rejection does)."""

    def __init__(self, contender: str, mark: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(contender, jsonl_sink(sys.stdout), **kwargs)
        self._mark = mark

    def emit(self, kind: str, **fields: Any) -> Event:
        if fields.get("current") is None:
            with contextlib.suppress(EtcdfenceError):
                fields["current"] = self._mark()
        try:
            return super().emit(kind, **fields)
        except (OSError, ValueError):  # the parent closed our stdout: nobody is listening
            return Event(t=time.monotonic(), contender=self.contender, kind=kind)


def _die_with_parent() -> None:
    """Linux: get SIGKILLed when the demo process dies, even while SIGSTOPped."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent already died before prctl
            os._exit(1)


class _Contender:
    """The contender process's state: its elector, the fence, the commands from stdin."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client = Client(args.endpoints, timeout=3.0)
        self.guard = LAYOUT.guard(self.client, RESOURCE)
        self.commands: queue.Queue[str] = queue.Queue()
        self.quitting = threading.Event()
        self.elector = LeaderElector(
            self.client,
            LAYOUT.election,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=lambda token: self.recorder.elected(token),
            on_lost=lambda: self.recorder.lost("resigned" if self.quitting.is_set() else "lost"),
            on_leader_change=self._on_leader_change,
            retry_interval=0.5,
        )
        self.recorder = _MarkingRecorder(args.identity, self.guard.current, deadline=self.deadline)

    def deadline(self) -> float | None:
        """The term's session's local deadline: it bounds A's belief while frozen."""
        session = self.elector.session
        return None if session is None else float(session.deadline)

    def main(self) -> int:
        """Campaign in a thread; pass stdin's commands to it until ``quit`` or EOF."""

        def on_term(signum: int, frame: Any) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
        self.recorder.note(STARTED)
        worker = threading.Thread(target=self._run_elector, name="elector", daemon=True)
        self.recorder.campaign()
        worker.start()
        try:
            for line in sys.stdin:
                command = line.strip()
                if command == "quit":
                    break
                self.commands.put(command)
        finally:
            self._shut_down(worker)
        return 0

    def _shut_down(self, worker: threading.Thread) -> None:
        self.quitting.set()
        self.commands.put("quit")
        deadline = time.monotonic() + 3.0
        while worker.is_alive() and time.monotonic() < deadline:
            self.elector.stop()  # repeated: a stop() racing a campaign start can be missed
            worker.join(0.1)
        self.recorder.note(EXIT)
        self.client.close()

    def _run_elector(self) -> None:
        try:
            self.elector.run(self.work)
        except BaseException as exc:  # reported, then the process ends
            self.recorder.note(f"{CRASHED}{type(exc).__name__}: {exc}")

    def _on_leader_change(self, leader: Leader | None) -> None:
        name = None if leader is None else leader.value.decode("utf-8", "replace")
        self.recorder.note(NOBODY if name is None else SEES + name)

    def work(self, token: FencingToken, stop: threading.Event) -> None:
        """One term: write once, then write whenever told, until the term or we end."""
        if not self.write(token):
            return
        while True:
            command = self._next_command(stop)
            if command is None or command == "quit":
                return
            if command == "write":
                self.recorder.note(DECIDING, token=token.value)
                # A real process would compute the new config here. If it is paused now
                # it resumes right here, and writes without looking again.
                if self.commands.get() != "go" or not self.write(token):
                    return

    def _next_command(self, stop: threading.Event) -> str | None:
        """The next command from stdin, or None once the term ended (``stop`` set)."""
        while True:
            try:
                return self.commands.get(timeout=0.05)
            except queue.Empty:
                if stop.is_set():
                    return None

    def write(self, token: FencingToken) -> bool:
        """Write the next config version through the fence, recorded (the stored value
        names the write and its token); whether it was accepted."""
        pending = self.recorder.write(RESOURCE, LAYOUT.data_key(RESOURCE), token)
        try:
            revision = self.guard.put(token, pending.key, pending.value)
        except StaleTokenError as exc:
            self.recorder.rejected(pending, exc.current)
            return False
        except EtcdfenceError as exc:  # not the story's point, but never hide it
            self.recorder.unknown(pending, f"{type(exc).__name__}: {exc}")
            return False
        self.recorder.accepted(pending, revision)
        return True


def main(argv: list[str] | None = None) -> int:
    """``python -m etcdfence.cli._demo_child --endpoints URL --id NAME [--ttl N]``."""
    parser = argparse.ArgumentParser(prog="python -m etcdfence.cli._demo_child")
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--id", dest="identity", required=True)
    parser.add_argument("--ttl", type=int, default=2)
    args = parser.parse_args(argv)
    _die_with_parent()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40),  # errors only, on stderr
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    return _Contender(args).main()


if __name__ == "__main__":
    raise SystemExit(main())

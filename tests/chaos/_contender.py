"""A contender process for the chaos scenarios.

    python tests/chaos/_contender.py --endpoints URLS --root ROOT --id ID
                                     [--ttl 1] [--resource res] [--interval 0.05]
                                     [--timeout 2.0] [--term 0] [--unsafe]

It runs a :class:`etcdfence.LeaderElector` on the election ``ROOT/election`` and, while
it leads, writes ``ROOT/data/<resource>`` every ``--interval`` seconds through a
:class:`etcdfence.FenceGuard` whose mark lives under ``ROOT/fence/`` (``--unsafe``:
with a plain ``client.put``, no fencing). Every step is printed on stdout as one JSON
line (:class:`etcdfence.testing.history.Event`): campaign, elected, write and its
outcome (accepted / rejected / unknown), lost. With ``--term S`` it steps down after
leading S seconds and campaigns again (leadership keeps moving). SIGTERM resigns and
exits.

The work loop checks ``stop`` only *after* each write, like a worker that finishes the
unit of work it started: when the process is frozen between two writes (SIGSTOP, a GC
pause), the first thing it does on waking is one more write with its old token —
Kleppmann's client 1. The resource has to reject it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

import structlog

import etcdfence as ef
from etcdfence.testing.history import Layout, Recorder, jsonl_sink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--ttl", type=int, default=1)
    parser.add_argument("--resource", default="res")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--unsafe", action="store_true", help="write without the fence guard")
    parser.add_argument(
        "--term", type=float, default=0.0, help="step down after leading this long (0: never)"
    )
    args = parser.parse_args(argv)
    # stdout carries the JSON events: the library's log lines go to stderr
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    layout = Layout(args.root)
    client = ef.Client(args.endpoints.split(","), timeout=args.timeout)
    guard = layout.guard(client, args.resource)
    data_key = layout.data_key(args.resource)
    session: list[Any] = [None]

    def deadline() -> float | None:
        return None if session[0] is None else float(session[0].deadline)

    recorder = Recorder(args.id, jsonl_sink(sys.stdout), deadline=deadline)

    def on_elected(token: ef.FencingToken) -> None:
        election = elector._election  # the term's session: its deadline bounds our belief
        session[0] = None if election is None else election.session
        recorder.elected(token)

    def on_lost() -> None:
        current = session[0]
        expired = current is not None and current.expired
        recorder.lost(f"session expired={expired}")
        session[0] = None
        if not quit_.is_set():
            recorder.campaign()

    def write(token: ef.FencingToken) -> None:
        if not args.unsafe:
            recorder.guarded_put(guard, token, data_key)
            return
        pending = recorder.write(args.resource, data_key, token)
        try:
            revision = client.put(data_key, pending.value)
        except ef.EtcdfenceError as err:
            recorder.unknown(pending, f"{type(err).__name__}: {err}")
        else:
            recorder.accepted(pending, revision)

    def work(token: ef.FencingToken, stop: threading.Event) -> None:
        until = time.monotonic() + args.term if args.term else float("inf")
        while True:
            time.sleep(args.interval)
            write(token)
            if stop.is_set() or time.monotonic() >= until:
                return

    elector = ef.LeaderElector(
        client,
        layout.election,
        identity=args.id,
        ttl=args.ttl,
        on_elected=on_elected,
        on_lost=on_lost,
        retry_interval=0.05,
    )
    quit_ = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: quit_.set())
    signal.signal(signal.SIGINT, lambda *_: quit_.set())
    recorder.campaign()
    runner = threading.Thread(target=elector.run, args=(work,), name="elector", daemon=True)
    runner.start()
    while not quit_.wait(0.2):
        if not runner.is_alive():
            break
    elector.stop()
    runner.join(10.0)
    recorder.note("exit")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

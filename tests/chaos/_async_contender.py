"""An asyncio contender for the partition, skew and soak scenarios.

    python tests/chaos/_async_contender.py --endpoints URLS --root ROOT --id ID
        [--ttl 1] [--margin M] [--resource res] [--interval 0.05] [--timeout 2.0]
        [--term 0] [--unsafe] [--naive]

The asyncio twin of ``_contender.py`` (same options, same JSON event lines on stdout):
an :class:`etcdfence.AsyncLeaderElector` that, while it leads, writes
``ROOT/data/<resource>`` every ``--interval`` seconds through an
:class:`etcdfence.AsyncFenceGuard`. Being asyncio only, it can run under libfaketime
with a clock *rate* (``FAKETIME="+0 x0.5"``): CPython's timed thread waits hang there,
asyncio's timers do not (see /work/shared/FAULT-TESTING.md). Its event times are then
in its own (faked) clock: the parent re-stamps them on arrival.

``--naive`` is the control of the partition scenarios: campaign once, then write with
plain puts (no guard) and *ignore the local deadline* — a client that trusts its lease
until etcd tells it otherwise. It reports no session deadline, so the checker takes it
to believe it leads until it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import structlog

import etcdfence as ef
from etcdfence.testing.history import Layout, PendingWrite, Recorder, jsonl_sink


async def main(args: argparse.Namespace) -> int:
    layout = Layout(args.root)
    client = ef.AsyncClient(args.endpoints.split(","), timeout=args.timeout)
    guard = layout.guard(client, args.resource)
    data_key = layout.data_key(args.resource)
    loop = asyncio.get_running_loop()
    quit_ = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, quit_.set)
    loop.add_signal_handler(signal.SIGINT, quit_.set)
    session: list[Any] = [None]

    def deadline() -> float | None:
        return None if session[0] is None else float(session[0].deadline)

    recorder = Recorder(args.id, jsonl_sink(sys.stdout), deadline=None if args.naive else deadline)

    async def write(token: ef.FencingToken) -> None:
        pending: PendingWrite = recorder.write(args.resource, data_key, token)
        try:
            if args.unsafe or args.naive:
                revision = await client.put(data_key, pending.value)
            else:
                revision = await guard.put(token, data_key, pending.value)
        except ef.StaleTokenError as err:
            recorder.rejected(pending, err.current)
        except ef.NotOwnerError as err:
            recorder.rejected(pending, detail=f"not the owner: {err}")
        except ef.EtcdfenceError as err:
            recorder.unknown(pending, f"{type(err).__name__}: {err}")
        except asyncio.CancelledError:
            recorder.unknown(pending, "cancelled with the term")
            raise
        else:
            recorder.accepted(pending, revision)

    if args.naive:
        recorder.campaign()
        async with client.session(args.ttl, margin=args.margin) as naive_session:
            token = await naive_session.election(layout.election).campaign(args.id.encode())
            recorder.elected(token)
            while not quit_.is_set():
                await asyncio.sleep(args.interval)
                await write(token)
            recorder.lost("stopped")
        recorder.note("exit")
        await client.aclose()
        return 0

    elector: ef.AsyncLeaderElector

    def on_elected(token: ef.FencingToken) -> None:
        election = elector._election
        session[0] = None if election is None else election.session
        recorder.elected(token)

    def on_lost() -> None:
        current = session[0]
        expired = current is not None and current.expired
        recorder.lost(f"session expired={expired}")
        session[0] = None
        if not quit_.is_set():
            recorder.campaign()

    async def work(token: ef.FencingToken, stop: asyncio.Event) -> None:
        until = loop.time() + args.term if args.term else float("inf")
        while not stop.is_set() and loop.time() < until:
            await asyncio.sleep(args.interval)
            await write(token)

    elector = ef.AsyncLeaderElector(
        client,
        layout.election,
        identity=args.id,
        ttl=args.ttl,
        margin=args.margin,
        on_elected=on_elected,
        on_lost=on_lost,
        retry_interval=0.05,
    )
    recorder.campaign()
    runner = asyncio.create_task(elector.run(work))
    stopper = asyncio.create_task(quit_.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    elector.stop()
    try:
        await asyncio.wait_for(runner, 10.0)
    except (asyncio.TimeoutError, ef.EtcdfenceError):
        runner.cancel()
    stopper.cancel()
    recorder.note("exit")
    await client.aclose()
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--ttl", type=int, default=1)
    parser.add_argument("--margin", type=float, default=None)
    parser.add_argument("--resource", default="res")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--term", type=float, default=0.0)
    parser.add_argument("--unsafe", action="store_true", help="write without the fence guard")
    parser.add_argument(
        "--naive", action="store_true", help="control: no guard, ignore the local deadline"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    sys.exit(asyncio.run(main(parse())))

"""An asyncio service whose leader-only work runs under AsyncLeaderElector.

Every instance serves (here: a heartbeat loop stands in for the real service); only the
elected leader also runs the singleton duty — publishing a fenced "who leads, since
when" status record every ``--interval`` seconds. When leadership is lost the duty's
task is cancelled at once, and every write it makes carries the term's fencing token,
so even a write already on its way is refused if a newer leader exists::

    python examples/async_service.py --id api-1 --duration 20
    python examples/async_service.py --id api-2 --iterations 3

The run is bounded: it ends after ``--iterations`` leader writes by this instance or
after ``--duration`` seconds, then resigns and exits 0. Prints ``[ID] leader write N
(token T)`` for each write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import etcdfence as ef


async def run(args: argparse.Namespace) -> int:
    writes = 0
    async with ef.AsyncClient(args.endpoints, timeout=5.0) as client:
        guard = client.fence(args.name)

        async def duty(token: ef.FencingToken, stop: asyncio.Event) -> None:
            """Leader-only work: cancelled by the elector when the term ends."""
            nonlocal writes
            while not stop.is_set():
                writes += 1
                status = {"leader": args.identity, "token": token.value, "at": time.time()}
                # Not under NAME/: every key there counts as a candidate of the election.
                try:
                    await guard.put(token, f"status/{args.name}", json.dumps(status))
                except ef.StaleTokenError as exc:
                    print(f"[{args.identity}] fenced off (mark {exc.current})", flush=True)
                    return
                print(f"[{args.identity}] leader write {writes} (token {token})", flush=True)
                if args.iterations is not None and writes >= args.iterations:
                    elector.stop()
                    return
                try:
                    await asyncio.wait_for(stop.wait(), args.interval)
                except asyncio.TimeoutError:
                    pass

        elector = ef.AsyncLeaderElector(
            client,
            args.name,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=lambda t: print(f"[{args.identity}] elected (token {t})", flush=True),
            on_lost=lambda: print(f"[{args.identity}] not leader any more", flush=True),
        )

        async def heartbeat() -> None:
            """Stands in for the part of the service every instance runs."""
            while True:
                await asyncio.sleep(args.interval)

        async def deadline() -> None:
            if args.duration is not None:
                await asyncio.sleep(args.duration)
                elector.stop()

        print(f"[{args.identity}] serving; campaigning for {args.name!r}", flush=True)
        background = [asyncio.create_task(heartbeat()), asyncio.create_task(deadline())]
        try:
            await elector.run(duty)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    print(f"[{args.identity}] done after {writes} leader write(s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--endpoints",
        default=os.environ.get("ETCDFENCE_ENDPOINTS", "http://127.0.0.1:2379"),
        help="etcd endpoints (default: $ETCDFENCE_ENDPOINTS or http://127.0.0.1:2379)",
    )
    parser.add_argument("--name", default="services/api-singleton", help="election name")
    parser.add_argument("--id", dest="identity", default=f"pid-{os.getpid()}")
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL in seconds")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between writes")
    parser.add_argument("--iterations", type=int, default=None, help="stop after N writes")
    parser.add_argument("--duration", type=float, default=None, help="stop after S seconds")
    args = parser.parse_args(argv)
    if args.iterations is None and args.duration is None:
        parser.error("give --iterations and/or --duration so the run ends")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())

"""Client and guard throughput, measured side by side against one embedded etcd.

Ratios printed (targets from the issues):
  * etcdfence Client.put vs python3-etcd3 put, sequential          >= 1.0
  * AsyncClient, 64 puts in flight vs sequential sync puts         >= 3.0
  * guard.put vs client.put on the same client, sequential         >= 0.9
  * 64 guarded writes in flight (async, distinct resources) vs 64 plain puts in flight  >= 0.8

Each comparison runs twice: against a durable etcd (every write fsynced — what
production sees, where the disk dominates) and against ``--unsafe-no-fsync``
(where the client's own CPU cost and etcd's apply cost become visible).

Run: ``python bench/bench_client.py [--n 300] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import etcd3
from _common import Result, interleave, machine, table, verdict

import etcdfence as ef
from etcdfence.testing import EtcdServer


def run(n: int, rounds: int, *, fsync: bool = True) -> list[Result]:
    """One side-by-side run. ``fsync=False`` starts etcd with ``--unsafe-no-fsync`` so
    the disk does not dominate every write and the clients' own cost shows."""
    with EtcdServer(extra_args=[] if fsync else ["--unsafe-no-fsync"]) as server:
        host, port = server.endpoint.rsplit("//", 1)[-1].split(":")
        legacy = etcd3.client(host=host, port=int(port))
        client = ef.Client(server.endpoint)
        guard = client.fence("bench/guarded")
        value = b"x" * 64
        token = ef.FencingToken(10**12)  # far above any revision: always accepted

        def ef_put() -> int:
            for i in range(n):
                client.put(f"bench/ef/{i % 64}", value)
            return n

        def etcd3_put() -> int:
            for i in range(n):
                legacy.put(f"bench/e3/{i % 64}", value)
            return n

        def guarded_put() -> int:
            for i in range(n):
                guard.put(token, f"bench/g/{i % 64}", value)
            return n

        loop = asyncio.new_event_loop()
        aclient = ef.AsyncClient(server.endpoint)
        aguards = [aclient.fence(f"bench/r{i}") for i in range(64)]

        async def in_flight(make: object, total: int) -> int:
            sem = asyncio.Semaphore(64)

            async def one(i: int) -> None:
                async with sem:
                    await make(i)  # type: ignore[operator]

            await asyncio.gather(*(one(i) for i in range(total)))
            return total

        def async_plain() -> int:
            return loop.run_until_complete(
                in_flight(lambda i: aclient.put(f"bench/a/{i % 64}", value), n * 4)
            )

        def async_guarded() -> int:
            return loop.run_until_complete(
                in_flight(lambda i: aguards[i % 64].put(token, f"bench/ag/{i % 64}", value), n * 4)
            )

        ef_put(), etcd3_put(), async_plain()  # warm up channels
        seq = interleave({"ef": ef_put, "etcd3": etcd3_put, "guarded": guarded_put}, rounds)
        par = interleave({"async64": async_plain, "async64_guarded": async_guarded}, rounds)
        loop.run_until_complete(aclient.aclose())
        loop.close()
        client.close()
        legacy.close()
        version = ".".join(map(str, server.version))
    results = [
        {
            "name": "Client.put / python3-etcd3 put",
            "ratio": seq["ef"] / seq["etcd3"],
            "target": 1.0,
            "detail": f"{seq['ef']:.0f} vs {seq['etcd3']:.0f} ops/s",
        },
        {
            "name": "AsyncClient 64 in flight / sequential Client.put",
            "ratio": par["async64"] / seq["ef"],
            "target": 3.0,
            "detail": f"{par['async64']:.0f} vs {seq['ef']:.0f} ops/s",
        },
        {
            "name": "guard.put / client.put (sequential)",
            "ratio": seq["guarded"] / seq["ef"],
            "target": 0.9,
            "detail": f"{seq['guarded']:.0f} vs {seq['ef']:.0f} ops/s",
        },
        {
            "name": "64 guarded in flight / 64 plain in flight (async)",
            "ratio": par["async64_guarded"] / par["async64"],
            "target": 0.8,
            "detail": f"{par['async64_guarded']:.0f} vs {par['async64']:.0f} ops/s",
        },
    ]
    mode = "durable etcd (fsync)" if fsync else "client-bound etcd (--unsafe-no-fsync)"
    print(f"\n## {mode} — {machine()}, etcd {version}, n={n}, rounds={rounds}")
    return results


def report(results: list[Result]) -> None:
    rows = [
        (
            r["name"],
            f"{r['ratio']:.2f}x",
            f">= {r['target']}",
            verdict(r["ratio"], r["target"]),
            r["detail"],
        )
        for r in results
    ]
    print(table(rows, ("comparison", "ratio", "target", "verdict", "measured")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="operations per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for fsync in (True, False):
        report(run(args.n, args.rounds, fsync=fsync))


if __name__ == "__main__":
    main()

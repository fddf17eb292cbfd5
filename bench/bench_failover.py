"""Crash failover time vs session TTL (1, 2, 5 s): SIGKILL the leader *process* and
time until the next candidate process's ``campaign`` returns.

Candidates are ``bench_handoff.py child`` processes (asyncio API, one session of
the given TTL each) started in a chain on one election, as in the handoff bench.
The parent waits a random 0.1 s … TTL/3 + 0.1 s (so the kill lands at a random
point of the leader's keepalive cycle), sends SIGKILL, and stamps the first line
the next candidate prints once elected. Nothing resigns or revokes: the dead
leader's lease must run out on the etcd server, whose lessor looks for expired
leases every 0.5 s (etcd 3.5); then the waiter's watch sees its key deleted.

Expected: the lease was last renewed at most TTL/3 before the kill, so the remaining
lease life is between 2/3·TTL and TTL; add up to 0.5 s of lessor granularity and one
handoff. Target: failover ≤ TTL + 1 s. The TTLs alternate in rounds; durable etcd
(TTL dominates; fsync adds one disk write to the revoke).

    python bench/bench_failover.py [--quick] [--rounds 2] [--chain 4] [--ttls 1,2,5]
"""

from __future__ import annotations

import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_curves import (
    Json,
    Stopwatch,
    bench_args,
    median,
    python_child_env,
    reap,
    save,
    start_etcd,
)
from bench_handoff import child_command, start_chain

import etcdfence as ef


def failover_chain(client: ef.Client, endpoint: str, name: str, ttl: int, k: int) -> list[float]:
    env = python_child_env()
    commands = [child_command(endpoint, name, ttl, f"c{i}") for i in range(k)]
    procs: list[tuple[Any, Any]] = start_chain(client, commands, name, env)
    out: list[float] = []
    try:
        for i in range(k - 1):
            time.sleep(random.uniform(0.1, ttl / 3 + 0.1))
            proc, _ = procs[i]
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            elected, _ = procs[i + 1][1].next(timeout=ttl + 15)
            out.append(elected - killed)
            proc.wait(5)
    finally:
        for proc, _ in procs:
            reap(proc)
    return out


def main() -> int:
    parser = bench_args(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--chain", type=int, default=None, help="candidates per chain")
    parser.add_argument("--ttls", default="1,2,5")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    chain = args.chain or (3 if args.quick else 4)
    ttls = [int(x) for x in args.ttls.split(",")]
    clock = Stopwatch()
    samples: dict[str, list[float]] = {str(ttl): [] for ttl in ttls}
    with start_etcd(fsync=True) as server, ef.Client(server.endpoint) as client:
        for rnd in range(rounds):
            for ttl in ttls if rnd % 2 == 0 else list(reversed(ttls)):
                got = failover_chain(client, server.endpoint, f"failover/{ttl}/{rnd}", ttl, chain)
                samples[str(ttl)].extend(got)
                print(
                    f"  round {rnd} ttl={ttl}s  failover " + " ".join(f"{x:.2f}s" for x in got),
                    flush=True,
                )
    data: Json = {
        "ttls": ttls,
        "rounds": rounds,
        "chain": chain,
        "lessor_interval_s": 0.5,
        "results": {
            key: {
                "samples_s": [round(x, 3) for x in values],
                "median_s": round(median(values), 3),
                "max_s": round(max(values), 3),
                "min_s": round(min(values), 3),
                "target_s": int(key) + 1,
            }
            for key, values in samples.items()
        },
    }
    data.update(clock.result())
    save("failover", data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What does fencing cost a SQL write? ``SQLFence.guarded`` insert vs the same insert
in a plain transaction, per dialect, measured side by side.

    python bench/bench_sql.py                 # sqlite, postgresql, mariadb; --n 1000 per side
    python bench/bench_sql.py --n 5000 --dialects postgresql

Batches of guarded and plain inserts alternate (AB BA AB ...) on the same connection
and table, so drift (autovacuum, checkpoints, CPU frequency) hits both sides alike.
The guarded side uses one token for the whole run, as a leader does within one term.
PostgreSQL's target: guarded <= 1.5x plain. Servers come from ``--pg-dsn`` /
``--mysql-dsn`` (defaults: local trust-auth PostgreSQL and MariaDB root); one that
does not answer is skipped.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from etcdfence.sql import SQLFence

PG_TARGET = 1.5


@dataclass
class Result:
    dialect: str
    n: int
    plain_us: float  # mean microseconds per insert
    guarded_us: float
    ratio_median: float  # median over batch pairs of guarded/plain


def connect(dialect: str, args: argparse.Namespace, tmp: Path) -> Any:
    if dialect == "sqlite":
        return sqlite3.connect(tmp / "bench.db", timeout=30)
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(args.pg_dsn, connect_timeout=5)
    import pymysql

    u = urlsplit(args.mysql_dsn)
    return pymysql.connect(
        host=u.hostname or "127.0.0.1",
        port=u.port or 3306,
        user=unquote(u.username or "root"),
        password=unquote(u.password or ""),
        database=u.path.lstrip("/") or "test",
        connect_timeout=5,
    )


def bench(dialect: str, conn: Any, n: int, batch: int) -> Result:
    suffix = uuid.uuid4().hex[:8]
    fences, data = f"bench_fences_{suffix}", f"bench_data_{suffix}"
    p = "?" if dialect == "sqlite" else "%s"
    idcol = {
        "sqlite": "id INTEGER PRIMARY KEY AUTOINCREMENT",
        "postgresql": "id BIGSERIAL PRIMARY KEY",
        "mysql": "id BIGINT AUTO_INCREMENT PRIMARY KEY",
    }[dialect]
    tail = " ENGINE=InnoDB" if dialect == "mysql" else ""
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {data} ({idcol}, payload VARCHAR(64) NOT NULL){tail}")
    conn.commit()
    fence = SQLFence(conn, table=fences)
    fence.ensure_schema()
    insert = f"INSERT INTO {data} (payload) VALUES ({p})"
    token = 1_000_000

    def guarded() -> None:
        with fence.guarded("bench/orders", token) as c:
            c.execute(insert, ("guarded",))

    def plain() -> None:
        c = conn.cursor()
        c.execute(insert, ("plain",))
        conn.commit()
        c.close()

    def run(op: Callable[[], None], count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            op()
        return time.perf_counter() - start

    try:
        run(guarded, min(50, n))  # warm-up: connection, prepared statements, caches
        run(plain, min(50, n))
        times = {"guarded": 0.0, "plain": 0.0}
        ratios = []
        done = 0
        pair = 0
        while done < n:
            k = min(batch, n - done)
            order = ("guarded", "plain") if pair % 2 == 0 else ("plain", "guarded")
            took = {name: run(guarded if name == "guarded" else plain, k) for name in order}
            for name, t in took.items():
                times[name] += t
            ratios.append(took["guarded"] / took["plain"])
            done += k
            pair += 1
    finally:
        c = conn.cursor()
        c.execute(f"DROP TABLE {data}")
        c.execute(f"DROP TABLE {fences}")
        conn.commit()
    return Result(
        dialect,
        n,
        plain_us=times["plain"] / n * 1e6,
        guarded_us=times["guarded"] / n * 1e6,
        ratio_median=statistics.median(ratios),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=1000, help="inserts per side (default 1000)")
    parser.add_argument("--batch", type=int, default=50, help="inserts per batch (default 50)")
    parser.add_argument(
        "--dialects", default="sqlite,postgresql,mysql", help="comma-separated subset"
    )
    parser.add_argument("--pg-dsn", default="host=127.0.0.1 port=5432 user=postgres dbname=test")
    parser.add_argument("--mysql-dsn", default="mysql://root@127.0.0.1:3306/test")
    args = parser.parse_args(argv)

    results: list[Result] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in [d.strip() for d in args.dialects.split(",") if d.strip()]:
            try:
                conn = connect(dialect, args, Path(tmp))
            except Exception as exc:
                skipped.append(f"{dialect}: not reachable ({exc.__class__.__name__}: {exc})")
                continue
            try:
                results.append(bench(dialect, conn, args.n, args.batch))
            finally:
                conn.close()

    print(f"{'dialect':<11} {'n':>6} {'plain µs':>9} {'guarded µs':>11} {'ratio':>6} {'median':>7}")
    for r in results:
        ratio = r.guarded_us / r.plain_us
        print(
            f"{r.dialect:<11} {r.n:>6} {r.plain_us:>9.1f} {r.guarded_us:>11.1f}"
            f" {ratio:>5.2f}x {r.ratio_median:>6.2f}x"
        )
    for line in skipped:
        print(f"skipped {line}")
    pg = next((r for r in results if r.dialect == "postgresql"), None)
    if pg is not None:
        ratio = pg.guarded_us / pg.plain_us
        verdict = "meets" if ratio <= PG_TARGET else "MISSES"
        print(f"postgresql: guarded/plain {ratio:.2f}x {verdict} the <= {PG_TARGET}x target")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What does fencing cost a SQL write? ``SQLFence.guarded`` insert vs the same insert
in a plain transaction, per dialect, measured side by side.

    python -m bench.sql                 # sqlite, postgresql, mariadb; --n 1000 per side
    python -m bench.sql --n 5000 --dialects postgresql
    python -m bench.sql --render-only

Batches of guarded and plain inserts alternate (AB BA AB ...) on the same connection
and table, so drift (autovacuum, checkpoints, CPU frequency) hits both sides alike.
The guarded side uses one token for the whole run, as a leader does within one term.
PostgreSQL's target: guarded <= 1.5x plain. Servers come from ``--pg-dsn`` /
``--mysql-dsn`` (defaults: local trust-auth PostgreSQL and MariaDB root); one that
does not answer is skipped.
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from bench._common import Json, Part, Stopwatch, md_table, ratio, run_topic, save_data, topic_args
from etcdfence.sql import SQLFence

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
MYSQL_DSN = "mysql://root@127.0.0.1:3306/test"

PG_TARGET = 1.5


@dataclass
class Result:
    dialect: str
    n: int
    plain_us: float  # mean microseconds per insert
    guarded_us: float
    ratio_median: float  # median over batch pairs of guarded/plain


def connect(dialect: str, dsn: dict[str, str], tmp: Path) -> Any:
    if dialect == "sqlite":
        return sqlite3.connect(tmp / "bench.db", timeout=30)
    if dialect == "postgresql":
        import psycopg

        return psycopg.connect(dsn["postgresql"], connect_timeout=5)
    import pymysql

    u = urlsplit(dsn["mysql"])
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
    fence = SQLFence(conn, "bench/orders", table=fences)
    fence.ensure_schema()
    insert = f"INSERT INTO {data} (payload) VALUES ({p})"
    token = 1_000_000

    def guarded() -> None:
        with fence.guarded(token) as c:
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


def measure(
    quick: bool,
    *,
    n: int | None = None,
    batch: int = 50,
    dialects: list[str] | None = None,
    dsn: dict[str, str] | None = None,
) -> Json:
    """Guarded vs plain inserts per reachable dialect; writes ``results/sql.json``."""
    n = n or (300 if quick else 1000)
    dsn = {"postgresql": PG_DSN, "mysql": MYSQL_DSN, **(dsn or {})}
    clock = Stopwatch()
    results: list[Result] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in dialects or ["sqlite", "postgresql", "mysql"]:
            try:
                conn = connect(dialect, dsn, Path(tmp))
            except Exception as exc:
                skipped.append(f"{dialect}: not reachable ({exc.__class__.__name__}: {exc})")
                continue
            try:
                results.append(bench(dialect, conn, n, batch))
            finally:
                conn.close()
            print(f"  {results[-1]}", flush=True)
    data: Json = {"n": n, "batch": batch, "results": [asdict(r) for r in results],
                  "skipped": skipped}  # fmt: skip
    return save_data("sql", data, clock)


def render(data: Json) -> Part:
    """One row per dialect: mean µs per insert, guarded / plain (means and median)."""
    part = Part("sql", "What fencing costs a SQL write", "", machine=data.get("machine"))
    rows = []
    for r in data["results"]:
        mean = r["guarded_us"] / r["plain_us"]
        rows.append(
            [
                r["dialect"],
                str(r["n"]),
                f"{r['plain_us']:.1f}",
                f"{r['guarded_us']:.1f}",
                ratio(mean),
                ratio(r["ratio_median"]),
            ]
        )
        if r["dialect"] == "postgresql":
            part.add("sql", "SQLFence.guarded / plain insert, PostgreSQL", ratio(mean),
                     mean <= PG_TARGET, f"≤ {PG_TARGET}×")  # fmt: skip
    headers = ["dialect", "n", "plain µs", "guarded µs", "guarded / plain", "median of batches"]
    parts = [
        "`SQLFence.guarded` insert (check the fence, raise it and write in one transaction) "
        "vs the same insert in a plain transaction, on the same connection and table. "
        f"Batches of {data['batch']} alternate (AB BA AB …) so drift (autovacuum, "
        "checkpoints, CPU frequency) hits both sides alike; one token for the whole run, "
        "as a leader within one term.",
        "",
        md_table(headers, rows),
        "",
    ]
    parts += [f"Skipped {line}." for line in data["skipped"]]
    part.section = "\n".join(parts).rstrip() + "\n"
    return part


def main(argv: list[str] | None = None) -> int:
    parser = topic_args(__doc__)
    parser.add_argument("--n", type=int, default=None, help="inserts per side (1000; quick 300)")
    parser.add_argument("--batch", type=int, default=50, help="inserts per batch (default 50)")
    parser.add_argument(
        "--dialects", default="sqlite,postgresql,mysql", help="comma-separated subset"
    )
    parser.add_argument("--pg-dsn", default=PG_DSN)
    parser.add_argument("--mysql-dsn", default=MYSQL_DSN)
    args = parser.parse_args(argv)

    def run() -> Json:
        return measure(
            args.quick,
            n=args.n,
            batch=args.batch,
            dialects=[d.strip() for d in args.dialects.split(",") if d.strip()],
            dsn={"postgresql": args.pg_dsn, "mysql": args.mysql_dsn},
        )

    return run_topic("sql", run, render, args.render_only)


if __name__ == "__main__":
    sys.exit(main())

"""Write one row to a SQL database, fenced by a token: a stale writer's row never lands.

Run it with an explicit token::

    python examples/fenced_sql_writer.py --dsn sqlite:///tmp/x.db --token 42 \\
        --key primary --value 10.0.0.5

or under a lock, which hands the token down in the environment (``ETCDFENCE_TOKEN``
from ``etcdfence lock``, ``ETCD_LOCK_REV`` from ``etcdctl lock``)::

    etcdfence lock jobs/db -- python examples/fenced_sql_writer.py \\
        --dsn postgresql://postgres@127.0.0.1/test --key primary --value 10.0.0.5

DSNs: ``sqlite:///abs/path.db`` (or ``sqlite://relative.db``),
``postgresql://user:pw@host:port/db`` (psycopg 3), ``mysql://user:pw@host:port/db``
(PyMySQL; MariaDB too). Exit status: 0 written, 2 no/invalid token, 3 stale token
(a newer holder has already written; nothing was changed).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from typing import Any
from urllib.parse import unquote, urlsplit

from etcdfence.errors import InvalidToken, StaleTokenError
from etcdfence.sql import SQLFence
from etcdfence.token import FencingToken, parse_token

EXIT_OK, EXIT_BAD_TOKEN, EXIT_STALE = 0, 2, 3


def connect(dsn: str) -> Any:
    """Open a DB-API connection for a DSN of the forms listed above."""
    scheme = dsn.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return sqlite3.connect(dsn[len("sqlite://") :], timeout=30)
    if scheme in ("postgresql", "postgres"):
        import psycopg

        return psycopg.connect(dsn)
    if scheme in ("mysql", "mariadb"):
        import pymysql

        u = urlsplit(dsn)
        return pymysql.connect(
            host=u.hostname or "127.0.0.1",
            port=u.port or 3306,
            user=unquote(u.username or "root"),
            password=unquote(u.password or ""),
            database=u.path.lstrip("/") or None,
        )
    raise SystemExit(f"unsupported DSN scheme {scheme!r} (sqlite, postgresql, mysql)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--dsn", required=True, help="sqlite:///path | postgresql://... | mysql://..."
    )
    parser.add_argument("--token", help="fencing token (default: from the environment)")
    parser.add_argument("--resource", default="fenced_kv", help="name of the fenced resource")
    parser.add_argument("--key", default="primary")
    parser.add_argument("--value", required=True)
    args = parser.parse_args(argv)

    try:
        token = (
            FencingToken.from_env()
            if args.token is None
            else FencingToken(parse_token(args.token, source="--token"))
        )
    except InvalidToken as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_TOKEN

    conn = connect(args.dsn)
    try:
        fence = SQLFence(conn, args.resource)
        fence.ensure_schema()
        p = "?" if fence.dialect == "sqlite" else "%s"
        cur = conn.cursor()
        cur.execute(
            "CREATE TABLE IF NOT EXISTS fenced_kv ("
            "name VARCHAR(255) NOT NULL PRIMARY KEY, value TEXT NOT NULL, token BIGINT NOT NULL)"
        )
        conn.commit()
        try:
            # The check, the mark and these statements commit together or not at all.
            with fence.guarded(token) as cur:
                cur.execute(f"DELETE FROM fenced_kv WHERE name = {p}", (args.key,))
                cur.execute(
                    f"INSERT INTO fenced_kv (name, value, token) VALUES ({p}, {p}, {p})",
                    (args.key, args.value, int(token)),
                )
        except StaleTokenError as exc:
            print(
                f"stale token {exc.token}: {exc.resource!r} already accepted {exc.current}; "
                "nothing written",
                file=sys.stderr,
            )
            return EXIT_STALE
        print(f"wrote {args.key}={args.value!r} to {args.resource!r} with token {token}")
        return EXIT_OK
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())

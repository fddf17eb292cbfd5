"""Within-term ordering for SQLFence (#17): the (token, epoch) mark, fence_off, the
0.1 migration, and real network faults through FaultProxy's hold-and-release mode.

What the fault tests show (see etcdfence.sql's module notes): a guarded transaction
takes the mark's row lock with its first statement and the client waits for each
answer, so a COMMIT held in the network blocks every later write of the resource until
it lands, and a transaction held before its COMMIT was sent can never commit. The
control is a one-statement fenced write (the etcd shape: check and write in one
request), where a held write with a token-only check really lands late, and the epoch
check rejects it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_sql import DB, PG_DSN, VARIANTS, _mysql_params, _need, _res, legacy
from test_sql import db as sql_db  # noqa: F401  (test_sql's parametrized fixture)

from etcdfence.errors import OutcomeUnknown, StaleTokenError, UnavailableError
from etcdfence.sql import UnboundSQLFence
from etcdfence.testing import FaultProxy

T = 40  # the term's token in the fault tests
WRITER_A, WRITER_B = 1, 2


# -- schema migration and the epoch --------------------------------------------------------


def _old_table(db: DB, name: str) -> None:
    """A fences table as etcdfence 0.1 created it (no epoch column), with one mark."""
    if db.dialect == "mysql":
        ddl = (
            f"CREATE TABLE {name} (resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE"
            " utf8mb4_bin NOT NULL, token BIGINT NOT NULL, updated_at DATETIME(6) NOT NULL"
            " DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (resource)) ENGINE=InnoDB"
        )
    else:
        ddl = (
            f"CREATE TABLE {name} (resource VARCHAR(255) NOT NULL PRIMARY KEY,"
            " token BIGINT NOT NULL, updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)"
        )
    conn = db.connect()
    db.execute(conn, ddl)
    db.execute(conn, db.q(f"INSERT INTO {name} (resource, token) VALUES ({{p}}, {{p}})"), ("r", 7))
    db._forget(conn)


def test_ensure_schema_migrates_a_0_1_table(sql_db: DB) -> None:  # noqa: F811
    db = sql_db
    old, raced = f"old_{uuid.uuid4().hex[:8]}", f"old_{uuid.uuid4().hex[:8]}"
    try:
        _old_table(db, old)
        fence = legacy(db.connect(), table=old)
        fence.ensure_schema()
        assert fence.current_mark("r") == (7, 0)  # a 0.1 mark reads as epoch 0
        assert fence.current("r") == 7
        with fence.guarded("r", 7):  # a 0.1 writer used (7, 0): this fence claims above
            pass
        assert fence.current_mark("r") == (7, 1)
        assert fence.fence_off("r", 7) == (7, 2)
        fence.ensure_schema()  # idempotent
        assert fence.current_mark("r") == (7, 2)
        with pytest.raises(StaleTokenError):
            fence.advance("r", 6)
        # several processes migrating at once
        _old_table(db, raced)
        fences = [legacy(db.connect(), table=raced) for _ in range(3)]
        barrier = threading.Barrier(len(fences), timeout=10)
        errors: list[BaseException] = []

        def migrate(f: UnboundSQLFence) -> None:
            try:
                barrier.wait()
                f.ensure_schema()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=migrate, args=(f,)) for f in fences]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert fences[0].current_mark("r") == (7, 0)
    finally:
        conn = db.connect()
        for name in (old, raced):
            db.execute(conn, f"DROP TABLE IF EXISTS {name}")


def test_same_term_writers_claim_their_own_epochs_lower_tokens_stay_stale(sql_db: DB) -> None:  # noqa: F811
    db = sql_db
    a, b = db.fence(), db.fence()
    r = _res()
    a.advance(r, 10)
    assert a.current_mark(r) == (10, 0)
    assert a.fence_off(r, 10) == (10, 1)
    assert (a.epoch(r, 10), b.epoch(r, 10)) == (1, 0)
    with b.guarded(r, 10) as cur:  # b's first block claims an epoch of its own
        db.insert_log(cur, r, 10)
    assert b.epoch(r, 10) == 2
    assert db.log(r) == [10]
    assert b.current_mark(r) == (10, 2)
    assert b.fence_off(r, 10) == (10, 3)
    with a.guarded(r, 10) as cur:  # a meets epoch 3: refused at 1, claims 4, passes
        db.insert_log(cur, r, 10)
    assert a.current_mark(r) == (10, 4) and a.epoch(r, 10) == 4
    with pytest.raises(StaleTokenError) as info, b.guarded(r, 9):
        pass
    assert info.value.current == 10  # .current stays the token part
    with pytest.raises(StaleTokenError):
        a.fence_off(r, 9)
    a.advance(r, 11)  # a new term starts at epoch 0
    assert a.current_mark(r) == (11, 0)
    assert db.log(r) == [10, 10]


# -- real faults through the proxy ------------------------------------------------------------


@pytest.fixture(params=[pytest.param(v, marks=pytest.mark.sql) for v in ("postgresql", "mysql")])
def server_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DB]:
    variant: str = request.param
    _need(VARIANTS[variant])
    d = DB(variant, VARIANTS[variant], tmp_path / "unused")
    try:
        d.setup()
        yield d
    finally:
        d.teardown()


def _via(proxy: FaultProxy, db: DB, **kw: Any) -> Any:
    """A connection to the database through the proxy, set up like ``db``'s."""
    if db.dialect == "postgresql":
        import psycopg

        conn: Any = psycopg.connect(f"{PG_DSN} host=127.0.0.1 port={proxy.port}", **kw)
    else:
        import pymysql

        conn = pymysql.connect(**{**_mysql_params(), "port": proxy.port}, **kw)
    db._open.append(conn)
    return conn


def _session_id(db: DB, conn: Any) -> int:
    """The server's id of ``conn``'s session (PostgreSQL backend pid, MariaDB thread id)."""
    return int(conn.info.backend_pid if db.dialect == "postgresql" else conn.thread_id())


def _waits_on_a_lock(db: DB, session: int) -> bool:
    """Whether the session ``session`` waits on a lock now. Only that one: other tests
    (other pytest-xdist workers) share the database server and its lock waits."""
    if db.dialect == "postgresql":
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            f" AND pid = {int(session)}"
        )
    else:
        sql = (
            "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
            f" AND trx_mysql_thread_id = {int(session)}"
        )
    return int(db.query(sql)[0][0]) > 0


def _until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _impatient_fence(db: DB) -> UnboundSQLFence:
    """A fence whose row-lock waits give up after a second."""
    conn = db.connect()
    cur = conn.cursor()
    if db.dialect == "postgresql":
        cur.execute("SET lock_timeout = '1s'")
    else:
        cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
    conn.commit()
    return db.fence(conn)


def test_held_commit_blocks_later_writes_until_it_lands(server_db: DB) -> None:
    """A's COMMIT is held in the network and A's client gives up (OutcomeUnknown). No
    later write of the resource can be acknowledged before that COMMIT lands: they wait
    on the mark's row lock. fence_off returns only once it has landed, so the re-read
    after it is final, and the newer write lands after A."""
    db = server_db
    r = _res()
    db.fence().advance(r, T)
    with FaultProxy("127.0.0.1:" + ("5432" if db.dialect == "postgresql" else "3306")) as proxy:
        fence_a = db.fence(_via(proxy, db))
        assert fence_a.current(r) == T  # the proxied connection is set up
        in_block, go = threading.Event(), threading.Event()
        outcome: list[BaseException | None] = []

        def writer_a() -> None:
            try:
                with fence_a.guarded(r, T) as cur:
                    db.insert_log(cur, r, WRITER_A)
                    in_block.set()
                    go.wait(20)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread_a = threading.Thread(target=writer_a)
        thread_a.start()
        assert in_block.wait(20)
        assert proxy.hold() == 1
        go.set()  # A sends COMMIT: held
        proxy.wait_held()
        assert proxy.sever_held() == 1  # A's client gives up
        thread_a.join(20)
        assert isinstance(outcome[0], OutcomeUnknown), outcome
        assert outcome[0].fenced_off is False  # its connection is dead
        assert fence_a.bound(r)._writer.epochs.owned(T) is None  # gave its claim up first

        # A later write of the term cannot be acknowledged meanwhile ...
        impatient = _impatient_fence(db)
        driver_error = type(impatient.connection).__module__.split(".")[0]
        with pytest.raises(UnavailableError) as info, impatient.guarded(r, T) as cur:
            db.insert_log(cur, r, WRITER_B)
        # the lock wait timed out: the driver's error, as the cause of the category's
        assert type(info.value.__cause__).__module__.startswith(driver_error)
        # ... and fencing off waits for the held COMMIT too.
        fence_b = db.fence()
        session_b = _session_id(db, fence_b.connection)
        fenced: list[object] = []
        thread_b = threading.Thread(target=lambda: fenced.append(fence_b.fence_off(r, T)))
        thread_b.start()
        _until(lambda: _waits_on_a_lock(db, session_b))
        assert fenced == []  # blocked on the row lock A's transaction holds
        proxy.release()
        thread_b.join(30)
        assert fenced == [(T, 2)]  # above A's claim of (T, 1), which landed
        assert db.log(r) == [WRITER_A]  # the re-read after fence_off: A did land
        with fence_b.guarded(r, T) as cur:
            db.insert_log(cur, r, WRITER_B)
        assert db.log(r) == [WRITER_A, WRITER_B]  # the newer write stays the last
        assert fence_b.current_mark(r) == (T, 2)


def test_held_check_never_commits(server_db: DB) -> None:
    """A's BEGIN/check is held and A's client gives up before sending COMMIT (it waits
    for each answer). A later write is acknowledged; the held bytes, released, run on
    the server and are rolled back at end of stream: nothing of A ever lands."""
    db = server_db
    r = _res()
    db.fence().advance(r, T)
    with FaultProxy("127.0.0.1:" + ("5432" if db.dialect == "postgresql" else "3306")) as proxy:
        fence_a = db.fence(_via(proxy, db))
        assert fence_a.current(r) == T
        assert proxy.hold() == 1
        outcome: list[BaseException | None] = []

        def writer_a() -> None:
            try:
                with fence_a.guarded(r, T) as cur:
                    db.insert_log(cur, r, WRITER_A)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread_a = threading.Thread(target=writer_a)
        thread_a.start()
        proxy.wait_held()
        assert proxy.sever_held() == 1
        thread_a.join(20)
        assert outcome and outcome[0] is not None  # A failed; it never sent COMMIT
        fence_b = db.fence()
        with fence_b.guarded(r, T) as cur:  # acknowledged while A's bytes are held
            db.insert_log(cur, r, WRITER_B)
        proxy.release()
        _until(lambda: proxy.active_connections == 0)  # the server saw A's end of stream
        assert db.log(r) == [WRITER_B]
        assert fence_b.current_mark(r) == (T, 1)  # fence_b claimed above advance's (T, 0)


@pytest.mark.parametrize("epoch_check", [True, False], ids=["epoch", "token-only"])
def test_one_statement_write_held_in_the_network(server_db: DB, epoch_check: bool) -> None:
    """The etcd shape on SQL: check and write in ONE statement (one request, no row lock
    held across round trips). Held in the network while the writer fences off and
    writes again, then released: with the (token, epoch) check it is rejected; with a
    token-only check (the control, ordering switched off) it lands after the newer,
    acknowledged write."""
    db = server_db
    r = _res()
    db.fence().advance(r, T)
    if epoch_check:
        cond = "(token, epoch) <= ({p}, {p})"
        params: tuple[Any, ...] = (r, WRITER_A, r, T, 0)
    else:
        cond = "token <= {p}"
        params = (r, WRITER_A, r, T)
    one_shot = db.q(
        "INSERT INTO {data} (resource, writer) SELECT {p}, {p}"
        f" FROM {db.fences} WHERE resource = {{p}} AND {cond}"
    ).replace("{p}", db.ph)
    with FaultProxy("127.0.0.1:" + ("5432" if db.dialect == "postgresql" else "3306")) as proxy:
        conn_a = _via(proxy, db, autocommit=True)
        conn_a.cursor().execute("SELECT 1")
        assert proxy.hold() == 1
        sender = threading.Thread(target=lambda: conn_a.cursor().execute(one_shot, params))
        sender.start()
        proxy.wait_held()
        # The writer cannot tell whether its one-shot write applied: it fences off
        # (the recipe after OutcomeUnknown), re-reads, and writes again.
        writer = db.fence()
        assert writer.fence_off(r, T) == (T, 1)
        assert db.log(r) == []
        with writer.guarded(r, T) as cur:
            db.insert_log(cur, r, WRITER_B)  # acknowledged
        proxy.release()
        sender.join(20)
        if epoch_check:
            assert db.log(r) == [WRITER_B]  # the late (T, 0) write was rejected
        else:
            assert db.log(r) == [WRITER_B, WRITER_A]  # it landed after the newer write


def test_a_new_fence_never_shares_an_epoch_with_a_held_write_of_an_earlier_one(
    server_db: DB,
) -> None:
    """Issue #21 item 3 on SQL. Writer A (one SQLFence) writes at its epoch; a write of
    A in the one-request shape, checked at A's (token, epoch), is held in the network
    and A is gone. B — a new SQLFence with the same token, as after a restart — writes
    (acknowledged); the held write is released and must be refused. Epochs kept per
    SQLFence object let B start at A's epoch, and the stray landed after B's write."""
    db = server_db
    r = _res()
    a = db.fence()
    with a.guarded(r, T) as cur:
        db.insert_log(cur, r, WRITER_A)
    stray = db.q(
        "INSERT INTO {data} (resource, writer) SELECT {p}, {p}"
        f" FROM {db.fences} WHERE resource = {{p}} AND (token, epoch) <= ({{p}}, {{p}})"
    ).replace("{p}", db.ph)
    params = (r, 3, r, T, a.epoch(r, T))  # A's next write (writer 3), at A's epoch
    with FaultProxy("127.0.0.1:" + ("5432" if db.dialect == "postgresql" else "3306")) as proxy:
        conn_a = _via(proxy, db, autocommit=True)
        conn_a.cursor().execute("SELECT 1")
        assert proxy.hold() == 1
        ran: list[object] = []

        def send() -> None:
            cur = conn_a.cursor()
            try:
                cur.execute(stray, params)
                ran.append(cur.rowcount)
            except Exception as exc:
                ran.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        proxy.wait_held()
        b = db.fence()  # the next incarnation: a new SQLFence, same token
        with b.guarded(r, T) as cur:
            db.insert_log(cur, r, WRITER_B)  # acknowledged
        proxy.release()
        sender.join(20)
        assert ran and not isinstance(ran[0], Exception), ran  # the stray did run
    assert db.log(r) == [WRITER_A, WRITER_B], "A's held write landed after B's"
    assert ran == [0]  # refused: it inserted nothing
    assert b.epoch(r, T) > a.epoch(r, T)  # never one epoch for two incarnations

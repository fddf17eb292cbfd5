"""Adapter factories the conformance tests run the kit on, importable by the kit's
writer processes (``conformance_adapters:unfenced``; tests/ is on their path).

Where the store lives comes from the environment, which writer processes inherit:
``CONFORMANCE_TOY_DB`` (a SQLite file for the toy stores), ``CONFORMANCE_SQL``
(``dialect:fences_table:data_table[:sqlite path]``) for SQLFence, ``CONFORMANCE_REDIS``
(the resource; the server is ``ETCDFENCE_TEST_REDIS``, default 127.0.0.1:6379) and
``CONFORMANCE_REDIS_RESTART`` (a command starting that Redis again) for RedisFence,
``CONFORMANCE_HTTP`` (the base URL of a running examples/fenced_http_service.py) for the
HTTP service.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etcdfence import (
    Client,
    EtcdUnavailable,
    OutcomeUnknown,
    StaleTokenError,
    _txn,
)
from etcdfence.conformance import Adapter
from etcdfence.conformance._adapter import as_adapter
from etcdfence.conformance.adapters import fence_guard_adapter, sql_fence_adapter
from etcdfence.testing import FaultProxy
from etcdfence.token import coerce_token


class ToyStore:
    """A key-value store in one SQLite file with a fencing mark per key.

    ``fenced=False``: writes without looking at the token (the control that must fail).
    ``durable_mark=False``: checks the token, but ``restart()`` forgets every mark, as
    a store keeping its marks in memory (or a Redis without persistence) would.
    ``as_text=True``: keeps and compares the mark as text, as a store with a VARCHAR
    column or a string header comparison does ("1000" < "999"). ``latency``: seconds
    each write sleeps before it starts (a slow but correct store).
    """

    def __init__(
        self,
        path: str,
        *,
        fenced: bool = True,
        durable_mark: bool = True,
        as_text: bool = False,
        latency: float = 0.0,
    ) -> None:
        self.path, self.fenced, self.durable_mark = path, fenced, durable_mark
        self.as_text, self.latency = as_text, latency
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS data (k TEXT PRIMARY KEY, v TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS marks (k TEXT PRIMARY KEY, token INTEGER)")
        return db

    def write(self, token: Any, key: str, value: str) -> None:
        time.sleep(self.latency)
        if not self.fenced:
            self.db.execute("INSERT OR REPLACE INTO data VALUES (?, ?)", (key, value))
            return
        token = coerce_token(token)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute("SELECT token FROM marks WHERE k = ?", (key,)).fetchone()
            if row is not None and self._above(row[0], token):
                raise StaleTokenError(key, token, int(row[0]))
            self.db.execute("INSERT OR REPLACE INTO marks VALUES (?, ?)", (key, token))
            self.db.execute("INSERT OR REPLACE INTO data VALUES (?, ?)", (key, value))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _above(self, mark: Any, token: int) -> bool:
        """Whether the stored mark is above ``token`` (the flaw: compared as text)."""
        return str(mark) > str(token) if self.as_text else int(mark) > token

    def read(self, key: str) -> str | None:
        row = self.db.execute("SELECT v FROM data WHERE k = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def restart(self) -> None:
        self.db.close()
        self.db = self._open()
        if not self.durable_mark:
            self.db.execute("DELETE FROM marks")  # the marks were only in memory

    def close(self) -> None:
        self.db.close()


def _toy(**kwargs: Any) -> ToyStore:
    return ToyStore(os.environ["CONFORMANCE_TOY_DB"], **kwargs)


def unfenced() -> ToyStore:
    """Writes whatever comes: must fail every scenario with a stale or malformed token."""
    return _toy(fenced=False)


def naive() -> ToyStore:
    """Checks tokens, but forgets its marks on restart: fails only the restart scenario."""
    return _toy(durable_mark=False)


def toy() -> ToyStore:
    """Checks tokens with a durable mark: passes everything."""
    return _toy()


def text_tokens() -> ToyStore:
    """Flawed: compares tokens as text; fails only the token-digits scenario."""
    return _toy(as_text=True)


def slow_toy() -> ToyStore:
    """Correct but slow: every write takes 200 ms more; passes everything."""
    return _toy(latency=0.2)


# ----------------------------------------------------------------------------- Redis stores
# Stores as users write them on Redis (resource ``CONFORMANCE_REDIS``, keys under its hash
# tag so the tests' cleanup finds them): one atomic check-and-set script, with and without
# an expiring mark, and a check-then-write in separate commands.

#: The check and the write in one script (atomic); ARGV[3] > 0: the mark expires (EX).
#: Tokens are compared as canonical decimals, by length first (Lua's numbers are doubles).
CHECK_AND_SET = """
local mark = redis.call('GET', KEYS[1])
local token = ARGV[1]
if mark and (#mark > #token or (#mark == #token and mark > token)) then return 0 end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


class RedisStore:
    """A fenced key-value store on Redis, written as users write one.

    ``mode="script"``: the check and the write in one Lua script (correct);
    ``mode="expiring"``: the same script, but the mark is set with ``EX`` (it expires
    ``ttl`` seconds after the last write: a zombie that wakes later gets in);
    ``mode="check-then-write"``: ``GET`` the mark, compare in Python, then ``SET``
    the mark and the data — two round trips, so two writers can both pass the check.
    """

    def __init__(self, resource: str, mode: str = "script", ttl: int = 3) -> None:
        import redis

        host, port = redis_address()
        self.client = redis.Redis(host=host, port=port, socket_timeout=5)
        self.resource, self.mode, self.ttl = resource, mode, ttl
        self.script = self.client.register_script(CHECK_AND_SET)

    def _keys(self, key: str) -> tuple[str, str]:
        return f"{{{self.resource}}}:mark:{key}", f"{{{self.resource}}}:data:{key}"

    def write(self, token: Any, key: str, value: str) -> None:
        token = coerce_token(token)
        mark, data = self._keys(key)
        if self.mode == "check-then-write":
            current = self.client.get(mark)
            if current is not None and int(current) > token:
                raise StaleTokenError(key, token, int(current))
            self.client.set(mark, token)
            self.client.set(data, value)
            return
        ttl = self.ttl if self.mode == "expiring" else 0
        if not self.script(keys=[mark, data], args=[str(token), value, ttl]):
            raise StaleTokenError(key, token, int(self.client.get(mark) or 0))

    def read(self, key: str) -> Any:
        return self.client.get(self._keys(key)[1])

    def close(self) -> None:
        self.client.close()


def redis_script() -> RedisStore:
    """Correct: an atomic check-and-set script with a mark that never expires."""
    return RedisStore(os.environ["CONFORMANCE_REDIS"])


def redis_expiring() -> RedisStore:
    """Flawed: the same script, but the mark expires 3 s after the last write."""
    return RedisStore(os.environ["CONFORMANCE_REDIS"], "expiring")


def redis_check_then_write() -> RedisStore:
    """Flawed: GET the mark, compare, SET mark and data (not atomic)."""
    return RedisStore(os.environ["CONFORMANCE_REDIS"], "check-then-write")


def fence_guard(endpoints: list[str]) -> Adapter:
    """FenceGuard on the kit's etcd."""
    return fence_guard_adapter(endpoints)


#: The lock the bound adapters' resources are bound to (the kit's terms all use it).
BOUND_LOCK = "etcdfence-conformance-bound/jobs"


def fence_guard_declared_bound(endpoints: list[str]) -> Adapter:
    """Flawed: declares its resource bound to BOUND_LOCK but checks only the token's
    value, as every fence did before sequencers (the control the sequencer scenarios
    must fail)."""
    return dataclasses.replace(fence_guard_adapter(endpoints), bound_lock=BOUND_LOCK)


def toy_declared_bound() -> ToyStore:
    """Flawed: a fencing toy store that declares a binding but checks only values, and
    cannot reach etcd (so it takes tokens from the future too)."""
    store = _toy()
    store.bound_lock = BOUND_LOCK  # type: ignore[attr-defined]
    return store


def fence_guard_bound(endpoints: list[str]) -> Adapter:
    """FenceGuard bound to BOUND_LOCK (``client.fence(key, lock=BOUND_LOCK)``): a token
    of another lock or cluster, a bare number and a token above etcd's revision are
    refused with nothing written."""
    return fence_guard_adapter(endpoints, lock=BOUND_LOCK)


def sql() -> Adapter:
    """SQLFence on the database named by ``CONFORMANCE_SQL``."""
    dialect, fences, data, *rest = os.environ["CONFORMANCE_SQL"].split(":", 3)
    return sql_fence_adapter(connector(dialect, *rest), data_table=data, fences_table=fences)


def sql_held_commit() -> Adapter:
    """SQLFence on ``CONFORMANCE_SQL`` with a ``delay()`` that holds a COMMIT: another
    connection runs the guarded write and waits before committing, its transaction
    holding the mark's row lock; later writes wait for it (in order) until
    ``release()`` lets it commit."""
    from etcdfence.sql import SQLFence

    dialect, fences, data, *rest = os.environ["CONFORMANCE_SQL"].split(":", 3)
    connect = connector(dialect, *rest)
    adapter = sql_fence_adapter(connect, data_table=data, fences_table=fences)

    def delay(token: Any, key: str, value: str) -> Callable[[], None]:
        conn = connect()
        fence = SQLFence(conn, key, table=fences, data_table=data)
        # the row fence.put writes, written here inside a guarded block held open
        upsert = fence.sql_dialect.statements(fences, data, "%s").put
        written, go = threading.Event(), threading.Event()

        def hold() -> None:
            try:
                with fence.guarded(token) as cur:
                    cur.execute(upsert, (key, key.encode(), value.encode()))
                    written.set()
                    go.wait(120)  # the COMMIT is held here
            finally:
                written.set()

        holder = threading.Thread(target=hold, name="held-commit", daemon=True)
        holder.start()
        assert written.wait(30), "the held write did not run"

        def release() -> None:
            go.set()
            holder.join(30)
            conn.close()

        return release

    adapter.delay = delay
    adapter.name = "SQLFence (held COMMIT)"
    return adapter


def connector(dialect: str, path: str = "") -> Any:
    """A function opening a new connection to the test database of ``dialect``."""
    if dialect == "sqlite":
        return lambda: sqlite3.connect(path, timeout=30)
    if dialect == "postgresql":
        import psycopg

        dsn = os.environ.get(
            "ETCDFENCE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
        )
        return lambda: psycopg.connect(dsn, connect_timeout=5)
    import pymysql

    return lambda: pymysql.connect(
        host="127.0.0.1", port=3306, user="root", password="", database="test", connect_timeout=5
    )


def held_write(proxy: FaultProxy, write: Callable[[], Any], size: int) -> BaseException | None:
    """Send ``write()`` with its bytes held in ``proxy`` (once ``size`` bytes are held),
    make the client give up on it (its connection is severed; the bytes stay held for
    ``proxy.release()``) and return what the write raised (None: it returned)."""
    proxy.hold()
    outcome: list[BaseException] = []

    def send() -> None:
        try:
            write()
        except BaseException as err:
            outcome.append(err)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    proxy.wait_held(size)
    proxy.sever_held()
    sender.join(15)
    assert not sender.is_alive(), "the held write did not give up"
    return outcome[0] if outcome else None


class HeldFenceGuard:
    """FenceGuard whose client reaches etcd through a FaultProxy, so that one write can
    be held in the network (``delay``) and delivered after later writes.

    ``epochs=False`` is the control: the guarded txn the 0.1 way, whose epoch never
    moves, so a held write of the current term lands late (issue #17).
    """

    rejections = (StaleTokenError,)

    def __init__(self, endpoints: list[str], *, epochs: bool = True) -> None:
        # through the guard, an etcd fence: FutureTokenError above etcd's revision
        self.refuses_future = epochs
        self.proxy = FaultProxy(endpoints[0])
        self.client = Client([self.proxy.endpoint], timeout=5.0)
        self.epochs = epochs
        self.guards: dict[str, Any] = {}
        self.lock = threading.Lock()

    def guard(self, key: str) -> Any:
        with self.lock:
            return self.guards.setdefault(key, self.client.fence(key))

    def _txn(self, token: int, key: str, value: str, epoch: int) -> Any:
        return _txn.fence_txn(
            self.guard(key).key, token, [_txn.op_put(key.encode(), value.encode())], epoch=epoch
        )

    def write(self, token: Any, key: str, value: str) -> None:
        if self.epochs:
            self.guard(key).put(token, key, value)
            return
        value_ = coerce_token(token)
        if self.client.txn_raw(self._txn(value_, key, value, 0)).succeeded:  # stale branch
            raise StaleTokenError(key, value_, self.guard(key).current())

    def read(self, key: str) -> bytes | None:
        kv = self.client.get(key)
        return None if kv is None else bytes(kv.value)

    def delay(self, token: Any, key: str, value: str) -> Any:
        value_ = coerce_token(token)
        epoch = self.guard(key).epoch(value_) if self.epochs else 0
        size = len(self._txn(value_, key, value, epoch).SerializeToString()) + 9 + 5
        self.client.get(key)  # the connection through the proxy is up
        # the whole request is in the network; the client gives up, its bytes stay held
        error = held_write(self.proxy, lambda: self.write(token, key, value), size)
        assert isinstance(error, EtcdUnavailable), error
        self.client.get(key)  # an idempotent read: the channel reconnects first

        def release() -> None:
            self.proxy.release()
            deadline = time.monotonic() + 10
            while self.proxy.held_bytes and time.monotonic() < deadline:
                time.sleep(0.01)
            # etcd handles the delivered request or not: a rejected one changes nothing
            # a watch could report, so give it the proxy's linger (1 s) and a margin
            time.sleep(1.5)

        return release

    def close(self) -> None:
        self.client.close()
        self.proxy.close()


def held_fence_guard(endpoints: list[str]) -> HeldFenceGuard:
    """FenceGuard with a delay(): passes the late-landing scenario too."""
    return HeldFenceGuard(endpoints)


def epochless_fence_guard(endpoints: list[str]) -> HeldFenceGuard:
    """The control: token checks only, so a held write of the term lands late."""
    return HeldFenceGuard(endpoints, epochs=False)


# ----------------------------------------------------------------------------- examples

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str) -> Any:
    """``examples/<name>.py`` as a module (examples/ is no package), loaded once."""
    module_name = f"etcdfence_example_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def redis_address() -> tuple[str, int]:
    """Host and port of the test Redis (``ETCDFENCE_TEST_REDIS``, as tests/test_redis.py)."""
    host, _, port = os.environ.get("ETCDFENCE_TEST_REDIS", "127.0.0.1:6379").rpartition(":")
    return host, int(port)


class HeldRedisFence:
    """RedisFence through examples/fenced_redis.py's conformance parts, its client
    reaching Redis through a FaultProxy so that ``delay()`` can hold one EVALSHA in
    the network and deliver it after later writes (the late-landing scenario)."""

    def __init__(self, resource: str, restart_command: str | None = None) -> None:
        import redis

        host, port = redis_address()
        self.proxy = FaultProxy(f"{host}:{port}")
        self.client = redis.Redis(host="127.0.0.1", port=self.proxy.port, socket_timeout=5,
                                  socket_connect_timeout=5)  # fmt: skip
        parts = example("fenced_redis").redis_conformance_parts(
            self.client, resource, restart_command=restart_command
        )
        self.write, self.read, self.restart = parts["write"], parts["read"], parts["restart"]

    def delay(self, token: Any, key: str, value: str) -> Any:
        import redis

        self.client.ping()  # a connection through the proxy is open and back in the pool
        least = len(key) + len(value) + 40  # the EVALSHA's bytes (the script's SHA1: 40)
        error = held_write(self.proxy, lambda: self.write(token, key, value), least)
        assert isinstance(error, OutcomeUnknown), error  # the guard moved to the next epoch
        host, port = redis_address()
        watcher = redis.Redis(host=host, port=port, socket_timeout=10)

        def release() -> None:
            try:
                with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]
                    # MONITOR is on (its OK read) before the held bytes go
                    self.proxy.release()
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:  # Redis ran the held EVALSHA
                        command = monitor.next_command()["command"]
                        if command.upper().startswith("EVALSHA") and value in command:
                            return
                    raise TimeoutError("the held write did not reach Redis")
            finally:
                watcher.close()

        return release

    def close(self) -> None:
        self.client.close()
        self.proxy.close()


def redis_fence() -> Adapter:
    """RedisFence (examples/fenced_redis.py's parts) on the test Redis, resource
    ``CONFORMANCE_REDIS``, with ``delay()``; ``restart()`` only when
    ``CONFORMANCE_REDIS_RESTART`` names the command that starts the Redis again."""
    restart = os.environ.get("CONFORMANCE_REDIS_RESTART") or None
    return as_adapter(HeldRedisFence(os.environ["CONFORMANCE_REDIS"], restart))


#: ServiceThreads the test process runs, by base URL: the kit's own adapter (built in
#: that process) restarts the service; writer processes only send it requests.
SERVICES: dict[str, Any] = {}


def http_service() -> Adapter:
    """examples/fenced_http_service.py running at ``CONFORMANCE_HTTP`` (started by the
    test, its guard's mark in etcd), driven over real HTTP; ``restart()`` restarts
    the uvicorn server when this process runs it."""
    url = os.environ["CONFORMANCE_HTTP"]
    service = SERVICES.get(url)
    restart = None if service is None else service.restart
    adapter = as_adapter(example("fenced_http_service").http_conformance_parts(url, restart))
    adapter.refuses_future = True  # its guard is an etcd fence
    return adapter


# ----------------------------------------------------------------------------- flawed toys
# Stores flawed in ways the kit once missed (the hostile review of issue #21's kit), and
# adapters misbehaving at the API level; all on the toy store's SQLite file.


class CheckThenWrite(ToyStore):
    """Flawed: reads the mark in one autocommit statement, then writes mark and data in
    ``BEGIN IMMEDIATE`` (an ORM's load-compare-save): a window of tens of microseconds.
    ``keep_max``: the mark becomes max(mark, token), so it never goes back and only the
    data of a racing lower token can land last."""

    def __init__(self, path: str, keep_max: bool = False) -> None:
        super().__init__(path)
        self.keep_max = keep_max

    def _mark(self, key: str) -> int | None:
        row = self.db.execute("SELECT token FROM marks WHERE k = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def write(self, token: Any, key: str, value: str) -> None:
        token = coerce_token(token)
        mark = self._mark(key)  # transaction 1
        if mark is not None and mark > token:
            raise StaleTokenError(key, token, mark)
        self.db.execute("BEGIN IMMEDIATE")  # transaction 2
        now = self._mark(key)
        new = max(token, now) if self.keep_max and now is not None else token
        self.db.execute("INSERT OR REPLACE INTO marks VALUES (?, ?)", (key, new))
        self.db.execute("INSERT OR REPLACE INTO data VALUES (?, ?)", (key, value))
        self.db.execute("COMMIT")


def check_then_write() -> CheckThenWrite:
    return CheckThenWrite(os.environ["CONFORMANCE_TOY_DB"])


def check_then_write_max() -> CheckThenWrite:
    return CheckThenWrite(os.environ["CONFORMANCE_TOY_DB"], keep_max=True)


class LruMarks(ToyStore):
    """Flawed: correct check-and-write, but at most ``capacity`` marks are kept, the
    least recently written evicted (a cache with LRU eviction): an evicted key takes
    any token."""

    def __init__(self, path: str, capacity: int = 1) -> None:
        super().__init__(path)
        self.capacity, self.order = capacity, 0
        self.db.execute("CREATE TABLE IF NOT EXISTS lru (k TEXT PRIMARY KEY, n INTEGER)")

    def write(self, token: Any, key: str, value: str) -> None:
        super().write(token, key, value)
        self.order += 1  # one writer (the kit's) in the scenarios this store is run on
        self.db.execute("INSERT OR REPLACE INTO lru VALUES (?, ?)", (key, self.order))
        self.db.execute(
            "DELETE FROM marks WHERE k NOT IN (SELECT k FROM lru ORDER BY n DESC LIMIT ?)",
            (self.capacity,),
        )


def lru_marks() -> LruMarks:
    return LruMarks(os.environ["CONFORMANCE_TOY_DB"])


class Raising(ToyStore):
    """A correct store whose adapter misbehaves: ``on_stale`` is raised instead of
    StaleTokenError; ``on_write``: raised by every write; ``close_error``: raised by
    close(); ``close_hangs``: close() never returns."""

    def __init__(self, path: str, *, on_stale: BaseException | None = None,
                 on_write: BaseException | None = None, close_error: BaseException | None = None,
                 close_hangs: bool = False) -> None:  # fmt: skip
        super().__init__(path)
        self.on_stale, self.on_write, self.close_error = on_stale, on_write, close_error
        self.close_hangs = close_hangs

    def write(self, token: Any, key: str, value: str) -> None:
        if self.on_write is not None:
            raise self.on_write
        try:
            super().write(token, key, value)
        except StaleTokenError:
            if self.on_stale is None:
                raise
            raise self.on_stale from None

    def close(self) -> None:
        super().close()
        if self.close_hangs:
            threading.Event().wait()
        if self.close_error is not None:
            raise self.close_error


def sysexit_on_stale() -> Raising:
    """A correct store whose refusal surfaces as SystemExit(0)."""
    return Raising(os.environ["CONFORMANCE_TOY_DB"], on_stale=SystemExit(0))


def keyboard_interrupt() -> Raising:
    """Every write raises KeyboardInterrupt."""
    return Raising(os.environ["CONFORMANCE_TOY_DB"], on_write=KeyboardInterrupt())


def close_raises() -> Raising:
    """A correct store whose close() raises OSError."""
    return Raising(os.environ["CONFORMANCE_TOY_DB"], close_error=OSError("already closed"))


def close_hangs() -> Raising:
    """A correct store whose close() never returns."""
    return Raising(os.environ["CONFORMANCE_TOY_DB"], close_hangs=True)


class JsSafe(ToyStore):
    """Correct up to 2**53-1; refuses larger tokens (JavaScript-safe integers only)."""

    def write(self, token: Any, key: str, value: str) -> None:
        if coerce_token(token) > 2**53 - 1:
            raise StaleTokenError(key, coerce_token(token), 2**53 - 1)
        super().write(token, key, value)


def js_safe() -> JsSafe:
    return JsSafe(os.environ["CONFORMANCE_TOY_DB"])

"""The conformance kit on real etcd and real stores: the controls fail exactly the
scenarios they must, every shipped guard passes, and the three ways in (code, CLI,
pytest) work. The adapters are in ``tests/conformance_adapters.py``."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conformance_adapters
import pytest
from conftest import clean_env

import etcdfence as ef
from etcdfence.conformance import (
    Adapter,
    Report,
    pytest_scenarios,
    run_conformance,
    scenario_names,
    scenarios,
)
from etcdfence.conformance._adapter import as_adapter, load_factory
from etcdfence.errors import InvalidArgumentError
from etcdfence.history import parse_write_value
from etcdfence.sql import SQLFence
from etcdfence.token import coerce_token

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
ALL = set(scenario_names())
#: The sequencer scenarios: they run only for an adapter that declares a binding
#: (Adapter(bound_lock=...)); every other run skips them.
BOUND_ONLY = {"foreign-lock-token", "future-token", "bare-token"}
#: The scenarios writing made-up bare numbers: skipped for a bound resource.
UNBOUND_ONLY = {"token-digits", "large-tokens"}
#: What an adapter that ignores tokens must fail: every scenario with a stale or
#: malformed token. Equal tokens and a retried write are fine without fencing; the
#: late landing needs a delay(), which the toy stores do not have (skipped).
UNFENCED_FAILS = ALL - {"equal-tokens", "retried-write", "late-landing"} - BOUND_ONLY
#: The late zombie's sleep in runs about something else (the default, 10 s, in the
#: README's run and tests/test_conformance_power.py).
QUICK: dict[str, Any] = {"zombie_delay": 1.0}


@pytest.fixture
def toy_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite file for the toy stores (writer processes inherit the variable)."""
    path = str(tmp_path / "toy.db")
    monkeypatch.setenv("CONFORMANCE_TOY_DB", path)
    return path


def assert_fences(
    spec: str, endpoints: list[str], *, skipped: set[str], bound: bool = False
) -> Report:
    """Run the whole kit on ``spec``: nothing fails, exactly ``skipped`` is skipped
    (and the scenarios of the other binding: ``bound`` says whether the adapter
    declares one). A guard's conformance test is this one call, with a factory in
    conformance_adapters.py."""
    report = run_conformance(spec, endpoints, **QUICK)
    assert report.ok and not report.failed, report.render()
    skipped = skipped | (UNBOUND_ONLY if bound else BOUND_ONLY)
    assert {r.name for r in report if r.status == "skip"} == skipped, report.render()
    return report


def _assert_history(report: Report) -> None:
    """Every failure carries findings and its history; the text shows both."""
    text = report.render()
    for result in report:
        if result.status == "fail":
            assert result.findings and result.history, result.render()
            assert f"FAIL {result.name}: " in text
    data = json.loads(report.to_json())
    assert data["failed"] == report.failed and data["ok"] == report.ok


# ----------------------------------------------------------------------------- controls


@pytest.mark.conformance
@pytest.mark.integration
def test_unfenced_store_fails_exactly_the_stale_and_malformed_scenarios(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    report = run_conformance("conformance_adapters:unfenced", etcd_endpoints, **QUICK)
    assert set(report.failed) == UNFENCED_FAILS, report.render()
    assert not report.ok and "NOT FENCED" in report.summary()
    _assert_history(report)
    zombie = report["zombie-after-pause"]
    kinds = {f.kind for f in zombie.findings}
    assert {"stale-write-accepted", "stale-accepted", "token-regression"} <= kinds, zombie.render()
    assert "paused: no more keepalives" in "\n".join(zombie.history)
    assert "processes" not in report["concurrent-writers"].explanation  # it failed
    assert {f.kind for f in report["malformed-tokens"].findings} == {"malformed-accepted"}
    assert report.seconds < 60


@pytest.mark.conformance
@pytest.mark.integration
def test_mark_that_is_not_durable_fails_only_the_restart(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    report = run_conformance("conformance_adapters:naive", etcd_endpoints, **QUICK)
    assert report.failed == ["restart-between-terms"], report.render()
    restart = report["restart-between-terms"]
    assert "restarting the resource" in "\n".join(restart.history)
    assert "stale-accepted" in {f.kind for f in restart.findings}
    _assert_history(report)


@pytest.mark.conformance
@pytest.mark.integration
def test_durable_toy_store_passes_everything_with_writer_processes(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    report = assert_fences("conformance_adapters:toy", etcd_endpoints, skipped={"late-landing"})
    assert "3 processes released together" in report["concurrent-writers"].explanation
    assert "a process with ETCDFENCE_TOKEN" in report["env-token"].explanation


@pytest.mark.conformance
@pytest.mark.integration
def test_store_declaring_a_binding_it_does_not_enforce_fails_the_sequencer_scenarios(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    """A store checking only the token's value (every fence before sequencers), declared
    bound: a token of another lock fences the real holder off, a token from the future is
    taken, a bare number too. An etcd FenceGuard declared bound the same way still
    refuses the token from the future: every etcd fence checks etcd's revision."""
    report = run_conformance("conformance_adapters:toy_declared_bound", etcd_endpoints,
                             only=sorted(BOUND_ONLY | {"lower-after-higher"}), **QUICK)  # fmt: skip
    assert set(report.failed) == BOUND_ONLY, report.render()
    _assert_history(report)
    kinds = {name: {f.kind for f in report[name].findings} for name in BOUND_ONLY}
    assert {"foreign-token-accepted", "current-refused"} <= kinds["foreign-lock-token"]
    assert {"future-token-accepted", "current-refused"} <= kinds["future-token"]
    assert kinds["bare-token"] == {"bare-token-accepted"}
    assert report["lower-after-higher"].status == "pass"  # terms on the bound lock
    guard = run_conformance("conformance_adapters:fence_guard_declared_bound", etcd_endpoints,
                            only=sorted(BOUND_ONLY), **QUICK)  # fmt: skip
    assert set(guard.failed) == BOUND_ONLY - {"future-token"}, guard.render()
    assert guard["future-token"].status == "pass"


@pytest.mark.conformance
@pytest.mark.integration
def test_bound_store_passes_the_whole_kit_with_its_sequencer_scenarios(
    etcd_endpoints: list[str],
) -> None:
    """The same guard behind a check of the token's lock, cluster and revision passes
    every scenario, the sequencer ones included; its writer threads get whole
    sequencers (not bare numbers) and the made-up-number scenarios are skipped."""
    report = assert_fences("conformance_adapters:fence_guard_bound", etcd_endpoints,
                           skipped={"late-landing"}, bound=True)  # fmt: skip
    assert "was refused" in report["foreign-lock-token"].explanation
    assert "bound to lock" in report["token-digits"].explanation  # the skip says why
    assert "bound to lock 'etcdfence-conformance-bound/jobs'" in report.render()
    assert json.loads(report.to_json())["bound_lock"] == "etcdfence-conformance-bound/jobs"


def test_bound_lock_is_validated_and_switches_the_default_rejections() -> None:
    def write(token: object, key: str, value: str) -> None: ...

    def read(key: str) -> None: ...

    bound = as_adapter({"write": write, "read": read, "bound_lock": "jobs/nightly"})
    assert bound.bound_lock == "jobs/nightly" and ef.InvalidTokenError in bound.rejections
    assert ef.InvalidTokenError not in Adapter(write, read).rejections
    with pytest.raises(InvalidArgumentError):
        Adapter(write, read, bound_lock="")


# ----------------------------------------------------------------------------- guards

#: The scenarios that write only tokens above etcd's revision: skipped for an etcd fence,
#: which refuses every such token (FutureTokenError; see the test below).
FUTURE_ONLY = {"token-digits", "large-tokens"}

# FenceGuard through the pytest helper: one test per scenario, marked `conformance`.
test_fence_guard = pytest.mark.integration(
    pytest_scenarios(
        "conformance_adapters:fence_guard",
        names=[name for name in scenario_names() if name not in FUTURE_ONLY],
        **QUICK,
    )
)


@pytest.mark.conformance
@pytest.mark.integration
def test_fence_guard_with_a_held_write_passes_everything(etcd_endpoints: list[str]) -> None:
    spec = "conformance_adapters:held_fence_guard"
    assert_fences(spec, etcd_endpoints, skipped={"restart-between-terms", *FUTURE_ONLY})


@pytest.mark.conformance
@pytest.mark.integration
def test_an_etcd_fence_skips_the_scenarios_of_tokens_from_the_future(
    etcd_endpoints: list[str],
) -> None:
    """FenceGuard refuses a token above etcd's revision, so the scenarios that write only
    such tokens cannot reach its comparison: skipped, saying why. Without the adapter's
    ``refuses_future`` they would fail on FutureTokenError (an error, not a refusal)."""
    sys.path.insert(0, str(TESTS)) if str(TESTS) not in sys.path else None
    from conformance_adapters import fence_guard

    report = run_conformance("conformance_adapters:fence_guard", etcd_endpoints,
                             only=sorted(FUTURE_ONLY))  # fmt: skip
    assert {r.name for r in report if r.status == "skip"} == FUTURE_ONLY, report.render()
    assert all("FutureTokenError" in report[n].explanation for n in FUTURE_ONLY)
    adapter = fence_guard(etcd_endpoints)
    adapter.refuses_future = False
    try:
        report = run_conformance(adapter, etcd_endpoints, only=sorted(FUTURE_ONLY))
    finally:
        adapter.call("close")
    assert set(report.failed) == FUTURE_ONLY, report.render()
    assert "FutureTokenError" in report.render()


@pytest.mark.conformance
@pytest.mark.integration
def test_control_token_only_guard_fails_only_the_late_landing(etcd_endpoints: list[str]) -> None:
    """FenceGuard's txn without epochs (0.1): every token rule holds, yet the held
    write of the current term lands after two later acknowledged ones."""
    report = run_conformance("conformance_adapters:epochless_fence_guard", etcd_endpoints, **QUICK)
    assert report.failed == ["late-landing"], report.render()
    kinds = {f.kind for f in report["late-landing"].findings}
    assert kinds == {"late-landing", "late-write"}, report.render()


def _sql_connect(dialect: str, path: str) -> Any:
    sys.path.insert(0, str(TESTS)) if str(TESTS) not in sys.path else None
    from conformance_adapters import connector

    return connector(dialect, path)()


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def sql_env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Fresh fences and data tables on one database; ``CONFORMANCE_SQL`` names them."""
    dialect: str = request.param
    fences, data = f"cf_{uuid.uuid4().hex[:8]}", f"cd_{uuid.uuid4().hex[:8]}"
    path = str(tmp_path / "sql.db")
    try:
        conn = _sql_connect(dialect, path)
    except Exception as err:  # ImportError, OperationalError: the server is not there
        if os.environ.get("ETCDFENCE_REQUIRE_SQL") == "1":
            pytest.fail(f"{dialect} not reachable: {err!r}")
        pytest.skip(f"{dialect} not reachable: {err!r}")
    try:
        SQLFence(conn, "schema", table=fences, data_table=data).ensure_schema()
        monkeypatch.setenv("CONFORMANCE_SQL", f"{dialect}:{fences}:{data}:{path}")
        yield dialect
    finally:
        if dialect != "sqlite":
            conn.rollback()
            cur = conn.cursor()
            cur.execute(f"DROP TABLE IF EXISTS {fences}, {data}")
            conn.commit()
        conn.close()


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.sql
def test_sql_fence_passes_on_every_database(etcd_endpoints: list[str], sql_env: str) -> None:
    # restart() reconnects (SQLite: reopens the file); no delay(): in SQL a held COMMIT
    # keeps the mark's row lock, so later writes wait for it (etcdfence.sql's notes)
    assert_fences("conformance_adapters:sql", etcd_endpoints, skipped={"late-landing"})


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.sql
@pytest.mark.timeout(90)
@pytest.mark.parametrize("sql_env", ["postgresql"], indirect=True)
def test_sql_fence_behind_a_held_commit_is_ordered_and_the_kit_finishes(
    etcd_endpoints: list[str], sql_env: str
) -> None:
    """Issue #21: delay() holds a guarded write's COMMIT on another connection, whose
    row lock makes the kit's next write wait. That write gets no answer within the
    deadline (indeterminate, the kit goes on), the kit delivers the held COMMIT, and
    the waiting write lands after it: ordered, FENCED. (The kit had no deadline: it
    waited for that write forever, before it could deliver the held one.)"""
    only = ["lower-after-higher", "equal-tokens", "late-landing"]
    report = run_conformance(
        "conformance_adapters:sql_held_commit", etcd_endpoints, only=only, deadline=1.0
    )
    assert report.ok, report.render()
    late = report["late-landing"]
    assert late.status == "pass" and "ordered" in late.explanation, late.render()
    history = "\n".join(late.history)
    assert "no answer within the deadline of 1 s" in history, history
    assert "answered accepted after" in history, history


def _lock_fences(seconds: float) -> tuple[threading.Thread, threading.Event]:
    """Another PostgreSQL connection holding an EXCLUSIVE lock on the fences table (every
    guarded write waits) for ``seconds`` or until the event is set."""
    dialect, fences, _data, *_ = os.environ["CONFORMANCE_SQL"].split(":", 3)
    conn = _sql_connect(dialect, "")
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            conn.cursor().execute(f"LOCK TABLE {fences} IN EXCLUSIVE MODE")
            locked.set()
            done.wait(seconds)
            conn.commit()
        finally:
            conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10)
    return thread, done


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.sql
@pytest.mark.timeout(90)
@pytest.mark.parametrize("sql_env", ["postgresql"], indirect=True)
def test_sql_fence_blocked_by_another_transaction_passes_or_fails_but_always_ends(
    etcd_endpoints: list[str], sql_env: str
) -> None:
    """A lock held by another transaction for a while past the deadline: the writes
    wait, land in order, FENCED. Held for good: the kit still ends, NOT FENCED, the
    stuck write named and the scenarios behind it failed at once."""
    only = ["lower-after-higher", "equal-tokens"]
    spec = "conformance_adapters:sql"
    thread, _ = _lock_fences(2.5)
    report = run_conformance(spec, etcd_endpoints, only=only, deadline=1.0)
    thread.join(10)
    assert report.ok, report.render()
    assert "past the deadline" in "\n".join(report["lower-after-higher"].history)
    thread, done = _lock_fences(60)
    try:
        report = run_conformance(spec, etcd_endpoints, only=only, deadline=0.5)
    finally:
        done.set()
        thread.join(10)
    assert report.failed == only, report.render()
    assert report.seconds < 20, report.render()
    kinds = {f.kind for r in report for f in r.findings}
    assert "write-timeout" in kinds, report.render()
    assert "stuck" in report["equal-tokens"].explanation, report.render()


# RedisFence: examples/fenced_redis.py's parts on the real Redis, with the variables of
# tests/test_redis.py (ETCDFENCE_TEST_REDIS, ETCDFENCE_REQUIRE_REDIS and the
# ETCDFENCE_TEST_REDIS_RESTART gate of the test that restarts the shared Redis)

REDIS_RESTART = os.environ.get("ETCDFENCE_TEST_REDIS_RESTART", "") not in ("", "0")
#: What starts the machine's Redis again (as tests/test_redis.py); for a Redis of your
#: own on another port, ETCDFENCE_TEST_REDIS_START gives its command instead.
REDIS_START = os.environ.get("ETCDFENCE_TEST_REDIS_START") or (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


def _redis_down(client: Any) -> str | None:
    try:
        client.ping()
    except Exception as err:  # ConnectionError, TimeoutError: the server is not there
        host, port = conformance_adapters.redis_address()
        return f"no Redis at {host}:{port}: {err!r}"
    return None


@pytest.fixture
def redis_resource(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A client of the test Redis and a resource name of this test (``CONFORMANCE_REDIS``);
    the resource's mark and keys are deleted afterwards."""
    redis = pytest.importorskip("redis")
    host, port = conformance_adapters.redis_address()
    client = redis.Redis(host=host, port=port, socket_timeout=5, socket_connect_timeout=2)
    down = _redis_down(client)
    if down and os.environ.get("ETCDFENCE_REQUIRE_REDIS") == "1":
        pytest.fail(f"{down} (ETCDFENCE_REQUIRE_REDIS=1)")
    if down:
        pytest.skip(down)
    name = f"conformance-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("CONFORMANCE_REDIS", name)
    try:
        yield client, name
    finally:
        if _redis_down(client) is None:
            client.delete(f"etcdfence:fence:{{{name}}}", f"etcdfence:fence:{{{name}}}:version",
                          *client.scan_iter(match=f"{{{name}}}:*", count=1000))  # fmt: skip
        client.close()


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.redis
def test_redis_fence_with_a_held_write_passes_everything(
    etcd_endpoints: list[str], redis_resource: tuple[Any, str]
) -> None:
    """RedisFence passes every scenario, the late landing included (an EVALSHA held in a
    FaultProxy arrives after two later writes of its term: the epoch refuses it). No
    restart(): it would restart the shared Redis (see the next test)."""
    client, name = redis_resource
    spec = "conformance_adapters:redis_fence"
    report = assert_fences(spec, etcd_endpoints, skipped={"restart-between-terms"})
    assert "3 processes released together" in report["concurrent-writers"].explanation
    assert client.get(f"etcdfence:fence:{{{name}}}")  # the kit wrote to Redis itself
    assert any(client.scan_iter(match=f"{{{name}}}:etcdfence-conformance/*"))


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.redis
def test_control_redis_fence_without_epochs_fails_only_the_late_landing(
    etcd_endpoints: list[str], redis_resource: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held EVALSHA really reaches Redis late: with the writer's epochs switched
    off (token checks only, as before epochs), it overwrites the two later writes."""
    from etcdfence.fence._sync import engine

    class NoEpochs:  # every write of a term carries epoch 0, a lost one too
        def get(self, token: int) -> int:
            return 0

        def owned(self, token: int) -> int:
            return 0  # never claims: as if epoch 0 were every writer's, for ever

        def claimed(self, token: int, epoch: int) -> None:
            pass

        def give_up(self, token: int, epoch: int) -> None:
            pass

    monkeypatch.setattr(engine, "WriterEpochs", NoEpochs)  # the fence engine's, as Redis's
    monkeypatch.setattr(engine.Writer, "_claim_until", lambda *a, **kw: (0, ""))  # no fence-off
    only = ["lower-after-higher", "late-landing"]  # in this process: threads, patched
    report = run_conformance(conformance_adapters.redis_fence, etcd_endpoints, only=only)
    assert report.failed == ["late-landing"], report.render()
    kinds = {f.kind for f in report["late-landing"].findings}
    assert kinds == {"late-landing", "late-write"}, report.render()


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.redis
@pytest.mark.skipif(
    not REDIS_RESTART,
    reason="restarts the shared Redis at 127.0.0.1:6379: set ETCDFENCE_TEST_REDIS_RESTART=1",
)
def test_redis_fence_without_persistence_fails_the_restart(
    etcd_endpoints: list[str], redis_resource: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented limit, shown by the kit: a Redis that keeps nothing on disk
    forgets the mark when it restarts, and the older term's token is accepted."""
    client, _ = redis_resource
    if client.config_get("save")["save"] or client.config_get("appendonly")["appendonly"] != "no":
        pytest.skip("this Redis persists; the limit shows only without persistence")
    monkeypatch.setenv("CONFORMANCE_REDIS_RESTART", REDIS_START)
    try:
        report = run_conformance("conformance_adapters:redis_fence", etcd_endpoints,
                                 only=["restart-between-terms"])  # fmt: skip
    finally:
        if _redis_down(client) is not None:  # the kit stopped it and failed to start it
            subprocess.run(REDIS_START, shell=True, check=True, timeout=30)
    assert report.failed == ["restart-between-terms"], report.render()
    restart = report["restart-between-terms"]
    assert "restarting the resource" in "\n".join(restart.history)
    assert "stale-accepted" in {f.kind for f in restart.findings}, restart.render()
    _assert_history(report)


# The HTTP service example: Starlette + FencingMiddleware on a real uvicorn, its handler
# writing through an AsyncFenceGuard; the kit drives it over HTTP, from writer processes too.


@pytest.fixture
def http_service(
    etcd_endpoints: list[str], etcd_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """examples/fenced_http_service.py on a uvicorn thread, at ``CONFORMANCE_HTTP``; its
    ServiceThread is in ``conformance_adapters.SERVICES`` so the kit can restart it."""
    example = conformance_adapters.example("fenced_http_service")
    service = example.ServiceThread(example.make_app(etcd_endpoints, etcd_namespace + "/store"))
    url: str = service.start()
    conformance_adapters.SERVICES[url] = service
    monkeypatch.setenv("CONFORMANCE_HTTP", url)
    try:
        yield url
    finally:
        conformance_adapters.SERVICES.pop(url, None)
        service.stop()


@pytest.mark.conformance
@pytest.mark.integration
def test_http_service_example_passes_everything_across_restarts(
    etcd_endpoints: list[str], http_service: str
) -> None:
    """The mark is the guard's, in etcd: it survives the service's restart. No delay():
    late-landing is skipped (FenceGuard's own run covers the epoch)."""
    report = assert_fences(
        "conformance_adapters:http_service", etcd_endpoints, skipped={"late-landing", *FUTURE_ONLY}
    )
    assert report["restart-between-terms"].status == "pass", report.render()
    assert "3 processes released together" in report["concurrent-writers"].explanation


# ----------------------------------------------------------------------------- in-process


class _DictStore:
    """A thread-safe dict with a mark per key; ``mode`` picks how it refuses."""

    def __init__(self, mode: str = "raise") -> None:
        import threading

        self.data: dict[str, str] = {}
        self.marks: dict[str, int] = {}
        self.lock = threading.Lock()
        self.mode = mode

    def write(self, token: Any, key: str, value: str) -> bool:
        token = coerce_token(token)
        with self.lock:
            if self.marks.get(key, 0) > token:
                if self.mode == "false":
                    return False
                if self.mode == "odd":
                    raise RuntimeError("conflict")
                raise ef.StaleTokenError(key, token, self.marks[key])
            self.marks[key] = token
            self.data[key] = value
        return True

    def read(self, key: str) -> str | None:
        with self.lock:
            return self.data.get(key)


@pytest.mark.conformance
@pytest.mark.integration
def test_in_process_adapters_false_and_designated_rejections(etcd_endpoints: list[str]) -> None:
    quick = ["lower-after-higher", "equal-tokens", "concurrent-writers", "env-token"]
    report = run_conformance(as_adapter(_DictStore()), etcd_endpoints, only=quick)
    assert report.ok, report.render()
    assert "3 threads released together" in report["concurrent-writers"].explanation
    assert report.results[0].name == "lower-after-higher"
    store = _DictStore("false")  # False means refused
    assert run_conformance(dict(write=store.write, read=store.read), etcd_endpoints, only=quick)
    odd = _DictStore("odd")  # an exception of its own: unknown unless designated
    report = run_conformance(as_adapter(odd), etcd_endpoints, only=["lower-after-higher"])
    assert report.failed == ["lower-after-higher"]
    assert "adapter-error" in {f.kind for f in report.results[0].findings}
    designated = Adapter(odd.write, odd.read, rejections=(RuntimeError,))
    assert run_conformance(designated, etcd_endpoints, only=["lower-after-higher"]).ok


@pytest.mark.conformance
@pytest.mark.integration
def test_async_adapter_and_factory_with_threads(etcd_endpoints: list[str]) -> None:
    store = _DictStore()

    async def write(token: Any, key: str, value: str) -> None:
        store.write(token, key, value)

    async def read(key: str) -> bytes | None:
        value = store.read(key)
        return None if value is None else value.encode()

    only = ["zombie-after-pause", "retried-write", "concurrent-writers"]
    report = run_conformance(Adapter(write, read), etcd_endpoints, only=only)
    assert report.ok, report.render()
    made: list[_DictStore] = []

    def factory() -> _DictStore:  # each writer thread gets an adapter of its own
        made.append(store)
        return store

    assert run_conformance(factory, etcd_endpoints, only=["concurrent-writers"]).ok
    assert len(made) == 4  # the kit's own + one per writer thread


@pytest.fixture
def dict_adapter() -> Adapter:
    store = _DictStore()
    return Adapter(store.write, store.read, name="dict")


# the pytest helper with a fixture of ours, on a few scenarios
test_dict_store = pytest.mark.integration(
    pytest_scenarios(fixture="dict_adapter", names=["lower-after-higher", "restart-between-terms"])
)


@pytest.mark.conformance
@pytest.mark.integration
def test_restart_scenario_skipped_without_restart(etcd_endpoints: list[str]) -> None:
    store = _DictStore()
    report = run_conformance(Adapter(store.write, store.read), etcd_endpoints,
                             only=["restart-between-terms"])  # fmt: skip
    assert report.ok and report.results[0].status == "skip"
    assert "restart()" in report.results[0].explanation


@pytest.mark.conformance
@pytest.mark.integration
def test_embedded_etcd_when_no_endpoints() -> None:
    store = _DictStore()
    report = run_conformance(Adapter(store.write, store.read), only=["lower-after-higher"])
    assert report.ok, report.render()
    assert report.endpoints and report.endpoints[0].startswith("http://127.0.0.1:")
    values = [parse_write_value(v) for v in store.data.values()]
    assert all(v is not None for v in values)


# ----------------------------------------------------------------------------- CLI


def _cli(*args: str, endpoints: list[str]) -> subprocess.CompletedProcess[str]:
    env = clean_env(PYTHONPATH=str(TESTS))
    env["CONFORMANCE_TOY_DB"] = os.environ["CONFORMANCE_TOY_DB"]
    return subprocess.run(
        [sys.executable, "-m", "etcdfence.conformance", *args, "--zombie-delay", "1",
         "--endpoints", ",".join(endpoints)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


@pytest.mark.conformance
@pytest.mark.integration
def test_cli_exit_codes_and_json(etcd_endpoints: list[str], toy_db: str) -> None:
    bad = _cli("conformance_adapters:unfenced", "-w", "json", "-q", endpoints=etcd_endpoints)
    assert bad.returncode == 1, bad.stderr
    data = json.loads(bad.stdout)
    assert set(data["failed"]) == UNFENCED_FAILS and data["ok"] is False
    stale = next(s for s in data["scenarios"] if s["name"] == "lower-after-higher")
    assert stale["findings"] and stale["history"] and stale["status"] == "fail"
    good = _cli("conformance_adapters:toy", "--only", "equal-tokens", endpoints=etcd_endpoints)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "FENCED: 1 passed, 0 failed" in good.stdout
    assert "PASS equal-tokens" in good.stderr  # progress
    for args in (
        ["nosuch_module:f"],
        ["conformance_adapters:toy", "--only", "nope"],
        ["conformance_adapters:sql"],  # the factory raises (no CONFORMANCE_SQL)
    ):
        usage = _cli(*args, endpoints=etcd_endpoints)
        assert usage.returncode == 2 and "Traceback" not in usage.stderr, usage.stderr
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nobody listens on
    nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
    unreachable = _cli("conformance_adapters:toy", endpoints=[nobody])
    closed.close()
    assert unreachable.returncode == 2 and "Traceback" not in unreachable.stderr
    assert "etcdfence.conformance:" in unreachable.stderr


# ----------------------------------------------------------------------------- units


def test_registry_and_adapter_validation() -> None:
    assert [s.name for s in scenarios] == scenario_names()
    assert scenario_names()[-1] == "large-tokens"  # writes tokens near int64: last
    assert all(s.title and s.run.__doc__ for s in scenarios)
    with pytest.raises(InvalidArgumentError):
        as_adapter({"write": print, "read": print, "wirte": print})
    with pytest.raises(InvalidArgumentError):
        Adapter(write=1, read=print)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        as_adapter(object())
    for spec in ("nocolon", "a:b:c", "json:nosuch", "no_such_module_x:f", "json:__doc__"):
        with pytest.raises(InvalidArgumentError):
            load_factory(spec)
    with pytest.raises(InvalidArgumentError):
        run_conformance(as_adapter({"write": print, "read": print}), ["http://x"], only=["x"])
    with pytest.raises(InvalidArgumentError):
        run_conformance(as_adapter({"write": print, "read": print}), ["http://x"], ttl=0)
    with pytest.raises(InvalidArgumentError):
        pytest_scenarios("x:y", names=["nope"])
    with pytest.raises(TypeError):
        pytest_scenarios()


def test_toy_store_refuses_what_the_readme_says(tmp_path: Path) -> None:
    sys.path.insert(0, str(TESTS)) if str(TESTS) not in sys.path else None
    from conformance_adapters import ToyStore

    store = ToyStore(str(tmp_path / "t.db"))
    store.write(5, "k", "v5")
    with pytest.raises(ef.StaleTokenError):
        store.write(4, "k", "v4")
    with pytest.raises(ef.InvalidTokenError):
        store.write("5", "k", "x")
    assert store.read("k") == "v5"
    assert sqlite3.connect(str(tmp_path / "t.db")).execute("SELECT count(*) FROM marks").fetchone()


@pytest.mark.conformance
@pytest.mark.integration
def test_readme_example_store_is_fenced(etcd_endpoints: list[str], tmp_path: Path) -> None:
    """The README's "Is my resource fenced?" store, as printed, through the CLI."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Is my resource fenced?") :]
    code = section[section.index("```python\n") + 10 : section.index("\n```\n")]
    (tmp_path / "mystore.py").write_text(code + "\n")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "etcdfence.conformance", "mystore:make_adapter",
             "--endpoints", ",".join(etcd_endpoints)],
            capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=100,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:  # the progress lines say where it stuck
        pytest.fail(f"the kit took over 100 s; stdout: {err.stdout!r}; stderr: {err.stderr!r}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FENCED: 12 passed, 0 failed, 5 skipped" in done.stdout
    # progress only: the zombie's lease loss is expected and not reported as a warning
    assert all(line.startswith(("PASS ", "SKIP ")) for line in done.stderr.splitlines())


# ----------------------------------------------------------------------------- hostile review


def _readme_store() -> Any:
    """The README's ``mystore.py``, as printed, imported as a module."""
    import types

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Is my resource fenced?") :]
    code = section[section.index("```python\n") + 10 : section.index("\n```\n")]
    module = types.ModuleType("mystore")
    exec(compile(code, "README.md:mystore.py", "exec"), module.__dict__)
    return module


@pytest.mark.conformance
@pytest.mark.integration
def test_readme_store_as_an_object_and_as_a_callable_from_code(
    etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """The README's sqlite3 store, built on the caller's thread and handed in (its
    connection works only there), and as a factory callable (each writer thread builds
    its own on the thread that uses it): FENCED, not "SQLite objects created in a
    thread"."""
    mystore = _readme_store()
    only = ["lower-after-higher", "concurrent-writers", "env-token", "interleaved-terms"]
    report = run_conformance(mystore.make_adapter(str(tmp_path / "a.db")), etcd_endpoints,
                             only=only)  # fmt: skip
    assert report.ok, report.render()
    assert "thread" in report["concurrent-writers"].explanation
    path = str(tmp_path / "b.db")
    report = run_conformance(lambda: mystore.make_adapter(path), etcd_endpoints, only=only)
    assert report.ok, report.render()


@pytest.mark.conformance
@pytest.mark.integration
def test_mark_evicted_from_a_bounded_cache_fails_the_late_zombie(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    """One mark kept (LRU, capacity 1): the other keys the newer term writes evict the
    zombie's key's mark. The correct store passes the same scenario."""
    for _ in range(3):
        report = run_conformance("conformance_adapters:lru_marks", etcd_endpoints,
                                 only=["zombie-wakes-late"], zombie_delay=0.5)  # fmt: skip
        assert report.failed == ["zombie-wakes-late"], report.render()
        kinds = {f.kind for f in report.results[0].findings}
        assert "stale-write-accepted" in kinds, report.render()
    report = run_conformance("conformance_adapters:toy", etcd_endpoints,
                             only=["zombie-wakes-late"], zombie_delay=0.5)  # fmt: skip
    assert report.ok, report.render()


@pytest.mark.conformance
@pytest.mark.integration
def test_base_exceptions_of_the_adapter_are_findings_never_exit_0(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    """SystemExit(0) on a refusal, KeyboardInterrupt on every write: findings, a report,
    exit status 1 (it used to be 0 with no output); in code too, from read()."""
    for spec in ("sysexit_on_stale", "keyboard_interrupt"):
        done = _cli(f"conformance_adapters:{spec}", "--only", "lower-after-higher", "-q",
                    endpoints=etcd_endpoints)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "NOT FENCED" in done.stdout and "Traceback" not in done.stderr
        assert "a BaseException" in done.stdout and "adapter-error" in done.stdout
    store = _DictStore()

    def read(key: str) -> Any:
        raise SystemExit(0)

    report = run_conformance(Adapter(store.write, read), etcd_endpoints,
                             only=["lower-after-higher", "equal-tokens"])  # fmt: skip
    assert report.failed == ["lower-after-higher", "equal-tokens"], report.render()
    assert "SystemExit" in report.render()


@pytest.mark.conformance
@pytest.mark.integration
def test_close_that_raises_is_a_warning_and_the_report_is_printed(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    done = _cli("conformance_adapters:close_raises", "--only", "equal-tokens", "--only",
                "env-token", endpoints=etcd_endpoints)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FENCED: 2 passed" in done.stdout and "Traceback" not in done.stderr
    assert "warning: closing the adapter: OSError: already closed" in done.stdout
    data = json.loads(_cli("conformance_adapters:close_raises", "--only", "equal-tokens",
                           "-w", "json", "-q", endpoints=etcd_endpoints).stdout)  # fmt: skip
    assert data["ok"] and data["warnings"]


@pytest.mark.conformance
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_callable_factories_that_hang_end_with_a_verdict(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    """A close() that never returns, a factory that blocks from its second call on (a
    writer thread's): bounded by the deadline, a verdict at the end."""
    report = run_conformance(conformance_adapters.close_hangs, etcd_endpoints,
                             only=["env-token"], deadline=1)  # fmt: skip
    assert report.ok, report.render()
    assert any("did not" in w or "never" in w for w in report.warnings), report.warnings
    assert report.seconds < 30
    calls = [0]

    def second_blocks() -> Any:
        calls[0] += 1
        if calls[0] > 1:
            threading.Event().wait()
        return conformance_adapters.toy()

    report = run_conformance(second_blocks, etcd_endpoints, only=["env-token", "equal-tokens"],
                             deadline=1)  # fmt: skip
    assert report.failed == ["env-token"], report.render()
    assert "did not return" in report.render() and report.seconds < 30


@pytest.mark.conformance
@pytest.mark.integration
def test_store_refusing_tokens_above_2_53_is_a_limited_token_range(
    etcd_endpoints: list[str], toy_db: str
) -> None:
    report = run_conformance("conformance_adapters:js_safe", etcd_endpoints,
                             only=["large-tokens", "token-digits"])  # fmt: skip
    assert report.failed == ["large-tokens"], report.render()
    assert {f.kind for f in report["large-tokens"].findings} == {"limited-token-range"}
    assert "no stale write was accepted" in report.render()

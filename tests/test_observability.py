"""Plain Lock/Election report what LeaderElector reports: events with token and wait
time, the end of every hold with its reason, wait/hold histograms, and request/error
counters by method and gRPC code — against a real etcd. Also: retries are jittered,
and the README's metric list is exactly what ``enable_metrics`` registers."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import etcdfence as ef
from etcdfence import metrics
from etcdfence._backoff import jittered

prometheus_client = pytest.importorskip("prometheus_client")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def registry() -> Iterator[Any]:
    reg = prometheus_client.CollectorRegistry()
    metrics.enable_metrics(reg)
    try:
        yield reg
    finally:
        metrics.disable_metrics()


def value(reg: Any, metric: str, /, **labels: str) -> float:
    got = reg.get_sample_value(metric, labels)
    return 0.0 if got is None else float(got)


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


# -- locks --------------------------------------------------------------------------------


@pytest.mark.integration
def test_lock_acquire_and_release_report_token_wait_and_hold(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/job"
    lk = {"kind": "lock", "name": name}
    with capture_logs() as logs, etcd_client.session(ttl=10) as session:
        token = session.lock(name).acquire()
        assert value(registry, "etcdfence_lock_held", **lk) == 1
        time.sleep(0.2)
        session.lock(name).release()
    (acquired,) = events(logs, "etcdfence.lock_acquired")
    assert acquired["lock"] == name and acquired["token"] == token.value
    assert acquired["key"] == token.key and 0 <= acquired["wait_seconds"] < 5
    assert acquired["log_level"] == "info"
    (released,) = events(logs, "etcdfence.lock_released")
    assert released["reason"] == "resigned" and released["held_seconds"] >= 0.2
    assert not events(logs, "etcdfence.lock_lost")
    assert value(registry, "etcdfence_lock_acquired_total", **lk) == 1
    assert value(registry, "etcdfence_lock_released_total", **lk, reason="resigned") == 1
    assert value(registry, "etcdfence_lock_held", **lk) == 0
    assert value(registry, "etcdfence_lock_wait_seconds_count", **lk) == 1
    assert value(registry, "etcdfence_lock_hold_seconds_count", **lk) == 1
    assert value(registry, "etcdfence_lock_hold_seconds_sum", **lk) >= 0.2


@pytest.mark.integration
def test_wait_time_covers_the_queue(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/queue"
    with etcd_client.session(ttl=10) as first, etcd_client.session(ttl=10) as second:
        first.lock(name).acquire()
        with capture_logs() as logs:
            threading.Timer(0.5, first.lock(name).release).start()
            token = second.lock(name).acquire(timeout=10)
            second.lock(name).release()
    acquired = [e for e in events(logs, "etcdfence.lock_acquired") if e["token"] == token.value]
    assert len(acquired) == 1 and acquired[0]["wait_seconds"] >= 0.4
    assert value(registry, "etcdfence_lock_wait_seconds_sum", kind="lock", name=name) >= 0.4


@pytest.mark.integration
def test_expired_session_is_a_lost_hold(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/exp"
    with capture_logs() as logs, etcd_client.session(ttl=1) as session:
        session.lock(name).acquire()
        session.orphan()  # no more keepalives: the local deadline passes
        assert session.wait_expired(5)
        session.lock(name).release()  # harmless, and does not count twice
    (lost,) = events(logs, "etcdfence.lock_lost")
    assert lost["reason"] == "expired" and lost["log_level"] == "warning"
    assert not events(logs, "etcdfence.lock_released")
    labels = {"kind": "lock", "name": name}
    assert value(registry, "etcdfence_lock_released_total", **labels, reason="expired") == 1
    assert value(registry, "etcdfence_lock_hold_seconds_count", **labels) == 1


@pytest.mark.integration
def test_revoked_lease_is_a_lost_hold(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/rev"
    with capture_logs() as logs, etcd_client.session(ttl=3) as session:
        session.lock(name).acquire()
        etcd_client.lease_revoke(session.lease_id)
        assert session.wait_expired(5), "the keepalive learns the lease is gone"
    (lost,) = events(logs, "etcdfence.lock_lost")
    assert lost["reason"] == "revoked"
    labels = {"kind": "lock", "name": name}
    assert value(registry, "etcdfence_lock_released_total", **labels, reason="revoked") == 1


@pytest.mark.integration
def test_key_deleted_behind_the_holders_back_is_a_lost_hold(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/del"
    with capture_logs() as logs, etcd_client.session(ttl=10) as session:
        token = session.lock(name).acquire()
        assert token.key is not None
        etcd_client.delete(token.key)
        session.lock(name).release()
    (lost,) = events(logs, "etcdfence.lock_lost")
    assert lost["reason"] == "deleted"
    labels = {"kind": "lock", "name": name}
    assert value(registry, "etcdfence_lock_released_total", **labels, reason="deleted") == 1


@pytest.mark.integration
def test_closing_the_session_releases_the_hold(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/close"
    with capture_logs() as logs:
        with etcd_client.session(ttl=10) as session:
            session.lock(name).acquire()
        assert etcd_client.leader(name) is None
    (released,) = events(logs, "etcdfence.lock_released")
    assert released["reason"] == "resigned"
    labels = {"kind": "lock", "name": name}
    assert value(registry, "etcdfence_lock_held", **labels) == 0


# -- elections (async twin) ---------------------------------------------------------------


@pytest.mark.integration
async def test_election_reports_elected_resigned_and_a_failed_proclaim(
    registry: Any, async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/svc"
    labels = {"kind": "election", "name": name}
    with capture_logs() as logs:
        async with async_etcd_client.session(ttl=10) as session:
            election = session.election(name)
            token = await election.campaign(b"a")
            await election.resign()
            token2 = await election.campaign(b"a")
            assert token2.key is not None
            await async_etcd_client.delete(token2.key)
            with pytest.raises(ef.NotLeaderError):
                await election.proclaim(b"b")
    elected = events(logs, "etcdfence.elected")
    assert [e["token"] for e in elected] == [token.value, token2.value]
    assert elected[0]["election"] == name
    assert [e["reason"] for e in events(logs, "etcdfence.resigned")] == ["resigned"]
    assert [e["reason"] for e in events(logs, "etcdfence.election_lost")] == ["deleted"]
    assert value(registry, "etcdfence_lock_acquired_total", **labels) == 2
    assert value(registry, "etcdfence_lock_released_total", **labels, reason="resigned") == 1
    assert value(registry, "etcdfence_lock_released_total", **labels, reason="deleted") == 1
    assert value(registry, "etcdfence_lock_held", **labels) == 0


# -- requests -----------------------------------------------------------------------------


@pytest.mark.integration
def test_requests_are_counted_by_method_and_code(
    registry: Any, etcd_client: ef.Client, etcd_namespace: str
) -> None:
    before = value(registry, "etcdfence_requests_total", method="Put", code="OK")
    etcd_client.put(etcd_namespace + "/k", b"v")
    etcd_client.get(etcd_namespace + "/k")
    assert value(registry, "etcdfence_requests_total", method="Put", code="OK") == before + 1
    assert value(registry, "etcdfence_requests_total", method="Range", code="OK") >= 1
    assert value(registry, "etcdfence_request_errors_total", method="Range", code="OK") == 0


@pytest.mark.integration
def test_failed_requests_are_counted_with_their_grpc_code(
    registry: Any, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    seen: list[ef.CallRecord] = []
    with ef.Client(etcd_endpoints, timeout=3) as client:
        client.on_call(seen.append)
        with client.session(ttl=5) as session:
            lease = session.lease_id
        with pytest.raises(ef.EtcdfenceError):
            client.lease_revoke(lease)  # already revoked: NOT_FOUND
    failed = [r for r in seen if r.method == "LeaseRevoke" and r.outcome == "error"]
    assert failed and failed[-1].code == "NOT_FOUND"
    assert value(registry, "etcdfence_request_errors_total", method="LeaseRevoke", code="NOT_FOUND")
    ok = [r for r in seen if r.outcome == "ok"]
    assert ok and all(r.code == "OK" for r in ok)


def test_unreachable_etcd_is_counted_as_unavailable(registry: Any) -> None:
    with (
        ef.Client("http://127.0.0.1:1", timeout=0.5) as client,
        pytest.raises(ef.EtcdUnavailableError),
    ):
        client.get("k")
    assert value(registry, "etcdfence_request_errors_total", method="Range", code="UNAVAILABLE")
    assert value(registry, "etcdfence_requests_total", method="Range", code="OK") == 0


def test_no_counting_while_metrics_are_off() -> None:
    metrics.disable_metrics()
    reg = prometheus_client.CollectorRegistry()
    metrics.enable_metrics(reg)
    metrics.disable_metrics()
    record = ef.CallRecord("Range", "http://127.0.0.1:2379", 0.001, "ok")
    assert record.code == "OK"  # the field 0.2's observers did not pass has a default
    metrics.record_call(record)
    metrics.hold_started("lock", "x", 5, "x/1", 0.1)
    assert value(reg, "etcdfence_requests_total", method="Range", code="OK") == 0
    assert value(reg, "etcdfence_lock_acquired_total", kind="lock", name="x") == 0


# -- jitter -------------------------------------------------------------------------------


def test_backoffs_are_jittered() -> None:
    from etcdfence._async.connection import _capped_backoff

    waits = [jittered(1.0) for _ in range(200)]
    assert all(0.5 <= w <= 1.0 for w in waits) and len(set(waits)) > 100

    class State:  # what tenacity hands a wait strategy
        attempt_number = 6

    deadline = time.monotonic() + 60
    wait = _capped_backoff(deadline)
    draws = [wait(State()) for _ in range(200)]  # type: ignore[arg-type]
    assert all(0 <= d <= 1.0 for d in draws) and len(set(draws)) > 100
    near = _capped_backoff(time.monotonic() + 0.01)
    assert all(near(State()) <= 0.01 for _ in range(20))  # type: ignore[arg-type]


# -- the README's metric list ---------------------------------------------------------------


def _registered_names() -> set[str]:
    reg = prometheus_client.CollectorRegistry()
    metrics.enable_metrics(reg)
    try:
        return {m.name + ("_total" if m.type == "counter" else "") for m in reg.collect()}
    finally:
        metrics.disable_metrics()


def test_readme_lists_exactly_the_metrics_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`(etcdfence_[a-z_]+)(?:\{[^}`]*\})?`", text))
    # `etcdfence run --health`'s own gauges (etcdfence_supervisor_{...}) are the CLI's,
    # served on its /metrics and checked by test_cli_ops; the library registers the rest
    listed.discard("etcdfence_supervisor_")
    # the SQL fence's default data table is named like a metric, and is not one
    from etcdfence.fence.sql._session import DEFAULT_DATA_TABLE

    listed.discard(DEFAULT_DATA_TABLE)
    # etcdfence.celery's settings are app.conf keys with the same prefix, not metrics
    from etcdfence.celery._config import DEFAULTS as CELERY_SETTINGS

    listed -= set(CELERY_SETTINGS)
    assert listed == _registered_names()


def test_metrics_module_docstring_lists_them_too() -> None:
    documented = set(re.findall(r"``(etcdfence_[a-z_]+)``", metrics.__doc__ or ""))
    assert documented == _registered_names()


def test_a_hold_ends_once_whoever_reports_it(registry: Any) -> None:
    """The session's keepalive thread (expiry) and the owner (release) may report the
    end at the same moment: exactly one end is counted."""
    from etcdfence._hold import Hold, expiry_reason

    assert expiry_reason("local deadline passed (no keepalive acknowledged in time)") == ("expired")
    assert expiry_reason("lease expired or revoked on the server") == "revoked"
    for round_ in range(20):
        hold = Hold("lock", "race", round_ + 1, "race/1", 0.0)
        barrier = threading.Barrier(8)

        def end(reason: str, hold: Hold = hold, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            hold.end(reason)

        threads = [
            threading.Thread(target=end, args=("expired" if i % 2 else "resigned",))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert hold.ended
    ended = sum(
        value(registry, "etcdfence_lock_released_total", kind="lock", name="race", reason=r)
        for r in ("expired", "resigned")
    )
    assert ended == 20
    assert value(registry, "etcdfence_lock_hold_seconds_count", kind="lock", name="race") == 20


@pytest.mark.integration
async def test_a_cancelled_release_still_ends_the_hold(
    registry: Any, async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    import asyncio

    name = etcd_namespace + "/cancel"
    async with async_etcd_client.session(ttl=10) as session:
        lock = session.lock(name)
        await lock.acquire()
        task = asyncio.ensure_future(lock.release())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        labels = {"kind": "lock", "name": name}
        assert value(registry, "etcdfence_lock_held", **labels) == 0
        assert value(registry, "etcdfence_lock_released_total", **labels, reason="resigned") == 1
        await lock.release()  # nothing left to count
        assert value(registry, "etcdfence_lock_released_total", **labels, reason="resigned") == 1

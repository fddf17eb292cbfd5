"""Structured log events and Prometheus metrics (etcdfence.metrics)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from etcdfence import metrics
from etcdfence.errors import StaleTokenError
from etcdfence.sql import SQLFence

prometheus_client = pytest.importorskip("prometheus_client")
CollectorRegistry = prometheus_client.CollectorRegistry


@pytest.fixture
def registry() -> Iterator[object]:
    reg = CollectorRegistry()
    metrics.enable_metrics(reg)
    try:
        yield reg
    finally:
        metrics.disable_metrics()


def sample(reg: object, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)  # type: ignore[attr-defined,no-any-return]


def test_fence_helpers_record(registry: object) -> None:
    metrics.fence_accepted("orders", 7, 0.003, "etcd")
    metrics.fence_accepted("orders", 8, 0.001, "etcd")
    h = "etcdfence_fenced_write_seconds"
    assert sample(registry, h + "_count", resource="orders", backend="etcd") == 2
    assert sample(registry, h + "_sum", resource="orders", backend="etcd") == pytest.approx(0.004)
    assert sample(registry, h + "_bucket", resource="orders", backend="etcd", le="0.001") == 1
    assert sample(registry, "etcdfence_fence_mark", resource="orders") == 8

    metrics.fence_rejected("orders", 5, 8, 0.002, "etcd")
    assert sample(registry, "etcdfence_stale_rejections_total", resource="orders") == 1
    assert sample(registry, h + "_count", resource="orders", backend="etcd") == 3
    assert sample(registry, "etcdfence_fence_mark", resource="orders") == 8
    assert sample(registry, "etcdfence_stale_rejections_total", resource="other") is None


def test_leader_helpers_record(registry: object) -> None:
    metrics.leader_elected("svc", 42, "node-a")
    assert sample(registry, "etcdfence_is_leader", election="svc") == 1
    assert sample(registry, "etcdfence_leader_token", election="svc") == 42
    assert sample(registry, "etcdfence_leader_elected_total", election="svc") == 1

    metrics.leader_lost("svc", "node-a", "lease expired")
    assert sample(registry, "etcdfence_is_leader", election="svc") == 0
    assert sample(registry, "etcdfence_leader_lost_total", election="svc") == 1
    assert sample(registry, "etcdfence_leader_token", election="svc") == 42  # last term's

    for key in ("svc/1a", "svc/1a", None, "svc/2b", "svc/2b", "svc/1a"):
        metrics.leader_changed("svc", key)
    # 1a, 2b, 1a again: repeats of the same leader are not changes; None is no leader
    assert sample(registry, "etcdfence_leader_changes_total", election="svc") == 3

    metrics.lease_lost(0x694D7A3F0A1B2C3D, "keepalive deadline passed")
    metrics.lease_lost(1, "revoked")
    assert sample(registry, "etcdfence_leases_lost_total") == 2


def test_sqlfence_writes_are_measured(registry: object, tmp_path: Path) -> None:
    fence = SQLFence(sqlite3.connect(tmp_path / "m.db"), "ledger", table="fences")
    fence.ensure_schema()
    with fence.guarded(10) as cur:
        cur.execute("SELECT 1")
    fence.advance(12)
    with capture_logs() as logs, pytest.raises(StaleTokenError):
        fence.advance(9)
    h = "etcdfence_fenced_write_seconds"
    assert sample(registry, h + "_count", resource="ledger", backend="sqlite") == 3
    assert (sample(registry, h + "_sum", resource="ledger", backend="sqlite") or 0) > 0
    assert sample(registry, "etcdfence_fence_mark", resource="ledger") == 12
    assert sample(registry, "etcdfence_stale_rejections_total", resource="ledger") == 1
    assert logs == [
        {
            "event": "etcdfence.fence_rejected",
            "log_level": "warning",
            "resource": "ledger",
            "token": 9,
            "current": 12,
            "gap": 3,
            "backend": "sqlite",
        }
    ]


def test_events_are_logged() -> None:
    with capture_logs() as logs:
        metrics.fence_accepted("r", 3, 0.1, "etcd")  # the hot path logs nothing
        metrics.fence_rejected("r", 3, 10, 0.1, "etcd")
        metrics.leader_elected("svc", 11, "node-a")
        metrics.leader_lost("svc", "node-a", "resigned")
        metrics.leader_changed("svc", "svc/abc")
        metrics.lease_lost(0xABC, "expired")
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("etcdfence.fence_rejected", "warning"),
        ("etcdfence.leader_elected", "info"),
        ("etcdfence.leader_lost", "warning"),
        ("etcdfence.leader_changed", "debug"),
        ("etcdfence.lease_lost", "warning"),
    ]
    rejected, elected, lost, changed, lease = logs
    assert rejected["gap"] == 7 and rejected["current"] == 10 and rejected["token"] == 3
    assert elected["token"] == 11 and elected["identity"] == "node-a"
    assert lost["reason"] == "resigned"
    assert changed["leader_key"] == "svc/abc"
    assert lease["lease_id"] == "abc" and lease["reason"] == "expired"


def test_disabled_helpers_only_log(registry: object) -> None:
    metrics.fence_accepted("r", 3, 0.1, "etcd")
    metrics.disable_metrics()
    assert not metrics.metrics_enabled()
    with capture_logs() as logs:
        metrics.fence_accepted("r", 4, 0.1, "etcd")
        metrics.fence_rejected("r", 1, 4, 0.1, "etcd")
        metrics.leader_elected("svc", 5, None)
    assert len(logs) == 2
    assert sample(registry, "etcdfence_fence_mark", resource="r") == 3
    assert sample(registry, "etcdfence_stale_rejections_total", resource="r") is None
    assert sample(registry, "etcdfence_is_leader", election="svc") is None


def test_enable_is_idempotent_per_registry(registry: object) -> None:
    metrics.fence_accepted("r", 3, 0.1, "etcd")
    metrics.enable_metrics(registry)  # same registry: same collectors, no duplicate error
    metrics.enable_metrics(registry)
    metrics.fence_accepted("r", 4, 0.1, "etcd")
    assert (
        sample(registry, "etcdfence_fenced_write_seconds_count", resource="r", backend="etcd") == 2
    )

    other = CollectorRegistry()
    metrics.enable_metrics(other)  # switch to another registry
    metrics.fence_accepted("r", 5, 0.1, "etcd")
    assert sample(other, "etcdfence_fence_mark", resource="r") == 5
    assert sample(registry, "etcdfence_fence_mark", resource="r") == 4
    metrics.enable_metrics(registry)  # and back, keeping the old values
    metrics.fence_accepted("r", 6, 0.1, "etcd")
    assert (
        sample(registry, "etcdfence_fenced_write_seconds_count", resource="r", backend="etcd") == 3
    )


def test_default_registry_and_exposition() -> None:
    # In a child process, so the global REGISTRY of this test run stays untouched.
    code = (
        "from etcdfence import metrics\n"
        "from prometheus_client import generate_latest\n"
        "metrics.enable_metrics(); metrics.enable_metrics()\n"
        "metrics.fence_accepted('orders', 7, 0.002, 'etcd')\n"
        "print(generate_latest().decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert 'etcdfence_fence_mark{resource="orders"} 7.0' in out
    assert 'etcdfence_fenced_write_seconds_count{backend="etcd",resource="orders"} 1.0' in out
    types = dict(
        line.split()[2:4] for line in out.splitlines() if line.startswith("# TYPE etcdfence_")
    )
    assert {
        "etcdfence_fenced_write_seconds": "histogram",
        "etcdfence_fence_mark": "gauge",
        "etcdfence_stale_rejections_total": "counter",
        "etcdfence_is_leader": "gauge",
        "etcdfence_leader_token": "gauge",
        "etcdfence_leader_elected_total": "counter",
        "etcdfence_leader_lost_total": "counter",
        "etcdfence_leader_changes_total": "counter",
        "etcdfence_leases_lost_total": "counter",
    }.items() <= types.items()


def test_missing_prometheus_client_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install 'etcdfence\[metrics\]'"):
        metrics.enable_metrics()
    assert not metrics.metrics_enabled()


def test_helpers_are_thread_safe(registry: object) -> None:
    threads, per_thread = 8, 2000
    barrier = threading.Barrier(threads)

    def hammer(i: int) -> None:
        barrier.wait()
        for n in range(per_thread):
            metrics.fence_accepted(f"r{i % 2}", n + 1, 0.0001, "etcd")
            metrics.leader_changed("svc", f"svc/{i}")

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total = sum(
        sample(registry, "etcdfence_fenced_write_seconds_count", resource=r, backend="etcd") or 0
        for r in ("r0", "r1")
    )
    assert total == threads * per_thread


@pytest.mark.serial  # a CPU-time bound per call
def test_disabled_hot_path_is_cheap() -> None:
    metrics.disable_metrics()
    n = 100_000
    start = time.perf_counter()
    for _ in range(n):
        metrics.fence_accepted("r", 1, 0.001, "sqlite")
    per_call = (time.perf_counter() - start) / n
    assert per_call < 5e-6, f"{per_call * 1e9:.0f} ns per disabled fence_accepted"

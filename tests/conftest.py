"""Fixtures shared by the tests that run etcdfence and the examples as processes."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without any etcdfence/etcdctl settings of the developer's shell."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ETCDFENCE_", "ETCDCTL_", "ETCD_LOCK_"))
    }
    env.update(extra)
    return env


@pytest.fixture
def env(etcd_endpoints: list[str]) -> dict[str, str]:
    """Environment for CLI and example processes: etcd via ETCDFENCE_ENDPOINTS, as documented."""
    return clean_env(ETCDFENCE_ENDPOINTS=",".join(etcd_endpoints))


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; whatever is still running at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)

"""Fixtures shared by the tests that run etcdfence and the examples as processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator

import pytest


def free_port_pair() -> int:
    """A port P with P and P+1 free on 127.0.0.1 right now (`etcdfence etcd --listen`:
    client port P, peer port P+1)."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair")


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

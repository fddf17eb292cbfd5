"""Fixtures shared by the tests that run etcdfence and the examples as processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

import etcdfence as ef


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``--dist loadgroup``), the tests of a module that
    share a module-scoped fixture (a TLS etcd, a built wheel, a Redis of its own) form one
    ``xdist_group``: one worker runs them all and sets the fixture up once, instead of
    every worker setting it up for its share of the module."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group") is not None:
            continue
        scopes = {defs[-1].scope for defs in info.name2fixturedefs.values() if defs}
        if "module" in scopes:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


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


def advance_revision(endpoints: list[str], at_least: int) -> int:
    """Write to one scratch key until etcd's revision is ``at_least``; return the revision.

    For a test that writes made-up small tokens (``guard.put(10, ...)``) through an etcd
    fence: every etcd fence refuses a token above etcd's current revision
    (:class:`~etcdfence.FutureTokenError`), so the revision must be past the largest
    token first. Costs one request when it already is."""
    scratch = f"t/advance-revision-{uuid.uuid4().hex[:8]}"
    with ef.Client(endpoints, timeout=5.0) as client:
        revision = client.revision()
        if revision < at_least:
            while revision < at_least:
                revision = client.put(scratch, b"")
            revision = client.delete(scratch)
    return revision


@pytest.fixture
def revision_past(etcd_endpoints: list[str]) -> Callable[[int], int]:
    """``revision_past(n)``: make the test etcd's revision at least ``n`` (see
    :func:`advance_revision`) and return it, so made-up tokens up to ``n`` are not tokens
    from the future."""
    return lambda n: advance_revision(etcd_endpoints, n)

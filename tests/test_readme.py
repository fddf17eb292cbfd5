"""Every ```python block of README.md runs, as written, in a fresh process against a
real etcd given only through ``ETCDFENCE_ENDPOINTS`` (as a reader's shell would).

An HTML comment on the line before a block changes how it is run (use sparingly):

- ``<!-- readme-test: sigterm-when TEXT -->``: a service that runs until stopped;
  once its stdout shows TEXT it gets SIGTERM and must exit 0 within 15 s (the
  LeaderElector snippets: SIGTERM → ``stop()`` → resign → ``run()`` returns);
- ``<!-- readme-test: pytest -->``: a test module, run by pytest with the plugin's
  fixtures on the same etcd (``ETCDFENCE_TEST_ENDPOINTS``);
- ``<!-- readme-test: skip REASON -->``: not run; REASON says why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import clean_env

from etcdfence.testing.procs import LineReader, stop

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>\w*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<mode>[\w-]+)\s*(?P<arg>.*?)\s*-->\s*$")
MODES = {"run", "sigterm-when", "pytest", "skip"}


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    mode: str
    arg: str

    @property
    def id(self) -> str:
        return f"README.md:{self.line}"


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks (indented ones in lists too), each with its marker."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, start = m.group("indent"), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if m.group("lang") == "python":
            body = textwrap.dedent("\n".join(lines[start + 1 : j]))
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = _MARKER.match(lines[k]) if k >= 0 else None
            mode, arg = ("run", "") if marker is None else (marker["mode"], marker["arg"])
            blocks.append(Block(start + 1, body + "\n", mode, arg))
        del indent
        i = j + 1
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_its_snippets_and_markers_are_known() -> None:
    assert len(BLOCKS) >= 8, [b.id for b in BLOCKS]
    for block in BLOCKS:
        assert block.mode in MODES, f"{block.id}: unknown readme-test mode {block.mode!r}"
        if block.mode in ("skip", "sigterm-when"):
            assert block.arg, f"{block.id}: {block.mode} needs an argument"
        assert "import " in block.code, f"{block.id}: a snippet imports what it uses"
    assert sum(b.mode == "skip" for b in BLOCKS) <= 2, "skips are for the exceptional block"
    elector = [b for b in BLOCKS if "LeaderElector(" in b.code]
    assert elector and all(b.mode == "sigterm-when" for b in elector)
    assert any("signal.SIGTERM" in b.code and "elector.stop()" in b.code for b in elector)


@pytest.fixture(scope="module")
def readme_etcd() -> Iterator[str]:
    """A fresh etcd of the README's own: the snippets use fixed names
    (``jobs/nightly``, ``services/scheduler``) that no other test may hold."""
    from etcdfence.testing import EtcdBinaryNotFound, EtcdServer

    try:
        server = EtcdServer()
    except EtcdBinaryNotFound as exc:
        pytest.skip(str(exc))
    with server:
        yield server.endpoint


def _env(endpoint: str) -> dict[str, str]:
    env = clean_env(ETCDFENCE_ENDPOINTS=endpoint, PYTHONUNBUFFERED="1")
    env["ETCDFENCE_TEST_ENDPOINTS"] = endpoint
    return env


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_readme_snippet_runs(block: Block, readme_etcd: str, tmp_path: Path) -> None:
    if block.mode == "skip":
        pytest.skip(f"{block.id}: {block.arg}")
    env = _env(readme_etcd)
    if block.mode == "pytest":
        script = tmp_path / "test_readme_snippet.py"
        script.write_text(block.code, encoding="utf-8")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert re.search(r"\b1 passed\b", result.stdout), result.stdout
        return
    script = tmp_path / "snippet.py"
    script.write_text(block.code, encoding="utf-8")
    if block.mode == "run":
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
        assert result.returncode == 0, f"{block.id}\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
        return
    _run_until_sigterm(block, script, env, tmp_path)


def _run_until_sigterm(block: Block, script: Path, env: dict[str, str], cwd: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out = LineReader(proc.stdout)
        err = LineReader(proc.stderr)
        try:
            out.wait_for(lambda line: block.arg in line, timeout=30)
        except Exception:
            proc.kill()
            raise AssertionError(f"{block.id}: never printed {block.arg!r}: {err.lines}") from None
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=15) == 0, f"{block.id}: {err.lines}"
        assert time.monotonic() - started < 15
        assert not any("Traceback" in line for line in err.lines), err.lines
    finally:
        stop(proc, signal.SIGKILL)

"""The public types say what runs: mypy --strict over tests/typing/*.py.

Each ``# E: fragment`` line of a snippet must get an error containing the fragment, and
no other line may get one — so a sync ``work`` given to the async elector is rejected,
while async callbacks (awaited at run time, see test_elector_callbacks.py) type-check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = sorted((ROOT / "tests" / "typing").glob("*.py"))
_MARK = re.compile(r"#\s*E:\s*(.+?)\s*$")


def _expected(path: Path) -> dict[int, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {n: m.group(1) for n, line in enumerate(lines, 1) if (m := _MARK.search(line))}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda p: p.name)
def test_mypy_strict_accepts_and_rejects_what_the_snippet_says(snippet: Path) -> None:
    expected = _expected(snippet)
    assert expected, f"{snippet.name} marks no expected error: it could not fail"
    stdout, stderr, _status = mypy_api.run(
        [
            "--strict",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-error-summary",
            "--show-error-codes",
            str(snippet),
        ]
    )
    got: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = re.match(r"(.+?):(\d+): error: (.*)", line)
        if m is None:
            continue
        where = (ROOT / m.group(1)).resolve()
        assert where == snippet.resolve(), f"error outside the snippet: {line}"
        got.setdefault(int(m.group(2)), []).append(m.group(3))
    assert not stderr, stderr
    unexpected = {n: e for n, e in got.items() if n not in expected}
    assert not unexpected, f"errors on lines that must type-check: {unexpected}\n{stdout}"
    for number, fragment in expected.items():
        assert any(fragment in e for e in got.get(number, [])), (
            f"line {number}: expected an error with {fragment!r}, got {got.get(number)}\n{stdout}"
        )

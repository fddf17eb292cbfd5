#!/usr/bin/env python3
"""Report functions longer than a limit (80 lines by default) in ``etcdfence/`` and ``bench/``.

A function's length is counted from its ``def`` line (decorators excluded) to its last
line, docstring and comments included: what a reader has to hold in one sitting. The
generated twin ``etcdfence/_sync`` is skipped (its length follows ``etcdfence/_async``).
Exit status 1 when any function is too long, so ``make lint`` fails; ``--limit N`` and
paths on the command line change what is checked.

    python tools/long_functions.py                 # etcdfence/ and bench/, limit 80
    python tools/long_functions.py --limit 60 etcdfence/cli
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = [ROOT / "etcdfence", ROOT / "bench"]
EXCLUDED = [ROOT / "etcdfence" / "_sync"]


def python_files(paths: list[Path]) -> Iterator[Path]:
    """Every ``.py`` file under ``paths``, outside the excluded (generated) trees."""
    for path in paths:
        candidates = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in candidates:
            resolved = file.resolve()
            if not any(resolved.is_relative_to(excluded) for excluded in EXCLUDED):
                yield file


def long_functions(file: Path, limit: int) -> Iterator[tuple[int, str, int]]:
    """(line, qualified name, length) of each function in ``file`` longer than ``limit``."""
    tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    yield child.lineno, name, length
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files or directories")
    parser.add_argument("--limit", type=int, default=80, help="most lines a function may have")
    args = parser.parse_args(argv)
    found = 0
    for file in python_files(args.paths or DEFAULT_PATHS):
        for line, name, length in long_functions(file, args.limit):
            shown = (
                file.resolve().relative_to(ROOT) if file.resolve().is_relative_to(ROOT) else file
            )
            print(f"{shown}:{line}: {name} is {length} lines (limit {args.limit})")
            found += 1
    if found:
        print(f"{found} function(s) longer than {args.limit} lines", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())

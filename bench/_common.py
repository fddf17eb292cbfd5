"""Shared helpers for the benchmarks: an embedded etcd, interleaved timing, a table.

Machines here are noisy, so every comparison is measured *side by side in one
run*: the contenders alternate in short rounds and we report the ratio of the
medians of their per-round throughput.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

Result = dict[str, Any]


def machine() -> str:
    return f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"


def interleave(contenders: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Run each contender ``rounds`` times in alternation; return median ops/s.

    Each callable performs a batch and returns the number of operations it did.
    """
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            ops = fn()
            rates[name].append(ops / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "NOT met"


def table(rows: Sequence[tuple[object, ...]], headers: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(r: tuple[object, ...]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))

    return "\n".join([line(headers), line(tuple("-" * w for w in widths)), *map(line, rows)])

"""What a conformance run found: one result per scenario, rendered for people and as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "Report", "ScenarioResult"]

Status = Literal["pass", "fail", "skip"]
#: Findings listed per failed scenario in the text form (JSON has them all).
FINDINGS_SHOWN = 8


@dataclass(frozen=True)
class Finding:
    """One thing that went wrong: a history-checker violation (``kind`` as in
    :mod:`etcdfence.history`) or one of the kit's own checks."""

    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class ScenarioResult:
    """The verdict on one scenario.

    ``status`` is ``"pass"``, ``"fail"`` or ``"skip"``; ``explanation`` says in one
    sentence what happened (why it passed, what the resource did wrong, or why it
    did not run); ``findings`` are the problems; ``history`` is the offending history:
    the events the kit recorded (writes with their outcomes, terms), one per line,
    and ``checker`` the history checker's one-line verdict.
    """

    name: str
    title: str
    status: Status
    explanation: str
    findings: list[Finding] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    checker: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True unless the scenario failed (a skipped scenario did not fail)."""
        return self.status != "fail"

    def render(self) -> str:
        """The verdict, every finding and the history, as indented text."""
        lines = [f"{self.status.upper()} {self.name}: {self.explanation}"]
        lines += [f"  - {finding}" for finding in self.findings[:FINDINGS_SHOWN]]
        if len(self.findings) > FINDINGS_SHOWN:
            lines.append(f"  ... and {len(self.findings) - FINDINGS_SHOWN} more findings")
        if self.checker:
            lines.append(f"  history checker: {self.checker}")
        if self.history:
            lines.append("  history:")
            lines += [f"    {line}" for line in self.history]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``-w json`` prints per scenario)."""
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "passed": self.passed,
            "explanation": self.explanation,
            "findings": [{"kind": f.kind, "message": f.message} for f in self.findings],
            "checker": self.checker,
            "history": list(self.history),
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Report:
    """The result of :func:`~etcdfence.conformance.run_conformance`.

    ``bool(report)`` / ``report.ok``: no scenario failed. ``str(report)`` is the
    readable report (a table, then every failure with its history); :meth:`to_json`
    the machine-readable one; ``report["zombie-after-pause"]`` one result.
    """

    adapter: str
    endpoints: list[str]
    results: list[ScenarioResult]
    seconds: float = 0.0
    #: What went wrong that does not bear on the verdict (a close() that raised).
    warnings: list[str] = field(default_factory=list)
    #: The lock the adapter declared its resource bound to (``Adapter.bound_lock``).
    bound_lock: str | None = None

    @property
    def ok(self) -> bool:
        """Whether no scenario failed."""
        return all(result.passed for result in self.results)

    @property
    def failed(self) -> list[str]:
        """Names of the failed scenarios, in run order."""
        return [result.name for result in self.results if result.status == "fail"]

    def __bool__(self) -> bool:
        return self.ok

    def __iter__(self) -> Iterator[ScenarioResult]:
        return iter(self.results)

    def __getitem__(self, name: str) -> ScenarioResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def summary(self) -> str:
        """One line: how many scenarios passed, failed and were skipped."""
        counts = {
            s: sum(1 for r in self.results if r.status == s) for s in ("pass", "fail", "skip")
        }
        verdict = "FENCED" if self.ok else "NOT FENCED"
        return (
            f"{verdict}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip']} skipped in {self.seconds:.1f} s"
        )

    def render(self) -> str:
        """The whole report as text (also ``str(report)``)."""
        width = max((len(r.name) for r in self.results), default=10)
        bound = f", bound to lock {self.bound_lock!r}" if self.bound_lock else ""
        lines = [f"etcdfence conformance: {self.adapter} (etcd {', '.join(self.endpoints)}{bound})"]
        for r in self.results:
            lines.append(f"  {r.status.upper():4}  {r.name:{width}}  {r.explanation}")
        failures = [r for r in self.results if r.status == "fail"]
        for r in failures:
            lines += ["", r.render()]
        if self.warnings:
            lines += ["", *(f"warning: {w}" for w in self.warnings)]
        lines += ["", self.summary()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ok": self.ok,
            "adapter": self.adapter,
            "endpoints": list(self.endpoints),
            "bound_lock": self.bound_lock,
            "seconds": round(self.seconds, 3),
            "failed": self.failed,
            "warnings": list(self.warnings),
            "scenarios": [result.to_dict() for result in self.results],
        }

    def to_json(self) -> str:
        """The report as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

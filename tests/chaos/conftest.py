"""Harness of the chaos scenarios: contender processes, rounds, and the run summary.

- ``CHAOS_ROUNDS=N`` runs every scenario for at least N fault rounds (and the hypothesis
  machine for at least N examples), for a soak: ``CHAOS_ROUNDS=20 make chaos``;
- the ``chaos`` fixture is a :class:`ScenarioRecord` each scenario fills in (faults
  injected, the checker's result); at the end of the run a table of all records is
  printed and written as markdown to ``tests/chaos/last_summary.md``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

import etcdfence as ef
from etcdfence.history import (
    CheckResult,
    Event,
    History,
    Layout,
    Observer,
    check,
    parse_events,
)
from etcdfence.testing.procs import LineReader, start, stop, wait_until

__all__ = ["wait_until"]  # re-exported for the scenarios

ROUNDS_ENV = "CHAOS_ROUNDS"
#: The contender programs: ``python -m etcdfence.testing.contender`` with either twin.
CONTENDER = (sys.executable, "-m", "etcdfence.testing.contender", "--api", "sync")
ASYNC_CONTENDER = (sys.executable, "-m", "etcdfence.testing.contender", "--api", "async")
SUMMARY_FILE = Path(__file__).with_name("last_summary.md")


def rounds(default: int) -> int:
    """The number of fault rounds of a scenario: ``default``, or ``$CHAOS_ROUNDS`` if
    that is larger (a soak only ever scales up)."""
    value = os.environ.get(ROUNDS_ENV, "").strip()
    return max(default, int(value)) if value else default


# ----------------------------------------------------------------------------- records


@dataclass
class ScenarioRecord:
    """What one scenario did, for the summary table."""

    scenario: str
    rounds: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    stale_attempted: int = 0
    stale_accepted: int = 0
    violations: int = 0
    expect_violations: bool = False
    expected_because: str = "guard bypassed"
    verdicts: list[str] = field(default_factory=list)
    seconds: float = 0.0
    outcome: str = "?"

    def fault(self, name: str, count: int = 1) -> None:
        self.faults[name] += count

    def add(self, result: CheckResult) -> None:
        """Fold a checker result into the record."""
        self.stale_attempted += result.stats["stale_attempted"]
        self.stale_accepted += result.stats["stale_accepted"]
        self.violations += len(result.violations)
        self.verdicts.append(str(result))


_RECORDS: list[ScenarioRecord] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    record = getattr(item, "_chaos_record", None)
    relevant = report.when == "call" or report.outcome != "passed"
    if record is not None and relevant and record.outcome in ("?", "passed"):
        record.outcome = report.outcome
    return report


@pytest.fixture
def chaos(request: pytest.FixtureRequest) -> Iterator[ScenarioRecord]:
    """The scenario's summary record (named after the test)."""
    name = request.node.name.removeprefix("test_")
    record = ScenarioRecord(name)
    request.node._chaos_record = record
    started = time.monotonic()
    try:
        yield record
    finally:
        record.seconds = time.monotonic() - started
        _RECORDS.append(record)


def summary_rows() -> list[list[str]]:
    rows = []
    for r in _RECORDS:
        faults = ", ".join(f"{n} x{c}" for n, c in sorted(r.faults.items())) or "-"
        violations = str(r.violations)
        if r.expect_violations:
            violations += f" (expected: {r.expected_because})"
        rows.append(
            [
                r.scenario,
                str(r.rounds),
                faults,
                str(r.stale_attempted),
                str(r.stale_accepted),
                violations,
                f"{r.seconds:.1f}",
                r.outcome,
            ]
        )
    return rows


HEADER = [
    "Scenario",
    "Rounds",
    "Faults injected",
    "Stale writes attempted",
    "Stale writes accepted",
    "Violations",
    "Time (s)",
    "Result",
]


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RECORDS:
        return
    rows = summary_rows()
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADER)]
    terminalreporter.write_sep("=", "chaos summary")
    for line in [HEADER, *rows]:
        terminalreporter.write_line(
            "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True))
        )
    for record in _RECORDS:
        for verdict in record.verdicts:
            terminalreporter.write_line(f"{record.scenario}: {verdict}")
    SUMMARY_FILE.write_text(
        "<!-- written by tests/chaos/conftest.py at the end of a chaos run -->\n"
        + markdown_table(rows)
    )
    terminalreporter.write_line(f"(written to {SUMMARY_FILE})")


# ----------------------------------------------------------------------------- processes


class ContenderProcess:
    """One contender process (:mod:`etcdfence.testing.contender`); its JSON events are
    collected by a thread.

    ``script`` is the command that starts it (``CONTENDER``, the threaded twin, or
    ``ASYNC_CONTENDER``, e.g. under libfaketime through ``env``); ``extra_args`` are
    appended (e.g. ``--naive``). ``clock_rate``: the child's clocks run
    at this rate (libfaketime), so its event times mean nothing here: its times and
    session deadlines are mapped to this process's ``time.monotonic()`` by the rate and
    an offset measured from the arrival of its lines (see :meth:`_restamp`).
    """

    def __init__(
        self,
        ident: str,
        endpoints: list[str],
        layout: Layout,
        *,
        ttl: int = 1,
        unsafe: bool = False,
        timeout: float = 2.0,
        interval: float = 0.05,
        term: float = 0.0,
        log_dir: Path | None = None,
        script: Sequence[str] = CONTENDER,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        clock_rate: float | None = None,
    ) -> None:
        self.ident = ident
        self.clock_rate = clock_rate
        self._raw: list[Event] = []
        self._offset: float | None = None
        self.paused = False
        self._events: list[Event] = []
        self._cond = threading.Condition()
        args = [*script, "--endpoints", ",".join(endpoints)]
        args += ["--root", layout.root, "--id", ident, "--ttl", str(ttl)]
        args += ["--timeout", str(timeout), "--interval", str(interval), "--term", str(term)]
        if unsafe:
            args.append("--unsafe")
        args += list(extra_args)
        self._log: IO[bytes] | None = None
        self.log_path: Path | None = None
        if log_dir is not None:
            self.log_path = log_dir / f"{ident}.stderr.log"
            self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = start(args, env=env, stderr=self._log or subprocess.DEVNULL)
        self._reader = LineReader(self.proc.stdout, on_line=self._take, name=f"read-{ident}")

    def _take(self, line: str, arrival: float) -> None:
        parsed = parse_events([line])
        with self._cond:
            if self.clock_rate is None:
                self._events.extend(parsed)
            else:
                self._restamp(parsed, arrival)
            self._cond.notify_all()

    def _restamp(self, parsed: list[Event], arrival: float) -> None:
        """Map the child's (faked) times to ours: ``ours = offset + theirs / rate``, the
        offset being the smallest ``arrival - t / rate`` seen (the line that travelled
        fastest), so every time and deadline is exact up to that one latency."""
        rate = self.clock_rate or 1.0
        changed = False
        for event in parsed:
            self._raw.append(event)
            offset = arrival - event.t / rate
            if self._offset is None or offset < self._offset:
                self._offset, changed = offset, True
        assert self._offset is not None
        offset = self._offset

        def mapped(event: Event) -> Event:
            deadline = None if event.deadline is None else offset + event.deadline / rate
            return dataclasses.replace(event, t=offset + event.t / rate, deadline=deadline)

        if changed:
            self._events = [mapped(e) for e in self._raw]
        else:
            self._events.extend(mapped(e) for e in parsed)

    @property
    def events(self) -> list[Event]:
        with self._cond:
            return list(self._events)

    def last(self, kind: str) -> Event | None:
        with self._cond:
            for event in reversed(self._events):
                if event.kind == kind:
                    return event
        return None

    def leading(self) -> Event | None:
        """The ``elected`` event of the term it is in now (per its own events), or None."""
        with self._cond:
            for event in reversed(self._events):
                if event.kind == "lost":
                    return None
                if event.kind == "elected":
                    return event
        return None

    def wait_for(
        self, predicate: Callable[[Event], bool], timeout: float, what: str, after: float = 0.0
    ) -> Event:
        """The first event (recorded after ``after``) matching ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self._events:
                    if event.t >= after and predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and self._reader.eof):
                    break
                self._cond.wait(min(remaining, 0.1))
        raise AssertionError(f"no {what} within {timeout:.1f}s\n{self.describe(10)}")

    def describe(self, lines: int = 6) -> str:
        """State, last events and stderr tail, for failure messages."""
        status = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        if self.paused:
            status = "paused"
        text = [f"{self.ident} ({status}):"]
        text += [f"    {e.describe()}" for e in self.events[-lines:]]
        if self.log_path is not None and self.log_path.exists():
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
            text += [f"    stderr: {line}" for line in tail]
        return "\n".join(text)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 15.0) -> None:
        """SIGCONT if paused, SIGTERM (resign and exit), SIGKILL if it lingers."""
        stop(self.proc, timeout=timeout)  # continues a paused child after the SIGTERM
        self.paused = False
        self._reader.join(5)
        if self._log is not None:
            self._log.close()


class Contenders:
    """A group of contender processes on one :class:`Layout`."""

    def __init__(self, client: ef.Client, layout: Layout, log_dir: Path) -> None:
        self.client = client
        self.layout = layout
        self.log_dir = log_dir
        self.procs: list[ContenderProcess] = []

    def start(self, ident: str, endpoints: list[str], **kwargs: Any) -> ContenderProcess:
        proc = ContenderProcess(ident, endpoints, self.layout, log_dir=self.log_dir, **kwargs)
        self.procs.append(proc)
        return proc

    def events(self) -> list[Event]:
        return sorted((e for p in self.procs for e in p.events), key=lambda e: e.t)

    def leader(self) -> ContenderProcess | None:
        """The process that leads per etcd *and* per its own events, if any."""
        try:
            current = self.client.leader(self.layout.election)
        except ef.EtcdfenceError:
            return None
        if current is None:
            return None
        for proc in self.procs:
            elected = proc.leading()
            if elected is not None and elected.key == current.key:
                return proc
        return None

    def wait_leader(
        self, timeout: float, *, exclude: ContenderProcess | None = None, writing: bool = True
    ) -> ContenderProcess:
        """Wait for a leader (not ``exclude``) that has had a write accepted in its term."""

        def ready() -> ContenderProcess | None:
            proc = self.leader()
            if proc is None or proc is exclude:
                return None
            if writing:
                elected = proc.leading()
                accepted = proc.last("accepted")
                if elected is None or accepted is None or accepted.t < elected.t:
                    return None
            return proc

        try:
            return wait_until(ready, timeout, "a (new) leader that writes")
        except AssertionError as err:
            states = "\n".join(proc.describe() for proc in self.procs)
            raise AssertionError(f"{err}\n{states}") from None

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.paused:
                proc.resume()
        for proc in self.procs:
            proc.stop()


@pytest.fixture
def layout(etcd_namespace: str) -> Layout:
    return Layout(etcd_namespace)


@pytest.fixture
def cluster_client(etcd_cluster: Any) -> Iterator[ef.Client]:
    with ef.Client(etcd_cluster.endpoints, timeout=2.0) as client:
        yield client


@pytest.fixture
def observer(cluster_client: ef.Client, layout: Layout) -> Iterator[Observer]:
    """Ground truth: every change under the layout's root from before the scenario."""
    start = cluster_client.revision() + 1
    with Observer(cluster_client, layout, start_revision=start) as obs:
        yield obs


@pytest.fixture
def contenders(cluster_client: ef.Client, layout: Layout, tmp_path: Path) -> Iterator[Contenders]:
    group = Contenders(cluster_client, layout, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


def finish(
    group: Contenders, observer: Observer, client: ef.Client, record: ScenarioRecord
) -> CheckResult:
    """Stop every contender, let the observer catch up, read the final state, check."""
    group.stop_all()
    observer.sync(timeout=15)
    history = History.collect(group.events(), observer)
    history.read_final(client)
    result = check(history)
    record.add(result)
    return result


def netns_cluster(election_timeout: float) -> Iterator[Any]:
    """A started 3-member :class:`~etcdfence.testing.netns.NetnsCluster` for a
    module-scoped ``etcd_cluster`` fixture (``yield from``); skips the module when
    network namespaces are not available here."""
    from etcdfence.testing.netns import NetnsCluster, netns_unavailable

    why = netns_unavailable()
    if why is not None:
        pytest.skip(f"member partitions need network namespaces: {why}")
    cluster = NetnsCluster(3, election_timeout_ms=int(election_timeout * 1000))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

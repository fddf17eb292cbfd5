"""Process toolkit for tests that drive child processes: start, read, wait, stop.

Use it when a test runs a program (a contender, the CLI, etcdctl) as a real process and
has to read its output with deadlines, wait for a condition, and be sure the child is
gone afterwards. The demo, the fault and chaos suites and the benchmarks share it:

- :func:`start` runs a child in its own process group (a Ctrl-C at the terminal reaches
  only the test runner, which then stops its children itself);
- :class:`LineReader` collects the lines of a child's stdout (or stderr) in a thread and
  hands them out with deadlines: one at a time (:meth:`LineReader.line`, JSON events with
  :meth:`LineReader.event`), or by search (:meth:`LineReader.wait_for`); each waiting
  method has an ``a``-prefixed twin for ``async def`` tests;
- :func:`wait_until` / :func:`await_until` poll a condition until it holds;
- :func:`stop` signals one child by PID (SIGTERM by default), kills it if it lingers and
  reaps it.

Every wait fails with an :class:`AssertionError` that says what it waited for and what
was seen, so a timed-out test reads as a test failure, not a hang.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, TypeVar

from ..errors import InvalidArgumentError

__all__ = ["LineReader", "await_until", "start", "stop", "wait_until"]

T = TypeVar("T")


def start(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.DEVNULL,
    stdin: Any = subprocess.DEVNULL,
    new_group: bool = True,
    **kwargs: Any,
) -> subprocess.Popen[str]:
    """Start a child with text pipes, stdin closed, in its own process group.

    ``stdin=subprocess.PIPE`` for a child that takes commands on stdin;
    ``new_group=False`` keeps it in the test runner's group (a terminal's Ctrl-C then
    reaches it too). Pair every call with :func:`stop`."""
    return subprocess.Popen(
        list(args),
        stdout=stdout,
        stderr=stderr,
        stdin=stdin,
        text=True,
        env=None if env is None else dict(env),
        start_new_session=new_group,
        **kwargs,
    )


def stop(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0
) -> int | None:
    """Send ``sig`` to one child (by PID, never its group), wait ``timeout`` seconds for
    it, SIGKILL it if it lingers, and reap it. Returns its exit status (``-9`` when it had
    to be killed); safe to call on a child that already exited.

    A stopped (SIGSTOP) child is continued after the signal so that it can act on it."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            if sig not in (signal.SIGKILL, signal.SIGCONT):
                proc.send_signal(signal.SIGCONT)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def wait_until(
    condition: Callable[[], T | None], timeout: float = 10.0, what: str = "", interval: float = 0.02
) -> T:
    """Poll ``condition()`` every ``interval`` seconds until it returns something truthy
    and return that; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what or condition}")
        time.sleep(interval)


async def await_until(
    condition: Callable[[], Any], timeout: float = 5.0, what: str = "", interval: float = 0.02
) -> Any:
    """:func:`wait_until` for ``async def`` tests: ``condition`` may be sync or return an
    awaitable; the event loop keeps running between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what or condition}")
        await asyncio.sleep(interval)


class LineReader:
    """The lines of a child's stream, collected by a daemon thread, read with deadlines.

    ``lines`` holds every line received so far (without the newline). :meth:`line` and
    :meth:`event` hand them out one at a time in order (``seen`` are the ones handed
    out); :meth:`wait_for` searches all of them. ``on_line(line, arrival)`` is called in
    the reading thread for each line with its ``time.monotonic()`` arrival time, for
    callers that keep their own parsed view (the chaos harness re-stamps event times).

    ``stream`` is typically ``proc.stdout`` of a child started with a pipe; ``None`` (no
    pipe) raises :class:`~etcdfence.errors.InvalidArgumentError`."""

    def __init__(
        self,
        stream: IO[str] | None,
        *,
        on_line: Callable[[str, float], None] | None = None,
        name: str = "line-reader",
    ) -> None:
        if stream is None:
            raise InvalidArgumentError("LineReader needs a stream: start the child with a pipe")
        self.lines: list[str] = []
        self._next = 0  # index of the next line line() hands out
        self._eof = False
        self._cond = threading.Condition()
        self._on_line = on_line
        self._thread = threading.Thread(target=self._pump, args=(stream,), name=name, daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        try:
            for raw in stream:
                arrival = time.monotonic()
                line = raw.rstrip("\n")
                if self._on_line is not None:
                    self._on_line(line, arrival)
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    @property
    def seen(self) -> list[str]:
        """The lines handed out by :meth:`line`, :meth:`event` and :meth:`ready`."""
        with self._cond:
            return self.lines[: self._next]

    @property
    def eof(self) -> bool:
        """True once the stream has ended (every line is in ``lines``)."""
        with self._cond:
            return self._eof

    def _take(self) -> tuple[bool, str | None]:
        """(done, line): the next line, or (True, None) at EOF, or (False, None)."""
        with self._cond:
            if self._next < len(self.lines):
                self._next += 1
                return True, self.lines[self._next - 1]
            return self._eof, None

    def _timeout(self, timeout: float) -> AssertionError:
        return AssertionError(f"no output line within {timeout}s (seen so far: {self.seen})")

    def line(self, timeout: float = 5.0) -> str | None:
        """The next line (``None`` at EOF); AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                done, item = self._take()
                if done:
                    return item
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout(timeout)
                self._cond.wait(remaining)

    async def aline(self, timeout: float = 5.0) -> str | None:
        """:meth:`line` for ``async def`` tests (polls, so the event loop keeps running)."""
        deadline = time.monotonic() + timeout
        while True:
            done, item = self._take()
            if done:
                return item
            if time.monotonic() >= deadline:
                raise self._timeout(timeout)
            await asyncio.sleep(0.01)

    def ready(self) -> list[str]:
        """The lines received but not yet handed out, without waiting (marks them seen)."""
        with self._cond:
            lines = self.lines[self._next :]
            self._next = len(self.lines)
            return lines

    @staticmethod
    def _match(line: str | None, name: str, seen: list[str]) -> dict[str, Any] | None:
        if line is None:
            raise AssertionError(f"process ended before {name!r}; output: {seen}")
        data = json.loads(line)
        return dict(data) if data.get("event") == name else None

    def event(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """Skip JSON lines until one with ``event == name``; return it."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.line(max(0.0, deadline - time.monotonic()))
            found = self._match(line, name, self.seen)
            if found is not None:
                return found

    async def aevent(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """:meth:`event` for ``async def`` tests."""
        deadline = time.monotonic() + timeout
        while True:
            line = await self.aline(max(0.0, deadline - time.monotonic()))
            found = self._match(line, name, self.seen)
            if found is not None:
                return found

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 10.0) -> str:
        """The first line received so far or within ``timeout`` for which ``predicate``
        holds (searching every line, handed out or not; none is consumed)."""
        deadline = time.monotonic() + timeout
        checked = 0
        with self._cond:
            while True:
                for line in self.lines[checked:]:
                    if predicate(line):
                        return line
                checked = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    raise AssertionError(
                        f"no matching line within {timeout}s; got {self.lines!r}"
                        + (" (stream ended)" if self._eof else "")
                    )
                self._cond.wait(remaining)

    def join(self, timeout: float = 5.0) -> list[str]:
        """Wait for the stream to end (the child closed it); return every line."""
        self._thread.join(timeout)
        with self._cond:
            return list(self.lines)

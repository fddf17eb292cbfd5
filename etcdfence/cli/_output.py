"""What the command line writes: records on stdout, status lines and logs on stderr.

Stdout stays machine-readable (one JSON object per line, a table with ``-w table``, or
the endpoints of ``etcd``); everything meant for a person goes to stderr, prefixed
``etcdfence:`` — or, with ``--log-format json``, as one JSON object per line, the
library's structlog events and the command's own status lines alike (the library never
configures logging; the command line does, here).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import structlog

#: ``--log-format`` choices; ``console`` is the default.
LOG_FORMATS = ("console", "json")
#: ``-w/--write-out`` choices (``simple`` only where it is the command's default).
WRITE_FORMATS = ("json", "table")

_log_format = ["console"]
_log_level = [logging.WARNING]


class _StderrWriter:
    """Lines for stderr, written by one daemon thread so that no caller ever waits on
    the pipe: stderr may stall (journald or a Docker log driver blocking, Ctrl-S in a
    terminal) exactly when the supervisor must stop its command. A caller only
    appends to a bounded queue; when it is full the line is dropped and counted, and a
    warning with the count is written once the pipe moves again. The thread writes
    with ``os.write`` on fd 2 (no buffer lock that a stuck write would hold at exit).
    One line is one write: lines from several threads never interleave mid-line."""

    CAPACITY = 1000

    def __init__(self) -> None:
        self.fd = 2  # the real stderr (a saved copy once fd 2 is captured, see below)
        self._lines: collections.deque[bytes] = collections.deque()
        self._ready = threading.Condition()
        self._dropped = 0
        self._busy = False
        self._thread: threading.Thread | None = None

    def put(self, line: str) -> None:
        """Queue ``line`` (never blocks)."""
        with self._ready:
            if len(self._lines) >= self.CAPACITY:
                self._dropped += 1
                return
            self._lines.append(line.encode("utf-8", "replace") + b"\n")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="etcdfence-stderr", daemon=True
                )
                self._thread.start()
            self._ready.notify_all()

    def _next(self) -> bytes:
        with self._ready:
            self._busy = False
            self._ready.notify_all()
            while not self._lines:
                self._ready.wait()
            self._busy = True
            dropped, self._dropped = self._dropped, 0
            line = self._lines.popleft()
        if dropped:
            note = f"etcdfence: warning: stderr was blocked; {dropped} log lines dropped\n"
            line = note.encode() + line
        return line

    def _run(self) -> None:
        while True:
            data = self._next()
            with contextlib.suppress(OSError):  # stderr closed: the line is lost
                while data:
                    data = data[os.write(self.fd, data) :]

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queued lines to be written."""
        end = time.monotonic() + timeout
        with self._ready:
            while self._lines or self._busy:
                left = end - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._ready.wait(left)
        return True


_writer = _StderrWriter()


def _write_line(line: str) -> None:
    if sys.stderr is not sys.__stderr__ and sys.stderr is not None:
        sys.stderr.write(line + "\n")  # stderr replaced in-process (tests, embedding)
        sys.stderr.flush()
        return
    _writer.put(line)


#: A stop budget's end (``time.monotonic()``) that bounds the final flush (see
#: :class:`etcdfence.cli._process.StopBudget`); ``None``: not stopping.
exit_by: list[float | None] = [None]
#: What the final flush gets even past the budget's end: the line saying it ran out.
LAST_LINES = 0.2


def flush_stderr(timeout: float = 2.0) -> bool:
    """Give the queued stderr lines up to ``timeout`` seconds to be written (at exit:
    a stalled stderr must not keep a stopping supervisor alive for long); less when a
    stop budget ends earlier (but :data:`LAST_LINES` at least)."""
    if exit_by[0] is not None:
        timeout = min(timeout, max(LAST_LINES, exit_by[0] - time.monotonic()))
    if _captured[0] is not None:
        _captured[0].drain(min(timeout, 0.5))
    return _writer.flush(timeout)


class _NativeStderr:
    """With ``--log-format json`` every line on stderr is one JSON object, also what
    does not come through our logger: gRPC core's own lines (``E1126 ...``, written to
    fd 2 in C) and a Python traceback printed by a library thread. fd 2 becomes a
    pipe read by a daemon thread that passes JSON lines through and wraps any other
    line as an event of logger ``stderr``; our writer keeps the real stderr, and so
    does the command after ``--`` (:func:`command_stderr`)."""

    def __init__(self) -> None:
        self.real = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._read = read
        self._idle = threading.Event()
        _writer.fd = self.real
        threading.Thread(target=self._run, name="etcdfence-native-stderr", daemon=True).start()

    def _run(self) -> None:
        pending = b""
        while True:
            self._idle.set()
            try:
                data = os.read(self._read, 65536)
            except OSError:
                return
            self._idle.clear()
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for raw in lines:
                self._forward(raw.decode("utf-8", "replace").rstrip("\r"))

    @staticmethod
    def _forward(text: str) -> None:
        if not text.strip():
            return
        if text.startswith("{") and text.endswith("}"):
            with contextlib.suppress(ValueError):
                json.loads(text)
                _writer.put(text)
                return
        level = {"E": "error", "W": "warning", "D": "debug"}.get(text[:1], "info")
        if not text[1:5].isdigit():  # not gRPC core's 'E1126 07:31:51...' form
            level = "error" if "Error" in text or "Traceback" in text else "warning"
        _writer.put(_json_line(level, text, {"logger": "stderr"}))

    def drain(self, timeout: float) -> None:
        """Give lines already in the pipe a moment to be forwarded."""
        self._idle.wait(timeout)


_captured: list[_NativeStderr | None] = [None]


def command_stderr() -> int | None:
    """The fd the command after ``--`` gets as stderr: the real one when fd 2 is
    captured (its lines are its own), else ``None`` (inherit)."""
    captured = _captured[0]
    return None if captured is None else captured.real


class _StderrLogger:
    """structlog's logger for the CLI: every rendered event is one :func:`_write_line`."""

    def msg(self, message: str) -> None:
        _write_line(message)

    debug = info = warning = warn = error = err = critical = exception = fatal = msg


def _json_line(level: str, event: str, fields: dict[str, Any]) -> str:
    record = {"timestamp": _now(), "level": level, "logger": "etcdfence.cli", "event": event}
    record.update(fields)
    return json.dumps(record, default=str)


def _now() -> str:
    """UTC time, ISO 8601 with milliseconds (what log shippers parse)."""
    stamp = datetime.datetime.now(datetime.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _stderr(level: str, message: str, fields: dict[str, Any]) -> None:
    if _log_format[0] == "json":
        line = _json_line(level, message, fields)
    else:
        prefix = "" if level == "info" else f"{level}: "
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        line = f"etcdfence: {prefix}{message}{extra}"
    _write_line(line)


def format_from_argv(argv: Sequence[str]) -> None:
    """Take ``--log-format json`` from the raw command line before it is parsed, so
    that even a usage error (printed while parsing) is one JSON object."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return
        option, eq, value = arg.partition("=")
        if len(option) < len("--log-") or not "--log-format".startswith(option):
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value in LOG_FORMATS:
            _log_format[0] = value


def usage_error_line(message: str) -> str:
    """A usage error as the line ``--log-format`` asks for (text, or one JSON object)."""
    if _log_format[0] == "json":
        return _json_line("error", message, {"exit_code": 2}) + "\n"
    return f"etcdfence: error: {message}\n"


def say(message: str) -> None:
    """A status line on stderr (stdout stays machine-readable)."""
    _stderr("info", message, {})


def debug(message: str) -> None:
    """A line shown with ``-vv`` only (the library's debug level)."""
    if _log_level[0] <= logging.DEBUG:
        _stderr("debug", message, {})


def error(message: str) -> None:
    """An error line on stderr, the one line a failing command prints."""
    _stderr("error", message, {})


def warn(message: str, **fields: Any) -> None:
    """A warning on stderr, shown at every verbosity (a crashed command, say); its
    ``fields`` become keys with ``--log-format json``."""
    _stderr("warning", message, fields)


def emit(record: dict[str, Any]) -> None:
    """One JSON object as one line on stdout."""
    print(json.dumps(record), flush=True)


def signame(signum: int) -> str:
    """``SIGTERM`` for 15, as status lines name signals."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def configure_logging(verbosity: int, log_format: str = "console") -> None:
    """Route the library's structlog events to stderr (the library never does this):
    warnings (a lost lease and its reason) from ``verbosity`` 0, info from 1, debug
    from 2; below 0 errors only."""
    _log_format[0] = log_format
    if log_format == "json" and _captured[0] is None and sys.stderr is sys.__stderr__:
        with contextlib.suppress(OSError):
            _captured[0] = _NativeStderr()
    levels = {0: logging.WARNING, 1: logging.INFO}
    level = logging.ERROR if verbosity < 0 else levels.get(verbosity, logging.DEBUG)
    _log_level[0] = level

    def render(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        message = str(event.pop("event", ""))
        exc = event.pop("exception", None)
        fields = " ".join(f"{k}={v}" for k, v in event.items())
        text = f"etcdfence: {method}: {message} {fields}".rstrip()
        return f"{text}\n{exc}" if exc else text

    def as_json(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        message = str(event.pop("event", ""))
        fields = dict(event)
        fields["logger"] = "etcdfence"  # the library's events; the command's are etcdfence.cli
        return _json_line(method, message, fields)

    structlog.configure(
        processors=[
            structlog.processors.format_exc_info,
            as_json if log_format == "json" else render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *args: _StderrLogger(),
        cache_logger_on_first_use=False,
    )


# -- records on stdout -----------------------------------------------------------------------


def add_write_out(parser: argparse.ArgumentParser, default: str, choices: Sequence[str]) -> None:
    """``-w/--write-out FORMAT`` (as etcdctl's) for a command that prints records."""
    parser.add_argument(
        "-w",
        "--write-out",
        dest="write_out",
        choices=list(choices),
        default=default,
        help=f"output format: {', '.join(choices)} (default: {default})",
    )


def cell(value: Any) -> str:
    """A value as a table shows it (``-`` for none)."""
    if value is None:
        return "-"
    return str(value)


def table(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> str:
    """An etcdctl-style ASCII table (``+---+`` borders)."""
    body = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in header]
    for row in body:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + "|"

    return "\n".join([rule, line(header), rule, *(line(r) for r in body), rule])


def print_held(write_out: str, token: Any, **fields: Any) -> None:
    """What ``lock``/``run`` without a command print once they hold: etcdctl's
    'KEY TOKEN' line (``simple``), or ``fields`` plus key and token as a record."""
    if write_out == "simple":
        print(f"{token.key} {token.value}", flush=True)
        return
    record = {**fields, "key": token.key, "token": token.value}
    show([record], write_out, list(record))


def show(records: Sequence[dict[str, Any]], write_out: str, columns: Sequence[str]) -> None:
    """Print records: one JSON object per line, or one table with ``columns`` (the
    records' keys, upper-cased as headers)."""
    if write_out == "table":
        header = [c.replace("_", " ").upper() for c in columns]
        print(table(([r.get(c) for c in columns] for r in records), header), flush=True)
        return
    for record in records:
        emit(record)

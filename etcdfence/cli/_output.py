"""What the command line writes: records on stdout, status lines and logs on stderr.

Stdout stays machine-readable (one JSON object per line, a table with ``-w table``, or
the endpoints of ``etcd``); everything meant for a person goes to stderr, prefixed
``etcdfence:`` — or, with ``--log-format json``, as one JSON object per line, the
library's structlog events and the command's own status lines alike (the library never
configures logging; the command line does, here).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import structlog

#: ``--log-format`` choices; ``console`` is the default.
LOG_FORMATS = ("console", "json")
#: ``-w/--write-out`` choices (``simple`` only where it is the command's default).
WRITE_FORMATS = ("json", "table")

_log_format = ["console"]
#: One line, one write, under one lock: the command's lines and the library's events
#: come from several threads and must not interleave mid-line.
_write_lock = threading.Lock()


def _write_line(line: str) -> None:
    with _write_lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


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


def say(message: str) -> None:
    """A status line on stderr (stdout stays machine-readable)."""
    _stderr("info", message, {})


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
    levels = {0: logging.WARNING, 1: logging.INFO}
    level = logging.ERROR if verbosity < 0 else levels.get(verbosity, logging.DEBUG)

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

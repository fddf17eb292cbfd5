"""What the command line writes: JSON records on stdout, status lines on stderr.

Stdout stays machine-readable (one JSON object per line, or the endpoints of ``etcd``);
everything meant for a person goes to stderr, prefixed ``etcdfence:``. The library's own
structlog events are routed to stderr here too (the library never configures logging).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog


def say(message: str) -> None:
    """A status line on stderr (stdout stays machine-readable)."""
    print(f"etcdfence: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    """An error line on stderr, the one line a failing command prints."""
    print(f"etcdfence: error: {message}", file=sys.stderr, flush=True)


def emit(record: dict[str, Any]) -> None:
    """One JSON object as one line on stdout."""
    print(json.dumps(record), flush=True)


def signame(signum: int) -> str:
    """``SIGTERM`` for 15, as status lines name signals."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def configure_logging(verbosity: int) -> None:
    """Route the library's structlog events to stderr (the library never does this)."""
    level = logging.ERROR if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG

    def render(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        message = str(event.pop("event", ""))
        exc = event.pop("exception", None)
        fields = " ".join(f"{k}={v}" for k, v in event.items())
        text = f"etcdfence: {method}: {message} {fields}".rstrip()
        return f"{text}\n{exc}" if exc else text

    structlog.configure(
        processors=[structlog.processors.format_exc_info, render],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )

"""The library's one logger: silent by default, structured when the app wants it.

A library must not decide where its logs go. Every etcdfence event (``etcdfence.lease_lost``,
``etcdfence.fence_rejected``, ...) is emitted here and goes

* to **structlog**, with its fields, when the application configured structlog
  (``structlog.configure(...)``, e.g. with the stdlib integration); otherwise
* to the standard :mod:`logging` logger ``etcdfence``, message ``"<event> k=v ..."``
  and the fields in ``record.etcdfence_fields`` (and as ``extra`` attributes, so
  ``structlog.stdlib.ExtraAdder`` picks them up). An application that configured
  nothing sees warnings and errors on stderr only (``logging.lastResort``) — never a
  line on stdout, never a debug line.

structlog's unconfigured default prints every level to stdout, which would mix our
events into an application's JSON output and pipes; that is why we do not call
``structlog.get_logger`` blindly.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["EventLogger", "log"]

_LOGGER = logging.getLogger("etcdfence")
#: ``LogRecord`` attributes an ``extra`` field must not overwrite.
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class EventLogger:
    """``log.warning("etcdfence.event", key=value, ...)``: see the module docstring."""

    def __init__(self, logger: logging.Logger = _LOGGER) -> None:
        self._logger = logger

    def _emit(self, level: int, event: str, fields: dict[str, Any], exc_info: bool) -> None:
        if structlog.is_configured():
            method = logging.getLevelName(level).lower()
            bound = structlog.get_logger(self._logger.name)
            if exc_info:
                fields["exc_info"] = True
            getattr(bound, method)(event, **fields)
            return
        if not self._logger.isEnabledFor(level):
            return
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        extra = {k: v for k, v in fields.items() if k not in _RESERVED}
        extra["etcdfence_fields"] = dict(fields)
        self._logger.log(
            level,
            "%s %s" if text else "%s",
            event,
            *((text,) if text else ()),
            exc_info=exc_info,
            extra=extra,
            stacklevel=3,
        )

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields, False)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields, False)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields, False)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields, False)

    def exception(self, event: str, **fields: Any) -> None:
        """Log at ERROR with the exception being handled."""
        self._emit(logging.ERROR, event, fields, True)


#: The logger every etcdfence module uses.
log = EventLogger()

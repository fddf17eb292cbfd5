"""Stop and HUP signals that arrive while the CLI is still starting up.

``python -m etcdfence`` (and the ``etcdfence`` script) call :func:`install` before
anything else is imported: from then on SIGTERM, SIGINT and SIGHUP are only recorded,
instead of killing the process with the default action during the second or so of
imports and argument parsing. ``run`` and ``lock`` hand the recorded signals to their
own handlers once installed (:func:`replay`), so a stop signal at start-up is a
requested shutdown like any later one and SIGHUP never stops ``run``; every other
command gets the default actions back (:func:`release`). Stdlib only, no I/O.
"""

from __future__ import annotations

import os
import signal
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_pending: list[int] = []
_installed = [False]


def _record(signum: int, frame: Any) -> None:
    _pending.append(signum)


def install() -> None:
    """Record SIGTERM, SIGINT and SIGHUP from now on (main thread only)."""
    for signum in _SIGNALS:
        signal.signal(signum, _record)
    _installed[0] = True


def replay() -> None:
    """Deliver the recorded signals again, oldest first, to whatever handlers are
    installed now (call it where such a signal is expected to be handled)."""
    while _pending:
        os.kill(os.getpid(), _pending.pop(0))


def release() -> None:
    """Give the signals their default actions back (a no-op unless :func:`install`
    ran and the recorder is still the handler), then deliver the recorded ones."""
    if not _installed[0]:
        return
    _installed[0] = False
    for signum in _SIGNALS:
        if signal.getsignal(signum) is _record:
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, default)
    replay()

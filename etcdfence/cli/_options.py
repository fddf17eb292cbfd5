"""What every command shares on its command line: the parser class, the connection
options with their environment fallbacks, and the argument types.

A command module builds its parser with :func:`add_command` (which adds the connection
options, the examples and the exit codes to its help) and its arguments with the types
here, so bad input is refused by argparse with exit code 2 before any request is made.
:func:`make_client` turns the connection options into a :class:`~etcdfence.Client`.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import sys
from typing import Any, NoReturn

from .._keys import validate_name
from .._sync.client import Client
from ..errors import EtcdfenceError, InvalidArgumentError
from ..token import parse_token
from ._exits import EXIT_CODES_HELP, EXIT_USAGE, CommandError
from ._output import usage_error_line

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
DEFAULT_TIMEOUT = 5.0
#: etcd refuses leases longer than this (``MaxLeaseTTL`` in etcd's lessor).
MAX_TTL = 9_000_000_000
#: The longest wait any option accepts (about 31 years); beyond it timers overflow.
MAX_SECONDS = 1e9

ENV_HELP = """\
environment (defaults for the connection options; the etcdctl name is the fallback):
  --endpoints  ETCDFENCE_ENDPOINTS, ETCDCTL_ENDPOINTS
  --cacert     ETCDFENCE_CACERT, ETCDCTL_CACERT
  --cert       ETCDFENCE_CERT, ETCDCTL_CERT
  --key        ETCDFENCE_KEY_FILE, ETCDCTL_KEY
  --user       ETCDFENCE_USER, ETCDCTL_USER
  --password   ETCDFENCE_PASSWORD, ETCDCTL_PASSWORD
  --timeout        ETCDFENCE_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT
  --dial-timeout   ETCDFENCE_DIAL_TIMEOUT, ETCDCTL_DIAL_TIMEOUT
  (durations as etcdctl writes them — 2s, 500ms, 1m30s — or plain seconds)"""

#: The connection options that take a value (to find the command name in an argv).
VALUE_OPTIONS = frozenset(
    {
        "--endpoints",
        "--timeout",
        "--dial-timeout",
        "--cacert",
        "--cert",
        "--key",
        "--user",
        "--password",
        "--log-format",
    }
)

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

#: The timeouts' environment defaults (etcdctl's duration syntax, or plain seconds).
_TIMEOUT_ENV = {
    "timeout": ("ETCDFENCE_TIMEOUT", "ETCDCTL_COMMAND_TIMEOUT"),
    "dial_timeout": ("ETCDFENCE_DIAL_TIMEOUT", "ETCDCTL_DIAL_TIMEOUT"),
}


# -- parsers -------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``etcdfence: error: ...``, one JSON object with
    ``--log-format json``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, usage_error_line(f"{message} (see '{self.prog} --help')"))


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks; 100 columns wide."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=100)


def add_command(
    subparsers: Any, name: str, help_text: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """A (sub)command's parser: its help, examples, the exit codes and the connection
    options. ``subparsers`` is what ``add_subparsers()`` returned."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help_text,
        description=description,
        formatter_class=Formatter,
        epilog=f"examples:\n{examples}\n\n{EXIT_CODES_HELP}",
    )
    add_connection_options(parser, top=False)
    return parser


def add_connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
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
        metavar="DURATION",
        type=duration,
        default=default,
        help="timeout of each etcd request, e.g. 5, 5s, 500ms "
        f"(default: $ETCDCTL_COMMAND_TIMEOUT, else {DEFAULT_TIMEOUT:g}s)",
    )
    group.add_argument(
        "--dial-timeout",
        metavar="DURATION",
        type=duration,
        default=default,
        help="etcd must answer a first request within this, e.g. 2s "
        "(default: $ETCDCTL_DIAL_TIMEOUT, else no separate check)",
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
        help="log more on stderr: lock, run and observe show the library's warnings "
        "(a lost lease and its reason) always, -v adds info, -vv debug; "
        "one-request commands show warnings and info with -v",
    )
    group.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console" if top else argparse.SUPPRESS,
        help="stderr as text lines (console, the default) or one JSON object per line",
    )


def check_text_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse connection options that are not UTF-8 text (argv bytes that are not UTF-8
    arrive as lone surrogates and could not be sent)."""
    for option in ("user", "password", "endpoints", "cacert", "cert_file", "key_file"):
        value = getattr(args, option, None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                parser.error(f"--{option.replace('_file', '')}: not valid UTF-8 text: {value!r}")


def check_env_timeouts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill ``--timeout``/``--dial-timeout`` from the environment when not given; a value
    there that is not a duration is a usage error naming the variable (exit 2)."""
    for dest, names in _TIMEOUT_ENV.items():
        if getattr(args, dest, None) is not None:
            continue
        setattr(args, dest, None)
        for env_name in names:
            raw = os.environ.get(env_name)
            if not raw:
                continue
            try:
                setattr(args, dest, duration(raw))
            except argparse.ArgumentTypeError as exc:
                parser.error(f"${env_name}: {exc}")
            break


# -- argument types ------------------------------------------------------------------------

#: Go's ``time.ParseDuration`` units (what etcdctl's --dial-timeout and
#: --command-timeout accept), in seconds.
_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def duration(arg: str) -> float:
    """Seconds: a plain number (``5``, ``0.5``) or a Go duration as etcdctl takes it
    (``2s``, ``500ms``, ``1m30s``, ``1.5h``); more than 0, at most :data:`MAX_SECONDS`."""
    text = arg.strip()
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        if re.fullmatch(r"[+-]?[\d.eE+-]+|inf|nan", text.lower()):
            raise
    parts = _DURATION_PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(
            f"not a duration: {arg!r} (use seconds or a duration such as 2s, 500ms, 1m30s)"
        )
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not 0 < seconds <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_SECONDS:g} seconds, got {arg!r}"
        )
    return seconds


def positive_float(arg: str) -> float:
    """Seconds, more than 0 and at most :data:`MAX_SECONDS`."""
    try:
        value = float(arg)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {arg!r}") from None
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds up to {MAX_SECONDS:g}, got {arg!r}"
        )
    return value


def nonnegative_float(arg: str) -> float:
    """Seconds, from 0 to :data:`MAX_SECONDS`."""
    try:
        value = float(arg)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {arg!r}") from None
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {MAX_SECONDS:g}, got {arg!r}"
        )
    return value


def ttl(arg: str) -> int:
    """A lease TTL: whole seconds within etcd's limit."""
    try:
        value = int(arg)
    except ValueError:
        raise argparse.ArgumentTypeError(f"TTL must be whole seconds, got {arg!r}") from None
    if not 1 <= value <= MAX_TTL:
        raise argparse.ArgumentTypeError(
            f"TTL must be from 1 to {MAX_TTL} seconds (etcd's limit), got {arg!r}"
        )
    return value


def name(arg: str) -> str:
    """A lock/election name or resource: non-empty UTF-8 text, no trailing '/'."""
    try:
        return validate_name(arg)
    except EtcdfenceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def utf8(arg: str) -> str:
    """An identity, key or value: must be UTF-8 text (argv bytes that are not UTF-8
    arrive as lone surrogates and could not be sent to etcd)."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {arg!r}") from None
    return arg


def key(arg: str) -> str:
    """An etcd key: non-empty UTF-8 text."""
    if not arg:
        raise argparse.ArgumentTypeError("the key must not be empty")
    return utf8(arg)


def identity(arg: str) -> str:
    """A candidate's ``--id``: non-blank UTF-8 text without NUL."""
    if not arg.strip():
        raise argparse.ArgumentTypeError("--id must not be empty")
    if "\x00" in arg:
        raise argparse.ArgumentTypeError(f"--id must not contain NUL: {arg!r}")
    return utf8(arg)


def members(arg: str) -> int:
    """A cluster size, 1 to 9."""
    try:
        value = int(arg)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {arg!r}") from None
    if not 1 <= value <= 9:
        raise argparse.ArgumentTypeError(f"must be between 1 and 9, got {arg!r}")
    return value


def token(arg: str) -> int:
    """A fencing token: a positive int in etcd's revision range."""
    try:
        return parse_token(arg)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- connection ----------------------------------------------------------------------------


def _env(*names: str) -> str | None:
    for env_name in names:
        value = os.environ.get(env_name)
        if value:
            return value
    return None


def _option(args: argparse.Namespace, dest: str) -> Any:
    value = getattr(args, dest, None)
    if value is None:
        value = _env(*_OPTION_ENV[dest])
    return value


def _credentials(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(username, password) from ``--user NAME[:PASSWORD]``, ``--password``, the
    environment or a prompt on a terminal; (None, None) without a user."""
    user = _option(args, "user")
    if not user:
        return None, None
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
    return username, password


def make_client(args: argparse.Namespace) -> Client:
    """A :class:`Client` from the connection options, their env defaults and etcdctl's.

    With a dial timeout (``--dial-timeout``, ``$ETCDCTL_DIAL_TIMEOUT``) etcd must answer
    one read within it before the command goes on (etcdctl's dial), else exit 3."""
    endpoints = _option(args, "endpoints") or DEFAULT_ENDPOINT
    timeout = getattr(args, "timeout", None) or DEFAULT_TIMEOUT
    username, password = _credentials(args)
    client = _client(args, endpoints, timeout, username, password)
    dial_timeout = getattr(args, "dial_timeout", None)
    if dial_timeout is not None:
        try:
            client.revision(timeout=dial_timeout)
        except BaseException:
            client.close()
            raise
    return client


def _client(
    args: argparse.Namespace,
    endpoints: str,
    timeout: float,
    username: str | None,
    password: str | None,
) -> Client:
    return Client(
        endpoints,
        timeout=timeout,
        username=username,
        password=password,
        ca_file=_option(args, "cacert"),
        cert_file=_option(args, "cert_file"),
        key_file=_option(args, "key_file"),
    )

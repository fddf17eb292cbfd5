"""Exit codes of the ``etcdfence`` command line, and the errors that carry them.

Every command returns one of the ``EXIT_*`` codes (re-exported by :mod:`etcdfence.cli`);
scripts test them, so they never change meaning. :func:`exit_code_for` maps a library
error to its code; :class:`CommandError` is how a command fails with a message of its own.
"""

from __future__ import annotations

import time

from ..errors import (
    AcquireTimeoutError,
    AuthError,
    InvalidArgumentError,
    InvalidTypeError,
    NotOwnerError,
    RepairRefusedError,
    SessionExpiredError,
    StaleTokenError,
    UnavailableError,
)

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
#: The lock or leadership was lost (``SessionExpiredError``/``NotOwnerError``).
EXIT_LOST = 6
#: ``fence repair`` left the mark as it was: not provably forged, or it moved meanwhile.
EXIT_NOT_FORGED = 7
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
  {EXIT_NOT_FORGED:<4} fence repair: the mark is not above etcd's revision (or moved); unchanged
  {EXIT_TIMEOUT:<4} timed out waiting (lock --timeout-acquire)
  {EXIT_CANNOT_EXECUTE}/{EXIT_NOT_FOUND} the command after -- is not executable / not found
  128+N killed by signal N while waiting to acquire (130 = Ctrl-C)
  lock -- CMD and run -- CMD exit with CMD's own status (128+N if a signal ended it)."""


def exit_code_for(error: BaseException) -> int:
    """The documented exit code for an exception raised by etcdfence."""
    if isinstance(error, StaleTokenError):
        return EXIT_STALE
    if isinstance(error, AuthError):  # includes TLSError: retrying will not help
        return EXIT_AUTH
    if isinstance(error, UnavailableError):
        return EXIT_UNAVAILABLE
    if isinstance(error, (SessionExpiredError, NotOwnerError)):
        return EXIT_LOST
    if isinstance(error, RepairRefusedError):
        return EXIT_NOT_FORGED
    if isinstance(error, AcquireTimeoutError):
        return EXIT_TIMEOUT
    if isinstance(error, (InvalidArgumentError, InvalidTypeError)):
        return EXIT_USAGE
    return EXIT_ERROR


class CommandError(Exception):
    """A failure with a message for the user and a specific exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP arrived while blocked in a library call."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        #: When it arrived (``time.monotonic()``): a stop budget counts from then.
        self.at = time.monotonic()

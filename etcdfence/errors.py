"""The exceptions etcdfence raises. All share one root, :class:`EtcdfenceError`::

    EtcdfenceError
    ├── EtcdUnavailableError            no endpoint answered in time
    │   ├── OutcomeUnknownError         a guarded write got no answer (see fence_off)
    │   └── TLSError (+ AuthError)      the handshake failed, naming the cause
    ├── EtcdRequestError                etcd refused the request
    │   └── LeaseNotFoundError
    ├── AuthError                       credentials or permissions
    │   └── AuthTokenExpiredError       refreshed and retried by the client itself
    ├── CompactedError                  a watch needs history etcd discarded
    ├── SessionExpiredError             the lease is gone: locks and terms with it
    ├── AcquireTimeoutError (+ TimeoutError)
    ├── AlreadyHeldError (+ RuntimeError)
    ├── NotOwnerError
    │   └── NotLeaderError
    ├── StaleTokenError                 the resource accepted a higher token
    ├── TransactionInProgressError, TransactionAbortedError    (SQLFence)
    ├── UnsupportedError, ConsistencyError
    └── InvalidArgumentError (+ ValueError), InvalidTypeError (+ TypeError)
        └── InvalidTokenError

The names of 0.1 (``EtcdUnavailable``, ``SessionExpired``, ``AcquireTimeout``, ...)
remain as aliases of the same classes.

Catch :class:`EtcdfenceError` to handle anything this library raises; catch a
subclass to react to one situation (a stale token, a lost session, ...). gRPC
errors are translated at one boundary (``etcdfence._wire.errors``) and never
leak raw.
"""

from __future__ import annotations

from typing import Any


class EtcdfenceError(Exception):
    """Root of every error etcdfence raises."""


class EtcdUnavailableError(EtcdfenceError):
    """No etcd endpoint answered within the timeout (network down, cluster without quorum).

    The operation may or may not have taken effect if it was a write; etcdfence
    resolves such writes by re-reading where it can and never blindly resends.
    """


class OutcomeUnknownError(EtcdUnavailableError):
    """A guarded write got no answer: it may have been applied, or may still apply later.

    Raised by the guards instead of a plain :class:`EtcdUnavailableError` (so existing
    handlers still catch it). The guard has already moved this writer to a new
    *epoch*, so the lost attempt can never apply after any later write of this
    writer. ``fenced_off`` tells whether the guard also managed to raise the
    resource's mark past the attempt's epoch already: if True, the attempt can no
    longer apply at all and a re-read now is final; if False, call the guard's
    ``fence_off(token)`` (which returns only once that is true), then re-read and
    decide. Never simply resend the write.
    """

    def __init__(
        self, message: str, *, resource: str, token: int, epoch: int, fenced_off: bool
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.token = token
        self.epoch = epoch
        self.fenced_off = fenced_off

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_outcome_unknown,
            (str(self), self.resource, self.token, self.epoch, self.fenced_off),
        )


def _rebuild_outcome_unknown(
    message: str, resource: str, token: int, epoch: int, fenced_off: bool
) -> OutcomeUnknownError:
    return OutcomeUnknownError(
        message, resource=resource, token=token, epoch=epoch, fenced_off=fenced_off
    )


class EtcdRequestError(EtcdfenceError):
    """etcd rejected a request (too large, invalid, too many operations in a txn, ...)."""


class LeaseNotFoundError(EtcdRequestError):
    """The lease does not exist (expired or revoked)."""


class AuthError(EtcdfenceError):
    """Authentication failed or the user lacks permission (wrong password, RBAC denial,
    certificate refused)."""


class AuthTokenExpiredError(AuthError):
    """etcd no longer accepts the client's auth token (expired, or the auth store
    changed). The client gets a fresh one and repeats the request by itself; you see
    this only if that keeps failing."""


class TLSError(EtcdUnavailableError, AuthError):
    """The TLS handshake failed: wrong CA, expired or mismatched certificate, or a
    plaintext client talking to a TLS server (or the other way round)."""


class CompactedError(EtcdfenceError):
    """A watch asked for history that etcd has already compacted away.

    ``compact_revision`` is the oldest revision still available.
    """

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class SessionExpiredError(EtcdfenceError):
    """The session's lease is gone (or its local deadline passed): every lock and
    leadership held through it is lost, and tokens from it must not be used."""


class AcquireTimeoutError(EtcdfenceError, TimeoutError):
    """``acquire`` / ``campaign`` did not win within its timeout. Nothing is left
    queued behind: the contender's key has been deleted."""


class AlreadyHeldError(EtcdfenceError, RuntimeError):
    """``acquire``/``campaign`` on a lock or election object that is already held, or
    being acquired, through the same session.

    A session is *one* contender per name: its key is derived from the lease, so two
    acquires of the same name through one session would silently share one holding.
    Give each concurrent contender (thread, task) its own session.
    """


class NotOwnerError(EtcdfenceError):
    """The caller does not hold the lock (or leadership) it tried to use."""


class NotLeaderError(NotOwnerError):
    """``proclaim`` / ``resign`` on an election this contender does not lead."""


class StaleTokenError(EtcdfenceError):
    """A write carried a fencing token lower than the resource's high-water mark.

    Nothing was written. ``current`` is the mark the resource holds, ``token`` the
    value offered, ``resource`` the name of the guarded resource.
    """

    def __init__(self, resource: str, token: int, current: int) -> None:
        super().__init__(
            f"stale fencing token for {resource!r}: offered {token}, "
            f"resource already accepted {current}"
        )
        self.resource = resource
        self.token = token
        self.current = current

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.resource, self.token, self.current))


class TransactionInProgressError(EtcdfenceError, RuntimeError):
    """The connection has uncommitted work, so :class:`~etcdfence.sql.SQLFence` cannot
    start its own transaction on it. Commit or roll back first; never call ``guarded``
    from inside another ``guarded`` block on the same connection."""


class TransactionAbortedError(EtcdfenceError, RuntimeError):
    """A :meth:`~etcdfence.sql.SQLFence.guarded` block could not commit, so nothing of
    it was committed (a statement inside it failed, even if the block caught the error,
    or the database answered the COMMIT by rolling back). The mark did not move; the
    error that failed the block is the ``__cause__``. Retry the whole block."""


class UnsupportedError(EtcdfenceError, RuntimeError):
    """Something etcdfence needs is missing here (e.g. an SQLite without upsert)."""


class ConsistencyError(EtcdfenceError, RuntimeError):
    """A resource answered in a way its own rules rule out (say, a mark below the one
    just written). Nothing was committed; it points at a bug or a tampered resource."""


class InvalidArgumentError(EtcdfenceError, ValueError):
    """A bad argument value: empty or malformed name, TTL < 1, bad endpoint, ..."""


class InvalidTypeError(EtcdfenceError, TypeError):
    """An argument of the wrong type: a key that is not str/bytes, a float token, ..."""


class InvalidTokenError(InvalidArgumentError):
    """A fencing token that is not a positive int."""


# -- the 0.1 names: still importable, the same classes ---------------------------------

EtcdUnavailable = EtcdUnavailableError
OutcomeUnknown = OutcomeUnknownError
LeaseNotFound = LeaseNotFoundError
AuthTokenExpired = AuthTokenExpiredError
SessionExpired = SessionExpiredError
AcquireTimeout = AcquireTimeoutError
AlreadyHeld = AlreadyHeldError
NotLeader = NotLeaderError
InvalidArgument = InvalidArgumentError
InvalidType = InvalidTypeError
InvalidToken = InvalidTokenError
TransactionInProgress = TransactionInProgressError
TransactionAborted = TransactionAbortedError

"""The exceptions etcdfence raises. All share one root, :class:`EtcdfenceError`::

    EtcdfenceError
    ├── UnavailableError                the store did not answer (etcd, Redis, a database)
    │   ├── OutcomeUnknownError         a fenced write got no answer (see fence_off)
    │   └── TLSError (+ AuthError)      the handshake failed, naming the cause
    ├── RequestError                    the store refused the request
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
            ├── ForeignTokenError       a token of another lock/cluster on a bound resource
            └── FutureTokenError        a token above etcd's current revision

Catch :class:`EtcdfenceError` to handle anything this library raises; catch a
subclass to react to one situation (a stale token, a lost session, ...). gRPC
errors are translated at one boundary (``etcdfence._wire.errors``) and never
leak raw; each backend translates its driver's errors the same way.

**Categories, not stores.** :class:`UnavailableError`, :class:`RequestError` and
:class:`OutcomeUnknownError` say *what happened*, whichever store it happened at: the
fences over Redis and SQL raise them as the etcd client does, so one ``except
UnavailableError`` covers every backend. A backend may add its own subclass (Redis's
``RedisUnavailableError``) for callers that want to tell stores apart.

**The older names** are still importable from here (and as ``etcdfence.<name>``), the
same classes, but no longer listed in ``__all__``:

* ``EtcdUnavailableError`` and ``EtcdRequestError`` (0.2) are *aliases* of
  :class:`UnavailableError` and :class:`RequestError`, not etcd-only subclasses. Code
  written against 0.2 caught with them everything a guard could raise, including an
  :class:`OutcomeUnknownError` (a subclass of ``EtcdUnavailableError`` then) and Redis's
  errors (subclasses of the two then). Subclasses raised only by etcd would make such an
  ``except`` miss a Redis or SQL fence's ``OutcomeUnknownError`` (or, to keep catching
  it, need a second, etcd-only ``OutcomeUnknownError`` beside the category): aliases keep
  every old handler catching exactly what it caught, at no cost. The name's "Etcd" is
  history; new code writes the category.
* The 0.1 names (``EtcdUnavailable``, ``SessionExpired``, ``AcquireTimeout``, ...) are
  aliases too, listed at the end of this module.
"""

from __future__ import annotations

from typing import Any


class EtcdfenceError(Exception):
    """Root of every error etcdfence raises."""


class UnavailableError(EtcdfenceError):
    """The store could not be reached or did not answer in time: no etcd endpoint (network
    down, a cluster without quorum), a Redis or database server refusing connections or
    timing out.

    Catch it to retry later or fail over. Nothing was applied, unless the error is its
    subclass :class:`OutcomeUnknownError`: a write whose answer was lost is always
    reported as that, never as a plain ``UnavailableError`` (etcdfence resolves such
    writes by re-reading where it can and never blindly resends). Raised by every
    backend; ``EtcdUnavailableError`` is the 0.2 name of this class.
    """


class OutcomeUnknownError(UnavailableError):
    """A fenced write got no answer: it may have been applied, or may still apply later.

    Raised by the fences (etcd's guards, Redis, SQL) instead of a plain
    :class:`UnavailableError` (so handlers of that still catch it). The fence has
    already moved this writer to a new *epoch*, so the lost attempt can never apply
    after any later write of this writer. ``fenced_off`` tells whether the fence also
    managed to raise the resource's mark past the attempt's epoch already: if True,
    the attempt can no longer apply at all and a re-read now is final; if False, call
    the fence's ``fence_off(token)`` (which returns only once that is true), then
    re-read and decide. Never simply resend the write.
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


class RequestError(EtcdfenceError):
    """The store answered and refused the request: nothing of it was applied (etcd: too
    large, too many operations in a txn, ...; Redis: out of memory, a read-only replica).

    Retrying the same request will not help; catch it to report or to change the
    request. Raised by every backend; ``EtcdRequestError`` is the 0.2 name.
    """


class LeaseNotFoundError(RequestError):
    """The lease does not exist (expired or revoked)."""


class AuthError(EtcdfenceError):
    """Authentication failed or the user lacks permission (wrong password, RBAC denial,
    certificate refused)."""


class AuthTokenExpiredError(AuthError):
    """etcd no longer accepts the client's auth token (expired, or the auth store
    changed). The client gets a fresh one and repeats the request by itself; you see
    this only if that keeps failing."""


class TLSError(UnavailableError, AuthError):
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


class KeyExistsError(EtcdfenceError):
    """A fenced transaction's :class:`~etcdfence.fence.ops.Create` found its key already
    there: the transaction wrote nothing, and the mark did not move either (no epoch was
    claimed, the resource's version stayed) — on every backend. The token was not
    stale: a stale token raises :class:`StaleTokenError` first, whether the key exists
    or not. For effects that must apply once per id (a schedule slot, a request id):
    the id's key is the ``Create``, and a second delivery gets this error.

    ``resource`` is the fence's resource, ``key`` the key that exists (as the ``Create``
    gave it), ``value`` what it holds (read in the same round trip), in the type of the
    ``Create``'s value: ``str`` when that was a ``str`` (``bytes`` if what the key holds
    is not UTF-8), else ``bytes``; ``None`` when the backend could not read it as bytes,
    e.g. a Redis key of another type.

    **Your own earlier attempt.** A fence resends a write only after a definite refusal
    (nothing applied), never after a lost answer (that raises
    :class:`OutcomeUnknownError`), so this error is never about an attempt of the same
    call. After an ``OutcomeUnknownError`` nobody can tell from the key alone whether
    your attempt or another delivery's created it: fence off (unless ``fenced_off``),
    then send the same transaction again — if it raises this error, compare ``value``
    with your Create's value. Give each delivery a value of its own (a delivery id,
    not the slot id or the token, which a redelivery shares): equal means your earlier
    attempt applied, and with it every op of its transaction."""

    def __init__(self, resource: str, key: str | bytes, value: str | bytes | None = None) -> None:
        super().__init__(f"{key!r} already exists in {resource!r}: nothing was written")
        self.resource = resource
        self.key = key
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.resource, self.key, self.value))


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


class RepairRefusedError(EtcdfenceError):
    """``repair`` left a fence's mark as it was: the mark is not provably forged (its
    token is not above etcd's current revision, so a real lock or election may have
    issued it), or it changed while the repair judged it (a write in between, which the
    repair never undoes). ``resource``, ``mark`` (the ``(token, epoch)`` found) and
    ``revision`` (etcd's revision the mark was judged against) say which."""

    def __init__(self, message: str, *, resource: str, mark: tuple[int, int], revision: int):
        super().__init__(message)
        self.resource = resource
        self.mark = mark
        self.revision = revision

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_repair_refused, (str(self), self.resource, self.mark, self.revision))


def _rebuild_repair_refused(
    message: str, resource: str, mark: tuple[int, int], revision: int
) -> RepairRefusedError:
    return RepairRefusedError(message, resource=resource, mark=mark, revision=revision)


class InvalidArgumentError(EtcdfenceError, ValueError):
    """A bad argument value: empty or malformed name, TTL < 1, bad endpoint, ..."""


class InvalidTypeError(EtcdfenceError, TypeError):
    """An argument of the wrong type: a key that is not str/bytes, a float token, ..."""


class InvalidTokenError(InvalidArgumentError):
    """A fencing token that is not a positive int."""


class GroupNotFoundError(RequestError):
    """A group operation that needs the group (``join(..., create=False)``, ``delete``)
    found no group of that name: nobody created it, or it was deleted."""


class GroupNotEmptyError(RequestError):
    """``Group.delete()`` refused: members are still joined (they leave, or their
    sessions' leases run out)."""


class MemberExistsError(RequestError):
    """``Group.join`` of a member id that another session's lease already holds in the
    group (the same session joining again just updates its capabilities)."""


class ForeignTokenError(InvalidTokenError):
    """A token a bound resource refuses: of another lock or another etcd cluster, a bare
    number with no lock, or one whose sequencer etcd does not confirm. Nothing was
    written. ``lock`` / ``cluster_id`` are the resource's binding, ``token`` the token."""

    def __init__(
        self,
        message: str,
        *,
        token: object = None,
        lock: str | None = None,
        cluster_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.token = token
        self.lock = lock
        self.cluster_id = cluster_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.__dict__))


class FutureTokenError(InvalidTokenError):
    """A token above etcd's current revision: no lock or election has issued it yet, so it
    is forged, mistyped or from another cluster. Nothing was written (a resource that
    accepted it would refuse every real holder until etcd's revision caught up).
    ``token`` is its value, ``revision`` etcd's current revision."""

    def __init__(self, message: str, *, token: int = 0, revision: int = 0) -> None:
        super().__init__(message)
        self.token = token
        self.revision = revision

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.__dict__))


def _rebuild(cls: type[Exception], message: str, fields: dict[str, Any]) -> Exception:
    """Unpickle an error whose fields are keyword-only: the message, then its fields."""
    return cls(message, **fields)


__all__ = [
    "AcquireTimeoutError",
    "AlreadyHeldError",
    "AuthError",
    "AuthTokenExpiredError",
    "CompactedError",
    "ConsistencyError",
    "EtcdfenceError",
    "ForeignTokenError",
    "FutureTokenError",
    "GroupNotEmptyError",
    "GroupNotFoundError",
    "InvalidArgumentError",
    "InvalidTokenError",
    "InvalidTypeError",
    "KeyExistsError",
    "LeaseNotFoundError",
    "MemberExistsError",
    "NotLeaderError",
    "NotOwnerError",
    "OutcomeUnknownError",
    "RepairRefusedError",
    "RequestError",
    "SessionExpiredError",
    "StaleTokenError",
    "TLSError",
    "TransactionAbortedError",
    "TransactionInProgressError",
    "UnavailableError",
    "UnsupportedError",
]

# -- the older names: still importable, the same classes, not in __all__ -----------------

# 0.2: the categories under etcd's name (see the module docstring for why aliases).
EtcdUnavailableError = UnavailableError
EtcdRequestError = RequestError
# 0.1
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

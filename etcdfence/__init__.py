"""etcdfence: leader election and locks on etcd with resource-side fencing tokens.

A lock or election returns a :class:`FencingToken` (the etcd revision that
confirmed ownership). Send it with every write; the resource keeps the highest
token it accepted and rejects lower ones (:class:`FenceGuard` for etcd-stored
data, :mod:`etcdfence.sql` for databases). A leader that was paused or cut off
may still believe it leads, but its writes bounce.

Sync and asyncio APIs share names: ``Client`` / ``AsyncClient``, ``Session`` /
``AsyncSession``, and so on.
"""

from __future__ import annotations

from ._async.client import AsyncClient
from ._async.election import AsyncElection
from ._async.elector import AsyncLeaderElector
from ._async.guard import AsyncFenceGuard
from ._async.lock import AsyncLock
from ._async.session import AsyncSession
from ._async.watch import AsyncWatch
from ._sync.client import Client
from ._sync.election import Election
from ._sync.elector import LeaderElector
from ._sync.guard import FenceGuard
from ._sync.lock import Lock
from ._sync.session import Session
from ._sync.watch import Watch
from ._txn import Delete, Put
from .errors import (
    AcquireTimeout,
    AcquireTimeoutError,
    AlreadyHeld,
    AlreadyHeldError,
    AuthError,
    AuthTokenExpired,
    AuthTokenExpiredError,
    CompactedError,
    ConsistencyError,
    EtcdfenceError,
    EtcdRequestError,
    EtcdUnavailable,
    EtcdUnavailableError,
    InvalidArgument,
    InvalidArgumentError,
    InvalidToken,
    InvalidTokenError,
    InvalidType,
    InvalidTypeError,
    LeaseNotFound,
    LeaseNotFoundError,
    NotLeader,
    NotLeaderError,
    NotOwnerError,
    OutcomeUnknown,
    OutcomeUnknownError,
    SessionExpired,
    SessionExpiredError,
    StaleTokenError,
    TLSError,
    TransactionAbortedError,
    TransactionInProgressError,
    UnsupportedError,
)
from .token import FencingToken
from .types import CallRecord, KeyValue, Leader, WatchBatch, WatchEvent

__version__ = "0.2.0"  # the one place the version is written (pyproject reads it)

__all__ = [
    "AcquireTimeout",
    "AcquireTimeoutError",
    "AlreadyHeld",
    "AlreadyHeldError",
    "AsyncClient",
    "AsyncElection",
    "AsyncFenceGuard",
    "AsyncLeaderElector",
    "AsyncLock",
    "AsyncSession",
    "AsyncWatch",
    "AuthError",
    "AuthTokenExpired",
    "AuthTokenExpiredError",
    "CallRecord",
    "Client",
    "CompactedError",
    "ConsistencyError",
    "Delete",
    "Election",
    "EtcdRequestError",
    "EtcdUnavailable",
    "EtcdUnavailableError",
    "EtcdfenceError",
    "FenceGuard",
    "FencingToken",
    "InvalidArgument",
    "InvalidArgumentError",
    "InvalidToken",
    "InvalidTokenError",
    "InvalidType",
    "InvalidTypeError",
    "KeyValue",
    "Leader",
    "LeaderElector",
    "LeaseNotFound",
    "LeaseNotFoundError",
    "Lock",
    "NotLeader",
    "NotLeaderError",
    "NotOwnerError",
    "OutcomeUnknown",
    "OutcomeUnknownError",
    "Put",
    "Session",
    "SessionExpired",
    "SessionExpiredError",
    "StaleTokenError",
    "TLSError",
    "TransactionAbortedError",
    "TransactionInProgressError",
    "UnsupportedError",
    "Watch",
    "WatchBatch",
    "WatchEvent",
    "__version__",
]

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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first use (see __getattr__), so `import etcdfence` is cheap
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

if TYPE_CHECKING:
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

#: Names imported when first used: ``import etcdfence`` (and with it the pytest plugin
#: every pytest run in the environment loads) costs about a millisecond instead of
#: grpc's ~0.3 s; only the error classes are defined eagerly.
_LAZY = {
    "AsyncClient": "._async.client",
    "AsyncElection": "._async.election",
    "AsyncLeaderElector": "._async.elector",
    "AsyncFenceGuard": "._async.guard",
    "AsyncLock": "._async.lock",
    "AsyncSession": "._async.session",
    "AsyncWatch": "._async.watch",
    "Client": "._sync.client",
    "Election": "._sync.election",
    "LeaderElector": "._sync.elector",
    "FenceGuard": "._sync.guard",
    "Lock": "._sync.lock",
    "Session": "._sync.session",
    "Watch": "._sync.watch",
    "Delete": "._txn",
    "Put": "._txn",
    "FencingToken": ".token",
    "CallRecord": ".types",
    "KeyValue": ".types",
    "Leader": ".types",
    "WatchBatch": ".types",
    "WatchEvent": ".types",
}


def __getattr__(name: str) -> Any:
    """Import a public name (or a submodule such as ``etcdfence.metrics``) on first use."""
    where = _LAZY.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where, __name__), name)
    elif not name.startswith("__"):
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

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
    from ._async.group import AsyncGroup, AsyncGroupWatch
    from ._async.lock import AsyncLock
    from ._async.rwlock import AsyncReadLock, AsyncRWLock, AsyncWriteLock
    from ._async.semaphore import AsyncSemaphore
    from ._async.session import AsyncSession
    from ._async.watch import AsyncWatch
    from ._sync.client import Client
    from ._sync.election import Election
    from ._sync.elector import LeaderElector
    from ._sync.group import Group, GroupWatch
    from ._sync.lock import Lock
    from ._sync.rwlock import ReadLock, RWLock, WriteLock
    from ._sync.semaphore import Semaphore
    from ._sync.session import Session
    from ._sync.watch import Watch

    # Every other error class, and the older names (0.1, 0.2) of the same classes:
    # importable as etcdfence.<name> (resolved on first use) but not listed in __all__.
    from .errors import (
        AcquireTimeout as AcquireTimeout,
    )
    from .errors import (
        AlreadyHeld as AlreadyHeld,
    )
    from .errors import (
        AlreadyHeldError as AlreadyHeldError,
    )
    from .errors import (
        AuthError as AuthError,
    )
    from .errors import (
        AuthTokenExpired as AuthTokenExpired,
    )
    from .errors import (
        AuthTokenExpiredError as AuthTokenExpiredError,
    )
    from .errors import (
        ConsistencyError as ConsistencyError,
    )
    from .errors import (
        EtcdRequestError as EtcdRequestError,
    )
    from .errors import (
        EtcdUnavailable as EtcdUnavailable,
    )
    from .errors import (
        EtcdUnavailableError as EtcdUnavailableError,
    )
    from .errors import (
        InvalidArgument as InvalidArgument,
    )
    from .errors import (
        InvalidArgumentError as InvalidArgumentError,
    )
    from .errors import (
        InvalidToken as InvalidToken,
    )
    from .errors import (
        InvalidType as InvalidType,
    )
    from .errors import (
        InvalidTypeError as InvalidTypeError,
    )
    from .errors import (
        LeaseNotFound as LeaseNotFound,
    )
    from .errors import (
        LeaseNotFoundError as LeaseNotFoundError,
    )
    from .errors import (
        NotLeader as NotLeader,
    )
    from .errors import (
        OutcomeUnknown as OutcomeUnknown,
    )
    from .errors import (
        SessionExpired as SessionExpired,
    )
    from .errors import (
        TLSError as TLSError,
    )
    from .errors import (
        TransactionAborted as TransactionAborted,
    )
    from .errors import (
        TransactionAbortedError as TransactionAbortedError,
    )
    from .errors import (
        TransactionInProgress as TransactionInProgress,
    )
    from .errors import (
        TransactionInProgressError as TransactionInProgressError,
    )
    from .errors import (
        UnsupportedError as UnsupportedError,
    )
    from .fence._async.etcd import AsyncFenceGuard
    from .fence._sync.etcd import FenceGuard
    from .fence.ops import Create, Delete, Put
from . import errors as _errors
from .errors import (
    AcquireTimeoutError,
    CompactedError,
    EtcdfenceError,
    ForeignTokenError,
    FutureTokenError,
    InvalidTokenError,
    NotLeaderError,
    NotOwnerError,
    OutcomeUnknownError,
    RequestError,
    SessionExpiredError,
    StaleTokenError,
    UnavailableError,
)

if TYPE_CHECKING:
    from .token import FencingToken
    from .types import CallRecord, GroupChange, KeyValue, Leader, Member, WatchBatch, WatchEvent

__version__ = "0.2.0"  # the one place the version is written (pyproject reads it)

__all__ = [
    "AcquireTimeoutError",
    "AsyncClient",
    "AsyncElection",
    "AsyncFenceGuard",
    "AsyncGroup",
    "AsyncGroupWatch",
    "AsyncLeaderElector",
    "AsyncLock",
    "AsyncRWLock",
    "AsyncReadLock",
    "AsyncSemaphore",
    "AsyncSession",
    "AsyncWatch",
    "AsyncWriteLock",
    "CallRecord",
    "Client",
    "CompactedError",
    "Create",
    "Delete",
    "Election",
    "EtcdfenceError",
    "FenceGuard",
    "FencingToken",
    "ForeignTokenError",
    "FutureTokenError",
    "Group",
    "GroupChange",
    "GroupWatch",
    "InvalidTokenError",
    "KeyValue",
    "Leader",
    "LeaderElector",
    "Lock",
    "Member",
    "NotLeaderError",
    "NotOwnerError",
    "OutcomeUnknownError",
    "Put",
    "RWLock",
    "ReadLock",
    "RequestError",
    "Semaphore",
    "Session",
    "SessionExpiredError",
    "StaleTokenError",
    "UnavailableError",
    "Watch",
    "WatchBatch",
    "WatchEvent",
    "WriteLock",
    "__version__",
]

#: Names imported when first used: ``import etcdfence`` (and with it the pytest plugin
#: every pytest run in the environment loads) costs about a millisecond instead of
#: grpc's ~0.3 s; only the error classes are defined eagerly (the ones in ``__all__`` bound
#: here, every other one and the older names resolved from :mod:`etcdfence.errors`).
_LAZY = {
    "AsyncClient": "._async.client",
    "AsyncElection": "._async.election",
    "AsyncLeaderElector": "._async.elector",
    "AsyncFenceGuard": ".fence._async.etcd",
    "AsyncLock": "._async.lock",
    "AsyncSemaphore": "._async.semaphore",
    "Semaphore": "._sync.semaphore",
    "AsyncWriteLock": "._async.rwlock",
    "WriteLock": "._sync.rwlock",
    "AsyncReadLock": "._async.rwlock",
    "ReadLock": "._sync.rwlock",
    "AsyncRWLock": "._async.rwlock",
    "RWLock": "._sync.rwlock",
    "AsyncGroupWatch": "._async.group",
    "GroupWatch": "._sync.group",
    "AsyncGroup": "._async.group",
    "Group": "._sync.group",
    "AsyncSession": "._async.session",
    "AsyncWatch": "._async.watch",
    "Client": "._sync.client",
    "Election": "._sync.election",
    "LeaderElector": "._sync.elector",
    "FenceGuard": ".fence._sync.etcd",
    "Lock": "._sync.lock",
    "Session": "._sync.session",
    "Watch": "._sync.watch",
    "Create": ".fence.ops",
    "Delete": ".fence.ops",
    "Put": ".fence.ops",
    "FencingToken": ".token",
    "CallRecord": ".types",
    "KeyValue": ".types",
    "Leader": ".types",
    "GroupChange": ".types",
    "Member": ".types",
    "WatchBatch": ".types",
    "WatchEvent": ".types",
}


def __getattr__(name: str) -> Any:
    """Import a public name (or a submodule such as ``etcdfence.metrics``) on first use."""
    where = _LAZY.get(name)
    if where is not None:
        value = getattr(importlib.import_module(where, __name__), name)
    elif _is_error(getattr(_errors, name, None)):  # a class (or older name) not in __all__
        value = getattr(_errors, name)
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


def _is_error(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, EtcdfenceError)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

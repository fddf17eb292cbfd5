"""One hold of a lock (or term of an election) as metrics and events see it (pure;
shared by both twins).

A hold starts when ``acquire``/``campaign`` returns a token and ends exactly once:
released or resigned on purpose (``resigned``), the session's lease lost
(``expired``: the local deadline passed; ``revoked``: etcd said the lease is gone), or
the key found deleted or replaced (``deleted``: a late release, a failed proclaim).
Whichever comes first counts; the end may be reported from the session's keepalive
thread while the owner releases, hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from . import metrics

__all__ = ["Hold", "expiry_reason"]


def expiry_reason(session_reason: str | None) -> str:
    """A session's expiry reason as a hold's end reason: ``revoked`` when etcd said
    the lease is gone (revoked, or run out on the server first), else ``expired``."""
    if session_reason is not None and "server" in session_reason:
        return "revoked"
    return "expired"


def _always() -> bool:
    return True


class Hold:
    """Reports a hold's start now and its end once (see the module docstring)."""

    __slots__ = ("_ended", "_guard", "kind", "name", "started", "token")

    def __init__(
        self,
        kind: str,
        name: str,
        token: int,
        key: str,
        waited: float,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        """``alive()``: whether the holder's session still holds (its one answer, the
        deadline compared with the clock now); the held gauge asks it when scraped."""
        self.kind = kind
        self.name = name
        self.token = token
        self.started = time.monotonic()
        self._ended = False
        self._guard = threading.Lock()
        check: Callable[[], bool] = alive if alive is not None else _always
        metrics.hold_started(kind, name, token, key, waited, lambda: not self._ended and check())

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self, reason: str) -> None:
        """Report the end with ``reason`` (resigned, expired, revoked, deleted); only
        the first call counts."""
        with self._guard:
            if self._ended:
                return
            self._ended = True
        held = time.monotonic() - self.started
        metrics.hold_ended(self.kind, self.name, self.token, held, reason)

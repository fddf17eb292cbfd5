"""A counting semaphore: at most N holders at once, each with its own key and token.

Layout: ``<name>/<lease hex>`` attached to the holder's session lease, the mutex's
layout (``contender.py``). Holders are the keys with fewer than N keys created
before them: a key is admitted when it is among the N first-created under
``name/``. Keys ahead of a waiter only go, so an admitted key stays admitted until it
goes itself, and at any revision at most N keys are admitted. The acquire is one txn
(put our key, read the N first-created keys); a waiter waits in its client's shared
view of the prefix (``queue.py``), woken when its key becomes one of the first N, and
confirms with an O(1) read of its own key (no single key ahead can be watched: any of
the keys ahead leaving may admit us).

Every holder must use the same ``permits`` for a name: mismatched counts break the
bound (a permits=3 caller admits itself beside a permits=1 holder). Each holder key's
value records its permits (``permits=N``), and an acquire that reads the first keys
(every acquire but a waiter that joins its own client's crowd on the name) refuses
with :class:`InvalidArgumentError` when one of them says otherwise — or is empty, as a
mutex's or ``etcdctl lock``'s key is. Do not use a semaphore's name as a mutex, an
rwlock or ``etcdctl lock``: the recipes share the ``name/`` layout without excluding
each other (``etcdctl lock NAME`` beside ``semaphore(NAME, 2)`` is one more holder).

What fencing means here: permits are not exclusive, so one fence mark shared by all
holders is wrong — a newer holder's larger token would refuse the older holders that
legitimately hold alongside it. A holder's token fences *its own slot*: the part of
the resource that one permit guards (a worker slot, a job, an export directory).
Give each slot its own fence resource. When a holder loses its permit (paused past
its TTL, its process died) and another holder, admitted after that, takes the slot
over, the taker's token is larger than the lost holder's — its permit was confirmed
after the lost key was gone — so the slot's fence refuses the lost holder's late
writes. Tokens of holders admitted at the same time say nothing about each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, InvalidTypeError
from .lock import AsyncLock

if TYPE_CHECKING:
    from .session import AsyncSession

#: More permits than this is a mistake, not a semaphore (the acquire reads N keys).
MAX_PERMITS = 10_000


def validate_permits(permits: object) -> int:
    """Check a semaphore's ``permits``: an int in 1..MAX_PERMITS."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise InvalidTypeError(f"permits must be an int, got {type(permits).__name__}")
    if not 1 <= permits <= MAX_PERMITS:
        raise InvalidArgumentError(f"permits must be 1..{MAX_PERMITS}, got {permits}")
    return permits


class AsyncSemaphore(AsyncLock):
    """Up to ``permits`` holders at once across processes, each hold with its own
    :class:`FencingToken` (see the module docstring for what it fences).

    Get it from :meth:`AsyncSession.semaphore`. ``acquire(timeout)`` waits for a
    permit, ``try_acquire()`` takes one only if free now (no key is left behind),
    ``release()`` gives it back; ``async with sem as token:`` holds one for a block.
    One session holds at most one permit of a name: use a session per permit.
    """

    _kind = "semaphore"

    def __init__(self, session: AsyncSession, name: str, permits: int = 1) -> None:
        super().__init__(session, name)
        self._permits = validate_permits(permits)

    _reads_values = True

    @property
    def _value(self) -> bytes:
        return f"permits={self._permits}".encode()

    def _check_queue(self, first: Any) -> None:
        """Refuse when a key among the first holders records other permits (or none)."""
        for kv in first:
            if bytes(kv.value) != self._value:
                raise InvalidArgumentError(
                    f"semaphore {self.name!r}: key {bytes(kv.key).decode(errors='replace')!r}"
                    f" holds {bytes(kv.value)!r}, not {self._value!r}: every user of the "
                    "name must pass the same permits, and no mutex, rwlock or etcdctl lock "
                    "may share it"
                )

    @property
    def permits(self) -> int:
        """How many holders the semaphore admits at once."""
        return self._permits

    def __repr__(self) -> str:
        held = "held" if self._token is not None else "not held"
        return f"<{type(self).__name__} {self.name!r} permits={self._permits} {held}>"

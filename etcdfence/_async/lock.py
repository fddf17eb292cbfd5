"""A distributed mutex compatible with Go's ``concurrency.Mutex`` and ``etcdctl lock``."""

from __future__ import annotations

from ..token import FencingToken
from .contender import AsyncContender


class AsyncLock(AsyncContender):
    """Mutual exclusion across processes, with a fencing token per hold.

    Get it from :meth:`AsyncSession.lock`. ``acquire()`` queues behind earlier
    holders and returns a :class:`FencingToken`; pass that token with every write
    the lock protects, so a holder that was paused past its lease is rejected
    by the resource. ``async with session.lock(name) as token:`` never enters
    the block without the lock. Interoperates with ``etcdctl lock NAME`` and Go's
    ``concurrency.NewMutex`` on the same name.
    """

    _kind = "lock"

    @property
    def _value(self) -> bytes:
        """What this contender's key holds (empty, as Go's mutex and etcdctl write)."""
        return b""

    async def acquire(self, timeout: float | None = None) -> FencingToken:
        """Wait for the lock (forever, or ``timeout`` seconds) and return its token.

        Raises :class:`AcquireTimeoutError` (our queued key is removed) or
        :class:`SessionExpiredError` (the session's lease was lost while waiting).
        """
        return await self._contend(self._value, timeout)

    async def try_acquire(self) -> FencingToken | None:
        """Take the lock if it is free right now, else return ``None`` (no key is left behind)."""
        try:
            return await self._contend(self._value, 0)
        except TimeoutError:
            return None

    async def release(self) -> None:
        """Release the lock. Harmless if it is not held, or was already lost: the
        delete is guarded by our key's create revision and never removes a newer
        holder's key."""
        await self._give_up()

    async def is_owner(self) -> bool:
        """Whether etcd still says we hold the lock (our key exists and is first)."""
        return await self._holds()

    async def __aenter__(self) -> FencingToken:
        return await self.acquire()

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Release; an exception in flight is never replaced by a release error, and
        nothing is sent when the session is known to be expired."""
        await self._exit_block(exc)

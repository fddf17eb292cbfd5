"""A read-write lock: many readers or one writer, in etcd's RWMutex recipe layout.

Layout (the shape of etcd's Go recipe ``client/v3/experimental/recipes/rwmutex.go``,
with a key derived from the session's lease as for the mutex, so a retried acquire
is idempotent)::

    <name>/read/<lease hex>     a reader, attached to its session's lease
    <name>/write/<lease hex>    a writer, attached to its session's lease

Everyone queues by create revision. A reader holds once no *writer* created before
it is left (readers created before it do not matter, writers created after it wait
for it); a writer holds once no key at all — reader or writer — created before it is
left. Keys ahead of a waiter can only go, never come, so both rules are stable, and
waiting is the mutex's (``contender.py``, ``queue.py``): a lone waiter watches the one
key just ahead of it (the last writer before it, for a reader), a crowd of one client
shares one view of the prefix. No herd: a release wakes the waiters it admits.

Safety: a writer's key is created after every key it waited for, and every later
reader or writer waits for it, so a writer holds alone; readers hold together only
while no writer before them exists. As for the mutex, "holds" is what etcd says at a
revision: a holder paused past its lease's TTL has lost its hold, which is what the
fencing token is for.

Tokens carry the sequencer ``lock`` of their key's parent, ``<name>/read`` or
``<name>/write`` (``FencingToken.lock``). A writer's token is the header revision of
the read that confirmed it, exactly like a mutex's, and strictly increases from writer
to writer (each writer's hold starts after the previous one's key is gone): fence
writes with it. A reader's token is the revision that confirmed the read hold. It is
greater than the token of every writer that held before it, so a resource that
accepts reads at or above its fence mark refuses a reader admitted before a writer
that has since written; readers do not fence each other (they hold together), and a
reader's token must not be used to *write* a fence mark, or it would refuse the
current readers' peers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AlreadyHeldError
from .lock import AsyncLock

if TYPE_CHECKING:
    from .session import AsyncSession


class _AsyncSide(AsyncLock):
    """One side of an :class:`AsyncRWLock`: its key is ``<name>/<side>/<lease hex>``."""

    _side = ""

    def __init__(self, rwlock: AsyncRWLock) -> None:
        super().__init__(rwlock.session, rwlock.name)
        self._rwlock = rwlock  # a live side keeps its rwlock (the session pins the side)

    def _key_of(self, lease_id: int) -> str:
        return f"{self.name}/{self._side}/{lease_id:x}"

    @property
    def _pin_key(self) -> str:
        return f"{self.name}\x00{self._side}"

    @property
    def _lock_name(self) -> str:
        return f"{self.name}/{self._side}"  # a token's lock is its key's parent

    def _claim(self) -> None:
        self._rwlock._exclusive(self)
        super()._claim()


class AsyncReadLock(_AsyncSide):
    """The shared side of :class:`AsyncRWLock` (from ``rwlock.read()``): held together
    with other readers, never with a writer. Same methods as :class:`AsyncLock`."""

    _kind = "read_lock"
    _side = "read"

    def __init__(self, rwlock: AsyncRWLock) -> None:
        super().__init__(rwlock)
        self._prefix = f"{self.name}/write/".encode()  # a reader waits for writers only


class AsyncWriteLock(_AsyncSide):
    """The exclusive side of :class:`AsyncRWLock` (from ``rwlock.write()``): held alone,
    with a fencing token like a mutex's. Same methods as :class:`AsyncLock`."""

    _kind = "write_lock"
    _side = "write"  # and self._prefix stays "<name>/": a writer waits for every key


class AsyncRWLock:
    """Many readers or one writer across processes (etcd's RWMutex recipe, herd-free).

    Get it from :meth:`AsyncSession.rwlock`. ``async with rw.read() as token:`` holds
    the lock shared, ``async with rw.write() as token:`` exclusive; each side also has
    ``acquire(timeout)``, ``try_acquire()``, ``release()`` and ``is_owner()``. Fence
    writes with the writer's token; see the module docstring for what a reader's token
    means. One session holds one side at a time (a session that holds the read side
    and asks for the write side would wait for itself: :class:`AlreadyHeldError`).
    Do not use the same name as a mutex (yours, Go's or ``etcdctl lock NAME``) or a
    semaphore: the recipes do not exclude each other — an ``etcdctl lock`` holder does
    not keep readers out — and a writer queues behind every key under ``name/``. In one
    session, names nested in this one's (``lock("NAME/read")``) are refused while either
    is live.
    """

    def __init__(self, session: AsyncSession, name: str) -> None:
        self.name = name
        self._session = session
        self._reader = AsyncReadLock(self)
        self._writer = AsyncWriteLock(self)

    @property
    def session(self) -> AsyncSession:
        return self._session

    def read(self) -> AsyncReadLock:
        """The shared side: use ``async with rw.read() as token`` or its methods."""
        return self._reader

    def write(self) -> AsyncWriteLock:
        """The exclusive side: ``async with rw.write() as token``; fence with the token."""
        return self._writer

    def _exclusive(self, side: AsyncLock) -> None:
        """Refuse ``side`` while this session has the other side (acquiring or held)."""
        other = self._writer if side is self._reader else self._reader
        if other.live():
            raise AlreadyHeldError(
                f"{side._kind} {self.name!r}: this session already has the "
                f"{other._kind} of it (acquiring or held); release it first"
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} read={self._reader!r} write={self._writer!r}>"

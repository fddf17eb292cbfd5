"""Sessions: one lease, one keepalive stream, a local deadline, many locks/elections."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .. import metrics
from .._keys import validate_name
from .._log import log
from .._raise import own_copy
from .._wire import messages as m
from ..errors import (
    EtcdfenceError,
    InvalidArgumentError,
    InvalidTypeError,
    LeaseNotFoundError,
    RequestError,
    SessionExpiredError,
)
from . import _compat
from .election import AsyncElection
from .keepalive import KeptLease
from .lock import AsyncLock
from .rwlock import AsyncRWLock
from .semaphore import AsyncSemaphore, validate_permits

if TYPE_CHECKING:
    from .client import AsyncClient
    from .connection import AsyncConnection
    from .contender import AsyncContender


#: etcd's largest lease TTL in seconds (``MaxLeaseTTL`` in etcd's server/lease/lessor.go).
MAX_LEASE_TTL = 9_000_000_000


def default_margin(ttl: int) -> float:
    """Safety margin subtracted from the lease TTL for the local deadline.

    10 % of the TTL, at least 0.2 s, at most 5 s: enough to absorb clock-rate
    differences and scheduling delays between this process and the etcd leader.
    """
    return min(5.0, max(0.2, ttl * 0.1))


class Interruptible(Protocol):
    """What a contender waits on: a watch, or its turn in a queue view."""

    def interrupt(self, error: BaseException) -> None: ...


class AsyncSession:
    """A lease kept alive on one stream; the lifetime of every lock and
    leadership acquired through it.

    The session keeps a *local deadline*: the send time of the last keepalive
    etcd acknowledged, plus the granted TTL, minus a safety margin. The server
    cannot expire the lease before that moment, so when the deadline passes —
    because the network is cut, etcd has no quorum, or this process was frozen —
    the session declares itself expired *before* anyone else can take over:
    ``expired`` turns true, ``on_expired`` callbacks run once, waiting acquires
    raise :class:`SessionExpiredError`, and so does every later operation.

    Get one from :meth:`AsyncClient.session` and use ``async with``; ``aclose()``
    revokes the lease (locks are released at once), ``orphan()`` stops the
    keepalive but leaves the lease to run out.
    """

    def __init__(self, client: AsyncClient, ttl: int = 60, *, margin: float | None = None) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int):
            raise InvalidTypeError(
                f"ttl must be an int number of seconds, got {type(ttl).__name__}"
            )
        if not 1 <= ttl <= MAX_LEASE_TTL:
            raise InvalidArgumentError(f"ttl must be 1..{MAX_LEASE_TTL} seconds, got {ttl}")
        if margin is not None:
            if isinstance(margin, bool) or not isinstance(margin, (int, float)):
                raise InvalidTypeError(f"margin must be a number of seconds, got {margin!r}")
            if not 0 <= margin < ttl:  # NaN fails this too
                raise InvalidArgumentError(f"margin must be >= 0 and < ttl ({ttl}), got {margin!r}")
        self._client = client
        self._conn = client.connection
        self._requested_ttl = ttl
        self._ttl = ttl
        self._margin = default_margin(ttl) if margin is None else float(margin)
        self._lease_id: int | None = None
        self._deadline = 0.0
        self._expired = _compat.Signal()
        self._settled = _compat.Signal()  # expired, and its on_expired callbacks ran
        self._expiry_reason: str | None = None
        self._interrupted: BaseException | None = None
        self._callbacks: list[Callable[[], Any]] = []
        self._waiters: list[Interruptible] = []
        # session.lock(name) is the same object while it is live: weakly here, and
        # strongly in _pinned while it is acquiring, held, or owes a withdrawal — so a
        # long-lived session keeps only its live contenders, not every name it ever used
        self._contenders: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._pinned: dict[str, AsyncContender] = {}
        # get-or-create and pinning are one step each: two threads asking lock(name) of
        # a forgotten name must not make two objects (they would share one key)
        self._registry_lock = threading.Lock()
        self._open_lock = _compat.Lock()
        self._state_lock = threading.Lock()  # guards expiry in the threaded twin too
        self._kept: KeptLease | None = None  # the lease as the client's keepalives track it
        self._loop: Any = None  # the event loop the session was opened on (async twin)

    # -- properties ------------------------------------------------------------------

    @property
    def lease_id(self) -> int:
        """The lease id (after the session was opened)."""
        if self._lease_id is None:
            raise SessionExpiredError(
                "the session is not open yet: use it in a with block or open() it"
            )
        return self._lease_id

    @property
    def ttl(self) -> int:
        """The TTL etcd granted, in seconds."""
        return self._ttl

    @property
    def margin(self) -> float:
        """Seconds subtracted from the TTL for the local deadline."""
        return self._margin

    @property
    def expired(self) -> bool:
        """True once the lease is lost, the local deadline passed, or the session closed.

        Answered by :meth:`_lost`, like :meth:`check`, a contender's ``token`` and an
        elector's ``is_leader()``: read right after a pause past the deadline, before
        the keepalive worker noticed, it is already true."""
        return self._lost()

    @property
    def expiry_reason(self) -> str | None:
        """Why the session expired (``None`` while it has not)."""
        if not self._lost():
            return None
        return self._expiry_reason or "local deadline passed"  # (expiring on its loop)

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` value at which the session expires unless renewed."""
        return self._deadline if self._kept is None else self._kept.deadline

    @property
    def keepalives_sent(self) -> int:
        """Keepalive requests sent for this session's lease so far."""
        return 0 if self._kept is None else self._kept.sent

    @property
    def client(self) -> AsyncClient:
        return self._client

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self) -> AsyncSession:
        """Grant the lease and start the keepalive (done implicitly on first use)."""
        async with self._open_lock:
            if self._lease_id is not None:
                return self
            if self._expired.is_set():
                raise SessionExpiredError("the session was closed")
            sent: list[float] = []  # when the answered attempt left (see call's on_send)
            response = await self._conn.call(
                "LeaseGrant", m.LeaseGrantRequest(TTL=self._requested_ttl), on_send=sent.append
            )
            if response.error:
                raise RequestError(f"etcd refused the lease: {response.error}")
            self._ttl = int(response.TTL)
            self._loop = _compat.owner_loop()
            self._deadline = sent[-1] + self._ttl - self._margin
            self._lease_id = int(response.ID)
            self._kept = KeptLease(
                self._lease_id, self._ttl, self._margin, self._deadline, on_gone=self._expire
            )
            self._client.keepalives.add(self._kept)  # one stream for every session
            return self

    # -- what locks and elections use (the session's whole internal surface) -------------

    @property
    def connection(self) -> AsyncConnection:
        """The connection requests made for this session's locks and elections go to."""
        return self._conn

    async def lease(self) -> int:
        """The open lease's id: grants it on first use, raises :class:`SessionExpiredError`
        if the session can no longer be used (see :meth:`check`)."""
        if self._lease_id is None:
            await self.open()
        self.check()
        return self.lease_id

    @contextlib.contextmanager
    def waiting(self, waiter: Interruptible) -> Iterator[None]:
        """Mark ``waiter`` (a watch, a queue turn) as one a contender waits on: expiry
        and :meth:`interrupt_waiters` reach it while the block runs."""
        self._waiters.append(waiter)
        try:
            yield
        finally:
            self._waiters.remove(waiter)

    def lose(self, reason: str) -> None:
        """Declare the lease lost because of ``reason`` (etcd said it is gone): the
        session expires now, with its callbacks, instead of at its deadline."""
        self._expire(reason)

    def check(self) -> None:
        """Raise :class:`SessionExpiredError` if the session can no longer be used (or the
        error given to :meth:`interrupt_waiters`)."""
        if self._interrupted is not None:
            raise own_copy(self._interrupted)  # each raise its own traceback
        if self._lost():
            raise SessionExpiredError(f"session expired: {self.expiry_reason}")

    def _lost(self) -> bool:
        """The one answer to "is this session's lease still ours?": every read of it —
        :attr:`expired`, :meth:`check`, a contender's ``token``, an elector's
        ``is_leader()`` — asks here, so no two of them can disagree.

        Expired means: marked expired (lease gone, closed), or the local deadline
        compared with the monotonic clock *now* has passed. The comparison does not wait
        for the keepalive hub's deadline worker, which a paused process (SIGSTOP, a
        blocked event loop, a long GC) runs late; the first read past the deadline
        expires the session, callbacks included (on the session's event loop when read
        from another thread), and the answer stays true: a passed deadline is never
        pushed out again (see ``AsyncKeepAlives._answered``)."""
        if self._expired.is_set():
            return True
        if self._lease_id is not None and _compat.monotonic() >= self.deadline:
            _compat.call_threadsafe(self._loop, lambda: self._expire("local deadline passed"))
            return True
        return False

    async def aclose(self, *, timeout: float | None = None, revoke: bool = True) -> None:
        """Revoke the lease (releasing every lock and leadership at once) and stop.

        A session that expired only locally (its deadline passed: etcd may still hold
        the lease, and an etcd restart extends it by a whole TTL) revokes too, best
        effort within the connection's timeout, so its keys do not block others.

        ``timeout`` bounds the revoke (default: the connection's timeout, at most the
        TTL; 0 skips it). ``revoke=False`` stops without revoking: the keys stay until
        etcd expires the lease by its TTL — for a holder that cannot prove the work
        it guarded has stopped, so nobody else may start before the TTL runs out."""
        lease_id = self._lease_id
        was_expired = self._expired.is_set() and not self._expired_locally()
        await self._stop_workers()
        self._mark_expired("session closed", notify=False)
        for contender in list(self._pinned.values()):
            contender._session_closed()  # revoking the lease releases every hold
        limit = min(self._conn.timeout, float(self._ttl))
        if timeout is not None:
            limit = min(limit, timeout)
        if lease_id is not None and not was_expired and revoke and limit > 0:
            try:
                await self._conn.call(
                    "LeaseRevoke",
                    m.LeaseRevokeRequest(ID=lease_id),
                    timeout=limit,
                    idempotent=True,
                )
            except LeaseNotFoundError:
                pass
            except EtcdfenceError as err:
                # The lease runs out by itself within the TTL.
                log.warning("etcdfence.revoke_failed", lease_id=f"{lease_id:x}", error=str(err))

    def _gone_on_server(self) -> bool:
        """Expired because etcd said the lease is gone (a keepalive answered TTL 0, a
        revoke): not by the local deadline, not by closing."""
        reason = self._expiry_reason or ""
        return (
            self._expired.is_set()
            and not reason.startswith("local deadline passed")
            and reason != "session closed"
        )

    def _expired_locally(self) -> bool:
        """Expired by the local deadline only: etcd did not say the lease is gone."""
        reason = self._expiry_reason or ""
        return self._expired.is_set() and reason.startswith("local deadline passed")

    async def orphan(self) -> None:
        """Stop the keepalive without revoking: keys stay until the TTL runs out.

        The local deadline still applies, so ``expired`` turns true in time.
        """
        if self._lease_id is not None:
            self._client.keepalives.orphan(self._lease_id)

    async def _stop_workers(self) -> None:
        if self._lease_id is not None:
            self._client.keepalives.remove(self._lease_id)

    async def __aenter__(self) -> AsyncSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- expiry -----------------------------------------------------------------------------

    def on_expired(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` once when the session expires (at once if it already has).

        Use it to stop work that must not continue without the lock/leadership.
        Callbacks run on the session's background task/thread and must be quick.
        """
        if self._lost() and self._expiry_reason != "session closed":
            callback()
            return
        self._callbacks.append(callback)

    async def wait_expired(self, timeout: float | None = None) -> bool:
        """Block until the session expired and its ``on_expired`` callbacks ran; return
        whether that happened within ``timeout``."""
        return await self._settled.wait(timeout)

    def _mark_expired(self, reason: str, *, notify: bool) -> bool:
        with self._state_lock:
            if self._expired.is_set():
                return False
            self._expiry_reason = reason
            self._expired.set()
            with_callbacks = list(self._callbacks) if notify else []
            self._callbacks.clear()
        error = SessionExpiredError(f"session expired: {reason}")
        for waiter in list(self._waiters):
            waiter.interrupt(error)
        if notify:  # a hold ends with the lease (only a live contender has one)
            for contender in list(self._pinned.values()):
                contender._session_expired()
        try:
            for callback in with_callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("etcdfence.on_expired_callback_failed")
        finally:
            self._settled.set()
        return True

    def _expire(self, reason: str) -> None:
        if self._mark_expired(reason, notify=True) and self._lease_id is not None:
            metrics.lease_lost(self._lease_id, reason)
            self._client.keepalives.remove(self._lease_id)

    def interrupt_waiters(self, error: BaseException) -> None:
        """Make every acquire/campaign on this session raise ``error``: the ones waiting
        now, and any that start or reach their next wait later (the interrupt sticks,
        so one that lands between two waits is not lost)."""
        self._interrupted = error
        for waiter in list(self._waiters):
            waiter.interrupt(error)

    # -- locks and elections ----------------------------------------------------------------

    def lock(self, name: str) -> AsyncLock:
        """The Go/etcdctl-compatible mutex ``name`` held through this session.

        Interoperates with ``etcdctl lock`` and Go's mutex, not with an rwlock or a
        semaphore of the same name (they do not exclude each other: use separate
        names). A name nested in a live contender's of this session (``a/read`` beside
        ``rwlock("a")``) is refused with :class:`InvalidArgumentError` when acquired.

        The same name returns the same object while it is live (acquiring, held, or
        referenced): the contender's key is derived from the lease, so two objects would
        silently be one contender. An idle one nobody references is forgotten, so a
        long-lived session does not keep every name it ever locked.
        """
        lock: AsyncLock = self._contender(name, AsyncLock)
        return lock

    def election(self, name: str) -> AsyncElection:
        """The Go/etcdctl-compatible election ``name`` contended through this session."""
        election: AsyncElection = self._contender(name, AsyncElection)
        return election

    def rwlock(self, name: str) -> AsyncRWLock:
        """The read-write lock ``name`` (many readers or one writer) through this session:
        ``async with rw.read() as token`` / ``async with rw.write() as token``. Same
        object while live, like :meth:`lock`."""
        rwlock: AsyncRWLock = self._contender(name, AsyncRWLock)
        return rwlock

    def semaphore(self, name: str, permits: int = 1) -> AsyncSemaphore:
        """The counting semaphore ``name`` admitting ``permits`` holders at once; this
        session holds at most one of them. Every user of ``name`` must pass the same
        ``permits``. Same object while live, like :meth:`lock`."""
        permits = validate_permits(permits)
        semaphore: AsyncSemaphore = self._contender(
            name, AsyncSemaphore, lambda: AsyncSemaphore(self, name, permits)
        )
        if semaphore.permits != permits:
            raise InvalidArgumentError(
                f"semaphore {name!r} has {semaphore.permits} permits in this session, not {permits}"
            )
        return semaphore

    def _contender(self, name: str, kind: Any, make: Callable[[], Any] | None = None) -> Any:
        name = validate_name(name)  # before the lookup: an unhashable name is a TypeError too
        with self._registry_lock:
            existing = self._contenders.get(name)
            if existing is None:
                existing = kind(self, name) if make is None else make()
                self._contenders[name] = existing
        if type(existing) is not kind:  # a semaphore is a lock subclass, not a lock
            raise InvalidArgumentError(
                f"{name!r} is already used as a {type(existing).__name__} in this session"
            )
        return existing

    def _refuse_overlap(self, contender: AsyncContender) -> None:
        """Refuse ``contender`` when its keys (``name/...``) and those of a live contender
        of this session lie one inside the other: ``lock("a/read")`` and
        ``rwlock("a").read()`` would be one key, and ``lock("a")`` would queue behind
        ``lock("a/b")``'s key. Called under the registry lock."""
        mine = contender.name + "/"
        for other in self._pinned.values():
            theirs = other.name + "/"
            if other.name != contender.name and (
                mine.startswith(theirs) or theirs.startswith(mine)
            ):
                raise InvalidArgumentError(
                    f"{contender._kind} {contender.name!r} overlaps {other._kind} "
                    f"{other.name!r} held or acquiring in this session: the keys of one lie "
                    f"under the other's {min(mine, theirs, key=len)!r}; use names that are "
                    "not nested"
                )

    def pin(self, contender: AsyncContender) -> None:
        """Keep ``contender`` (strongly) while it is live — acquiring, held, or owing
        the withdrawal of a key — and let it go when it is not: an idle contender nobody
        references is forgotten, and ``lock(name)`` makes a new one next time.

        Called after every change of the contender's state; liveness is read here, under
        the registry lock, so the last call always sees the last state (a late call
        carrying an older answer could unpin a contender that is acquiring again).
        A contender that becomes live with a name nested in (or around) a live one's is
        refused with :class:`InvalidArgumentError` (see :meth:`_refuse_overlap`)."""
        with self._registry_lock:
            if contender.live():
                if self._pinned.get(contender._pin_key) is not contender:
                    self._refuse_overlap(contender)
                self._pinned[contender._pin_key] = contender
            elif self._pinned.get(contender._pin_key) is contender:
                del self._pinned[contender._pin_key]

    def __repr__(self) -> str:
        lease = "unopened" if self._lease_id is None else f"{self._lease_id:x}"
        return f"<{type(self).__name__} lease={lease} ttl={self._ttl} expired={self.expired}>"

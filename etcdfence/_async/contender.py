"""What locks and elections share: queueing by create revision behind one key.

The protocol is etcd's own (Go ``concurrency.Mutex``/``Election``, etcdctl):

1. One txn puts ``name/<lease hex>`` if it does not exist and reads the
   first-created key under ``name/``. If that is ours, we own it, and the txn's
   header revision is the fencing token.
2. Otherwise wait for the key immediately ahead of ours (highest create
   revision below ours) to be deleted — one watch, no thundering herd — and
   re-check with one read-only txn of our own key and the key now ahead.
3. If our key is gone the session expired while queued: raise
   :class:`SessionExpiredError` (Go's ``Election.Campaign`` misses this and can
   report a phantom leadership). When our key exists and none is ahead, we own
   it, and that read's header revision is the token.

A contender that queues while another contender of the same client is already in
an acquire on the name is part of a *crowd*: it enqueues without the first-created
read, waits in the client's shared view of the queue (``queue.py``) instead of
watching the key ahead, and confirms with a read of its own key — step 3 with an
O(1) read, since nobody ahead at the view's revision stays true.

Giving up (timeout, cancellation, interruption, an error or a lost reply) deletes
our key, guarded by its create revision so a late delete never removes a newer
incarnation; when the create revision is unknown (the enqueue's reply was lost),
the key is read first. An object is one contender: acquiring it while it is held
or being acquired raises :class:`AlreadyHeldError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _txn
from .._hold import Hold, expiry_reason
from .._keys import contender_key, contender_prefix, validate_name, validate_timeout
from .._log import log
from ..errors import (
    AcquireTimeoutError,
    AlreadyHeldError,
    CompactedError,
    EtcdfenceError,
    LeaseNotFoundError,
    NotOwnerError,
    SessionExpiredError,
    UnavailableError,
)
from ..token import FencingToken
from . import _compat
from .watch import AsyncWatch

if TYPE_CHECKING:
    from .queue import AsyncQueueViews
    from .session import AsyncSession


#: Reason a :class:`KeyMonitor` gives when etcd deleted the key it watches.
KEY_DELETED = "key deleted"


class KeyMonitor:
    """Watches one held key (a lock's, a leader's) from its token's revision on and
    calls ``on_end(reason, deleted)`` once when the watch ends: ``deleted`` when etcd
    deleted the key (``etcdctl del``, a revoke, the lease's expiry on the server), else
    it lost track of it (``reason`` says why). Not after :meth:`aclose`.

    Compaction is not a loss: when the watch falls behind a compaction (after a
    broken stream, say), the key is re-read; the hold goes on if it is still our
    incarnation, and watching resumes after that read.
    """

    def __init__(self, conn: Any, token: FencingToken, on_end: Callable[[str, bool], None]) -> None:
        self._conn = conn
        self._key = (token.key or "").encode("utf-8")
        self._create_revision = token.create_revision
        self._on_end = on_end
        self._guard = threading.Lock()
        self._closed = False
        self._watch: AsyncWatch | None = None
        self._task = _compat.Background(
            self._run, token.value + 1, name=f"etcdfence-key-{self._key!r}"
        )

    def _adopt(self, watch: AsyncWatch) -> bool:
        with self._guard:
            if self._closed:
                return False
            self._watch = watch
            return True

    async def _run(self, start_revision: int) -> None:
        try:
            while True:
                watch = AsyncWatch(self._conn, self._key, start_revision=start_revision)
                if not self._adopt(watch):
                    return
                try:
                    await watch.start()
                    async for batch in watch:
                        if any(ev.type == "delete" for ev in batch.events):
                            self._end(KEY_DELETED, deleted=True)
                            return
                    return  # closed
                except CompactedError:
                    read = await self._conn.call(
                        "Range", _txn.range_request(self._key), idempotent=True
                    )
                    if not read.kvs or read.kvs[0].create_revision != self._create_revision:
                        self._end(KEY_DELETED, deleted=True)
                        return
                    start_revision = int(read.header.revision) + 1
                finally:
                    await watch.aclose()
        except EtcdfenceError as err:
            self._end(f"lost track of the key: {err}", deleted=False)

    def _end(self, reason: str, *, deleted: bool) -> None:
        if not self._closed:
            self._on_end(reason, deleted)

    async def aclose(self, timeout: float = 1.0) -> None:
        """Stop watching (no ``on_end`` from now on); wait up to ``timeout`` for the end."""
        with self._guard:
            self._closed = True
            watch = self._watch
        if watch is not None:
            await watch.aclose()
        self._task.cancel()
        await self._task.join(timeout)


@dataclass
class _Attempt:
    """One acquire in flight: our key, and what etcd told us of it so far."""

    key: bytes
    lease_id: int
    revision: int = 0  # our key's create revision, 0 until etcd answered the enqueue
    request: Any = None  # the enqueue request (spawned), to learn its outcome after a cancel


class AsyncContender:
    """Base of :class:`AsyncLock` and :class:`AsyncElection`."""

    _kind = "contender"
    #: How many holders at once: those with fewer than this many keys ahead (the
    #: semaphore's N; 1 for a lock, an election and each side of a read-write lock).
    _permits = 1
    _reads_values = False  # the acquire's read of the first keys brings their values

    def __init__(self, session: AsyncSession, name: str) -> None:
        self.name = validate_name(name)
        self._session = session
        self._conn = session.connection
        self._prefix = contender_prefix(self.name).encode("utf-8")
        self._create_revision = 0
        self._token: FencingToken | None = None
        # One holding per object: "acquiring" from the first request until the
        # outcome is known, then "held" until release, else idle (None).
        self._state: str | None = None
        self._state_lock = threading.Lock()  # callers may be threads (sync twin)
        self._stray: bytes | None = None  # a key we failed to withdraw (see _withdraw)
        self._hold: Hold | None = None  # the current hold, for events and metrics
        self._monitor: KeyMonitor | None = None  # watch_key()'s watch of the held key
        self._key_deleted = False  # that watch saw etcd delete the held key

    @property
    def session(self) -> AsyncSession:
        return self._session

    @property
    def key(self) -> str:
        """This contender's key, ``name/<lease hex>``."""
        return self._key_of(self._session.lease_id)

    def _key_of(self, lease_id: int) -> str:
        """Where this contender queues for a lease (Go/etcdctl: ``name/<lease hex>``);
        ``self._prefix`` is what it queues behind (``name/``)."""
        return contender_key(self.name, lease_id)

    @property
    def _pin_key(self) -> str:
        """This contender's entry in its session's registry of live contenders."""
        return self.name

    @property
    def _lock_name(self) -> str:
        """The ``lock`` of this contender's tokens: its key without ``/<lease hex>``."""
        return self.name

    @property
    def token(self) -> FencingToken | None:
        """The token of the current hold/term, ``None`` when not held — nor once the
        session expired (its local deadline passed: the same answer as ``check()``)."""
        token = self._token
        return None if token is None or self._session.expired else token

    def watch_key(self, on_taken: Callable[[], Any] | None = None) -> None:
        """Watch the held key until it is released: from the moment etcd deletes it
        (``etcdctl del``, a revoke of the lease, its expiry on the server),
        :meth:`key_taken` is true and ``on_taken()`` runs once (in the
        background: keep it quick); also when a keepalive answer says the
        lease is gone. For work that must end the moment another process may hold the
        key — ``etcdfence lock`` kills its command then. A second call while watching
        does nothing. Raises :class:`NotOwnerError` when nothing is held."""
        token = self._token
        if token is None or token.key is None or self._session.expired:
            raise NotOwnerError(f"{self._kind} {self.name!r} is not held: nothing to watch")
        if self._monitor is not None:
            return
        fired = threading.Event()

        def taken() -> None:
            if on_taken is not None and not fired.is_set():
                fired.set()
                on_taken()

        def ended(reason: str, deleted: bool) -> None:
            if not deleted:  # the local deadline still bounds the hold
                log.warning("etcdfence.key_watch_lost", contender=self.name, error=reason)
                return
            self._key_deleted = True
            self._lose_hold("deleted")
            taken()

        self._session.on_expired(lambda: taken() if self.key_taken() else None)
        self._monitor = KeyMonitor(self._conn, token, ended)

    def key_taken(self) -> bool:
        """Whether etcd has taken the held key away: :meth:`watch_key`'s watch saw it
        deleted, or a keepalive answer said the session's lease is gone on the server.
        From then on another process may already hold it: work still running must end
        at once, a grace period protects nothing. False while the key is ours, when
        nothing is held, and when only the session's local deadline passed (etcd may
        still hold the lease). No I/O; safe from any thread."""
        if self._key_deleted:
            return True
        return self._create_revision != 0 and self._session._gone_on_server()

    async def _unwatch(self, timeout: float | None) -> None:
        """Stop :meth:`watch_key`'s watch (before our own delete, which it must not
        report as taken)."""
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            await monitor.aclose(1.0 if timeout is None else min(timeout, 1.0))

    def _check_queue(self, first: Any) -> None:
        """Check the first-created keys the acquire read (a semaphore checks their
        permits); raising withdraws our key."""

    def _claim(self) -> None:
        with self._state_lock:
            if self._state is not None:
                raise AlreadyHeldError(
                    f"{self._kind} {self.name!r} is already {self._state} through this session; "
                    "a session is one contender per name: use one session per concurrent "
                    "contender"
                )
            self._state = "acquiring"
        try:
            self._session.pin(self)  # refuses a name nested in a live one's
        except BaseException:
            self._set_state(None)
            raise

    def _set_state(self, state: str | None) -> None:
        with self._state_lock:
            self._state = state
        self._repin()

    def _repin(self) -> None:
        """Tell the session this contender's state changed (see ``AsyncSession.pin``)."""
        self._session.pin(self)

    def live(self) -> bool:
        """Acquiring, held, or owing the withdrawal of a key (the session keeps it)."""
        with self._state_lock:
            return self._state is not None or self._stray is not None

    async def _contend(self, value: bytes, timeout: float | None) -> FencingToken:
        """Enqueue, wait for our turn, return the token. Every other way out of here —
        a timeout, an error, a lost reply, cancellation, KeyboardInterrupt — withdraws
        our key, so no contender is left blocked behind a key nobody waits on."""
        timeout = validate_timeout(timeout)
        started = _compat.monotonic()
        self._session.check()  # a lost session is reported as such, not as "held"
        self._claim()
        try:
            deadline = None if timeout is None else _compat.monotonic() + timeout
            lease_id = await self._session.lease()
            if self._stray is not None:
                await self._withdraw(self._stray, None)
        except BaseException:
            self._set_state(None)
            raise
        attempt = _Attempt(self._key_of(lease_id).encode("utf-8"), lease_id)
        queues: AsyncQueueViews = self._conn.queues
        crowd = queues.enter(self._prefix)  # another of this client's contenders is queued here
        try:
            response = await self._enqueue(attempt, value, crowd)
            if not crowd:
                self._check_queue(response.responses[1].response_range.kvs)
            if crowd:
                header = await self._wait_in_crowd(attempt, deadline)
            elif _txn.admitted(
                response.responses[1].response_range.kvs, attempt.revision, self._permits
            ):
                header = response.header
            elif self._permits > 1:  # no one key ahead to watch: wait in the shared view
                header = await self._wait_in_crowd(attempt, deadline)
            else:
                header = await self._wait_for_turn(attempt.key, attempt.revision, deadline)
            token = self._won(header, attempt.key, attempt.revision, lease_id)
        except BaseException:
            await self._abandon(attempt)
            raise
        finally:
            queues.exit(self._prefix)
        self._set_state("held")
        waited = _compat.monotonic() - started
        self._hold = Hold(
            self._kind,
            self.name,
            token.value,
            token.key or "",
            waited,
            lambda: not self._session.expired,
        )
        return token

    async def _enqueue(self, attempt: _Attempt, value: bytes, crowd: bool) -> Any:
        """The acquire txn (and, when our key holds another value, its update); sets
        ``attempt.revision`` to our key's create revision. A crowd waiter leaves out
        the read of the first-created key (see ``queue.py``)."""
        try:
            # Spawned and settled, not simply awaited: a cancelled caller must not
            # cancel a request that may already be at etcd, or the key could appear
            # after our withdrawal read found nothing.
            if crowd:
                request = _txn.enqueue_txn(attempt.key, value, attempt.lease_id)
            else:
                request = _txn.acquire_txn(
                    attempt.key,
                    value,
                    attempt.lease_id,
                    self._prefix,
                    self._permits,
                    values=self._reads_values,
                )
            attempt.request = _compat.spawn(self._conn.call("Txn", request, idempotent=True))
            response = await _compat.settle(attempt.request)
        except LeaseNotFoundError:  # revoked or run out before the keepalive could tell us
            self._session.lose("lease expired or revoked on the server")
            raise SessionExpiredError(
                f"{self._kind} {self.name!r}: the session's lease is gone"
            ) from None
        revision = _txn.enqueued_revision(response)
        if revision is None:  # cannot happen within one txn; be explicit rather than guess
            raise SessionExpiredError(f"{self._kind} key {attempt.key!r} vanished during acquire")
        attempt.revision = self._create_revision = revision
        mine = response.responses[0].response_range.kvs
        if not response.succeeded and mine[0].value != value:
            update = _txn.guarded_put(attempt.key, value, attempt.lease_id, revision)
            await self._conn.call("Txn", update, idempotent=True)
        return response

    async def _abandon(self, attempt: _Attempt) -> None:
        """After a failed acquire: forget the holding and withdraw the key (unless the
        session expired, which took it). Runs to its end even if cancelled again."""
        self._token = None
        self._create_revision = 0
        try:
            if not self._session.expired:
                revision = attempt.revision or None
                if revision is None and attempt.request is not None:
                    answer = await _compat.uncancellable(_compat.outcome(attempt.request))
                    revision = _txn.enqueued_revision(answer)
                await _compat.uncancellable(self._withdraw(attempt.key, revision))
        finally:
            self._set_state(None)

    def _won(self, header: Any, key: bytes, create_revision: int, lease_id: int) -> FencingToken:
        """The token of a won acquire: ``header`` is the ResponseHeader of the answer that
        showed us first (its revision is the token, its cluster id the token's cluster;
        0, protobuf's unset, from a server that sends none, is no cluster)."""
        self._session.check()
        self._key_deleted = False
        self._token = FencingToken(
            int(header.revision),
            key=key.decode("utf-8"),
            create_revision=create_revision,
            lease_id=lease_id,
            lock=self._lock_name,
            cluster_id=int(header.cluster_id) or None,
        )
        return self._token

    async def _withdraw(self, key: bytes, create_revision: int | None) -> bool:
        """Delete our queued key after giving up; never raises, never masks the cause.
        Returns whether the key is known to be gone.

        ``create_revision`` is ``None`` when the enqueue's reply was lost: then read
        the key (it is derived from our lease, so whatever incarnation exists is
        ours) and delete that one, guarded. If etcd cannot be reached the key is
        remembered and withdrawn before this object's next acquire (and by the
        lease's end in any case).
        """
        try:
            if create_revision is None:
                read = await self._conn.call("Range", _txn.range_request(key), idempotent=True)
                if not read.kvs:
                    self._stray = None
                    self._repin()
                    return True
                create_revision = int(read.kvs[0].create_revision)
            await self._conn.call("Txn", _txn.guarded_delete(key, create_revision), idempotent=True)
            self._stray = None
            self._repin()
            return True
        except EtcdfenceError as err:
            self._stray = key
            self._repin()
            log.warning(
                "etcdfence.withdraw_failed",
                contender=self.name,
                key=key.decode("utf-8", "replace"),
                error=str(err),
            )
            return False

    async def _wait_in_crowd(self, attempt: _Attempt, deadline: float | None) -> Any:
        """Wait in this client's shared view of the queue (``queue.py``) until our key is
        first, then confirm with a read of our key alone; return that read's header
        (its revision is the token)."""
        queues: AsyncQueueViews = self._conn.queues
        view = queues.join(self._prefix)
        turn = None
        try:
            turn = view.join(attempt.key, attempt.revision, self._permits)
            with self._session.waiting(turn):
                self._session.check()
                remaining = None if deadline is None else deadline - _compat.monotonic()
                if not await turn.woken.wait(remaining):
                    raise AcquireTimeoutError(f"{self._kind} {self.name!r} not acquired in time")
                if turn.error is not None:
                    raise turn.error
                read = await self._read_txn(_txn.own_key_read(attempt.key))
                self._check_mine(read, attempt.key, attempt.revision)
                revision: int = read.header.revision
                if revision < turn.judged_at:  # a linearizable read cannot be older
                    raise UnavailableError(
                        f"etcd answered a linearizable read at revision {revision}, below "
                        f"the revision {turn.judged_at} the queue view had applied"
                    )
                return read.header
        finally:
            queues.leave(self._prefix, view, turn)

    def _check_mine(self, read: Any, my_key: bytes, my_rev: int) -> None:
        """Raise :class:`SessionExpiredError` unless ``read``'s first range holds our key."""
        mine = read.responses[0].response_range.kvs
        if not mine or mine[0].create_revision != my_rev:
            raise SessionExpiredError(
                f"{self._kind} key {my_key.decode()} is gone: the session expired while "
                "waiting, so no ownership is granted"
            )

    async def _wait_for_turn(self, my_key: bytes, my_rev: int, deadline: float | None) -> Any:
        """Wait until no key with a lower create revision is left under the prefix and
        return the header of the read that saw it (its revision is the token).

        Every read also re-reads our own key (same txn, no extra round trip): once it is
        gone — lease expired or revoked, key deleted — we stop at once with
        :class:`SessionExpiredError` instead of queueing on for a turn that never comes.
        """
        while True:
            self._session.check()
            read = await self._read_txn(_txn.queue_read(my_key, self._prefix, my_rev))
            self._check_mine(read, my_key, my_rev)
            ahead = read.responses[1].response_range.kvs
            if not ahead:
                return read.header  # ours exists, nobody ahead: we own it
            if deadline is not None and deadline <= _compat.monotonic():
                raise AcquireTimeoutError(f"{self._kind} {self.name!r} not acquired in time")
            await self._wait_gone(ahead[0], read.header.revision, deadline)

    async def _wait_gone(self, ahead: Any, read_revision: int, deadline: float | None) -> None:
        """Return once the key ahead may be gone (deleted, or history compacted: the
        caller re-reads either way); :class:`AcquireTimeoutError` at ``deadline``."""
        # Watch from *now*: etcd notifies such a watcher at once, while one that starts
        # in the past waits for etcd's catch-up loop (every 100 ms) under load.
        watch = AsyncWatch(self._conn, ahead.key)
        try:
            with self._session.waiting(watch):
                self._session.check()  # an expiry/interrupt that landed before we registered
                wait = self._conn.timeout
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - _compat.monotonic()))
                try:
                    await watch.start(wait)
                except UnavailableError:  # not confirmed in time: re-read (or time out) instead
                    if deadline is not None and deadline <= _compat.monotonic():
                        raise AcquireTimeoutError(
                            f"{self._kind} {self.name!r} not acquired in time"
                        ) from None
                    return
                self._session.check()
                # the key ahead may have gone between our read and the watch: look again
                if watch.created_revision > read_revision and not await self._exists(ahead):
                    return
                while True:
                    remaining = None if deadline is None else deadline - _compat.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise AcquireTimeoutError(
                            f"{self._kind} {self.name!r} not acquired in time"
                        )
                    try:
                        batch = await watch.get(remaining)
                    except TimeoutError:
                        raise AcquireTimeoutError(
                            f"{self._kind} {self.name!r} not acquired in time"
                        ) from None
                    except CompactedError:
                        return  # the watch lost its place; the caller's re-read is the truth
                    if any(ev.type == "delete" for ev in batch.events):
                        return
        finally:
            await watch.aclose()

    async def _exists(self, kv: Any) -> bool:
        """Whether ``kv``'s key still exists as the same incarnation."""
        now = await self._conn.call("Range", _txn.range_request(kv.key), idempotent=True)
        return bool(now.kvs and now.kvs[0].create_revision == kv.create_revision)

    async def _delete_key(self, timeout: float | None = None) -> bool:
        """Delete our key if it is still the incarnation we created; True if it was.
        ``timeout``: how long the delete may take (default: the connection's).

        Skipped when the session is known to be expired (the lease took the key, or
        will within its TTL). Also withdraws a key an earlier failed acquire could not
        delete. If etcd cannot be reached the error propagates and the key is
        withdrawn by the next release or before the next acquire.
        """
        rev = self._create_revision
        token = self._token
        self._token = None
        self._create_revision = 0
        self._set_state(None)
        if self._session.expired:
            return False
        if self._stray is not None:  # a failed acquire left a key we could not withdraw
            stray = self._stray
            if not await self._withdraw(stray, None):
                raise UnavailableError(
                    f"could not withdraw {stray.decode('utf-8', 'replace')}: etcd unreachable"
                )
        if not rev or token is None or token.key is None:
            return False
        key = token.key.encode("utf-8")
        try:
            response = await self._conn.call(
                "Txn", _txn.guarded_delete(key, rev), timeout=timeout, idempotent=True
            )
        except EtcdfenceError:
            self._stray = key
            self._repin()
            raise
        return bool(response.succeeded)

    async def _exit_block(self, exc: BaseException | None) -> None:
        """Leave ``async with``: release, but never replace an exception in flight."""
        if exc is None:
            await self._give_up()
            return
        try:
            await self._give_up()
        except Exception as err:
            log.warning(
                "etcdfence.release_failed",
                contender=self.name,
                error=str(err),
                while_handling=type(exc).__name__,
            )

    async def _read_txn(self, request: Any) -> Any:
        """Send a read-only txn that a cancelled caller does not cancel.

        etcd 3.5.0–3.5.4 crash (panic) when a read-only txn is cancelled while it is
        being applied (etcd-io/etcd#14110, fixed in 3.5.5); a waiter cancelled at its
        re-read must not take the server down. The request runs to its answer and the
        caller is released at once.
        """
        return await _compat.settle(_compat.spawn(self._conn.call("Txn", request, idempotent=True)))

    async def _holds(self) -> bool:
        """Ask etcd whether our key exists with our create revision and is first."""
        token = self._token
        if token is None or token.key is None or self._session.expired:
            return False
        read = await self._read_txn(
            _txn.ownership_read(token.key.encode("utf-8"), self._prefix, self._permits)
        )
        mine = read.responses[0].response_range.kvs
        first = read.responses[1].response_range.kvs
        return bool(
            mine
            and mine[0].create_revision == self._create_revision
            and _txn.admitted(first, self._create_revision, self._permits)
            and not self._session.expired
        )

    # -- the hold's end, for events and metrics (etcdfence/_hold.py) ---------------------

    def _end_hold(self, reason: str) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.end(reason)

    def _lose_hold(self, reason: str) -> None:
        """The hold is known lost (``reason``: expired, deleted) before it is given up."""
        hold = self._hold
        if hold is not None:
            hold.end(reason)

    def _session_expired(self) -> None:
        """The session's lease is lost: so is the hold (if any)."""
        hold = self._hold
        if hold is not None:
            hold.end(expiry_reason(self._session.expiry_reason))

    def _session_closed(self) -> None:
        """The session was closed on purpose (its lease revoked): the hold ends as a
        deliberate release."""
        self._end_hold("resigned")

    async def _give_up(self, timeout: float | None = None) -> bool:
        """Release (see :meth:`_delete_key`) and report how the hold ended."""
        deleted: bool | None = None
        try:
            await self._unwatch(timeout)
            deleted = await self._delete_key(timeout)
            return deleted
        finally:
            if self._session.expired:
                self._end_hold(expiry_reason(self._session.expiry_reason))
            else:
                self._end_hold("deleted" if deleted is False else "resigned")

    def __repr__(self) -> str:
        held = "held" if self._token is not None else "not held"
        return f"<{type(self).__name__} {self.name!r} {held}>"

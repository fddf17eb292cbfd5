"""What locks and elections share: queueing by create revision behind one key.

The protocol is etcd's own (Go ``concurrency.Mutex``/``Election``, etcdctl):

1. One txn puts ``name/<lease hex>`` if it does not exist and reads the
   first-created key under ``name/``. If that is ours, we own it, and the txn's
   header revision is the fencing token.
2. Otherwise wait for the key immediately ahead of ours (highest create
   revision below ours) to be deleted — one watch, no thundering herd — and
   re-check with one read-only txn of our own key and the key now ahead.
3. If our key is gone the session expired while queued: raise
   :class:`SessionExpired` (Go's ``Election.Campaign`` misses this and can
   report a phantom leadership). When our key exists and none is ahead, we own
   it, and that read's header revision is the token.

Giving up (timeout, cancellation, error) deletes our key, guarded by its create
revision so a late delete never removes a newer incarnation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _txn
from .._keys import contender_key, contender_prefix, validate_name
from ..errors import AcquireTimeout, EtcdfenceError, LeaseNotFound, SessionExpired
from ..token import FencingToken
from . import _compat
from .watch import AsyncWatch

if TYPE_CHECKING:
    from .session import AsyncSession


class AsyncContender:
    """Base of :class:`AsyncLock` and :class:`AsyncElection`."""

    _kind = "contender"

    def __init__(self, session: AsyncSession, name: str) -> None:
        self.name = validate_name(name)
        self._session = session
        self._conn = session.client._conn
        self._prefix = contender_prefix(self.name).encode("utf-8")
        self._create_revision = 0
        self._token: FencingToken | None = None

    @property
    def session(self) -> AsyncSession:
        return self._session

    @property
    def key(self) -> str:
        """This contender's key, ``name/<lease hex>``."""
        return contender_key(self.name, self._session.lease_id)

    @property
    def token(self) -> FencingToken | None:
        """The token of the current hold/term, ``None`` when not held."""
        return self._token

    async def _contend(self, value: bytes, timeout: float | None) -> FencingToken:
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise ValueError(f"timeout must be None or >= 0, got {timeout!r}")
        deadline = None if timeout is None else _compat.monotonic() + timeout
        lease_id = await self._session._ensure_open()
        my_key = contender_key(self.name, lease_id).encode("utf-8")
        try:
            response = await self._conn.call(
                "Txn", _txn.acquire_txn(my_key, value, lease_id, self._prefix), idempotent=True
            )
        except LeaseNotFound:  # revoked or run out before the keepalive could tell us
            self._session._expire("lease expired or revoked on the server")
            raise SessionExpired(
                f"{self._kind} {self.name!r}: the session's lease is gone"
            ) from None
        if response.succeeded:
            my_rev = response.header.revision
        else:
            mine = response.responses[0].response_range.kvs
            if not mine:  # cannot happen within one txn; be explicit rather than guess
                raise SessionExpired(f"{self._kind} key {my_key!r} vanished during acquire")
            my_rev = mine[0].create_revision
            if mine[0].value != value:
                await self._conn.call(
                    "Txn", _txn.guarded_put(my_key, value, lease_id, my_rev), idempotent=True
                )
        self._create_revision = my_rev
        owner = response.responses[1].response_range.kvs
        if owner and owner[0].create_revision == my_rev:
            return self._won(response.header.revision, my_key, my_rev, lease_id)
        try:
            revision = await self._wait_for_turn(my_key, my_rev, deadline)
            return self._won(revision, my_key, my_rev, lease_id)
        except BaseException:
            await self._abandon(my_key, my_rev)
            raise

    def _won(self, revision: int, key: bytes, create_revision: int, lease_id: int) -> FencingToken:
        self._session.check()
        self._token = FencingToken(
            revision, key=key.decode("utf-8"), create_revision=create_revision, lease_id=lease_id
        )
        return self._token

    async def _wait_for_turn(self, my_key: bytes, my_rev: int, deadline: float | None) -> int:
        """Wait until no key with a lower create revision is left under the prefix and
        return the revision of the read that saw it (the token).

        Every read also re-reads our own key (same txn, no extra round trip): once it is
        gone — lease expired or revoked, key deleted — we stop at once with
        :class:`SessionExpired` instead of queueing on for a turn that never comes.
        """
        while True:
            self._session.check()
            read = await self._conn.call(
                "Txn", _txn.queue_read(my_key, self._prefix, my_rev), idempotent=True
            )
            mine = read.responses[0].response_range.kvs
            if not mine or mine[0].create_revision != my_rev:
                raise SessionExpired(
                    f"{self._kind} key {my_key.decode()} is gone: the session expired while "
                    "waiting, so no ownership is granted"
                )
            ahead = read.responses[1].response_range.kvs
            if not ahead:
                revision: int = read.header.revision  # ours exists, nobody ahead: we own it
                return revision
            if deadline is not None and deadline <= _compat.monotonic():
                raise AcquireTimeout(f"{self._kind} {self.name!r} not acquired in time")
            # Watch from *now*: etcd notifies such a watcher at once, while one that starts
            # in the past waits for etcd's catch-up loop (every 100 ms) under load.
            watch = AsyncWatch(self._conn, ahead[0].key)
            self._session._waiters.append(watch)
            try:
                self._session.check()  # an expiry/interrupt that landed before we registered
                await watch.start()
                wait = self._conn.timeout
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - _compat.monotonic()))
                created = await watch.wait_created(wait)
                self._session.check()
                # the key ahead may have gone between our read and the watch: look again
                deleted = created is None or (
                    created > read.header.revision and not await self._exists(ahead[0])
                )
                while not deleted:
                    remaining = None if deadline is None else deadline - _compat.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise AcquireTimeout(f"{self._kind} {self.name!r} not acquired in time")
                    try:
                        batch = await watch.get(remaining)
                    except TimeoutError:
                        raise AcquireTimeout(
                            f"{self._kind} {self.name!r} not acquired in time"
                        ) from None
                    deleted = any(ev.type == "delete" for ev in batch.events)
            finally:
                self._session._waiters.remove(watch)
                await watch.close()

    async def _exists(self, kv: Any) -> bool:
        """Whether ``kv``'s key still exists as the same incarnation."""
        now = await self._conn.call("Range", _txn.range_request(kv.key), idempotent=True)
        return bool(now.kvs and now.kvs[0].create_revision == kv.create_revision)

    async def _abandon(self, my_key: bytes, my_rev: int) -> None:
        """Delete our queued key (guarded) after giving up; never masks the cause."""
        self._token = None
        self._create_revision = 0
        try:
            await self._conn.call("Txn", _txn.guarded_delete(my_key, my_rev), idempotent=True)
        except EtcdfenceError:
            pass  # the lease expiry removes it anyway

    async def _give_up(self) -> bool:
        """Delete our key if it is still the incarnation we created; True if it was."""
        rev = self._create_revision
        token = self._token
        self._token = None
        self._create_revision = 0
        if not rev or token is None or token.key is None:
            return False
        response = await self._conn.call(
            "Txn", _txn.guarded_delete(token.key.encode("utf-8"), rev), idempotent=True
        )
        return bool(response.succeeded)

    async def _holds(self) -> bool:
        """Ask etcd whether our key exists with our create revision and is first."""
        token = self._token
        if token is None or token.key is None or self._session.expired:
            return False
        read = await self._conn.call(
            "Txn", _txn.ownership_read(token.key.encode("utf-8"), self._prefix), idempotent=True
        )
        mine = read.responses[0].response_range.kvs
        owner = read.responses[1].response_range.kvs
        return bool(
            mine
            and mine[0].create_revision == self._create_revision
            and owner
            and owner[0].create_revision == self._create_revision
            and not self._session.expired
        )

    def __repr__(self) -> str:
        held = "held" if self._token is not None else "not held"
        return f"<{type(self).__name__} {self.name!r} {held}>"

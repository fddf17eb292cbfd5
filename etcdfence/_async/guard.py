"""The resource-side guard for data stored in etcd: the resource decides, not the writer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import _txn, metrics
from .._keys import (
    DEFAULT_FENCE_PREFIX,
    decode_mark_epoch,
    fence_key,
    to_bytes,
    to_key,
    validate_name,
)
from .._log import log
from .._txn import Delete, Put
from ..epochs import WriterEpochs, lost_attempt
from ..errors import (
    AuthError,
    EtcdfenceError,
    EtcdUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
    NotOwnerError,
    OutcomeUnknownError,
    StaleTokenError,
    TLSError,
)
from ..token import FencingToken, coerce_token

if TYPE_CHECKING:
    from .client import AsyncClient


#: How often a write re-tries after adopting a higher epoch of its own term (another
#: writer of the term fenced off an attempt); each retry follows a proven rejection.
_ADOPT_ATTEMPTS = 8
#: How long the guard tries to fence off a write whose outcome it lost, before raising.
_QUICK_FENCE_OFF = 1.0


class AsyncFenceGuard:
    """Protects writes to etcd-stored data with a fencing high-water mark.

    The mark of ``resource`` lives at ``<prefix><resource>``. Every guarded write is
    one txn: if the mark is above the writer's ``(token, epoch)`` nothing is written
    and :class:`StaleTokenError` is raised (for a lower token); otherwise the mark
    advances and the writes apply, atomically. Equal tokens pass (one term writes
    many times). With ``require_owner=True`` the txn also requires the token's
    lock/leader key to still exist with its create revision (:class:`NotOwnerError`
    otherwise) — still one round trip.

    **Within a term, writes are ordered too.** The mark carries an *epoch* after the
    token. A write whose outcome is unknown (no reply: timeout, a member cut off,
    cancellation) moves this writer to the next epoch before the error reaches you,
    so the lost attempt can never apply after a later write of this writer — even if
    its bytes reach etcd much later. The guard also tries to *fence it off* at once
    (raise the mark's epoch); :class:`OutcomeUnknownError` says whether that worked. If
    not, call :meth:`fence_off` — it returns only once the attempt can no longer
    apply — then re-read and decide. Writers of one term in other objects or
    processes adopt a higher epoch of their token when they meet it, and retry.

    Use ``client.fence("config/db")`` to get one; share it between the threads or
    tasks of one writer.
    """

    def __init__(
        self,
        client: AsyncClient,
        resource: str,
        *,
        prefix: str = DEFAULT_FENCE_PREFIX,
        require_owner: bool = False,
    ) -> None:
        self.resource = validate_name(resource, "resource")
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgumentError("prefix must be a non-empty str")
        self.prefix = prefix
        self.require_owner = bool(require_owner)
        self._client = client
        self._conn = client.connection
        self.key = fence_key(prefix, self.resource)
        self._reserved = to_bytes(prefix, "prefix")
        self._epochs = WriterEpochs()

    def epoch(self, token: FencingToken | int) -> int:
        """The epoch this writer's next write with ``token`` carries (0 until an
        outcome was lost or a higher epoch of the term was met)."""
        return self._epochs.get(coerce_token(token))

    async def txn(self, token: FencingToken | int, ops: list[Put | Delete]) -> int:
        """Apply ``ops`` atomically if ``token`` is not stale; return the revision.

        Raises :class:`StaleTokenError` (nothing written) when the resource already
        accepted a higher token, and :class:`OutcomeUnknownError` when no answer came back
        (see the class docstring: never resend blindly; :meth:`fence_off` first).
        """
        value = coerce_token(token)
        wire_ops = _txn.user_ops(ops, reserved=self._reserved)
        owner = self._owner(token)
        for _ in range(_ADOPT_ATTEMPTS):
            epoch = self._epochs.get(value)
            started = time.perf_counter()
            response = await self._send(value, epoch, wire_ops, owner, ops)
            elapsed = time.perf_counter() - started
            if response.succeeded:  # the mark is above (token, epoch): nothing written
                kvs = response.responses[0].response_range.kvs
                current, current_epoch = decode_mark_epoch(kvs[0].value) if kvs else (0, 0)
                if current == value and current_epoch > epoch:
                    self._epochs.adopt(value, current_epoch)  # a writer of our term fenced off
                    log.debug(
                        "etcdfence.epoch_adopted",
                        resource=self.resource,
                        token=value,
                        epoch=current_epoch,
                    )
                    continue
                metrics.fence_rejected(self.resource, value, current, elapsed, "etcd")
                raise StaleTokenError(self.resource, value, current)
            if owner is not None and not response.responses[0].response_txn.succeeded:
                raise NotOwnerError(
                    f"token {value} for {self.resource!r} is from {owner[0].decode()} which no "
                    "longer holds its lock/leadership; nothing was written"
                )
            metrics.fence_accepted(self.resource, value, elapsed, "etcd")
            revision: int = response.header.revision
            return revision
        raise OutcomeUnknownError(
            f"writers of token {value} on {self.resource!r} keep raising the epoch; "
            "nothing was written",
            resource=self.resource,
            token=value,
            epoch=self._epochs.get(value),
            fenced_off=True,
        )

    def _owner(self, token: FencingToken | int) -> tuple[bytes, int] | None:
        if not self.require_owner:
            return None
        if not isinstance(token, FencingToken) or token.key is None or not token.create_revision:
            raise InvalidTypeError(
                "require_owner=True needs a FencingToken from a lock or election "
                "(with key and create_revision)"
            )
        return (token.key.encode("utf-8"), token.create_revision)

    async def _send(
        self,
        value: int,
        epoch: int,
        wire_ops: list[Any],
        owner: tuple[bytes, int] | None,
        ops: list[Put | Delete],
    ) -> Any:
        """One guarded txn. A lost answer moves the writer past ``epoch`` first."""
        request = _txn.fence_txn(self.key, value, wire_ops, owner, epoch=epoch)
        try:
            return await self._conn.call("Txn", request)
        except AuthError as err:
            if "permission denied" not in str(err):
                raise
            raise AuthError(f"{err}; {self._needs(ops, owner)}") from None
        except TLSError:
            raise  # refused at the handshake: nothing was sent
        except EtcdUnavailableError as err:
            next_epoch = self._epochs.bump(value, epoch)
            fenced = await self._quick_fence_off(value, next_epoch)
            raise lost_attempt(self.resource, value, epoch, next_epoch, fenced, err) from None
        except BaseException:  # cancelled or interrupted in flight: the outcome is unknown
            self._epochs.bump(value, epoch)
            raise

    async def _quick_fence_off(self, value: int, epoch: int) -> bool:
        """Try once, briefly, to raise the mark to ``(value, epoch)``."""
        try:
            await self._advance_mark(
                value, epoch, timeout=min(_QUICK_FENCE_OFF, self._conn.timeout)
            )
        except StaleTokenError:
            return True  # a higher token fenced every attempt of ours off already
        except EtcdfenceError:
            return False
        return True

    async def _advance_mark(self, value: int, epoch: int, *, timeout: float | None) -> None:
        """Raise the mark to at least ``(value, epoch)``; idempotent, so it is retried."""
        while True:
            request = _txn.fence_txn(self.key, value, [], None, epoch=epoch)
            response = await self._conn.call("Txn", request, timeout=timeout, idempotent=True)
            if not response.succeeded:
                self._epochs.adopt(value, epoch)
                return
            kvs = response.responses[0].response_range.kvs
            current, current_epoch = decode_mark_epoch(kvs[0].value) if kvs else (0, 0)
            if current > value:
                raise StaleTokenError(self.resource, value, current)
            self._epochs.adopt(value, current_epoch)
            return  # the mark is already past (value, epoch)

    async def fence_off(self, token: FencingToken | int) -> None:
        """Make sure no earlier attempt of this writer with ``token`` can apply any
        more; return only once that holds.

        Raises the mark to ``(token, epoch + 1)`` (idempotent, retried until the
        client's timeout). After it returns, a re-read of the guarded data is final:
        use it after :class:`OutcomeUnknownError` whose ``fenced_off`` is False, or before
        deciding anything from data a lost write may have touched. Raises
        :class:`StaleTokenError` if a higher token owns the resource now (every
        attempt of ours is then rejected anyway).
        """
        value = coerce_token(token)
        epoch = self._epochs.bump(value, self._epochs.get(value))
        await self._advance_mark(value, epoch, timeout=None)

    def _needs(self, ops: list[Put | Delete], owner: tuple[bytes, int] | None) -> str:
        """The permissions a guarded write needs, for a permission-denied message."""
        keys = ", ".join(repr(to_key(op.key).decode("utf-8", "replace")) for op in ops)
        needs = f"a guarded write to {self.resource!r} needs readwrite on its mark "
        needs += repr(self.key.decode("utf-8", "replace"))
        if keys:
            needs += f" and write on {keys}"
        if owner is not None:
            needs += f" and read on {owner[0].decode()!r}"
        return needs + " (nothing was written)"

    async def put(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` if ``token`` is not stale (one txn); returns the revision."""
        return await self.txn(token, [Put(key, value)])

    async def delete(self, token: FencingToken | int, key: str | bytes) -> int:
        """Delete ``key`` if ``token`` is not stale (one txn); returns the revision."""
        return await self.txn(token, [Delete(key)])

    async def advance(self, token: FencingToken | int) -> None:
        """Raise the mark to ``token`` without a data write (fence off older writers
        right after winning, before the first real write)."""
        await self.txn(token, [])

    async def current(self) -> int:
        """The high-water mark: the highest token accepted so far, 0 if none."""
        return (await self.current_mark())[0]

    async def current_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none (0.1 marks read as epoch 0)."""
        kv = await self._client.get(self.key)
        return (0, 0) if kv is None else decode_mark_epoch(kv.value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.resource!r} at {self.key.decode()!r}>"

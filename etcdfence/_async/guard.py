"""The resource-side guard for data stored in etcd: the resource decides, not the writer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import _txn, metrics
from .._keys import DEFAULT_FENCE_PREFIX, decode_mark, fence_key, to_key, validate_name
from .._txn import Delete, Put
from ..errors import AuthError, InvalidArgument, InvalidType, NotOwnerError, StaleTokenError
from ..token import FencingToken, coerce_token

if TYPE_CHECKING:
    from .client import AsyncClient


class AsyncFenceGuard:
    """Protects writes to etcd-stored data with a fencing high-water mark.

    The mark of ``resource`` lives at ``<prefix><resource>`` as a 20-digit
    decimal. Every guarded write is one txn: if the mark is above the writer's
    token nothing is written and :class:`StaleTokenError` is raised; otherwise
    the mark advances to the token and the writes apply, atomically. Equal
    tokens pass (one term writes many times). With ``require_owner=True`` the
    txn also requires the token's lock/leader key to still exist with its create
    revision (:class:`NotOwnerError` otherwise) — still one round trip.

    Use ``client.fence("config/db")`` to get one; it holds no state beyond names.
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
            raise InvalidArgument("prefix must be a non-empty str")
        self.prefix = prefix
        self.require_owner = bool(require_owner)
        self._client = client
        self._conn = client._conn
        self.key = fence_key(prefix, self.resource)

    async def txn(self, token: FencingToken | int, ops: list[Put | Delete]) -> int:
        """Apply ``ops`` atomically if ``token`` is not stale; return the revision.

        Raises :class:`StaleTokenError` (nothing written) when the resource already
        accepted a higher token.
        """
        value = coerce_token(token)
        wire_ops = _txn.user_ops(ops, reserved=self.prefix.encode("utf-8"))
        owner = None
        if self.require_owner:
            if (
                not isinstance(token, FencingToken)
                or token.key is None
                or not token.create_revision
            ):
                raise InvalidType(
                    "require_owner=True needs a FencingToken from a lock or election "
                    "(with key and create_revision)"
                )
            owner = (token.key.encode("utf-8"), token.create_revision)
        started = time.perf_counter()
        try:
            response = await self._conn.call(
                "Txn", _txn.fence_txn(self.key, value, wire_ops, owner)
            )
        except AuthError as err:
            if "permission denied" not in str(err):
                raise
            raise AuthError(f"{err}; {self._needs(ops, owner)}") from None
        elapsed = time.perf_counter() - started
        if response.succeeded:
            kvs = response.responses[0].response_range.kvs
            current = decode_mark(kvs[0].value) if kvs else 0
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
        kv = await self._client.get(self.key)
        return 0 if kv is None else decode_mark(kv.value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.resource!r} at {self.key.decode()!r}>"

"""The one shape every fence has: :class:`Fence` (blocking) and :class:`AsyncFence`.

Use these as the type of a parameter that takes "any fence": code written against
:class:`Fence` works with the etcd guard, the Redis fence and the SQL fence alike, and
the shared tests and the conformance kit drive every backend through it.

A fence is bound to one *resource* (the thing whose writes it orders) when it is made.
Every method takes the writer's token first; every backend raises the same errors:

* :class:`~etcdfence.errors.StaleTokenError` — a higher token owns the resource;
  nothing was written;
* :class:`~etcdfence.errors.KeyExistsError` — a :class:`~etcdfence.fence.ops.Create`
  found its key (the token was not stale); nothing was written, the mark did not move;
* :class:`~etcdfence.errors.OutcomeUnknownError` — the store did not answer; the write
  may or may not have applied (its ``fenced_off`` says whether it still can);
* :class:`~etcdfence.errors.UnavailableError` / :class:`~etcdfence.errors.RequestError`
  — the store could not be reached / refused the request; nothing was written;
* :class:`~etcdfence.errors.InvalidTokenError` and other
  :class:`~etcdfence.errors.InvalidArgumentError` — bad input, refused before any I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..token import FencingToken
from .ops import Op

__all__ = ["AsyncFence", "Fence", "TokenLike"]

#: What a fence accepts as a token: the token a lock or election returned, or its value.
TokenLike = FencingToken | int


@runtime_checkable
class Fence(Protocol):
    """A resource-side fence, blocking API (see the module docstring)."""

    @property
    def resource(self) -> str:
        """The resource this fence orders writes of."""
        ...

    def put(self, token: TokenLike, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` if ``token`` is not stale; returns the resource's version after
        the write (an int that grows with every accepted write; etcd: its revision)."""
        ...

    def delete(self, token: TokenLike, key: str | bytes) -> int:
        """Delete ``key`` if ``token`` is not stale; returns the version, as :meth:`put`."""
        ...

    def create(self, token: TokenLike, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` if ``token`` is not stale and ``key`` does not exist yet;
        returns the version, as :meth:`put`. An effect that must apply once per id:
        ``txn(token, [Create(id_key, ...), Put(...)])``."""
        ...

    def txn(self, token: TokenLike, ops: Sequence[Op]) -> int:
        """Apply ``ops`` (:class:`~etcdfence.fence.ops.Put`, ``Delete``, ``Create``)
        atomically if ``token`` is not stale; returns the version."""
        ...

    def advance(self, token: TokenLike) -> None:
        """Raise the mark to ``token`` without a data write (a new leader fences older
        writers off before its first real write)."""
        ...

    def current(self) -> int:
        """The highest token the resource accepted so far; 0 if none."""
        ...

    def current_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none."""
        ...

    def fence_off(self, token: TokenLike, *, timeout: float | None = None) -> int:
        """Return only once no earlier attempt with ``token`` — of any writer of the
        term — can apply any more; returns the epoch this fence claimed for its next
        writes. ``timeout`` (seconds; ``None``: the backend's request timeout, retried)
        bounds the wait: :class:`~etcdfence.errors.OutcomeUnknownError` after it."""
        ...


@runtime_checkable
class AsyncFence(Protocol):
    """A resource-side fence, asyncio API: :class:`Fence` with coroutine methods."""

    @property
    def resource(self) -> str:
        """The resource this fence orders writes of."""
        ...

    async def put(self, token: TokenLike, key: str | bytes, value: str | bytes) -> int:
        """See :meth:`Fence.put`."""
        ...

    async def delete(self, token: TokenLike, key: str | bytes) -> int:
        """See :meth:`Fence.delete`."""
        ...

    async def create(self, token: TokenLike, key: str | bytes, value: str | bytes) -> int:
        """See :meth:`Fence.create`."""
        ...

    async def txn(self, token: TokenLike, ops: Sequence[Op]) -> int:
        """See :meth:`Fence.txn`."""
        ...

    async def advance(self, token: TokenLike) -> None:
        """See :meth:`Fence.advance`."""
        ...

    async def current(self) -> int:
        """See :meth:`Fence.current`."""
        ...

    async def current_mark(self) -> tuple[int, int]:
        """See :meth:`Fence.current_mark`."""
        ...

    async def fence_off(self, token: TokenLike, *, timeout: float | None = None) -> int:
        """See :meth:`Fence.fence_off`."""
        ...

"""The fence: resource-side fencing, one concept in one place.

A lock or election hands its holder a *token* (the etcd revision that confirmed the
term). Every write the holder makes carries it, and the *resource* keeps a durable mark
and refuses a token below it — so a leader that was paused or cut off past its lease
cannot corrupt data after a newer leader wrote, whatever it still believes.

This package holds that idea once:

* :mod:`etcdfence.fence.base` — :class:`Fence` / :class:`AsyncFence`, the one shape
  every backend has (``put``, ``delete``, ``txn``, ``advance``, ``current``,
  ``current_mark``, ``fence_off``);
* :mod:`etcdfence.fence.ops` — :class:`Put` / :class:`Delete` / :class:`Create`, the
  writes they apply;
* :mod:`etcdfence.fence.epochs` — the within-term protocol (epochs claimed at the
  mark, adopt-and-retry, the quick fence-off after a lost answer) and its constants;
* one module per backend (etcd, Redis, SQL, the HTTP gates).
"""

from __future__ import annotations

from .base import AsyncFence, Fence, TokenLike
from .ops import Create, Delete, Op, Put

__all__ = ["AsyncFence", "Create", "Delete", "Fence", "Op", "Put", "TokenLike"]

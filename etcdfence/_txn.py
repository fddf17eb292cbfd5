"""Pure builders of etcd requests shared by both sides: compares, ops, txns.

Nothing here does I/O. The lock/election acquire txn and the fence guard txn are
assembled here so that the sync and async implementations send byte-identical
requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._keys import encode_mark, prefix_range_end, to_bytes, to_key
from ._wire import messages as m
from .errors import InvalidArgumentError, InvalidTypeError


@dataclass(frozen=True)
class Put:
    """A put to apply atomically with a fence check: ``guard.txn(token, [Put(k, v)])``."""

    key: str | bytes
    value: str | bytes
    lease_id: int = 0


@dataclass(frozen=True)
class Delete:
    """A delete to apply atomically with a fence check; ``prefix=True`` deletes a range."""

    key: str | bytes
    prefix: bool = False


def range_request(
    key: bytes,
    *,
    prefix: bool = False,
    first_created: bool = False,
    last_created_below: int | None = None,
    revision: int = 0,
    keys_only: bool = False,
    count_only: bool = False,
    limit: int = 0,
) -> Any:
    """A RangeRequest; ``first_created`` is Go's ``WithFirstCreate()``."""
    req = m.RangeRequest(
        key=key, revision=revision, keys_only=keys_only, count_only=count_only, limit=limit
    )
    if prefix:
        req.range_end = prefix_range_end(key)
    if first_created:
        req.sort_target = m.SortTarget.CREATE
        req.sort_order = m.SortOrder.ASCEND
        req.limit = 1
    if last_created_below is not None:
        req.sort_target = m.SortTarget.CREATE
        req.sort_order = m.SortOrder.DESCEND
        req.max_create_revision = last_created_below - 1
        req.limit = 1
    return req


def op_range(req: Any) -> Any:
    return m.RequestOp(request_range=req)


def op_put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return m.RequestOp(request_put=m.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes, prefix: bool = False) -> Any:
    req = m.DeleteRangeRequest(key=key)
    if prefix:
        req.range_end = prefix_range_end(key)
    return m.RequestOp(request_delete_range=req)


def cmp_create(key: bytes, revision: int) -> Any:
    """``create_revision(key) == revision`` (0 means "key does not exist")."""
    return m.Compare(
        key=key,
        target=m.CompareTarget.CREATE,
        result=m.CompareResult.EQUAL,
        create_revision=revision,
    )


def acquire_txn(my_key: bytes, value: bytes, lease: int, prefix: bytes) -> Any:
    """The one-round-trip acquire of Go's Mutex/Election and etcdctl.

    ``If(create_revision(my_key) == 0) Then(Put(my_key, value, lease), Range(first
    created under prefix)) Else(Range(my_key), Range(first created))``. Retrying it
    is idempotent because ``my_key`` is derived from the lease.
    """
    owner = op_range(range_request(prefix, prefix=True, first_created=True))
    return m.TxnRequest(
        compare=[cmp_create(my_key, 0)],
        success=[op_put(my_key, value, lease), owner],
        failure=[op_range(range_request(my_key)), owner],
    )


def enqueue_txn(my_key: bytes, value: bytes, lease: int) -> Any:
    """:func:`acquire_txn` without the read of the first-created key, for a waiter that
    learns its turn from its client's queue view (``_async/queue.py``): that read
    sorts the whole queue inside etcd, O(N) per call."""
    return m.TxnRequest(
        compare=[cmp_create(my_key, 0)],
        success=[op_put(my_key, value, lease)],
        failure=[op_range(range_request(my_key))],
    )


def own_key_read(my_key: bytes) -> Any:
    """A read-only txn of my key alone (a crowd waiter's confirmation, O(1) for etcd)."""
    return m.TxnRequest(success=[op_range(range_request(my_key))])


def enqueued_revision(response: Any) -> int | None:
    """Our key's create revision from an :func:`acquire_txn` response (``None`` if no
    response arrived)."""
    if response is None:
        return None
    if response.succeeded:
        return int(response.header.revision)
    mine = response.responses[0].response_range.kvs
    return int(mine[0].create_revision) if mine else None


def ownership_read(my_key: bytes, prefix: bytes) -> Any:
    """A read-only txn: my key and the first-created key, at one revision."""
    return m.TxnRequest(
        success=[
            op_range(range_request(my_key)),
            op_range(range_request(prefix, prefix=True, first_created=True)),
        ]
    )


def queue_read(my_key: bytes, prefix: bytes, my_create_revision: int) -> Any:
    """A read-only txn for a queued contender: my key and the key immediately ahead
    of it (highest create revision below mine), at one revision."""
    return m.TxnRequest(
        success=[
            op_range(range_request(my_key)),
            op_range(range_request(prefix, prefix=True, last_created_below=my_create_revision)),
        ]
    )


def guarded_delete(key: bytes, create_revision: int) -> Any:
    """Delete ``key`` only if it is still the incarnation created at ``create_revision``."""
    return m.TxnRequest(compare=[cmp_create(key, create_revision)], success=[op_delete(key)])


def guarded_put(key: bytes, value: bytes, lease: int, create_revision: int) -> Any:
    """Overwrite ``key`` only while it is the incarnation created at ``create_revision``."""
    return m.TxnRequest(
        compare=[cmp_create(key, create_revision)], success=[op_put(key, value, lease)]
    )


def user_ops(ops: object, reserved: bytes | None = None) -> list[Any]:
    """Validate ``[Put(...), Delete(...)]`` and turn them into RequestOps.

    ``reserved`` is a key prefix the ops must not touch at all — a guard passes the
    fence prefix in use, where every resource's mark lives. Any Put of a key under
    it, and any Delete whose key or range overlaps it, is refused: a guarded write
    to one resource must never move (or wipe) the mark of another, or its own.
    """
    if isinstance(ops, (Put, Delete)) or not isinstance(ops, (list, tuple)):
        raise InvalidTypeError("ops must be a list of etcdfence.Put / etcdfence.Delete")
    out = []
    for op in ops:
        if not isinstance(op, (Put, Delete)):
            raise InvalidTypeError(f"ops must be Put or Delete, got {type(op).__name__}")
        key = to_key(op.key)
        end = prefix_range_end(key) if isinstance(op, Delete) and op.prefix else key + b"\x00"
        if reserved is not None and _overlaps(key, end, reserved, prefix_range_end(reserved)):
            raise InvalidArgumentError(
                f"ops must not touch fence marks: {key!r} is under (or its range overlaps) "
                f"the fence prefix {reserved!r}"
            )
        if isinstance(op, Put):
            out.append(op_put(key, to_bytes(op.value, "value"), op.lease_id))
        else:
            out.append(op_delete(key, op.prefix))
    return out


def _overlaps(start: bytes, end: bytes, other_start: bytes, other_end: bytes) -> bool:
    """Whether ``[start, end)`` and ``[other_start, other_end)`` share a key (an end of
    ``b"\\x00"`` means "to the end of the keyspace", as in etcd)."""
    before_other_end = other_end == b"\x00" or start < other_end
    other_before_end = end == b"\x00" or other_start < end
    return before_other_end and other_before_end


def fence_txn(
    fence_key: bytes,
    token: int,
    ops: list[Any],
    owner: tuple[bytes, int] | None = None,
    *,
    epoch: int = 0,
) -> Any:
    """The guard txn: one round trip that checks, advances the mark and writes.

    Outer: ``If(value(fence) > token) Then(Range(fence)) Else(<inner>)``. Without an
    owner check the inner part is just ``Put(fence, token), ops``. With
    ``owner=(key, create_revision)`` the Else branch is a nested txn
    ``If(create_revision(key) == rev) Then(Put(fence, token), ops) Else(Range(key))``
    so a writer that lost its lock writes nothing, still in one round trip.

    The mark compared and written is ``(token, epoch)`` (:func:`~etcdfence._keys.encode_mark`):
    one fixed-width value, so the within-term epoch costs nothing extra on the wire.
    """
    # Built in place with add(): constructing nested messages and passing them to a
    # parent copies each one, which made this the costliest Python step of a guarded
    # write. The bytes on the wire are the same.
    mark = encode_mark(token, epoch)
    txn = m.TxnRequest()
    stale = txn.compare.add()
    stale.key, stale.value = fence_key, mark
    stale.target, stale.result = m.CompareTarget.VALUE, m.CompareResult.GREATER
    txn.success.add().request_range.key = fence_key
    if owner is None:
        accepted = txn.failure
    else:
        owner_key, owner_rev = owner
        inner = txn.failure.add().request_txn
        held = inner.compare.add()
        held.key, held.create_revision = owner_key, owner_rev
        held.target, held.result = m.CompareTarget.CREATE, m.CompareResult.EQUAL
        inner.failure.add().request_range.key = owner_key
        accepted = inner.success
    put = accepted.add().request_put
    put.key, put.value = fence_key, mark
    accepted.extend(ops)
    return txn

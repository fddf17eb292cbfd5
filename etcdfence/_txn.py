"""Pure builders of etcd requests shared by both sides: compares, ops, txns.

Nothing here does I/O. The lock/election acquire txn and the fence guard txn are
assembled here so that the sync and async implementations send byte-identical
requests.
"""

from __future__ import annotations

from typing import Any

from ._keys import check_lease_id, encode_mark, prefix_range_end, to_bytes, to_key
from ._wire import messages as m
from .errors import ConsistencyError, InvalidArgumentError, InvalidTypeError
from .fence.ops import Create, Delete, Put, check_creates


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


def acquire_txn(
    my_key: bytes, value: bytes, lease: int, prefix: bytes, permits: int = 1, values: bool = False
) -> Any:
    """The one-round-trip acquire of Go's Mutex/Election and etcdctl.

    ``If(create_revision(my_key) == 0) Then(Put(my_key, value, lease), Range(first
    created under prefix)) Else(Range(my_key), Range(first created))``. Retrying it
    is idempotent because ``my_key`` is derived from the lease. ``permits`` > 1 (a
    semaphore) reads the first ``permits`` created keys instead of the first (with
    their values when ``values``: a semaphore's record its permits).
    """
    owner = op_range(first_created(prefix, permits, keys_only=not values and permits > 1))
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


def ownership_read(my_key: bytes, prefix: bytes, permits: int = 1) -> Any:
    """A read-only txn: my key and the first-created key (the first ``permits``), at
    one revision."""
    return m.TxnRequest(
        success=[op_range(range_request(my_key)), op_range(first_created(prefix, permits))]
    )


def first_created(prefix: bytes, count: int = 1, keys_only: bool | None = None) -> Any:
    """A range of the ``count`` first-created keys under ``prefix`` (by default keys
    only when more than one: only their create revisions matter)."""
    if keys_only is None:
        keys_only = count > 1
    request = range_request(prefix, prefix=True, first_created=True, keys_only=keys_only)
    request.limit = count
    return request


def admitted(first: Any, my_create_revision: int, permits: int = 1) -> bool:
    """Whether fewer than ``permits`` of ``first`` (the first-created keys of a wait
    prefix, as read by :func:`first_created`) were created before ours: the one rule of
    every queue (a mutex's key is the first; a reader's has no writer before it; a
    semaphore's is among the first ``permits``)."""
    ahead = sum(1 for kv in first if kv.create_revision < my_create_revision)
    return ahead < permits


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


def stale_key_delete(key: bytes, create_revision: int, lease: int, value: bytes) -> Any:
    """Delete ``key`` only if it is still exactly what was read: the incarnation created
    at ``create_revision``, attached to ``lease``, holding ``value`` (a candidate's own
    key from an earlier lease, taken back; never another holder's)."""
    return m.TxnRequest(
        compare=[
            cmp_create(key, create_revision),
            m.Compare(
                key=key, target=m.CompareTarget.LEASE, result=m.CompareResult.EQUAL, lease=lease
            ),
            m.Compare(
                key=key, target=m.CompareTarget.VALUE, result=m.CompareResult.EQUAL, value=value
            ),
        ],
        success=[op_delete(key)],
    )


def guarded_put(key: bytes, value: bytes, lease: int, create_revision: int) -> Any:
    """Overwrite ``key`` only while it is the incarnation created at ``create_revision``."""
    return m.TxnRequest(
        compare=[cmp_create(key, create_revision)], success=[op_put(key, value, lease)]
    )


def user_ops(ops: object, reserved: bytes | None = None) -> list[Any]:
    """Validate ``[Put(...), Delete(...), Create(...)]`` and turn them into RequestOps
    (a Create is a put here: its "absent" compare is :func:`created_keys`'s, in the
    guard's nested txn).

    ``reserved`` is a key prefix the ops must not touch at all — a guard passes the
    fence prefix in use, where every resource's mark lives. Any Put of a key under
    it, and any Delete whose key or range overlaps it, is refused: a guarded write
    to one resource must never move (or wipe) the mark of another, or its own.
    """
    if isinstance(ops, (Put, Delete, Create)) or not isinstance(ops, (list, tuple)):
        raise InvalidTypeError("ops must be a list of etcdfence.Put / Delete / Create")
    out = []
    keys = []
    for op in ops:
        if not isinstance(op, (Put, Delete, Create)):
            raise InvalidTypeError(f"ops must be Put, Delete or Create, got {type(op).__name__}")
        key = to_key(op.key)
        keys.append(key)
        end = prefix_range_end(key) if isinstance(op, Delete) and op.prefix else key + b"\x00"
        if reserved is not None and _overlaps(key, end, reserved, prefix_range_end(reserved)):
            raise InvalidArgumentError(
                f"ops must not touch fence marks: {key!r} is under (or its range overlaps) "
                f"the fence prefix {reserved!r}"
            )
        if isinstance(op, Put):
            value = to_bytes(op.value, "value")
            out.append(op_put(key, value, check_lease_id(op.lease_id)))
        elif isinstance(op, Create):
            out.append(op_put(key, to_bytes(op.value, "value")))
        else:
            out.append(op_delete(key, op.prefix))
    check_creates(ops, keys)
    return out


#: etcd's default ``--max-txn-ops`` (``embed.DefaultMaxTxnOps``): the most entries one
#: level of a txn may have in its compare list or in either branch; a nested txn's
#: levels count against the budget its parents left.
MAX_TXN_OPS = 128


def check_op_count(count: int, nested: bool, max_txn_ops: int = MAX_TXN_OPS) -> None:
    """Refuse (:class:`InvalidArgumentError`, before any I/O) a guarded write of
    ``count`` user ops that etcd would refuse as "too many operations in txn request".

    The guard's txn puts the mark beside the ops, so a flat one (no owner check, no
    Create) takes ``max_txn_ops - 1`` ops; a ``nested`` one (``require_owner`` or a
    Create: the ops go into a txn inside the outer one, which uses one entry of the
    budget) takes ``max_txn_ops - 2`` (its compares and reads, one per Create plus the
    owner's, are never more than its ops plus the mark put)."""
    limit = max_txn_ops - (2 if nested else 1)
    if count > limit:
        shape = "with a Create or require_owner (a nested txn)" if nested else "without"
        raise InvalidArgumentError(
            f"a guarded write to etcd {shape} takes at most {limit} ops, got {count}: "
            f"etcd refuses more than --max-txn-ops={max_txn_ops} per txn level, and the "
            "guard's own mark put (and nested check) take the rest; nothing was sent"
        )


def created_keys(ops: list[Any] | tuple[Any, ...]) -> list[tuple[bytes, Create]]:
    """The :class:`Create` ops of ``ops`` (already checked by :func:`user_ops`), each
    with its key as sent."""
    return [(to_key(op.key), op) for op in ops if isinstance(op, Create)]


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
    creates: list[bytes] | None = None,
) -> Any:
    """The guard txn: one round trip that checks, advances the mark and writes.

    Outer: ``If(value(fence) > token) Then(Range(fence)) Else(<inner>)``. Without an
    owner check the inner part is just ``Put(fence, token), ops``. With
    ``owner=(key, create_revision)`` the Else branch is a nested txn
    ``If(create_revision(key) == rev) Then(Put(fence, token), ops) Else(Range(key))``
    so a writer that lost its lock writes nothing, still in one round trip. ``creates``
    (the keys of the :class:`Create` ops) join that nested compare as
    ``create_revision(key) == 0``, and its Else branch reads each of them
    (:func:`_checked`): a Create whose key exists writes nothing, the mark included.

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
    accepted = _checked(txn.failure, owner, creates)
    put = accepted.add().request_put
    put.key, put.value = fence_key, mark
    accepted.extend(ops)
    return txn


def claim_txn(
    fence_key: bytes,
    mod_revision: int,
    mark: bytes,
    ops: list[Any] | None = None,
    owner: tuple[bytes, int] | None = None,
    creates: list[bytes] | None = None,
) -> Any:
    """A writer's claim of an epoch (:mod:`etcdfence.fence.epochs`), with the writes that
    go with it: ``If(mod_revision(fence) == mod_revision) Then(Put(fence, mark), ops)
    Else(Range(fence))``. The mark moves only if nothing wrote it since it was read at
    ``mod_revision`` (0: it does not exist), so two claims never get one epoch, and a
    claim that lands late moves nothing. With ``owner`` the Then branch is the nested
    owner check of :func:`fence_txn` (and its ``creates`` compares): a writer that lost
    its lock, or whose Create found its key, claims nothing."""
    txn = m.TxnRequest()
    same = txn.compare.add()
    same.key, same.mod_revision = fence_key, mod_revision
    same.target, same.result = m.CompareTarget.MOD, m.CompareResult.EQUAL
    accepted = _checked(txn.success, owner, creates)
    put = accepted.add().request_put
    put.key, put.value = fence_key, mark
    if ops:
        accepted.extend(ops)
    txn.failure.add().request_range.key = fence_key
    return txn


def _checked(branch: Any, owner: tuple[bytes, int] | None, creates: list[bytes] | None) -> Any:
    """Where a guarded write's ops go in ``branch``: the branch itself, or the success
    branch of a nested ``If(create_revision(owner) == rev, create_revision(c) == 0 for
    each created key c) ... Else(Range(owner), Range(c) ...)`` — the Else reads tell
    a lost lock from an existing key (:func:`refused_inside`) in the same round trip."""
    if owner is None and not creates:
        return branch
    inner = branch.add().request_txn
    if owner is not None:
        owner_key, owner_rev = owner
        held = inner.compare.add()
        held.key, held.create_revision = owner_key, owner_rev
        held.target, held.result = m.CompareTarget.CREATE, m.CompareResult.EQUAL
        inner.failure.add().request_range.key = owner_key
    for key in creates or ():
        absent = inner.compare.add()
        absent.key, absent.create_revision = key, 0
        absent.target, absent.result = m.CompareTarget.CREATE, m.CompareResult.EQUAL
        inner.failure.add().request_range.key = key
    return inner.success


def refused_inside(
    inner: Any, owner: tuple[bytes, int] | None, creates: list[bytes]
) -> tuple[str, Any]:
    """Why the nested txn of :func:`_checked` (``inner``, a TxnResponse) wrote nothing:
    ``("owner", None)`` when the owner key is gone or re-created (checked first: a
    writer that lost its lock learns nothing about the data), ``("exists", kv)`` with
    the first created key that exists, ``("", None)`` when it applied."""
    if inner.succeeded:
        return "", None
    reads = list(inner.responses)
    if owner is not None:
        kvs = reads.pop(0).response_range.kvs
        if not kvs or kvs[0].create_revision != owner[1]:
            return "owner", None
    for read in reads[: len(creates)]:
        kvs = read.response_range.kvs
        if kvs:
            return "exists", kvs[0]
    # the reads run at the revision the compares saw: one of them must show the cause
    raise ConsistencyError("etcd refused a guarded write, yet no compare of it failed")

"""The fence for data stored in etcd: the mark is a key, every write one txn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ... import _txn
from ..._keys import (
    DEFAULT_FENCE_PREFIX,
    decode_mark_epoch,
    encode_mark,
    fence_key,
    to_bytes,
    to_key,
    validate_name,
)
from ...errors import (
    AuthError,
    InvalidArgumentError,
    InvalidTypeError,
    NotOwnerError,
    TLSError,
    UnavailableError,
)
from ...token import FencingToken, coerce_token
from ..ops import Create, Delete, Op, Put, key_exists
from .admit import AsyncAdmission
from .engine import (
    AsyncWriter,
    Lost,
    Repaired,
    Reply,
    check_fence_off_timeout,
    claim_target,
    repair,
)

if TYPE_CHECKING:
    from ..._async.client import AsyncClient


class _Ops:
    """A guarded write's etcd ops, with the owner check, the keys its Creates need
    absent (as sent; ``created`` maps them to their Creates) and what they need (for a
    permission-denied message)."""

    __slots__ = ("created", "creates", "owner", "user", "wire")

    def __init__(self, wire: list[Any], owner: tuple[bytes, int] | None, user: Sequence[Any]):
        self.wire = wire
        self.owner = owner
        self.user = user
        named = _txn.created_keys(list(user))
        self.creates = [raw for raw, _ in named]
        self.created = dict(named)


class _EtcdStore:
    """One resource's mark in etcd, as an engine store: each attempt is one Txn."""

    backend = "etcd"

    def __init__(self, guard: AsyncFenceGuard) -> None:
        self.resource = guard.resource
        self.key = guard.key
        self.prefix = guard.prefix
        self._conn = guard._conn
        self._client = guard._client
        self.timeout: float = self._conn.timeout

    async def read_mark(self) -> tuple[int, int]:
        """See :meth:`~etcdfence.fence._async.engine.AsyncRepairable.read_mark`."""
        kv = await self._client.get(self.key)
        return (0, 0) if kv is None else decode_mark_epoch(kv.value)

    async def lower(self, expected: tuple[int, int], new: tuple[int, int]) -> tuple[int, int]:
        """See :meth:`~etcdfence.fence._async.engine.AsyncRepairable.lower`: a Txn that
        sets the mark only if its mod revision is still the one ``expected`` was read at."""
        kv = await self._client.get(self.key)
        found = (0, 0) if kv is None else decode_mark_epoch(kv.value)
        if kv is None or found != expected:
            return found
        request = _txn.claim_txn(self.key, kv.mod_revision, encode_mark(*new))
        response = await self._conn.call("Txn", request, idempotent=False)
        if response.succeeded:
            return expected
        kvs = response.responses[0].response_range.kvs
        return decode_mark_epoch(kvs[0].value) if kvs else (0, 0)

    async def attempt(
        self,
        token: int,
        epoch: int | None,
        ops: _Ops | None,
        hint: Reply | None,
        timeout: float | None,
    ) -> Reply:
        """See :meth:`~etcdfence.fence._async.engine.AsyncStore.attempt`."""
        wire = None if ops is None else ops.wire
        owner = None if ops is None else ops.owner
        creates = None if ops is None else ops.creates
        if epoch is None:
            seen, (_, written) = claim_target(token, hint)
            mark = encode_mark(token, written)
            request = _txn.claim_txn(self.key, seen, mark, wire, owner, creates)
        else:
            written = epoch
            request = _txn.fence_txn(
                self.key, token, wire or [], owner, epoch=epoch, creates=creates
            )
        try:
            # a bare claim is safe to resend: a resent one that lands late moves nothing
            response = await self._conn.call(
                "Txn", request, timeout=timeout, idempotent=ops is None
            )
        except AuthError as err:
            if "permission denied" not in str(err):
                raise
            raise AuthError(f"{err}; {self._needs(ops)}") from None
        except TLSError:
            raise  # refused at the handshake: nothing was sent
        except UnavailableError as err:
            raise Lost(err) from None
        # a claim applies when its compare held; a write when its "mark above" compare failed
        applied = response.succeeded if epoch is None else not response.succeeded
        if not applied:
            kvs = response.responses[0].response_range.kvs
            current = decode_mark_epoch(kvs[0].value) if kvs else (0, 0)
            return Reply(False, mark=current, seen=kvs[0].mod_revision if kvs else 0)
        if ops is not None and (owner is not None or ops.creates):
            self._inner(token, ops, response.responses[0].response_txn)
        return Reply(True, epoch=written, version=response.header.revision)

    def _inner(self, token: int, ops: _Ops, inner: Any) -> None:
        """Raise when the nested owner / Create check refused the write (the mark did
        not move either: its put is inside)."""
        why, kv = _txn.refused_inside(inner, ops.owner, ops.creates)
        if why == "owner" and ops.owner is not None:
            raise NotOwnerError(
                f"token {token} for {self.resource!r} is from {ops.owner[0].decode()} which "
                "no longer holds its lock/leadership; nothing was written"
            )
        if why == "exists":
            raise key_exists(self.resource, ops.created[kv.key], bytes(kv.value))

    def _needs(self, ops: _Ops | None) -> str:
        """The permissions a guarded write needs, for a permission-denied message."""
        user = [] if ops is None else ops.user
        keys = ", ".join(repr(to_key(op.key).decode("utf-8", "replace")) for op in user)
        needs = f"a guarded write to {self.resource!r} needs readwrite on its mark "
        needs += repr(self.key.decode("utf-8", "replace"))
        if keys:
            needs += f" and write on {keys}"
        if ops is not None and ops.owner is not None:
            needs += f" and read on {ops.owner[0].decode()!r}"
        return needs + " (nothing was written)"


class AsyncFenceGuard:
    """Protects writes to etcd-stored data with a fencing high-water mark.

    The mark of ``resource`` lives at ``<prefix><resource>``. Every guarded write is
    one txn: if the mark is above the writer's ``(token, epoch)`` nothing is written
    and :class:`StaleTokenError` is raised (for a lower token); otherwise the mark
    advances and the writes apply, atomically. Equal tokens pass (one term writes
    many times). With ``require_owner=True`` the txn also requires the token's
    lock/leader key to still exist with its create revision (:class:`NotOwnerError`
    otherwise) — still one round trip.

    Writes within a term are ordered too (:mod:`etcdfence.fence.epochs`): the guard's
    first write with a token claims an epoch in the same txn (a second round trip
    only on a resource whose mark it has not seen yet); a write whose answer is lost
    raises :class:`OutcomeUnknownError` after fencing the attempt off if it could.
    This is the etcd backend of :class:`~etcdfence.fence.base.AsyncFence`.

    With ``lock="jobs/nightly"`` the resource is *bound*
    (:mod:`etcdfence.fence._async.admit`), and every token is checked before anything
    is sent: one of another lock or another etcd cluster, or a bare number with no
    lock, raises :class:`~etcdfence.errors.ForeignTokenError`. Bound or not, a token
    above etcd's current revision raises :class:`~etcdfence.errors.FutureTokenError`
    (known from the client's response headers: one read only when a token is above
    the highest revision seen). Nothing is written then. An unbound guard takes any
    other valid token.
    Binding does not confirm the sequencer: a made-up token of the bound lock at the
    current revision passes unless ``require_owner=True`` (the key and its create
    revision checked in the write's own txn, no extra round trip) — use both on a
    resource that must refuse forged sequencers.

    ``max_txn_ops`` is the cluster's ``--max-txn-ops`` (etcd's default 128): a txn
    with more ops than fit in one guarded write is refused before anything is sent.

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
        lock: str | None = None,
        max_txn_ops: int = _txn.MAX_TXN_OPS,
    ) -> None:
        self.resource = validate_name(resource, "resource")
        if isinstance(max_txn_ops, bool) or not isinstance(max_txn_ops, int):
            raise InvalidTypeError(f"max_txn_ops must be int, got {type(max_txn_ops).__name__}")
        if max_txn_ops < 1:
            raise InvalidArgumentError(f"max_txn_ops must be >= 1, got {max_txn_ops}")
        #: The etcd cluster's ``--max-txn-ops`` (default 128): bounds the ops of a txn.
        self.max_txn_ops = max_txn_ops
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgumentError("prefix must be a non-empty str")
        self.prefix = prefix
        self.require_owner = bool(require_owner)
        self._client = client
        self._conn = client.connection
        self.key = fence_key(prefix, self.resource)
        self._reserved = to_bytes(prefix, "prefix")
        self._store = _EtcdStore(self)
        self._writer = AsyncWriter(self._store)
        # every etcd fence checks revisions (bound ones clusters too) on its client's connection
        self._admission = AsyncAdmission(self.resource, lock=lock, conn=self._conn, probe=self.key)

    @property
    def lock(self) -> str | None:
        """The lock this resource is bound to (``lock=``), ``None`` when unbound."""
        return self._admission.lock

    def epoch(self, token: FencingToken | int) -> int:
        """The epoch this guard claimed last for ``token`` (0 if none yet)."""
        return self._writer.epoch(coerce_token(token))

    async def txn(self, token: FencingToken | int, ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if ``token`` is not stale; return the revision.

        Raises :class:`StaleTokenError` (nothing written) when the resource already
        accepted a higher token, :class:`~etcdfence.errors.KeyExistsError` (nothing
        written, the mark unmoved) when a :class:`~etcdfence.fence.ops.Create`'s key
        exists — ``compare create_revision(key) == 0`` in the same txn, so still one
        round trip — and :class:`OutcomeUnknownError` when no answer came back (see the
        class docstring: never resend blindly; :meth:`fence_off` first). More ops than
        one etcd txn takes (``max_txn_ops`` less what the guard adds: 127 ops, 126 with
        a Create or ``require_owner``, at etcd's default) raise
        :class:`~etcdfence.errors.InvalidArgumentError` before anything is sent.
        """
        prepared = _Ops(_txn.user_ops(ops, reserved=self._reserved), self._owner(token), ops)
        nested = prepared.owner is not None or bool(prepared.creates)
        _txn.check_op_count(len(prepared.wire), nested, self.max_txn_ops)
        value = await self._admission.admit(token)
        reply = await self._writer.write(value, prepared)
        return reply.version

    def _owner(self, token: FencingToken | int) -> tuple[bytes, int] | None:
        if not self.require_owner:
            return None
        if not isinstance(token, FencingToken) or token.key is None or not token.create_revision:
            raise InvalidTypeError(
                "require_owner=True needs a FencingToken from a lock or election "
                "(with key and create_revision)"
            )
        return (token.key.encode("utf-8"), token.create_revision)

    async def fence_off(self, token: FencingToken | int, *, timeout: float | None = None) -> int:
        """Make sure no earlier attempt with ``token`` — of this guard, or of any other
        writer of the term, in any process — can apply any more; return only once that
        holds. Returns the epoch this guard claimed for its next writes.

        Claims a fresh epoch at the mark, resending until ``timeout`` (default: the
        client's request timeout). After it returns, a re-read of the guarded data is
        final: use it after :class:`OutcomeUnknownError` whose ``fenced_off`` is False,
        or before deciding anything from data a lost write may have touched
        (``etcdfence fence off`` does it from the shell). Raises
        :class:`StaleTokenError` if a higher token owns the resource now (every attempt
        of ours is then rejected anyway).
        """
        if timeout is not None:  # refused before admission reads anything
            timeout = check_fence_off_timeout(timeout)
        return await self._writer.fence_off(await self._admission.admit(token), timeout)

    async def repair(self) -> Repaired:
        """Lower a *forged* mark — one whose token is above etcd's current revision, so
        no lock or election of this cluster issued it (a typo'd or hostile token written
        straight to the mark) — to ``(revision, MAX_EPOCH)``; returns what it did.

        Use it when every holder is refused by a mark from the future
        (``etcdfence fence repair RESOURCE`` does it from the shell). The mark is
        replaced by a compare-and-set on exactly the mark judged, so a write in between
        is never undone. The new mark refuses every token up to the revision, with any
        epoch: a live holder is refused too and must re-acquire (its new token is above
        the revision). Raises :class:`~etcdfence.errors.RepairRefusedError`, changing
        nothing, when the mark is not above the revision (it may be real) or moved
        meanwhile; :class:`~etcdfence.errors.UnavailableError` when etcd did not answer
        (then run it again: a repair that applied is refused the second time).
        """
        return await repair(self._store, self._client)

    async def put(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` if ``token`` is not stale (one txn); returns the revision."""
        return await self.txn(token, [Put(key, value)])

    async def delete(self, token: FencingToken | int, key: str | bytes) -> int:
        """Delete ``key`` if ``token`` is not stale (one txn); returns the revision."""
        return await self.txn(token, [Delete(key)])

    async def create(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> int:
        """Write ``key`` if ``token`` is not stale and ``key`` does not exist yet (one
        txn); returns the revision. :class:`~etcdfence.errors.KeyExistsError` when it
        exists (nothing written). For an id whose effect must apply once; with other
        writes, use ``txn(token, [Create(...), ...])``."""
        return await self.txn(token, [Create(key, value)])

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

"""The Redis fence, asyncio API.

:class:`AsyncRedisFence` is a store of the fence engine (:mod:`.engine`): each attempt
is one ``EVALSHA`` of the script in :mod:`etcdfence.fence._redis_common`, which checks
the writer's ``(token, epoch)`` against the mark — or claims an epoch there — moves the
mark, applies the ops and bumps the resource's version, atomically. The engine does the
rest (claims, adopting a higher epoch, the quick fence-off after a lost answer), as for
every other fence. :mod:`etcdfence.redis` is the public face and explains the semantics.

A claim is a compare-and-set, as on etcd: a writer's first write with a token claims
``(token, 0)`` only over a lower token (or no mark) — one round trip for a new token;
on a resource whose mark already holds its token (another writer of the term, or the
same writer restarted) that guess is refused with the mark and the version, and the
second round trip claims above that mark only if neither changed since. So a claim
whose answer was lost and that reaches Redis late can never apply after a later
acknowledged write of its writer (every applied run bumps the version).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import EtcdfenceError, InvalidArgumentError, InvalidTypeError
from ...token import coerce_token
from .. import _redis_common as _rc
from .._redis_common import ASEND_MAY_LAND, AsyncRedisClient, adrop
from ..base import TokenLike
from ..ops import Create, Delete, Op, Put
from .admit import AsyncAdmission
from .engine import (
    AsyncRevisionSource,
    AsyncWriter,
    Lost,
    Repaired,
    Reply,
    check_fence_off_timeout,
    repair,
)


class AsyncRedisFence:
    """Protects writes to Redis keys with a fencing high-water mark (on a
    ``redis.asyncio.Redis`` client).

    Use it when a lock holder or leader writes to Redis and a zombie must not: pass
    the holder's token to every write. ``AsyncRedisFence(client, "orders")`` keeps the
    mark at ``etcdfence:fence:{orders}`` and the resource's version beside it; data
    keys carry the same hash tag (:meth:`key_for` builds one). One per writer, shared
    by all of its tasks. Give the client a ``socket_timeout``: a reply that
    never comes is how a lost write shows, and it also bounds :meth:`fence_off` by
    default. The client's ``retry`` policy still applies to connecting and health
    checks (nothing of the write is sent yet, so that is safe). Read
    :mod:`etcdfence.redis` on durability: the mark survives a Redis restart only with
    persistence on.

    ``lock="jobs/nightly"`` binds the resource to that lock's tokens and ``verify=`` (an
    etcdfence ``AsyncClient``, an :class:`~etcdfence.fence._async.admit.AsyncVerifier`
    or a callable) checks each new token against etcd: see
    :mod:`etcdfence.fence._async.admit`. A refused token raises
    :class:`~etcdfence.errors.ForeignTokenError` /
    :class:`~etcdfence.errors.FutureTokenError` before anything is sent to Redis.
    """

    #: The ``backend`` label of metrics and log events.
    backend = _rc.BACKEND

    def __init__(
        self,
        client: Any,
        resource: str,
        *,
        prefix: str = _rc.DEFAULT_PREFIX,
        max_value_bytes: int = _rc.MAX_VALUE_BYTES,
        lock: str | None = None,
        verify: Any = None,
    ) -> None:
        if not isinstance(client, AsyncRedisClient):
            raise InvalidTypeError(
                f"{type(self).__name__} needs a {AsyncRedisClient.__module__}."
                f"{AsyncRedisClient.__qualname__} client, got {type(client).__name__}"
            )
        if getattr(client, "single_connection_client", False) or getattr(
            client, "_single_connection_client", False
        ):
            raise InvalidArgumentError(
                f"{type(self).__name__} sends its script on a connection of the client's "
                "pool; give it a client without single_connection_client=True"
            )
        self._layout = _rc.RedisLayout(resource, prefix=prefix, max_value_bytes=max_value_bytes)
        self.resource = self._layout.resource
        self.prefix = self._layout.prefix
        self.max_value_bytes = self._layout.max_value_bytes
        #: The mark's key: ``<prefix>{<resource>}``.
        self.key = self._layout.key
        #: The version counter's key: ``<prefix>{<resource>}:version``.
        self.version_key = self._layout.version_key
        #: The hash slot every key of this resource must share.
        self.slot = self._layout.slot
        self._pool: Any = client.connection_pool  # redis-py's pool methods are untyped
        timeout = self._pool.connection_kwargs.get("socket_timeout")
        #: The request timeout (s): the client's ``socket_timeout``, else 10.
        self.timeout = float(timeout) if timeout else _rc.DEFAULT_TIMEOUT
        self._writer = AsyncWriter(self)
        self._admission = AsyncAdmission(self.resource, lock=lock, verify=verify)

    @property
    def lock(self) -> str | None:
        """The lock this resource is bound to (``lock=``), ``None`` when unbound."""
        return self._admission.lock

    def key_for(self, name: str) -> str:
        """A data key in this resource's hash slot: ``{<resource>}:<name>``."""
        return self._layout.key_for(name)

    def epoch(self, token: TokenLike) -> int:
        """The epoch this fence claimed last for ``token`` (0 if none yet)."""
        return self._writer.epoch(coerce_token(token))

    async def txn(self, token: TokenLike, ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if ``token`` is not stale; returns the resource's
        version after the write. One round trip; two for this fence's first write of a
        token the mark already holds (its claim compares against the mark it is shown,
        see the module docstring), and one more when the script is not loaded yet.

        Raises :class:`~etcdfence.errors.StaleTokenError` (nothing written) when Redis
        already accepted a higher token, :class:`~etcdfence.errors.KeyExistsError`
        (nothing written, the mark and the version unmoved) when a
        :class:`~etcdfence.fence.ops.Create`'s key exists (``EXISTS`` in the same script,
        before any write), :class:`~etcdfence.redis.CrossSlotError` /
        ``InvalidArgument`` / ``InvalidType`` for bad ops (nothing sent), and
        :class:`~etcdfence.errors.OutcomeUnknownError` when no answer came back (never
        resend blindly: :meth:`fence_off` first unless it says ``fenced_off``).
        """
        prepared = self._layout.prepare(ops)
        value = await self._admission.admit(token)
        return (await self._writer.write(value, prepared)).version

    async def put(self, token: TokenLike, key: str | bytes, value: str | bytes) -> int:
        """``SET key value`` if ``token`` is not stale; returns the version (see :meth:`txn`)."""
        return await self.txn(token, [Put(key, value)])

    async def delete(self, token: TokenLike, key: str | bytes) -> int:
        """``DEL key`` if ``token`` is not stale; returns the version (see :meth:`txn`)."""
        return await self.txn(token, [Delete(key)])

    async def create(self, token: TokenLike, key: str | bytes, value: str | bytes) -> int:
        """``SET key value`` if ``token`` is not stale and ``key`` does not exist yet;
        returns the version. :class:`~etcdfence.errors.KeyExistsError` when it exists
        (nothing written). For an id whose effect must apply once (see :meth:`txn`)."""
        return await self.txn(token, [Create(key, value)])

    async def advance(self, token: TokenLike) -> None:
        """Raise the mark to ``token`` without a data write (fence off older writers
        right after winning, before the first real write, and after a Redis restart)."""
        await self.txn(token, [])

    async def fence_off(self, token: TokenLike, *, timeout: float | None = None) -> int:
        """Make sure no earlier attempt with ``token`` — of this fence or of any other
        writer of the term — can apply any more; return only once that holds. Returns
        the epoch this fence claimed for its next writes.

        Claims a fresh epoch at the mark, resent for ``timeout`` seconds (default: the
        client's ``socket_timeout``, else 10), then
        :class:`~etcdfence.errors.OutcomeUnknownError`. Use it after an
        ``OutcomeUnknownError`` whose ``fenced_off`` is False, then re-read and decide.
        Raises :class:`~etcdfence.errors.StaleTokenError` if a higher token owns the mark.
        """
        if timeout is not None:  # refused before admission reads anything
            timeout = check_fence_off_timeout(timeout)
        return await self._writer.fence_off(await self._admission.admit(token), timeout)

    async def current(self) -> int:
        """The high-water mark: the highest token accepted so far, 0 if none."""
        return (await self.current_mark())[0]

    async def current_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none."""
        try:
            return self._layout.decode_mark(await self._roundtrip(("GET", self.key)))
        except Lost as lost:
            raise _rc.unavailable(lost.cause, "reading the mark") from None

    async def repair(self, etcd: AsyncRevisionSource) -> Repaired:
        """Lower a *forged* mark — one whose token is above the current revision of the
        etcd cluster ``etcd`` (an :class:`~etcdfence.AsyncClient` of the cluster whose
        locks issue this resource's tokens), so no lock or election issued it — to
        ``(revision, MAX_EPOCH)``; returns what it did.

        Use it when every holder is refused by a mark from the future. The mark is
        replaced by a compare-and-set on exactly the mark judged, so a write in between
        is never undone; the version and the data are not touched. The new mark refuses
        every token up to the revision, with any epoch: a live holder is refused too and
        must re-acquire. Raises :class:`~etcdfence.errors.RepairRefusedError`, changing
        nothing, when the mark is not above the revision (it may be real) or moved
        meanwhile.
        """
        return await repair(self, etcd)

    async def read_mark(self) -> tuple[int, int]:
        """The mark (:meth:`current_mark`); the store side of :meth:`repair`."""
        return await self.current_mark()

    async def lower(self, expected: tuple[int, int], new: tuple[int, int]) -> tuple[int, int]:
        """The compare-and-set of :meth:`repair`
        (:meth:`~etcdfence.fence._async.engine.AsyncRepairable.lower`): one ``GET`` for
        the mark's exact bytes, one script that replaces them only if unchanged."""
        try:
            raw = await self._roundtrip(("GET", self.key))
            if raw is None or self._layout.decode_mark(raw) != expected:
                return self._layout.decode_mark(raw)
            reply = await self._roundtrip(self._layout.lower_command(raw, new))
        except Lost as lost:
            raise _rc.unavailable(lost.cause, "repairing the mark; run the repair again") from None
        return self._layout.parse_lower(reply, expected)

    async def version(self) -> int:
        """The resource's version: the number of writes accepted since it had none
        (0 for a resource never written, or last written by etcdfence 0.2)."""
        try:
            raw = await self._roundtrip(("GET", self.version_key))
        except Lost as lost:
            raise _rc.unavailable(lost.cause, "reading the version") from None
        return self._layout.decode_version(raw)

    async def attempt(
        self, token: int, epoch: int | None, ops: Any, hint: Reply | None, timeout: float | None
    ) -> Reply:
        """The engine's round trip (:class:`~etcdfence.fence._async.engine.AsyncStore`):
        one ``EVALSHA``. A claim is a compare-and-set, as on etcd: without ``hint`` it
        claims ``(token, 0)`` over a lower token only; with one, it claims above the
        refusal's mark only if the mark and the version are still the refusal's
        (``hint.mark``, ``hint.seen``). ``timeout`` is not applied per call: the
        client's ``socket_timeout`` bounds it. Not for direct use: call :meth:`txn`."""
        expect = None if epoch is not None or hint is None else (hint.mark, hint.seen)
        prepared = ops if ops is not None else _rc.NO_OPS
        command = self._layout.command(token, epoch, prepared, expect)
        try:
            raw = await self._roundtrip(command)
        except _rc.RedisUnavailableError as exc:
            if ops is not None:
                raise
            # A claim alone (a fence-off) only raises the mark: report "not sent" as a
            # lost answer, which the engine resends until its deadline.
            raise Lost(exc) from None
        exists = self._layout.exists(raw, prepared)
        if exists is not None:
            raise exists
        applied, mark_token, mark_epoch, version = self._layout.parse(raw)
        if applied:
            return Reply(applied=True, epoch=mark_epoch, version=version)
        return Reply(applied=False, mark=(mark_token, mark_epoch), seen=version)

    async def _roundtrip(self, command: tuple[Any, ...]) -> Any:
        """Send one command on a pooled connection and read its answer; loads the
        script on NOSCRIPT. Raises :class:`~etcdfence.fence._async.engine.Lost` when
        the answer did not come, an etcdfence error when nothing ran.

        Not redis-py's ``execute_command``: its retry resends a command whose answer
        was lost, which could apply a write after a later one."""
        try:
            conn = await self._pool.get_connection()
        except _rc.TRANSPORT_ERRORS as exc:
            raise _rc.refused(exc, "connecting; nothing was sent") from None
        try:
            try:  # connect and health-check first: nothing of the command is out yet
                await conn.connect()
                await conn.check_health()
            except _rc.TRANSPORT_ERRORS as exc:
                await adrop(conn)
                raise _rc.refused(exc, "connecting; nothing was sent") from None
            try:
                await conn.send_command(*command, check_health=False)
            except _rc.TRANSPORT_ERRORS as exc:
                if ASEND_MAY_LAND:
                    raise
                await adrop(conn)
                raise _rc.refused(exc, "sending; nothing was written") from None
            for _ in range(_rc.LOAD_ATTEMPTS):
                try:
                    return _rc.checked(await conn.read_response())
                except _rc.NoScriptError:  # a definite "not run": load, then run again
                    await conn.send_command("SCRIPT", "LOAD", _rc.SCRIPT)
                    _rc.loaded(await conn.read_response(), _rc.SHA)
                    await conn.send_command(*command)
            return _rc.checked(await conn.read_response())
        except _rc.TRANSPORT_ERRORS as exc:
            answer = _rc.definite(exc)
            if answer is not None:
                raise answer from None
            await adrop(conn)
            raise Lost(exc) from None
        except EtcdfenceError:
            raise
        except BaseException:
            await adrop(conn)  # an answer may still come: never hand it to another caller
            raise
        finally:
            await self._pool.release(conn)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.resource!r} at {self.key.decode()!r}>"

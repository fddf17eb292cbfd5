"""Group membership on session leases: who is in, with what capabilities, and changes.

Layout::

    <group>/group                      the group's marker (no lease): it exists
    <group>/members/<id segment>       a member, attached to the joining session's lease;
                                       its value is the member's capabilities

Only direct children of ``<group>/members/`` are members: an id segment never
contains ``/`` (ids are percent-encoded, ``/`` included), and a key with a further
``/`` below the members prefix (another recipe's key under that name) is ignored by
``members()``, ``watch()`` and ``delete()``. A group name with a ``members`` segment
that is not its last (``a/members/b``, ``a/members``) is refused, so one group's
keys never fall inside another group's member prefix.

An id segment is ``s.<percent-encoded UTF-8>`` for a text id and ``b.<hex>`` for a
bytes id (``_keys.member_segment``): ``"a"`` and ``b"a"`` are two members. A member
lives as long as the lease of the session that joined it: it leaves when it calls
``leave``, when its session is closed (the lease is revoked), or when its process
dies and the lease runs out — within the session's TTL, with no one's help.

``watch()`` follows the members with one read and one prefix watch from the revision
after it. When the watch falls behind a compaction the members are read again and
the difference with what was known is reported as joins, leaves and updates; broken
streams are resumed by the client's watch hub without losing events. A change can
thus be coalesced (a member that left and joined again while history was lost shows
as a leave and a join, or as an update), never missed.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .. import _txn
from .._keys import (
    member_id_of,
    member_segment,
    prefix_range_end,
    to_bytes,
    validate_group_name,
)
from .._log import log
from .._wire import messages as m
from ..errors import (
    CompactedError,
    GroupNotEmptyError,
    GroupNotFoundError,
    MemberExistsError,
)
from ..types import GroupChange, Member
from . import _compat
from .watch import AsyncWatch

if TYPE_CHECKING:
    from .connection import AsyncConnection
    from .session import AsyncSession

#: The marker key's last segment: ``<group>/group``.
MARKER = "group"


def _cmp(key: bytes, target: Any, result: Any, **value: Any) -> Any:
    return m.Compare(key=key, target=target, result=result, **value)


def _exists(key: bytes) -> Any:
    return _cmp(key, m.CompareTarget.CREATE, m.CompareResult.GREATER, create_revision=0)


def _on_lease(key: bytes, lease: int) -> Any:
    """``key`` exists on ``lease`` (an absent key compares as lease 0, and leases are
    never 0)."""
    return _cmp(key, m.CompareTarget.LEASE, m.CompareResult.EQUAL, lease=lease)


def _absent(key: bytes, range_end: bytes = b"") -> Any:
    return _cmp(
        key, m.CompareTarget.CREATE, m.CompareResult.EQUAL, create_revision=0, range_end=range_end
    )


class AsyncGroup:
    """A named group of members, each kept in by a session's lease.

    Get it from :meth:`AsyncClient.group`. ``create()`` makes the group (``join``
    does too, unless told not to), ``join(member_id, capabilities=..., session=...)``
    adds a member on that session's lease, ``leave(member_id)`` removes it,
    ``members()`` / ``member(id)`` read who is in, ``update(id, capabilities)``
    changes a member's capabilities, ``watch()`` follows joins, leaves and updates.
    Member ids are ``str`` or ``bytes`` and come back as given.
    """

    def __init__(self, conn: AsyncConnection, name: str) -> None:
        self.name = validate_group_name(name)
        self._conn = conn
        self._marker = f"{self.name}/{MARKER}".encode()
        self._prefix = f"{self.name}/members/".encode()
        self._joined: dict[bytes, int] = {}  # member key -> the lease this object joined it on

    def _key(self, member_id: object) -> bytes:
        return self._prefix + member_segment(member_id).encode("ascii")

    def _id_of(self, key: bytes) -> str | bytes | None:
        """The member id of a member key (``None`` for a key that is not a direct child
        of the members prefix, or that etcdfence did not write)."""
        segment = key[len(self._prefix) :]
        if not key.startswith(self._prefix) or b"/" in segment:
            return None
        try:
            return member_id_of(segment.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return None

    # -- the group ------------------------------------------------------------------

    async def create(self) -> bool:
        """Create the group; False if it already existed."""
        txn = m.TxnRequest(
            compare=[_absent(self._marker)], success=[_txn.op_put(self._marker, b"")]
        )
        response = await self._conn.call("Txn", txn, idempotent=True)
        return bool(response.succeeded)

    async def exists(self) -> bool:
        """Whether the group was created (and not deleted)."""
        read = await self._conn.call(
            "Range", _txn.range_request(self._marker, count_only=True), idempotent=True
        )
        return bool(read.count)

    async def delete(self) -> None:
        """Delete the empty group. Raises :class:`GroupNotEmptyError` while members are
        joined, :class:`GroupNotFoundError` if there is no such group.

        Reads the members prefix, then deletes the marker only if nothing under that
        prefix changed since the read (keys below it that are not members, such as
        another recipe's, do not make the group non-empty)."""
        end = prefix_range_end(self._prefix)
        for _ in range(20):
            read = await self._conn.call(
                "Range",
                _txn.range_request(self._prefix, prefix=True, keys_only=True),
                idempotent=True,
            )
            if any(self._id_of(bytes(kv.key)) is not None for kv in read.kvs):
                raise GroupNotEmptyError(f"group {self.name!r} still has members")
            unchanged = _cmp(
                self._prefix,
                m.CompareTarget.MOD,
                m.CompareResult.LESS,
                mod_revision=int(read.header.revision) + 1,
                range_end=end,
            )
            txn = m.TxnRequest(
                compare=[_exists(self._marker), unchanged],
                success=[_txn.op_delete(self._marker)],
                failure=[_txn.op_range(_txn.range_request(self._marker, count_only=True))],
            )
            response = await self._conn.call("Txn", txn, idempotent=True)
            if response.succeeded:
                return
            if not response.responses[0].response_range.count:
                raise GroupNotFoundError(f"group {self.name!r} does not exist")
        raise GroupNotEmptyError(f"group {self.name!r}: its members keep changing; try again")

    # -- members ---------------------------------------------------------------------

    async def join(
        self,
        member_id: str | bytes,
        capabilities: str | bytes = b"",
        *,
        session: AsyncSession,
        create: bool = True,
    ) -> int:
        """Add ``member_id`` with ``capabilities`` on ``session``'s lease; returns the
        revision it joined at. The member stays while the session lives.

        ``create=False`` raises :class:`GroupNotFoundError` when the group was not
        created (else it is created). Joining again through the same session updates
        the capabilities; an id held by another session raises :class:`MemberExistsError`.
        """
        key = self._key(member_id)
        value = to_bytes(capabilities, "capabilities")
        lease = await session.lease()
        for _ in range(2):
            txn = m.TxnRequest(
                compare=[_exists(self._marker), _absent(key)],
                success=[_txn.op_put(key, value, lease)],
                failure=[
                    _txn.op_range(_txn.range_request(self._marker, count_only=True)),
                    _txn.op_range(_txn.range_request(key)),
                ],
            )
            response = await self._conn.call("Txn", txn, idempotent=True)
            if response.succeeded:
                self._joined[key] = lease
                return int(response.header.revision)
            mine = response.responses[1].response_range.kvs
            if mine and mine[0].lease == lease:  # joined already (or a retried join landed)
                self._joined[key] = lease
                return await self._put(key, value, lease, int(mine[0].create_revision))
            if mine:
                raise MemberExistsError(
                    f"member {member_id!r} of group {self.name!r} is held by another session"
                )
            if not create:
                raise GroupNotFoundError(f"group {self.name!r} does not exist")
            await self.create()
        raise GroupNotFoundError(f"group {self.name!r} was deleted while joining it")

    async def _put(self, key: bytes, value: bytes, lease: int, created: int) -> int:
        txn = _txn.guarded_put(key, value, lease, created)
        response = await self._conn.call("Txn", txn, idempotent=True)
        return int(response.header.revision)

    def _joined_lease(self, key: bytes, session: AsyncSession | None) -> int | None:
        """The lease ``leave``/``update`` of ``key`` must find on it: the session's
        given, else the one this object joined on, else ``None`` (no guard)."""
        if session is not None:
            return session.lease_id
        return self._joined.get(key)

    async def update(
        self,
        member_id: str | bytes,
        capabilities: str | bytes,
        *,
        session: AsyncSession | None = None,
    ) -> bool:
        """Set a joined member's capabilities (its lease stays); False if not joined.

        Guarded like :meth:`leave`: when this object joined ``member_id`` (or
        ``session`` is given) the update applies only while the member is still on
        that session's lease — a stale update (the membership ended and someone joined
        the id again) changes nothing and returns False."""
        key = self._key(member_id)
        put = m.PutRequest(key=key, value=to_bytes(capabilities, "capabilities"), ignore_lease=True)
        lease = self._joined_lease(key, session)
        guard = _exists(key) if lease is None else _on_lease(key, lease)
        txn = m.TxnRequest(compare=[guard], success=[m.RequestOp(request_put=put)])
        response = await self._conn.call("Txn", txn, idempotent=True)
        return bool(response.succeeded)

    async def leave(self, member_id: str | bytes, *, session: AsyncSession | None = None) -> bool:
        """Remove ``member_id`` from the group; False if it was not joined.

        When this object joined ``member_id`` — or ``session`` is given — only the
        membership on that session's lease is removed: if it already ended (the
        session expired, e.g. a process paused past its TTL) and another process has
        joined the same id since, ``leave`` is a no-op that returns False, like a
        lock's release never deletes a newer holder's key. A group object that did not
        join the id, without ``session``, removes whoever holds it (an operator's
        removal)."""
        key = self._key(member_id)
        lease = self._joined_lease(key, session)
        self._joined.pop(key, None)
        if lease is None:
            request = m.DeleteRangeRequest(key=key)
            response = await self._conn.call("DeleteRange", request, idempotent=True)
            return bool(response.deleted)
        txn = m.TxnRequest(compare=[_on_lease(key, lease)], success=[_txn.op_delete(key)])
        response = await self._conn.call("Txn", txn, idempotent=True)
        return bool(response.succeeded)

    async def member(self, member_id: str | bytes) -> Member | None:
        """One member's :class:`Member` (capabilities, lease, revisions), or ``None``."""
        read = await self._conn.call(
            "Range", _txn.range_request(self._key(member_id)), idempotent=True
        )
        if not read.kvs:
            return None
        return self._member(read.kvs[0], member_id)

    async def members(self) -> dict[str | bytes, bytes]:
        """Every member now: id -> capabilities."""
        return {mid: info.capabilities for mid, info in (await self.members_info()).items()}

    async def members_info(self) -> dict[str | bytes, Member]:
        """Every member now with its :class:`Member` record."""
        read = await self._conn.call(
            "Range", _txn.range_request(self._prefix, prefix=True), idempotent=True
        )
        out: dict[str | bytes, Member] = {}
        for kv in read.kvs:
            mid = self._id_of(bytes(kv.key))
            if mid is not None:
                out[mid] = self._member(kv, mid)
        return out

    @staticmethod
    def _member(kv: Any, member_id: str | bytes) -> Member:
        return Member(
            member_id,
            bytes(kv.value),
            int(kv.lease),
            int(kv.create_revision),
            int(kv.mod_revision),
        )

    def watch(self, *, initial: bool = False) -> AsyncGroupWatch:
        """Follow joins, leaves and updates (``initial=True``: first a join for every
        current member) from its ``start()`` (``async with``, or the first ``get``):
        ``async for change in group.watch(): ...``, or ``get(timeout)`` for the next
        changes; ``aclose()`` when done."""
        return AsyncGroupWatch(self, initial)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _diff(
    group: str, ids: dict[bytes, Any], old: dict[bytes, Any], new: dict[bytes, Any], rev: int
) -> list[GroupChange]:
    """What changed from ``old`` to ``new`` (both key -> kv), as changes at ``rev``."""
    out = []
    for key, kv in old.items():
        now = new.get(key)
        if now is None or now.create_revision != kv.create_revision:
            out.append(GroupChange("leave", group, ids[key], bytes(kv.value), rev))
    for key, kv in new.items():
        was = old.get(key)
        if was is None or was.create_revision != kv.create_revision:
            out.append(GroupChange("join", group, ids[key], bytes(kv.value), rev))
        elif was.mod_revision != kv.mod_revision:
            out.append(GroupChange("update", group, ids[key], bytes(kv.value), rev))
    return out


class AsyncGroupWatch:
    """Joins, leaves and updates of one group (see the module docstring for how it
    survives compaction and reconnects). From :meth:`AsyncGroup.watch`."""

    def __init__(self, group: AsyncGroup, initial: bool) -> None:
        self._group = group
        self._initial = initial
        self._known: dict[bytes, Any] = {}  # member key -> kv, as last reported
        self._ids: dict[bytes, str | bytes] = {}
        self._watch: AsyncWatch | None = None
        self._next = 0  # the revision to watch from (0: read the members first)
        self._started = False
        self._closed = False
        self._ready: list[GroupChange] = []

    @property
    def members(self) -> dict[str | bytes, bytes]:
        """The members as of the last change reported (id -> capabilities)."""
        return {self._ids[key]: bytes(kv.value) for key, kv in self._known.items()}

    async def _resync(self) -> list[GroupChange]:
        """Read the members and report the difference with what was known; the watch
        starts (lazily, at the next wait) from the revision after the read."""
        group = self._group
        read = await group._conn.call(
            "Range", _txn.range_request(group._prefix, prefix=True), idempotent=True
        )
        now = {}
        for kv in read.kvs:
            mid = group._id_of(bytes(kv.key))
            if mid is not None:
                now[bytes(kv.key)] = kv
                self._ids[bytes(kv.key)] = mid
        revision = int(read.header.revision)
        report = self._started or self._initial
        changes = _diff(group.name, self._ids, self._known, now, revision) if report else []
        self._known, self._started, self._next = now, True, revision + 1
        self._ids = {key: self._ids[key] for key in now}
        return changes

    async def _watching(self) -> AsyncWatch:
        """The prefix watch from where the last read or event left off."""
        if self._watch is None:
            group = self._group
            self._watch = AsyncWatch(
                group._conn,
                group._prefix,
                range_end=prefix_range_end(group._prefix),
                start_revision=self._next,
            )
            await self._watch.start()
        return self._watch

    async def start(self) -> AsyncGroupWatch:
        """Take the baseline now: every change after this returns is reported (with
        ``initial``, the current members are reported first). Done by the first
        ``get`` otherwise, so a watch that was never started misses the changes before
        it."""
        if not self._started:
            self._ready = await self._resync()
        return self

    def _apply(self, events: Any) -> list[GroupChange]:
        old = dict(self._known)
        for event in events:
            key = bytes(event.kv.key)
            if event.type == "delete":
                self._known.pop(key, None)
                continue
            mid = self._group._id_of(key)
            if mid is not None:
                self._ids[key] = mid
                self._known[key] = event.kv
        changes = _diff(self._group.name, self._ids, old, self._known, 0)
        self._ids = {key: self._ids[key] for key in self._known}
        return changes

    async def get(self, timeout: float | None = None) -> list[GroupChange]:
        """The next changes (at least one): ``TimeoutError`` after ``timeout`` seconds
        without any, ``StopAsyncIteration`` once closed."""
        if self._ready:
            ready, self._ready = self._ready, []
            return ready
        deadline = None if timeout is None else _compat.monotonic() + timeout
        while True:
            if self._closed:
                raise StopAsyncIteration
            if not self._next:  # first use, or the watch fell behind a compaction
                changes = await self._resync()
                if changes:
                    return changes
            watch = await self._watching()
            remaining = None if deadline is None else max(0.0, deadline - _compat.monotonic())
            try:
                batch = await watch.get(remaining)
            except CompactedError as err:
                log.info("etcdfence.group_watch_resync", group=self._group.name, error=str(err))
                await watch.aclose()
                self._watch, self._next = None, 0
                continue
            self._next = batch.events[-1].kv.mod_revision + 1
            changes = []
            for revision, events in itertools.groupby(batch.events, _mod_revision):
                changes += [_at(c, revision) for c in self._apply(list(events))]
            if changes:
                return changes

    def __aiter__(self) -> AsyncIterator[GroupChange]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[GroupChange]:
        while True:
            try:
                changes = await self.get()
            except StopAsyncIteration:
                return
            while changes:  # one at a time, oldest first
                yield changes.pop(0)

    async def aclose(self) -> None:
        """Stop watching."""
        self._closed = True
        if self._watch is not None:
            await self._watch.aclose()

    async def __aenter__(self) -> AsyncGroupWatch:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _mod_revision(event: Any) -> int:
    return int(event.kv.mod_revision)


def _at(change: GroupChange, revision: int) -> GroupChange:
    return GroupChange(change.kind, change.group, change.member_id, change.capabilities, revision)

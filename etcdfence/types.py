"""Plain data returned by etcdfence: key-values, leaders, watch events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallRecord:
    """One request the client sent to etcd, as :meth:`Client.on_call` observers see it.

    ``method`` is the etcd RPC (``"Range"``, ``"Txn"``, ``"LeaseGrant"``, ...), or
    ``"stream:Watch"`` / ``"stream:LeaseKeepAlive"`` when a stream was opened. Every
    attempt is reported, retries included. ``outcome`` is ``"ok"``, ``"error"`` or
    ``"cancelled"``; ``duration`` is in seconds (0 for a stream open). ``code`` is the
    gRPC status name (``"OK"``, ``"UNAVAILABLE"``, ``"DEADLINE_EXCEEDED"``,
    ``"CANCELLED"``, ...; ``"UNKNOWN"`` for an error without one).
    """

    method: str
    endpoint: str
    duration: float
    outcome: str
    code: str = "OK"


@dataclass(frozen=True)
class KeyValue:
    """A key as stored in etcd, with the revisions that order it.

    ``lease_id`` is 0 when the key has no lease.
    """

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int

    @classmethod
    def from_wire(cls, kv: Any) -> KeyValue:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass(frozen=True)
class Leader:
    """The current leader of an election: its key, proclaimed value and lease.

    ``revision`` is the etcd revision at which this was observed.
    """

    name: str
    key: str
    value: bytes
    create_revision: int
    lease_id: int
    revision: int

    @classmethod
    def from_kv(cls, name: str, kv: Any, revision: int) -> Leader:
        return cls(
            name=name,
            key=kv.key.decode("utf-8", "replace"),
            value=kv.value,
            create_revision=kv.create_revision,
            lease_id=kv.lease,
            revision=revision,
        )

    def same_term(self, other: Leader | None) -> bool:
        """Whether ``other`` is the same leadership term (same key, same create revision)."""
        return (
            other is not None
            and other.key == self.key
            and other.create_revision == self.create_revision
        )


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch: ``type`` is ``"put"`` or ``"delete"``."""

    type: str
    kv: KeyValue
    prev_kv: KeyValue | None


@dataclass(frozen=True)
class WatchBatch:
    """Events delivered together; ``revision`` is etcd's header revision when it sent them.

    The header revision is *not* "everything up to here was delivered": a watch that
    catches up on history (it started in the past, or resumed after a break or a pause)
    gets it in responses of at most 1,000 revisions, each stamped with etcd's current
    revision. What a consumer has seen in full is :attr:`complete_through`.
    """

    revision: int
    events: tuple[WatchEvent, ...]

    @property
    def complete_through(self) -> int:
        """Every event of the watched range up to this revision has been delivered, by
        this batch or earlier ones: the last event's revision. A batch always ends on a
        whole revision: etcd may split one revision's events across fragments, and the
        watch holds such a revision back until its last fragment arrived. 0 for a batch
        without events."""
        return self.events[-1].kv.mod_revision if self.events else 0


#: A group member's id as given to ``join``: text and bytes ids are distinct members.
MemberId = str | bytes


@dataclass(frozen=True)
class Member:
    """One member of a group (:meth:`Group.member`): its id, capabilities, and the lease
    that keeps it joined (its session's; the member leaves when the lease ends).
    ``create_revision`` is when it joined, ``mod_revision`` its last capabilities update."""

    member_id: str | bytes
    capabilities: bytes
    lease_id: int
    create_revision: int
    mod_revision: int


@dataclass(frozen=True)
class GroupChange:
    """A change of a group's membership (:meth:`Group.watch`).

    ``kind`` is ``"join"``, ``"leave"`` or ``"update"`` (new capabilities);
    ``capabilities`` are the member's new ones (its last known ones for a leave);
    ``revision`` is the etcd revision of the change (of the re-read that found it,
    after the watch fell behind a compaction or a reconnect could not resume).
    """

    kind: str
    group: str
    member_id: str | bytes
    capabilities: bytes
    revision: int

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
    """Events delivered together at ``revision`` (empty for a progress notification)."""

    revision: int
    events: tuple[WatchEvent, ...]

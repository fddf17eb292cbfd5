"""The writes a fence applies: the vocabulary every backend shares.

``Put`` and ``Delete`` are plain values — no backend's wire format — so a fence that
does not talk to etcd (Redis, SQL) can take them without loading etcd's gRPC layer.
Each backend turns them into its own requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError, KeyExistsError

__all__ = ["Create", "Delete", "Op", "Put", "check_creates", "key_exists"]


@dataclass(frozen=True)
class Put:
    """A put to apply atomically with a fence check: ``fence.txn(token, [Put(k, v)])``.
    ``lease_id`` attaches the key to an etcd lease (etcd only; other backends refuse a
    non-zero one)."""

    key: str | bytes
    value: str | bytes
    lease_id: int = 0


@dataclass(frozen=True)
class Delete:
    """A delete to apply atomically with a fence check; ``prefix=True`` deletes every
    key under ``key`` (where the backend supports ranges)."""

    key: str | bytes
    prefix: bool = False


@dataclass(frozen=True)
class Create:
    """A put that applies only if ``key`` does not exist yet: if it does, the whole
    transaction writes nothing and raises :class:`~etcdfence.errors.KeyExistsError`.
    Exactly-once effects: the id of the effect (a schedule slot, a request id) is the
    ``Create``'s key, written atomically with the effect and the fence check, so a
    second delivery of the same id — with the same token, which the mark lets pass —
    applies nothing."""

    key: str | bytes
    value: str | bytes


#: One write of a guarded transaction.
Op = Put | Delete | Create


def check_creates(ops: Sequence[Op], keys: Sequence[bytes]) -> None:
    """Refuse (:class:`~etcdfence.errors.InvalidArgumentError`, before any I/O) a
    transaction in which another op writes a :class:`Create`'s key: two Creates of one
    key, a Create and a Put or Delete of it, a prefix Delete covering it. A Create
    checks its key as the transaction finds it, before any op applies, so such a
    transaction could never mean what it says (etcd itself refuses a key written twice
    in one txn). ``keys`` are the ops' keys as the backend encodes them, in order."""
    created = {key for op, key in zip(ops, keys, strict=True) if isinstance(op, Create)}
    if not created:
        return
    seen: set[bytes] = set()
    for op, key in zip(ops, keys, strict=True):
        if isinstance(op, Delete) and op.prefix:
            clash = any(c.startswith(key) for c in created)
        elif isinstance(op, Create):
            clash = key in seen
            seen.add(key)
        else:
            clash = key in created
        if clash:
            raise InvalidArgumentError(
                f"a Create's key {key!r} is also written by another op of the transaction "
                f"({type(op).__name__}): a Create checks the key before any op applies, "
                "so write it once per transaction"
            )


def key_exists(resource: str, op: Create, found: bytes | None) -> KeyExistsError:
    """The :class:`~etcdfence.errors.KeyExistsError` of ``op`` whose key holds ``found``
    (``None``: unreadable as bytes), as every backend reports it: ``.key`` as the Create
    gave it, ``.value`` in the type of the Create's value — ``str`` (decoded as UTF-8)
    when that was a ``str``, unless the stored bytes are not UTF-8 (then ``bytes``) — so
    a writer can compare it with its own value (the resend rule after a lost answer)."""
    value: str | bytes | None = found
    if found is not None and isinstance(op.value, str):
        try:
            value = found.decode("utf-8")
        except UnicodeDecodeError:
            value = found
    return KeyExistsError(resource, op.key, value)

"""Pure helpers for the key layout shared by locks, elections and guards.

The layout follows etcd's Go ``client/v3/concurrency`` package and etcdctl: a
contender's key is ``f"{name}/{lease_id:x}"`` attached to the session lease, and
the owner is the key under ``name/`` with the lowest create revision.
"""

from __future__ import annotations

import math
import urllib.parse

from .errors import InvalidArgumentError, InvalidTypeError

#: Width of the decimal high-water mark stored by FenceGuard. 20 digits hold any
#: int64 revision, and zero padding makes byte order equal numeric order, which is
#: how etcd compares values in a txn.
MARK_WIDTH = 20
DEFAULT_FENCE_PREFIX = "/etcdfence/fence/"


def validate_name(name: object, what: str = "name") -> str:
    """Check a lock/election/resource name and return it.

    Names must be non-empty text without surrounding whitespace, NUL bytes, or a
    trailing ``/`` (``name/`` is the contenders' prefix; a trailing slash would
    produce ``name//<lease>`` keys that Go and etcdctl never use).
    """
    if not isinstance(name, str):
        raise InvalidTypeError(f"{what} must be str, got {type(name).__name__}")
    if not name or not name.strip():
        raise InvalidArgumentError(f"{what} must not be empty")
    if name != name.strip():
        raise InvalidArgumentError(f"{what} must not start or end with whitespace: {name!r}")
    if name.endswith("/"):
        raise InvalidArgumentError(f"{what} must not end with '/': {name!r}")
    if "\x00" in name:
        raise InvalidArgumentError(f"{what} must not contain NUL: {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} is not valid UTF-8 text: {name!r}") from None
    return name


def validate_group_name(name: object) -> str:
    """Check a group name: a :func:`validate_name` without a ``members`` segment before
    its last (``a/members/b``, ``a/members``): such a group's keys would lie inside
    group ``a``'s member prefix ``a/members/``."""
    name = validate_name(name, "group name")
    segments = name.split("/")
    if "members" in segments[1:]:
        head = "/".join(segments[: segments.index("members", 1)])
        raise InvalidArgumentError(
            f"group name {name!r} has a 'members' segment after the first: its keys would "
            f"lie among the members of group {head!r}; use another segment name"
        )
    return name


def validate_timeout(timeout: object, what: str = "timeout") -> float | None:
    """Check a wait's ``timeout``: ``None`` (wait forever) or a finite number >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidTypeError(f"{what} must be None or a number of seconds, got {timeout!r}")
    if not math.isfinite(timeout) or timeout < 0:
        raise InvalidArgumentError(f"{what} must be None or a finite number >= 0, got {timeout!r}")
    return float(timeout)


#: The largest lease ID etcd takes (an int64).
MAX_LEASE_ID = 2**63 - 1


def check_lease_id(lease_id: object) -> int:
    """An etcd lease ID given by the caller: an int in 0..2**63-1 (0: no lease)."""
    if isinstance(lease_id, bool) or not isinstance(lease_id, int):
        raise InvalidTypeError(f"lease_id must be int, got {type(lease_id).__name__}")
    if not 0 <= lease_id <= MAX_LEASE_ID:
        raise InvalidArgumentError(f"lease_id must be in 0..2**63-1, got {lease_id}")
    return lease_id


def to_bytes(data: object, what: str = "key") -> bytes:
    """Encode a key or value given as ``str`` (UTF-8) or ``bytes``."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"{what} is not valid UTF-8 text: {data!r}") from None
    raise InvalidTypeError(f"{what} must be str or bytes, got {type(data).__name__}")


def to_key(key: object) -> bytes:
    """Encode a key and reject the empty key (etcd refuses it)."""
    raw = to_bytes(key, "key")
    if not raw:
        raise InvalidArgumentError("key must not be empty")
    return raw


def contender_prefix(name: str) -> str:
    """``name/``: the prefix under which all contenders of ``name`` live."""
    return name + "/"


def contender_key(name: str, lease_id: int) -> str:
    """The key a session with ``lease_id`` uses for ``name`` (Go/etcdctl layout)."""
    return f"{name}/{lease_id:x}"


def member_segment(member_id: object) -> str:
    """A group member id as one key segment: ``s.<percent-encoded UTF-8>`` for text,
    ``b.<hex>`` for bytes, so ``"a"`` and ``b"a"`` are distinct members, any id
    round-trips (:func:`member_id_of`), and no segment contains ``/``."""
    if isinstance(member_id, str):
        if not member_id:
            raise InvalidArgumentError("member id must not be empty")
        return "s." + urllib.parse.quote(to_bytes(member_id, "member id"), safe="")
    if isinstance(member_id, (bytes, bytearray, memoryview)):
        raw = bytes(member_id)
        if not raw:
            raise InvalidArgumentError("member id must not be empty")
        return "b." + raw.hex()
    raise InvalidTypeError(f"member id must be str or bytes, got {type(member_id).__name__}")


def member_id_of(segment: str) -> str | bytes:
    """The member id a :func:`member_segment` stands for."""
    if segment.startswith("b."):
        return bytes.fromhex(segment[2:])
    if not segment.startswith("s."):  # not written by etcdfence
        raise InvalidArgumentError(f"not a member id segment: {segment!r}")
    return urllib.parse.unquote(segment[2:], errors="strict")


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every key (prefix was all 0xff)


def fence_key(prefix: str, resource: str) -> bytes:
    """Where the high-water mark of ``resource`` is stored."""
    return (prefix + resource).encode("utf-8")


#: Width of the epoch suffix of a mark (``<token>:<epoch>``).
EPOCH_WIDTH = 10
MAX_EPOCH = 10**EPOCH_WIDTH - 1


def encode_mark(value: int, epoch: int = 0) -> bytes:
    """A mark as stored in etcd: the token as a 20-digit zero-padded decimal, then,
    for epoch > 0, ``:`` and the epoch as a 10-digit decimal.

    Byte order equals (token, epoch) order, which is how etcd compares values: the
    token part has a fixed width, and a mark without the suffix (epoch 0, and every
    mark written by 0.1) sorts before the same token with any suffix.
    """
    if value < 0 or value >= 10**MARK_WIDTH:
        raise InvalidArgumentError(f"mark out of range: {value}")
    if epoch < 0 or epoch > MAX_EPOCH:
        raise InvalidArgumentError(f"epoch out of range: {epoch}")
    text = str(value).zfill(MARK_WIDTH)
    if epoch:
        text += ":" + str(epoch).zfill(EPOCH_WIDTH)
    return text.encode("ascii")


def decode_mark_epoch(raw: bytes) -> tuple[int, int]:
    """Parse a stored mark into ``(token, epoch)``; unparseable is an error, never 0."""
    text = raw.decode("ascii", "replace").strip()
    token, sep, epoch = text.partition(":")
    # Bounded before int(): a tampered mark of thousands of digits is this error too,
    # not the bare ValueError int() raises beyond 4,300 digits.
    if not (token.isdigit() and len(token) <= MARK_WIDTH) or (
        sep and not (epoch.isdigit() and len(epoch) == EPOCH_WIDTH)
    ):
        shown = f"{raw[:48]!r}..." if len(raw) > 48 else repr(raw)
        raise InvalidArgumentError(f"fence mark is not <token>[:<epoch>] in decimal: {shown}")
    return int(token), int(epoch) if sep else 0


def decode_mark(raw: bytes) -> int:
    """The token part of a stored mark (see :func:`decode_mark_epoch`)."""
    return decode_mark_epoch(raw)[0]

"""Pure helpers for the key layout shared by locks, elections and guards.

The layout follows etcd's Go ``client/v3/concurrency`` package and etcdctl: a
contender's key is ``f"{name}/{lease_id:x}"`` attached to the session lease, and
the owner is the key under ``name/`` with the lowest create revision.
"""

from __future__ import annotations

from .errors import InvalidArgument, InvalidType

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
        raise InvalidType(f"{what} must be str, got {type(name).__name__}")
    if not name or not name.strip():
        raise InvalidArgument(f"{what} must not be empty")
    if name != name.strip():
        raise InvalidArgument(f"{what} must not start or end with whitespace: {name!r}")
    if name.endswith("/"):
        raise InvalidArgument(f"{what} must not end with '/': {name!r}")
    if "\x00" in name:
        raise InvalidArgument(f"{what} must not contain NUL: {name!r}")
    return name


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
            raise InvalidArgument(f"{what} is not valid UTF-8 text: {data!r}") from None
    raise InvalidType(f"{what} must be str or bytes, got {type(data).__name__}")


def to_key(key: object) -> bytes:
    """Encode a key and reject the empty key (etcd refuses it)."""
    raw = to_bytes(key, "key")
    if not raw:
        raise InvalidArgument("key must not be empty")
    return raw


def contender_prefix(name: str) -> str:
    """``name/``: the prefix under which all contenders of ``name`` live."""
    return name + "/"


def contender_key(name: str, lease_id: int) -> str:
    """The key a session with ``lease_id`` uses for ``name`` (Go/etcdctl layout)."""
    return f"{name}/{lease_id:x}"


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


def encode_mark(value: int) -> bytes:
    """A mark as stored in etcd: a 20-digit zero-padded decimal."""
    if value < 0 or value >= 10**MARK_WIDTH:
        raise InvalidArgument(f"mark out of range: {value}")
    return str(value).zfill(MARK_WIDTH).encode("ascii")


def decode_mark(raw: bytes) -> int:
    """Parse a stored mark; an unparseable value is an error, never silently 0."""
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit():
        raise InvalidArgument(f"fence mark is not a decimal number: {raw!r}")
    return int(text)

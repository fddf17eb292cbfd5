"""The sequencer part of a fencing token: which lock, which cluster, and its text form.

A bare revision is global to an etcd cluster, so it cannot tell a token of
``locks/orders`` from one of ``locks/billing``. Chubby's answer is the *sequencer*: the
token names its lock. This module holds the rules for those names and numbers, and the
one text form every carrier that has a single slot (the ``Fencing-Token`` header,
message metadata) uses::

    123; lock="jobs/nightly"; cluster=14841639068965178418;
        key="jobs/nightly/694d7a6d3e4b1c05"; crev=120; lease=7587868893459766277

(one line; wrapped here).
The number comes first and follows :func:`etcdfence.token.parse_token` (OWS, 1 to 19
ASCII digits). Then, in the style of RFC 8941 structured-field parameters, zero or more
``;`` + ``name=value``, with optional space/tab (OWS) around each ``;``:

- ``lock`` and ``key`` are strings: ``"..."`` holding printable ASCII (0x20-0x7E), where
  ``"`` and ``\\`` are escaped with a backslash (RFC 8941 sf-string), or, for a name
  with any other character, ``%"..."`` holding UTF-8 with every byte outside printable
  ASCII, ``%`` and ``"`` percent-encoded in lowercase hex (RFC 9651 display string).
- ``cluster`` (uint64, 1 to 2**64-1), ``crev`` (the key's create revision) and ``lease``
  (the lease id) are decimal, at most 20 digits (cluster) or 19 (the int64 ones).

Refused with :class:`~etcdfence.InvalidTokenError`: a value over :data:`MAX_TEXT` bytes,
a parameter without ``=value``, a repeated parameter, an unknown one (a misspelt
``lock`` must not silently drop the binding: a receiver reads exactly the parameters of
its version), bytes outside printable ASCII except OWS, a bad escape or percent-escape,
and a lock name that is not a valid etcdfence name. A bare number is still a token (all
parameters absent), and a reader that only knows bare numbers refuses the long form
instead of misreading it: its first non-digit is the ``;``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidTokenError

#: The longest ``Fencing-Token`` / metadata value read or written, in bytes (a name of
#: a few hundred characters fits twice, as ``lock`` and inside ``key``; the whole value
#: stays far below common header-line limits such as nginx's 8 KiB).
MAX_TEXT = 2048
#: etcd's ResponseHeader.cluster_id is a uint64.
MAX_CLUSTER_ID = 2**64 - 1
_MAX_INT64 = 2**63 - 1
_STRINGS = ("lock", "key")
_NUMBERS = {"cluster": MAX_CLUSTER_ID, "crev": _MAX_INT64, "lease": _MAX_INT64}
_WHAT = {"cluster": "cluster (a uint64)", "crev": "crev (an int64)", "lease": "lease (an int64)"}
#: The parameters of the text form, in the order they are written.
PARAMETERS = ("lock", "cluster", "key", "crev", "lease")
_PARAM_KEY = re.compile(rb"[a-z*][a-z0-9_.*-]*")
_DIGITS = re.compile(rb"[0-9]+")
_LEASE_SUFFIX = re.compile(r"/([0-9a-f]{1,16})\Z")
_OWS = b" \t"
_PRINTABLE = frozenset(range(0x20, 0x7F))


class Sequencer(NamedTuple):
    """Everything a token says about its hold, as one hashable, comparable tuple.

    ``FencingToken`` compares and hashes by revision alone (a fence orders tokens); use
    ``token.sequencer`` where the identity of the hold matters: as a cache key for a
    verifier, to compare two tokens field by field, to log or to check a binding."""

    lock: str | None
    cluster_id: int | None
    key: str | None
    create_revision: int | None
    lease_id: int | None
    revision: int


def lock_name_of(key: str | None) -> str | None:
    """The lock or election name of a contender key: ``key`` without its ``/<lease hex>``
    suffix (``"jobs/nightly/694d7a6d3e4b1c05"`` -> ``"jobs/nightly"``), the layout of
    etcdfence, etcd's Go ``concurrency`` package and ``etcdctl lock`` (``ETCD_LOCK_KEY``).

    ``None`` when ``key`` is ``None`` or not of that shape (no suffix of 1 to 16
    lowercase hex digits, or nothing valid before it)."""
    if key is None:
        return None
    match = _LEASE_SUFFIX.search(key)
    if match is None:
        return None
    name = key[: match.start()]
    return name if lock_problem(name) is None else None


def lock_problem(name: object) -> str | None:
    """Why ``name`` is not a lock/election name (the rule of ``validate_name``), or ``None``."""
    if not isinstance(name, str):
        return f"must be text, got {type(name).__name__}"
    if not name or not name.strip():
        return "is empty"
    if name != name.strip():
        return "starts or ends with whitespace"
    if name.endswith("/"):
        return "ends with '/'"
    if "\x00" in name:
        return "contains NUL"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 text"
    return None


def check_cluster_id(value: object, source: str) -> int:
    """``value`` as an etcd cluster id (a uint64, 0 excluded: protobuf's "unset")."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTokenError(
            f"{source}: a cluster id must be an int (etcd's uint64), got {type(value).__name__}"
        )
    if not 0 < value <= MAX_CLUSTER_ID:
        raise InvalidTokenError(
            f"{source}: a cluster id must be a uint64 from 1 to {MAX_CLUSTER_ID}, "
            f"got {_clip(str(value))}"
        )
    return value


def parse_number(text: str | bytes, source: str, *, limit: int, what: str) -> int:
    """A decimal field of a token (env value or parameter): OWS, then 1 to
    ``len(str(limit))`` ASCII digits, value from 1 to ``limit``."""
    raw = text.encode("latin-1", "replace") if isinstance(text, str) else bytes(text)
    digits = raw.strip(_OWS)
    width = len(str(limit))
    if _DIGITS.fullmatch(digits) is None:
        raise InvalidTokenError(f"{source}: {what} must be ASCII digits, got {_clip(text)}")
    if len(digits) > width:
        raise InvalidTokenError(
            f"{source}: {what} has {len(digits)} digits, at most {width}, got {_clip(text)}"
        )
    value = int(digits)
    if not 0 < value <= limit:
        raise InvalidTokenError(f"{source}: {what} must be from 1 to {limit}, got {_clip(text)}")
    return value


def _clip(text: str | bytes) -> str:
    if isinstance(text, bytes) and text.isascii():
        text = text.decode("ascii")
    return repr(text) if len(text) <= 32 else f"{text[:32]!r}... ({len(text)} characters)"


# -- the text form -------------------------------------------------------------------


def format_string(text: str) -> str:
    """``text`` as a parameter value: an sf-string when it is printable ASCII, else a
    display string (``%"..."``, UTF-8 percent-encoded)."""
    if text.isascii() and text.isprintable():
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    out = []
    for byte in text.encode("utf-8"):
        if byte in _PRINTABLE and byte not in b'%"':
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02x}")
    return '%"' + "".join(out) + '"'


def format_parameters(fields: dict[str, str | int | None]) -> str:
    """The ``; name=value`` tail for the non-``None`` ``fields`` (in :data:`PARAMETERS`
    order); empty when all are ``None``, so a token without a sequencer stays a bare
    number."""
    parts = []
    for name in PARAMETERS:
        value = fields.get(name)
        if value is None:
            continue
        text = format_string(value) if isinstance(value, str) else str(value)
        parts.append(f"; {name}={text}")
    return "".join(parts)


class _Cursor:
    """A position in the parameter bytes, with the carrier's name for errors."""

    __slots__ = ("data", "offset", "pos", "source")

    def __init__(self, data: bytes, source: str, offset: int) -> None:
        self.data, self.pos, self.source, self.offset = data, 0, source, offset

    def fail(self, problem: str) -> InvalidTokenError:
        return InvalidTokenError(f"{self.source}: {problem} (at byte {self.offset + self.pos})")

    def skip_ows(self) -> None:
        while self.pos < len(self.data) and self.data[self.pos] in _OWS:
            self.pos += 1

    def key(self) -> str:
        match = _PARAM_KEY.match(self.data, self.pos)
        if match is None:
            raise self.fail("expected a parameter name (lowercase letters) after ';'")
        self.pos = match.end()
        return match.group().decode("ascii")

    def string(self, name: str) -> str:
        """An sf-string or a display string, starting at the cursor."""
        display = self.data.startswith(b'%"', self.pos)
        if not display and not self.data.startswith(b'"', self.pos):
            raise self.fail(f'parameter {name} must be a quoted string ("..." or %"...")')
        self.pos += 2 if display else 1
        out = bytearray()
        while self.pos < len(self.data):
            byte = self.data[self.pos]
            self.pos += 1
            if byte == 0x22:  # the closing quote
                return self._decoded(bytes(out), name)
            if byte == 0x5C and not display:  # backslash: only \" and \\ exist
                nxt = self.data[self.pos : self.pos + 1]
                if nxt not in (b'"', b"\\"):
                    raise self.fail(f"parameter {name}: a backslash escapes only '\"' or '\\'")
                out += nxt
                self.pos += 1
            elif byte == 0x25 and display:  # %xx, lowercase hex
                hexits = self.data[self.pos : self.pos + 2]
                if re.fullmatch(rb"[0-9a-f]{2}", hexits) is None:
                    raise self.fail(f"parameter {name}: '%' must be followed by 2 lowercase hex")
                out.append(int(hexits, 16))
                self.pos += 2
            else:
                out.append(byte)
        raise self.fail(f"parameter {name}: unterminated string")

    def _decoded(self, raw: bytes, name: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"parameter {name}: not valid UTF-8 once percent-decoded") from None

    def number(self, name: str) -> int:
        match = _DIGITS.match(self.data, self.pos)
        after = self.data[match.end() : match.end() + 1] if match else b""
        if match is None or after not in (b"", b";", b" ", b"\t"):
            raise self.fail(f"parameter {name} must be a decimal number")
        self.pos = match.end()
        return parse_number(match.group(), self.source, limit=_NUMBERS[name], what=_WHAT[name])


def parse_parameters(data: bytes, source: str, offset: int = 0) -> dict[str, str | int]:
    """The parameters after the number's first ``;`` (``data`` starts right after it,
    at byte ``offset`` of the whole value: errors name that position)."""
    bad = next((b for b in data if b not in _PRINTABLE and b not in _OWS), None)
    if bad is not None:
        raise InvalidTokenError(
            f"{source}: parameters must be printable ASCII, got byte 0x{bad:02x} "
            '(a name with other characters is sent as %"...", percent-encoded)'
        )
    cursor = _Cursor(data, source, offset)
    found: dict[str, str | int] = {}
    while True:
        cursor.skip_ows()
        name = cursor.key()
        if name not in PARAMETERS:
            raise cursor.fail(f"unknown parameter {name!r} (known: {', '.join(PARAMETERS)})")
        if name in found:
            raise cursor.fail(f"parameter {name} given twice")
        if not data.startswith(b"=", cursor.pos):
            raise cursor.fail(f"parameter {name} needs a value ({name}=...)")
        cursor.pos += 1
        found[name] = cursor.string(name) if name in _STRINGS else cursor.number(name)
        cursor.skip_ows()
        if cursor.pos == len(data):
            return found
        if data[cursor.pos] != 0x3B:  # ';'
            raise cursor.fail(f"expected ';' or the end after parameter {name}")
        cursor.pos += 1

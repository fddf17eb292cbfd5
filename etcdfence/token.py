"""Fencing tokens: the number a resource uses to tell a current leader from a zombie.

A :class:`FencingToken` is the etcd header revision at which a lock or leadership
was confirmed. Revisions only grow, so a later term always carries a larger token.
Pass it with every write to a protected resource; the resource remembers the
highest token it accepted and rejects lower ones (see :class:`etcdfence.FenceGuard`
and :mod:`etcdfence.sql`).

A token also carries its *sequencer*: the lock or election name and the etcd cluster
id (besides the owner's key, create revision and lease), so a resource can tell a token
of its own lock from one of another lock or cluster (``token.lock``,
``token.cluster_id``, ``token.sequencer``).

Tokens travel between processes in the environment (``ETCDFENCE_TOKEN`` and
``ETCDFENCE_KEY`` / ``_LOCK`` / ``_CLUSTER`` / ``_CREATE_REVISION`` / ``_LEASE``, or
etcdctl's ``ETCD_LOCK_REV`` / ``ETCD_LOCK_KEY``), in the HTTP header ``Fencing-Token``,
or in message metadata under ``fencing-token``; the last two hold one value,
``123; lock="jobs/nightly"; cluster=...; key=...; crev=...; lease=...`` (grammar in
:mod:`etcdfence._sequencer`). Every reader still takes a bare number (then ``lock`` and
``cluster_id`` are ``None``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._sequencer import (
    MAX_CLUSTER_ID,
    MAX_TEXT,
    Sequencer,
    check_cluster_id,
    format_parameters,
    lock_name_of,
    lock_problem,
    parse_number,
    parse_parameters,
)
from .errors import InvalidTokenError

__all__ = [
    "ENV_VARS",
    "HEADER",
    "MAX_CLUSTER_ID",
    "MAX_TEXT",
    "MAX_TOKEN",
    "MAX_TOKEN_DIGITS",
    "METADATA_KEY",
    "FencingToken",
    "Sequencer",
    "coerce_token",
    "lock_name_of",
    "parse_token",
]

#: Environment variables read by :meth:`FencingToken.from_env`, in order.
ENV_VARS = ("ETCDFENCE_TOKEN", "ETCD_LOCK_REV")
#: HTTP header carrying a token (RFC 9110 field names are case-insensitive).
HEADER = "Fencing-Token"
#: Key used in message metadata (Kafka headers, AMQP properties, gRPC metadata).
METADATA_KEY = "fencing-token"
#: The largest token any guard accepts: etcd revisions are int64 (``mvccpb.KeyValue``
#: ``create_revision``/``mod_revision`` are ``int64`` in etcd's kv.proto). A larger
#: "token" could never be outdone by a real one and would fence a resource off forever.
MAX_TOKEN = 2**63 - 1


def coerce_token(token: object) -> int:
    """Return the integer value of ``token`` or raise :class:`InvalidTokenError`.

    Accepts a :class:`FencingToken` or a positive ``int`` (not ``bool``). Use it
    at every boundary where a token enters a write path.
    """
    if isinstance(token, FencingToken):
        return token.value
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidTokenError(
            f"a fencing token must be a positive int or FencingToken, got {type(token).__name__}"
        )
    if token <= 0:
        raise InvalidTokenError(f"a fencing token must be positive, got {token}")
    if token > MAX_TOKEN:
        raise InvalidTokenError(
            f"a fencing token must fit etcd's int64 revision range (<= {MAX_TOKEN}), got {token}"
        )
    return token


#: The most digits token text may have: ``len(str(MAX_TOKEN))``. Longer text is refused
#: before it is converted (``int()`` of more than 4,300 digits raises a bare ValueError,
#: and no revision needs more), leading zeros included.
MAX_TOKEN_DIGITS = len(str(MAX_TOKEN))
#: Optional whitespace around token text: RFC 9110's OWS, space and horizontal tab only.
_OWS = b" \t"
_SHOWN = 32  # characters of bad input quoted in an error message


def _show(text: str | bytes | bytearray) -> str:
    """``text`` quoted for an error message, clipped: hostile input can be long."""
    if len(text) <= _SHOWN:
        return repr(text)
    return f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def parse_token(text: str | bytes | bytearray, *, source: str = "fencing token") -> int:
    """Parse token text; the one rule every path applies (``from_env``, ``from_header``,
    ``from_metadata``, the HTTP middlewares, the CLI's ``--token``).

    The rule is an RFC 9110 field value holding a decimal: optional space/tab around
    (OWS, nothing else: no ``\\xa0``, no newline), then 1 to :data:`MAX_TOKEN_DIGITS`
    ASCII digits (no sign, ``_``, ``.`` or non-ASCII digit such as ``'١٢'``), whose
    value is a valid token (positive, at most :data:`MAX_TOKEN`). ``str`` (a WSGI
    header is latin-1 decoded text) and ``bytes`` (an ASGI header, Kafka metadata)
    follow the same rule. Anything else raises :class:`InvalidTokenError`, whose
    message starts with ``source`` (say ``"ETCDFENCE_TOKEN"``) and quotes the input
    clipped to a few dozen characters.
    """
    if isinstance(text, str):
        core = text.strip(" \t")
        if not core.isascii():
            bad = next(c for c in core if not c.isascii())
            raise InvalidTokenError(
                f"{source} must be ASCII digits, got {_show(text)} (character U+{ord(bad):04X})"
            )
        digits = core.encode("ascii")
    elif isinstance(text, (bytes, bytearray)):
        digits = bytes(text).strip(_OWS)
        if not digits.isascii():
            bad_byte = next(b for b in digits if b > 0x7F)
            raise InvalidTokenError(
                f"{source} must be ASCII digits, got {_show(bytes(text))} (byte 0x{bad_byte:02x})"
            )
    else:
        raise InvalidTokenError(f"{source} must be text, got {type(text).__name__}")
    if not digits:
        raise InvalidTokenError(f"{source} is empty")
    if not digits.isdigit():  # bytes.isdigit(): ASCII 0-9 only
        raise InvalidTokenError(
            f"{source} must be a positive decimal integer (digits 0-9 only), got {_show(text)}"
        )
    if len(digits) > MAX_TOKEN_DIGITS:
        raise InvalidTokenError(
            f"{source} has {len(digits)} digits; a token is an etcd revision (int64), "
            f"at most {MAX_TOKEN_DIGITS} digits, got {_show(text)}"
        )
    value = int(digits)
    if value == 0:
        raise InvalidTokenError(f"{source} must be positive, got {_show(text)}")
    if value > MAX_TOKEN:
        raise InvalidTokenError(
            f"{source} must fit etcd's int64 revision range (<= {MAX_TOKEN}), got {_show(text)}"
        )
    return value


def _is_metadata_key(key: object) -> bool:
    """``key`` names the token in metadata: ``fencing-token`` in any ASCII case (as HTTP
    field names compare; ``str.lower`` alone would also fold the Kelvin sign to ``k``)."""
    if isinstance(key, str):
        return key.isascii() and key.lower() == METADATA_KEY
    if isinstance(key, bytes):
        return key.lower() == METADATA_KEY.encode("ascii")
    return False


#: What :meth:`FencingToken.from_metadata` reads: a mapping, or ``(key, value)`` pairs.
Metadata = Mapping[Any, Any] | Iterable[Iterable[Any]]


def _metadata_items(metadata: object) -> list[tuple[Any, Any]]:
    """``metadata``'s entries as ``(key, value)`` pairs, repeats kept; a shape that is
    neither a mapping nor an iterable of pairs is an :class:`InvalidTokenError`."""
    if metadata is None:
        return []
    if isinstance(metadata, Mapping):
        return list(metadata.items())
    if isinstance(metadata, (str, bytes, bytearray, memoryview)) or not isinstance(
        metadata, Iterable
    ):
        raise InvalidTokenError(
            "message metadata must be a mapping or an iterable of (key, value) pairs, "
            f"got {type(metadata).__name__}"
        )
    items = []
    for entry in metadata:
        if isinstance(entry, (str, bytes, bytearray, Mapping)) or not isinstance(entry, Iterable):
            raise InvalidTokenError(
                f"message metadata entries must be (key, value) pairs, got {_shown(entry)}"
            )
        pair = tuple(entry)
        if len(pair) != 2:
            raise InvalidTokenError(
                "message metadata entries must be (key, value) pairs, "
                f"got one of {len(pair)} item(s)"
            )
        items.append((pair[0], pair[1]))
    return items


def _shown(entry: object) -> str:
    """A metadata entry named in an error: its type, and its text when short."""
    if isinstance(entry, (str, bytes, bytearray)):
        return f"{type(entry).__name__} {_show(entry)}"
    return type(entry).__name__


def _checked_fields(
    key: object, lock: object, cluster_id: object, lease_id: object, source: str
) -> tuple[str | None, int | None]:
    """The token's ``lock`` (given, else derived from ``key``) and ``cluster_id``,
    checked; :class:`InvalidTokenError` naming ``source`` for a bad or mismatched one."""
    if key is not None and (not isinstance(key, str) or not key or "\x00" in key):
        raise InvalidTokenError(f"{source}: key must be non-empty text without NUL, got {key!r}")
    derived = lock_name_of(key)  # type: ignore[arg-type]
    if lock is None:
        lock = derived
    else:
        problem = lock_problem(lock)
        if problem is not None:
            raise InvalidTokenError(f"{source}: lock name {_show(str(lock))} {problem}")
        if derived is not None and derived != lock:
            raise InvalidTokenError(
                f"{source}: lock {_show(str(lock))} is not the lock of key {_show(str(key))} "
                f"(which is {_show(derived)})"
            )
    if cluster_id is not None:
        cluster_id = check_cluster_id(cluster_id, source)
    if lease_id is not None and (
        isinstance(lease_id, bool) or not isinstance(lease_id, int) or not 0 < lease_id <= MAX_TOKEN
    ):
        raise InvalidTokenError(f"{source}: a lease id must be an int from 1 to {MAX_TOKEN}")
    return lock, cluster_id  # type: ignore[return-value]


@dataclass(frozen=True, order=True)
class FencingToken:
    """The fencing token of one lock hold or leadership term, and its sequencer.

    ``value`` is the etcd revision that confirmed ownership. ``key``,
    ``create_revision`` and ``lease_id`` identify the owner's key, so a resource can
    also check that the writer still holds it (``FenceGuard(..., require_owner=True)``).
    ``lock`` is the lock or election name (``key`` without ``/<lease hex>``: derived
    from ``key`` when not given, and refused when it disagrees with it) and
    ``cluster_id`` the etcd cluster that granted it (``ResponseHeader.cluster_id``, a
    uint64): revisions are only comparable within one cluster, and within it a bare
    revision says nothing of *which* lock it came from. Every lock and election fills
    all six; a token read from a bare number has only ``value``.

    Comparisons, hashing and ``int()`` use ``value`` alone: a fence orders tokens by
    revision, a bare number read back from a carrier must equal the holder's full
    token, and ``int`` and ``FencingToken`` stay interchangeable wherever a token is
    accepted. ``FencingToken(5, lock="a") == FencingToken(5, lock="b")`` is therefore
    true (two reads of one revision can confirm two locks); whether a token belongs to a
    lock is a separate, explicit question: compare :attr:`lock`/:attr:`cluster_id`, or
    use :attr:`sequencer` (a tuple of every field) as the identity of the hold.

    ``str(token)`` is the bare number (for logs and ``--token``); the carriers
    (:meth:`to_env`, :meth:`to_header`, :meth:`to_metadata`) carry every field. Use a
    token whenever a write must be rejected once a newer owner exists: pass it to
    ``FenceGuard.put``, ``SQLFence.guarded``, or send it along with :meth:`to_header`.
    """

    value: int
    key: str | None = field(default=None, compare=False)
    create_revision: int | None = field(default=None, compare=False)
    lease_id: int | None = field(default=None, compare=False)
    lock: str | None = field(default=None, compare=False)
    cluster_id: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Stored as the plain int: ``FencingToken(FencingToken(7)).value`` is ``7``, not a
        # FencingToken (whose key/lease would not be this token's anyway).
        object.__setattr__(self, "value", coerce_token(self.value))
        if self.create_revision is not None:
            object.__setattr__(self, "create_revision", coerce_token(self.create_revision))
        lock, cluster_id = _checked_fields(
            self.key, self.lock, self.cluster_id, self.lease_id, "FencingToken"
        )
        object.__setattr__(self, "lock", lock)
        object.__setattr__(self, "cluster_id", cluster_id)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __str__(self) -> str:
        """The bare revision: what logs show and ``--token`` takes (the carriers send
        the full form)."""
        return str(self.value)

    # -- the sequencer -------------------------------------------------------

    #: ``lock_name_of(key)``: the lock name of a contender key (``NAME/<lease hex>``).
    lock_name_of = staticmethod(lock_name_of)

    @property
    def sequencer(self) -> Sequencer:
        """Every field as one hashable :class:`~etcdfence.token.Sequencer` tuple
        ``(lock, cluster_id, key, create_revision, lease_id, revision)``: the identity
        of the hold (a verifier's cache key; tokens themselves compare by revision)."""
        return Sequencer(
            self.lock, self.cluster_id, self.key, self.create_revision, self.lease_id, self.value
        )

    @property
    def bare(self) -> bool:
        """Whether the token is only a number: no lock and no cluster (a token of an
        older sender, ``FencingToken(n)``, ``--token N``). A bound resource refuses it."""
        return self.lock is None and self.cluster_id is None

    @classmethod
    def _carried(cls, source: str, value: int, **fields: Any) -> FencingToken:
        """The token from a carrier's fields; a bad field is an error naming ``source``."""
        lock, cluster_id = _checked_fields(
            fields.get("key"),
            fields.get("lock"),
            fields.get("cluster_id"),
            fields.get("lease_id"),
            source,
        )
        fields.update(lock=lock, cluster_id=cluster_id)
        return cls(value, **fields)

    # -- the environment -----------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FencingToken:
        """Read the token a parent process exported: ``ETCDFENCE_TOKEN``, else
        ``ETCD_LOCK_REV`` (what ``etcdctl lock NAME -- cmd`` sets). The other fields come
        from the same family as the value: ``ETCDFENCE_KEY``, ``ETCDFENCE_LOCK``,
        ``ETCDFENCE_CLUSTER``, ``ETCDFENCE_CREATE_REVISION`` and ``ETCDFENCE_LEASE``
        beside ``ETCDFENCE_TOKEN``; ``ETCD_LOCK_KEY`` beside ``ETCD_LOCK_REV`` (its lock
        name is the key without ``/<lease hex>``). A field never pairs with the other
        family's value: a token of one lock must not take the name of another.

        ``ETCDFENCE_TOKEN`` wins whenever it is set: with both set to different values
        the result is ``ETCDFENCE_TOKEN``'s, silently (``etcdfence lock`` sets both to
        the same value; an outer ``etcdctl lock`` leaves its own ``ETCD_LOCK_REV``).
        A variable that is empty or holds only spaces/tabs (the only whitespace the
        token rule knows) counts as unset, so ``""`` and ``" "`` behave the same.

        Raises :class:`InvalidTokenError`, naming the variable, when neither is set or a
        value is malformed (a lock name ``validate_name`` refuses, a cluster id that is
        not a uint64, a lock that is not the key's).
        """
        env = os.environ if environ is None else environ
        for name in ENV_VARS:
            raw = env.get(name)
            if raw is not None and raw.strip(" \t") != "":
                return cls._from_family(env, name, parse_token(raw, source=name))
        raise InvalidTokenError(
            f"no fencing token in the environment (looked at {', '.join(ENV_VARS)})"
        )

    @classmethod
    def _from_family(cls, env: Mapping[str, str], name: str, value: int) -> FencingToken:
        family = _ENV_FAMILIES[name]
        fields: dict[str, Any] = {}
        for attr, var in family.items():
            raw = env.get(var)
            if raw is None or raw.strip(" \t") == "":
                continue
            if attr in ("key", "lock"):
                fields[attr] = raw
            else:
                limit = MAX_CLUSTER_ID if attr == "cluster_id" else MAX_TOKEN
                fields[attr] = parse_number(raw, var, limit=limit, what=_WHAT[attr])
        names = " / ".join([name, *(family[a] for a in fields)])
        return cls._carried(names, value, **fields)

    def to_env(self) -> dict[str, str]:
        """Variables a child process needs so that :meth:`from_env` finds this token:
        ``ETCDFENCE_TOKEN`` and every field's variable, ``""`` (unset) for a field the
        token lacks, so ``env.update(token.to_env())`` never leaves an outer token's
        field beside this value."""
        env = {"ETCDFENCE_TOKEN": str(self.value)}
        for attr, var in _ENV_FAMILIES["ETCDFENCE_TOKEN"].items():
            value = getattr(self, attr)
            env[var] = "" if value is None else str(value)
        return env

    # -- one-slot carriers: the HTTP header, message metadata ----------------

    @classmethod
    def from_text(
        cls, text: str | bytes | bytearray, *, source: str = "fencing token"
    ) -> FencingToken:
        """Parse the one-value form of :meth:`to_text` (a bare number, or the number with
        ``; lock=...`` parameters: see :mod:`etcdfence._sequencer` for the grammar).
        :class:`InvalidTokenError` names ``source`` and the problem."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise InvalidTokenError(f"{source} must be text, got {type(text).__name__}")
        if len(text) > MAX_TEXT and (";" in text if isinstance(text, str) else b";" in text):
            # (a bare number keeps parse_token's own messages: "5000 digits", ...)
            raise InvalidTokenError(
                f"{source} is {len(text)} characters long, at most {MAX_TEXT}: {_show(text)}"
            )
        if isinstance(text, str):
            cut = text.find(";")
            if cut < 0:
                return cls(parse_token(text, source=source))
            bad = next((c for c in text[cut:] if ord(c) > 0xFF), None)
            if bad is not None:  # a WSGI header is its bytes decoded as latin-1: not one
                raise InvalidTokenError(
                    f"{source}: parameters must be printable ASCII, got U+{ord(bad):04X}"
                )
            value = parse_token(text[:cut], source=source)
            rest = text[cut + 1 :].encode("latin-1")
        else:
            cut = text.find(b";")
            if cut < 0:
                return cls(parse_token(text, source=source))
            value = parse_token(text[:cut], source=source)
            rest = bytes(text[cut + 1 :])
        params = parse_parameters(rest, source, cut + 1)
        return cls._carried(
            source,
            value,
            key=params.get("key"),
            create_revision=params.get("crev"),
            lease_id=params.get("lease"),
            lock=params.get("lock"),
            cluster_id=params.get("cluster"),
        )

    def to_text(self) -> str:
        """The one-value form (ASCII) of the header and metadata: the bare number for a
        token with no other field, else ``"123; lock=\\"jobs/nightly\\"; cluster=...;
        key=...; crev=...; lease=..."``. Raises :class:`InvalidTokenError` when it would
        exceed :data:`MAX_TEXT` (a lock name of about a thousand characters)."""
        text = self.__dict__.get("_text")
        if text is None:
            text = str(self.value) + format_parameters(
                {
                    "lock": self.lock,
                    "cluster": self.cluster_id,
                    "key": self.key,
                    "crev": self.create_revision,
                    "lease": self.lease_id,
                }
            )
            if len(text) > MAX_TEXT:
                raise InvalidTokenError(
                    f"token {self.value}'s text form is {len(text)} characters, at most "
                    f"{MAX_TEXT}: lock {_show(self.lock or '')} is too long to send"
                )
            self.__dict__["_text"] = text  # a token is immutable: format it once
        return text

    @classmethod
    def from_header(cls, value: str | bytes | None) -> FencingToken:
        """Parse an HTTP ``Fencing-Token`` header value: a bare number (an older sender;
        then ``lock`` and ``cluster_id`` are ``None``) or :meth:`to_text`'s full form.
        Raises :class:`InvalidTokenError` naming the header and the problem."""
        if value is None:
            raise InvalidTokenError(f"missing {HEADER} header")
        return cls.from_text(value, source=f"{HEADER} header")

    def to_header(self) -> tuple[str, str]:
        """``(name, value)`` for an HTTP request: ``("Fencing-Token", token.to_text())``,
        e.g. ``"1234; lock=\\"jobs/nightly\\"; cluster=...; key=...; crev=...; lease=..."``
        (``"1234"`` for a bare token)."""
        return HEADER, self.to_text()

    @classmethod
    def from_metadata(cls, metadata: Metadata | None) -> FencingToken:
        """Read the token from message metadata (Kafka headers, AMQP properties, gRPC
        metadata): the ``fencing-token`` entry, its key compared ASCII
        case-insensitively, its value parsed by :meth:`from_text` (a bare number or
        the full form, as the HTTP header).

        ``metadata`` is a mapping (AMQP headers, a dict) or an iterable of ``(key,
        value)`` pairs: Kafka headers (kafka-python's ``ConsumerRecord.headers``,
        confluent-kafka's ``Message.headers()``: a list of ``(str, bytes)``), gRPC's
        ``context.invocation_metadata()`` (a tuple of pairs). ``None`` is no metadata.

        Raises :class:`InvalidTokenError` when there is none, when the value is
        malformed, when two entries name it (``fencing-token`` and ``Fencing-Token``
        keys, or one key in two pairs): which one the producer meant is unknowable, so
        it is refused as HTTP refuses a repeated ``Fencing-Token`` header — and when
        ``metadata`` is neither a mapping nor pairs (a ``str``, an ``int``, a 3-tuple).
        """
        found = [(k, v) for k, v in _metadata_items(metadata) if _is_metadata_key(k)]
        if not found:
            raise InvalidTokenError(f"no {METADATA_KEY!r} entry in message metadata")
        if len(found) > 1:
            keys = ", ".join(repr(k) for k, _ in found)
            raise InvalidTokenError(
                f"message metadata names the fencing token {len(found)} times ({keys}); "
                "send exactly one"
            )
        key, value = found[0]
        return cls.from_text(value, source=f"metadata {key!r}")

    def to_metadata(self) -> dict[str, str]:
        """Metadata to attach to a message: ``{"fencing-token": token.to_text()}``."""
        return {METADATA_KEY: self.to_text()}


_WHAT = {
    "create_revision": "a create revision (an int64)",
    "lease_id": "a lease id (an int64)",
    "cluster_id": "a cluster id (a uint64)",
}
#: Per value variable, the variable of each other field (the same-family rule).
_ENV_FAMILIES: dict[str, dict[str, str]] = {
    "ETCDFENCE_TOKEN": {
        "key": "ETCDFENCE_KEY",
        "lock": "ETCDFENCE_LOCK",
        "cluster_id": "ETCDFENCE_CLUSTER",
        "create_revision": "ETCDFENCE_CREATE_REVISION",
        "lease_id": "ETCDFENCE_LEASE",
    },
    "ETCD_LOCK_REV": {"key": "ETCD_LOCK_KEY"},
}

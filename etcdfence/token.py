"""Fencing tokens: the number a resource uses to tell a current leader from a zombie.

A :class:`FencingToken` is the etcd header revision at which a lock or leadership
was confirmed. Revisions only grow, so a later term always carries a larger token.
Pass it with every write to a protected resource; the resource remembers the
highest token it accepted and rejects lower ones (see :class:`etcdfence.FenceGuard`
and :mod:`etcdfence.sql`).

Tokens travel between processes as a decimal string: in the environment
(``ETCDFENCE_TOKEN``, or etcdctl's ``ETCD_LOCK_REV``), in the HTTP header
``Fencing-Token``, or in message metadata under ``fencing-token``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import InvalidTokenError

__all__ = [
    "ENV_VARS",
    "HEADER",
    "METADATA_KEY",
    "FencingToken",
    "coerce_token",
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


def parse_token(text: str | bytes) -> int:
    """Parse a decimal token as carried in env vars, headers and metadata."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidTokenError(f"fencing token is not ASCII: {text!r}") from None
    if not isinstance(text, str):
        raise InvalidTokenError(f"fencing token must be text, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped.isdigit() or not stripped.isascii():
        raise InvalidTokenError(f"fencing token must be a positive decimal integer, got {text!r}")
    return coerce_token(int(stripped))


@dataclass(frozen=True, order=True)
class FencingToken:
    """The fencing token of one lock hold or leadership term.

    ``value`` is the etcd revision that confirmed ownership; comparisons, hashing
    and ``int()`` use it alone. ``key``, ``create_revision`` and ``lease_id``
    identify the owner's key, so a resource can also check that the writer still
    holds it right now (``FenceGuard(..., require_owner=True)``).

    Use it whenever a write must be rejected once a newer owner exists: pass it to
    ``FenceGuard.put``, ``SQLFence.guarded`` or send it along as ``str(token)``.
    """

    value: int
    key: str | None = field(default=None, compare=False)
    create_revision: int | None = field(default=None, compare=False)
    lease_id: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        coerce_token(self.value)
        if self.create_revision is not None:
            coerce_token(self.create_revision)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return str(self.value)

    # -- propagation helpers -------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FencingToken:
        """Read the token a parent process exported: ``ETCDFENCE_TOKEN``, else
        ``ETCD_LOCK_REV`` (what ``etcdctl lock NAME -- cmd`` sets). ``ETCD_LOCK_KEY``
        / ``ETCDFENCE_KEY`` fill in ``key`` when present.

        Raises :class:`InvalidTokenError` when neither is set or the value is malformed.
        """
        env = os.environ if environ is None else environ
        for name in ENV_VARS:
            raw = env.get(name)
            if raw is not None and raw != "":
                key = env.get("ETCDFENCE_KEY") or env.get("ETCD_LOCK_KEY") or None
                return cls(parse_token(raw), key=key)
        raise InvalidTokenError(
            f"no fencing token in the environment (looked at {', '.join(ENV_VARS)})"
        )

    def to_env(self) -> dict[str, str]:
        """Variables a child process needs so that :meth:`from_env` finds this token."""
        env = {"ETCDFENCE_TOKEN": str(self.value)}
        if self.key is not None:
            env["ETCDFENCE_KEY"] = self.key
        return env

    @classmethod
    def from_header(cls, value: str | bytes | None) -> FencingToken:
        """Parse an HTTP ``Fencing-Token`` header value (raises :class:`InvalidTokenError`)."""
        if value is None:
            raise InvalidTokenError(f"missing {HEADER} header")
        return cls(parse_token(value))

    def to_header(self) -> tuple[str, str]:
        """``(name, value)`` for an HTTP request: ``("Fencing-Token", "1234")``."""
        return HEADER, str(self.value)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str | bytes] | None) -> FencingToken:
        """Read the token from message metadata (keys compared case-insensitively)."""
        if metadata:
            for k, v in metadata.items():
                if k.lower() == METADATA_KEY:
                    return cls(parse_token(v))
        raise InvalidTokenError(f"no {METADATA_KEY!r} entry in message metadata")

    def to_metadata(self) -> dict[str, str]:
        """Metadata to attach to a message: ``{"fencing-token": "1234"}``."""
        return {METADATA_KEY: str(self.value)}

"""The ``etcdfence_*`` keys of a Celery app's configuration, read and checked once.

Both halves read the same keys — the beat (:class:`~etcdfence.celery.LeaderScheduler`)
and the worker (:class:`~etcdfence.celery.FencedTask`) — so the resource whose mark the
beat advances is the one the workers' effects are fenced by, and the election whose
tokens the workers accept is the one the beat campaigns in.
"""

from __future__ import annotations

import importlib
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._keys import validate_name
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["MODES", "CeleryConfigError", "Settings", "load_object"]

#: ``etcdfence_mode`` values: ``auto`` (a token in the environment means ``env``, else
#: ``elect``), ``elect`` (campaign in a background thread), ``env`` (``etcdfence run``).
MODES = ("auto", "elect", "env")

#: Every key this module reads, with its default (``None``: derived, see :class:`Settings`).
DEFAULTS: dict[str, Any] = {
    "etcdfence_endpoints": None,
    "etcdfence_election": None,
    "etcdfence_identity": None,
    "etcdfence_ttl": 10,
    "etcdfence_resource": None,
    "etcdfence_prefix": None,
    "etcdfence_catchup": 10,
    "etcdfence_resend_window": 600,
    "etcdfence_mode": "auto",
    "etcdfence_advance": None,
    "etcdfence_fence_factory": None,
    "etcdfence_timeout": 5.0,
    "etcdfence_fencing": True,
}


class CeleryConfigError(InvalidArgumentError):
    """An ``etcdfence_*`` setting of the Celery app is missing or malformed; the message
    names the key and what it must be."""


def load_object(value: object, key: str) -> Any:
    """``value`` itself when callable, else the object a ``"module:attr"`` (or
    ``"module.attr"``) string names; :class:`CeleryConfigError` naming ``key`` otherwise.
    Config keys that take a hook accept both, so a hook can be set from a config file."""
    if callable(value):
        return value
    if not isinstance(value, str) or not value.strip():
        raise CeleryConfigError(f"{key} must be a callable or a 'module:attribute' string")
    module_name, sep, attr = value.partition(":")
    if not sep:
        module_name, _, attr = value.rpartition(".")
    if not module_name or not attr:
        raise CeleryConfigError(f"{key} must name 'module:attribute', got {value!r}")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise CeleryConfigError(f"{key}: cannot load {value!r}: {exc}") from None
    if not callable(found):
        raise CeleryConfigError(f"{key}: {value!r} is not callable")
    return found


def _name(conf: Mapping[str, Any], key: str, default: str) -> str:
    value = conf.get(key)
    if value is None:
        value = default
    try:
        return validate_name(value, key)
    except (InvalidArgumentError, InvalidTypeError) as exc:
        raise CeleryConfigError(str(exc)) from None


def _endpoints(conf: Mapping[str, Any]) -> list[str] | None:
    value = conf.get("etcdfence_endpoints")
    if value is None:
        value = os.environ.get("ETCDFENCE_ENDPOINTS") or None
    if value is None:
        return None  # the client's own default (127.0.0.1:2379)
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(v, str) and v for v in value)
    ):
        raise CeleryConfigError(
            "etcdfence_endpoints must be 'host:port[,host:port...]' or a list of them, "
            f"got {value!r}"
        )
    return list(value)


def _ttl(conf: Mapping[str, Any]) -> int:
    ttl = conf.get("etcdfence_ttl", DEFAULTS["etcdfence_ttl"])
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
        raise CeleryConfigError(
            f"etcdfence_ttl must be a whole number of seconds >= 1, got {ttl!r}"
        )
    return ttl


def _positive(conf: Mapping[str, Any], key: str, *, integer: bool) -> float:
    value: Any = conf.get(key, DEFAULTS[key])
    number = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not number or not math.isfinite(float(value)) or float(value) <= 0:
        what = "a whole number >= 1" if integer else "a number > 0"
        raise CeleryConfigError(f"{key} must be {what}, got {value!r}")
    return float(value)


def _window(conf: Mapping[str, Any]) -> float:
    value: Any = conf.get("etcdfence_resend_window", DEFAULTS["etcdfence_resend_window"])
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(float(value)) or float(value) < 0:
        raise CeleryConfigError(
            f"etcdfence_resend_window must be a number of seconds >= 0, got {value!r}"
        )
    return float(value)


@dataclass(frozen=True)
class Settings:
    """The checked ``etcdfence_*`` settings of one Celery app.

    =========================  ====================================  =====================
    key                        default                               meaning
    =========================  ====================================  =====================
    ``etcdfence_endpoints``    ``$ETCDFENCE_ENDPOINTS``              etcd endpoints
    ``etcdfence_election``     ``celery/<app main>/beat``            the beats' election
    ``etcdfence_identity``     ``host:pid``                          this beat's value
    ``etcdfence_ttl``          10                                    beat lease TTL (s)
    ``etcdfence_resource``     ``celery/<app main>``                 the workers' fence
    ``etcdfence_prefix``       ``/etcdfence/celery/<app main>/``     schedule state, slots
    ``etcdfence_catchup``      10                                    missed slots caught up
    ``etcdfence_resend_window``  600                                 sent slots re-sent (s)
    ``etcdfence_mode``         ``auto``                              ``elect`` / ``env``
    ``etcdfence_advance``      the etcd fence's ``advance``          ``hook(token)``
    ``etcdfence_fence_factory``  ``client.fence(resource)``          ``factory(app)``
    ``etcdfence_timeout``      5.0                                   etcd request timeout
    ``etcdfence_fencing``      True                                  False: control only
    =========================  ====================================  =====================
    """

    endpoints: list[str] | None
    election: str
    identity: str
    ttl: int
    resource: str
    prefix: str
    catchup: int
    resend_window: float
    mode: str
    advance: Callable[[Any], object] | None
    fence_factory: Callable[[Any], Any] | None
    timeout: float
    fencing: bool

    @property
    def state_resource(self) -> str:
        """The etcd fence guarding the schedule state (what the beat recorded)."""
        return self.election + "/state"

    def state_key(self, entry: str) -> str:
        """The key holding entry ``entry``'s last recorded slot."""
        return f"{self.prefix}schedule/{_quote(entry)}"

    def sent_prefix(self, entry: str | None = None) -> str:
        """The prefix of the SENT records (of ``entry``'s, or of every entry's): a new
        leader reads it to resend what was sent within ``etcdfence_resend_window``."""
        base = f"{self.prefix}sent/"
        return base if entry is None else f"{base}{_quote(entry)}/"

    def sent_key(self, entry: str, slot: str) -> str:
        """The key recording that slot ``slot`` of ``entry`` was published, and when."""
        return f"{self.sent_prefix(entry)}{_quote(slot)}"

    def slot_key(self, slot: str) -> str:
        """The key a worker creates, atomically with a slot's effect, to apply it once."""
        return f"{self.prefix}slots/{_quote(slot)}"

    @property
    def slots_visible(self) -> bool:
        """Whether the beat can read which slots the workers applied: their fence is the
        default etcd fence, so a slot's key is ``slot_key(slot)`` in this etcd."""
        return self.fence_factory is None and self.fencing

    @classmethod
    def from_app(cls, app: Any) -> Settings:
        """Read and check ``app.conf``; :class:`CeleryConfigError` names a bad key."""
        conf = app.conf
        unknown = sorted(k for k in conf if k.startswith("etcdfence_") and k not in DEFAULTS)
        if unknown:
            raise CeleryConfigError(
                f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}"
            )
        main = app.main
        if not main or main == "__main__":
            if conf.get("etcdfence_election") is None or conf.get("etcdfence_resource") is None:
                raise CeleryConfigError(
                    "the app has no name (Celery('name')): set etcdfence_election and "
                    "etcdfence_resource explicitly"
                )
            main = "app"
        return cls._read(conf, str(main))

    @classmethod
    def _read(cls, conf: Mapping[str, Any], main: str) -> Settings:
        mode = conf.get("etcdfence_mode", "auto")
        if mode not in MODES:
            raise CeleryConfigError(f"etcdfence_mode must be one of {MODES}, got {mode!r}")
        prefix = conf.get("etcdfence_prefix") or f"/etcdfence/celery/{main}/"
        if not isinstance(prefix, str) or not prefix.endswith("/") or "\x00" in prefix:
            raise CeleryConfigError(f"etcdfence_prefix must be text ending in '/', got {prefix!r}")
        identity = conf.get("etcdfence_identity") or f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(identity, str) or "\x00" in identity:
            raise CeleryConfigError(f"etcdfence_identity must be text, got {identity!r}")
        fencing = conf.get("etcdfence_fencing", True)
        if not isinstance(fencing, bool):
            raise CeleryConfigError(f"etcdfence_fencing must be True or False, got {fencing!r}")
        advance = conf.get("etcdfence_advance")
        factory = conf.get("etcdfence_fence_factory")
        if factory is not None and advance is None and fencing:
            raise CeleryConfigError(
                "etcdfence_fence_factory needs etcdfence_advance: the beat must advance the "
                "workers' mark in that store before its first publish, or a zombie beat's "
                "tasks and late copies of old slots would be accepted"
            )
        return cls(
            endpoints=_endpoints(conf),
            election=_name(conf, "etcdfence_election", f"celery/{main}/beat"),
            identity=identity,
            ttl=_ttl(conf),
            resource=_name(conf, "etcdfence_resource", f"celery/{main}"),
            prefix=prefix,
            catchup=int(_positive(conf, "etcdfence_catchup", integer=True)),
            resend_window=_window(conf),
            mode=mode,
            advance=None if advance is None else load_object(advance, "etcdfence_advance"),
            fence_factory=None
            if factory is None
            else load_object(factory, "etcdfence_fence_factory"),
            timeout=_positive(conf, "etcdfence_timeout", integer=False),
            fencing=fencing,
        )


def _quote(text: str) -> str:
    """``text`` safe as one key segment: ``%``, ``/`` and control characters escaped."""
    out = []
    for ch in text:
        if ch in "%/" or ord(ch) < 0x20 or ch == "\x7f":
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)

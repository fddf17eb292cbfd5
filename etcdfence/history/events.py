"""The event format: what a contender did or learned, and what etcd changed.

:class:`Event` is one JSON line (:meth:`Event.to_json`); :func:`jsonl_sink` writes
them from a process and :func:`parse_events` reads them back in another — the one
line protocol between a contender process and whoever checks it (the chaos suite, the
conformance kit's writers, the demo). :class:`Change` is one key change a watch saw.
:func:`write_value` / :func:`parse_write_value` encode a write's id and token in the
stored value, so a write that bypassed the guard is still attributed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import IO, Any

#: Kinds of :class:`Event` a recorder emits.
EVENT_KINDS = frozenset(
    {"campaign", "elected", "lost", "write", "accepted", "rejected", "unknown", "note"}
)
#: The kinds that end a write (its outcome).
OUTCOMES = frozenset({"accepted", "rejected", "unknown"})


@dataclass(frozen=True)
class Event:
    """One thing a contender did or learned, at ``t`` (``time.monotonic()``).

    ``token`` is the term's token for ``elected``/``lost`` and the token offered for a
    write; ``write_id`` ties a ``write`` to its outcome; ``revision`` is the revision of
    an accepted write; ``current`` the mark a rejection reported; ``deadline`` the
    session's local deadline when the event was recorded.
    """

    t: float
    contender: str
    kind: str
    token: int | None = None
    resource: str | None = None
    key: str | None = None
    write_id: str | None = None
    revision: int | None = None
    current: int | None = None
    deadline: float | None = None
    lease: int | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as a dict (what :meth:`to_json` encodes)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_json(self) -> str:
        """One compact JSON line; :func:`parse_events` reads it back."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def describe(self) -> str:
        """A one-line human-readable form, as used in the slice of a report."""
        parts = [f"t={self.t:.3f}", self.contender, self.kind]
        for name in ("token", "resource", "write_id", "revision", "current", "lease"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value:x}" if name == "lease" else f"{name}={value}")
        if self.deadline is not None:
            parts.append(f"deadline={self.deadline:.3f}")
        if self.detail:
            parts.append(f"({self.detail})")
        return " ".join(parts)


@dataclass(frozen=True)
class Change:
    """One key change etcd made, as a watch reported it."""

    revision: int
    key: str
    value: str
    deleted: bool = False
    create_revision: int = 0
    lease: int = 0

    def describe(self) -> str:
        """A one-line human-readable form, as used in the slice of a report."""
        what = "DELETE" if self.deleted else f"PUT {self.value!r}"
        return f"rev={self.revision} {what} {self.key}"


def write_value(write_id: str, token: int) -> str:
    """The value a recorded write stores: its id and token, so the observer can tell
    which write (and which token) the resource accepted, guarded or not."""
    return json.dumps({"w": write_id, "tok": token}, separators=(",", ":"))


def parse_write_value(value: str | bytes) -> tuple[str, int] | None:
    """``(write_id, token)`` of a value made by :func:`write_value`, else ``None``."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not value.startswith("{"):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    write_id, token = data.get("w"), data.get("tok")
    if not isinstance(write_id, str) or not isinstance(token, int):
        return None
    return write_id, token


def jsonl_sink(stream: IO[str]) -> Callable[[Event], None]:
    """A recorder sink that prints each event as one JSON line and flushes."""
    lock = threading.Lock()

    def sink(event: Event) -> None:
        line = event.to_json() + "\n"
        with lock:
            stream.write(line)
            stream.flush()

    return sink


def parse_events(lines: Iterable[str]) -> list[Event]:
    """Events from JSON lines (as written by :func:`jsonl_sink`); other lines are skipped."""
    events = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("kind") in EVENT_KINDS and "t" in data:
            events.append(Event.from_dict(data))
    return events

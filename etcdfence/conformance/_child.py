"""A writer process of the conformance kit: builds the user's adapter from its factory
and writes on command, printing history events as JSON lines.

    python -m etcdfence.conformance._child package.module:factory

The kit starts it (see :mod:`etcdfence.conformance._writers`); it is not meant to be run
by hand. stdin carries one JSON command per line::

    {"id": 1, "contender": "p1", "key": "...", "resource": "...", "token": 1234, "count": 20}

``"token": null`` means: take the token from the environment
(:meth:`etcdfence.FencingToken.from_env`, i.e. ``ETCDFENCE_TOKEN``), as a command run
under ``etcdfence lock``/``run`` does. Every write is one ``write`` event and its
outcome; each command ends with the note ``done <id>``. The first line is the note
``ready`` (the adapter is built; a factory taking ``endpoints=`` gets
``ETCDFENCE_ENDPOINTS``). EOF on stdin closes the adapter and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..testing.history import Recorder, jsonl_sink
from ..token import FencingToken
from ._adapter import Adapter, build, load_factory


def record_writes(adapter: Adapter, recorder: Recorder, command: dict[str, Any]) -> None:
    """Run one write command: ``count`` writes of ``key`` with the command's token (or
    the environment's), each recorded with its outcome (no revision: the kit cannot
    know one for a resource that is not etcd)."""
    raw = command.get("token")
    token = FencingToken.from_env() if raw is None else FencingToken(int(raw))
    key = str(command["key"])
    resource = str(command.get("resource") or key)
    for _ in range(int(command.get("count", 1))):
        pending = recorder.write(resource, key, token)
        outcome, detail = adapter.attempt(token, key, pending.value)
        if outcome == "accepted":
            recorder.accepted(pending, None)  # type: ignore[arg-type]
        elif outcome == "rejected":
            recorder.rejected(pending, detail=detail)
        else:
            recorder.unknown(pending, detail or "")


def main(argv: list[str] | None = None) -> int:
    """Build the adapter, then serve write commands from stdin until EOF."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m etcdfence.conformance._child module:factory", file=sys.stderr)
        return 2
    endpoints = [e for e in os.environ.get("ETCDFENCE_ENDPOINTS", "").split(",") if e]
    adapter = build(load_factory(args[0]), endpoints)
    sink = jsonl_sink(sys.stdout)
    recorders: dict[str, Recorder] = {}
    Recorder("writer", sink).note("ready")
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            name = str(command["contender"])
            recorder = recorders.setdefault(name, Recorder(name, sink))
            try:
                record_writes(adapter, recorder, command)
            finally:
                recorder.note(f"done {command['id']}")
    finally:
        adapter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A writer process of the conformance kit: builds the user's adapter from its factory
and writes on command, printing history events as JSON lines.

    python -m etcdfence.conformance._child package.module:factory

The kit starts it (see :mod:`etcdfence.conformance._writers`); it is not meant to be run
by hand. stdin carries one JSON command per line::

    {"id": 1, "contender": "p1", "key": "...", "resource": "...", "token": 1234, "count": 20,
     "at": 1700000000.25}

``"token": null`` means: take the token from the environment
(:meth:`etcdfence.FencingToken.from_env`, i.e. ``ETCDFENCE_TOKEN``), as a command run
under ``etcdfence lock``/``run`` does. Every write is one ``write`` event and its
outcome; each command ends with the note ``done <id>``. The first line is the note
``ready`` (the adapter is built; a factory taking ``endpoints=`` gets
``ETCDFENCE_ENDPOINTS``). EOF on stdin closes the adapter and exits 0. ``"at"``
(optional) is a start barrier: a ``time.time()`` moment the writes wait for, so that
writers in several processes start together.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..fence.base import TokenLike
from ..history import Recorder, jsonl_sink
from ..token import FencingToken
from ._adapter import build, load_factory


def carried_token(token: TokenLike | None) -> int | str | None:
    """``token`` as a write command carries it to a writer (JSON): a bare number as an
    int, a :class:`FencingToken` as its ``Fencing-Token`` header text, which keeps the
    whole sequencer (lock, cluster id) for a resource bound to its lock."""
    if isinstance(token, FencingToken):
        return token.to_header()[1]
    return token


def command_token(raw: int | str | None) -> FencingToken:
    """The token of a write command (:func:`carried_token`; None: the environment's)."""
    if raw is None:
        return FencingToken.from_env()
    if isinstance(raw, str):
        return FencingToken.from_header(raw)
    return FencingToken(int(raw))


def record_writes(
    attempt: Callable[[Any, str, str], tuple[str, str | None]],
    recorder: Recorder,
    command: dict[str, Any],
) -> None:
    """Run one write command: ``count`` writes of ``key`` (or, with ``"keys"``: one write
    of each ``[key, resource]`` in turn) with the command's token (or the
    environment's), each through ``attempt`` (:meth:`Adapter.attempt`) and recorded
    with its outcome (no revision: the kit cannot know one for a resource that is not
    etcd)."""
    token = command_token(command.get("token"))
    key = str(command["key"])
    resource = str(command.get("resource") or key)
    targets = [(str(k), str(r)) for k, r in command.get("keys") or []]
    targets = targets or [(key, resource)] * int(command.get("count", 1))
    if command.get("at") is not None:
        wait_until(float(command["at"]))
    for key, resource in targets:
        pending = recorder.write(resource, key, token)
        outcome, detail = attempt(token, key, pending.value)
        if outcome == "accepted":
            recorder.accepted(pending, None)  # type: ignore[arg-type]
        elif outcome == "rejected":
            recorder.rejected(pending, detail=detail)
        else:
            recorder.unknown(pending, detail or "")


#: The last seconds before a start moment are spun, not slept (a sleep can overshoot).
SPIN = 0.002


def wait_until(moment: float) -> None:
    """Return at the ``time.time()`` ``moment`` (at once if it has passed), to within
    tens of microseconds: writers of one barrier start together."""
    remaining = moment - time.time()
    if remaining > SPIN:
        time.sleep(remaining - SPIN)
    while time.time() < moment:
        pass


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
                record_writes(adapter.attempt, recorder, command)
            finally:
                recorder.note(f"done {command['id']}")
    finally:
        adapter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A recipe holder process for tests/test_recipes.py (read-write lock, semaphore, group).

Usage: ``python _recipe_holder.py sync|async ENDPOINT NAME KIND MODE [ARGS]``

KIND is ``read``, ``write`` (the two sides of ``session.rwlock(NAME)``), ``sem:N``
(``session.semaphore(NAME, permits=N)``) or ``member:ID`` (joins group NAME as ID).

MODE:

* ``stress ROUNDS LOG``: ROUNDS times acquire, append ``enter KIND PID`` to LOG, hold a
  few ms, append ``exit KIND PID``, release; print ``done``. Appends with ``O_APPEND``
  are ordered by the file, and each line is written inside the hold, so the file's
  intervals are inside the real holds: overlapping lines prove overlapping holds.
* ``hold RESOURCE``: acquire, print ``{"token": N}``, then wait for a line on stdin
  (the test froze and thawed us meanwhile) and act on the guarded resource with the
  token: a writer or permit holder writes ``RESOURCE/data`` through the fence guard of
  RESOURCE; a reader checks its token against the guard's mark before "serving" a read
  (a reader must not move the mark: it would refuse its fellow readers). Print
  ``accepted`` or ``refused``.
* ``join TTL``: join the group on a session with TTL, print ``joined``, wait forever.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

import etcdfence as ef

TTL = 2


def _side(session: Any, name: str, kind: str) -> Any:
    if kind == "read":
        return session.rwlock(name).read()
    if kind == "write":
        return session.rwlock(name).write()
    return session.semaphore(name, permits=int(kind.split(":")[1]))


def _log(path: str, what: str, kind: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {kind} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _verdict(kind: str, token: int, guard: Any, mark: int | None) -> str:
    """A reader's check: its token must not be below the mark the writers left."""
    del guard
    return "refused" if mark is not None and token < mark else "accepted"


def run_sync(endpoint: str, name: str, kind: str, mode: str, args: list[str]) -> None:
    client = ef.Client(endpoint, timeout=5)
    if kind.startswith("member:"):
        session = client.session(int(args[0]), margin=0.2)
        session.open()
        client.group(name).join(kind.split(":", 1)[1], b"caps", session=session)
        print("joined", flush=True)
        while True:
            time.sleep(60)
    session = client.session(TTL if mode == "hold" else 10, margin=0.2)
    session.open()
    side = _side(session, name, kind)
    if mode == "stress":
        for _ in range(int(args[0])):
            with side:
                _log(args[1], "enter", kind)
                time.sleep(random.uniform(0, 0.01))
                _log(args[1], "exit", kind)
        print("done", flush=True)
        session.close()
        client.close()
        return
    token = side.acquire(timeout=20)
    print(json.dumps({"token": token.value}), flush=True)
    sys.stdin.readline()
    guard = client.fence(args[0])
    try:
        if kind == "read":
            print(_verdict(kind, token.value, guard, guard.current()), flush=True)
        else:
            guard.put(token, args[0] + "/data", f"from {os.getpid()}")
            print("accepted", flush=True)
    except ef.StaleTokenError:
        print("refused", flush=True)


async def run_async(endpoint: str, name: str, kind: str, mode: str, args: list[str]) -> None:
    client = ef.AsyncClient(endpoint, timeout=5)
    if kind.startswith("member:"):
        session = client.session(int(args[0]), margin=0.2)
        await session.open()
        await client.group(name).join(kind.split(":", 1)[1], b"caps", session=session)
        print("joined", flush=True)
        await asyncio.Event().wait()
    session = client.session(TTL if mode == "hold" else 10, margin=0.2)
    await session.open()
    side = _side(session, name, kind)
    if mode == "stress":
        for _ in range(int(args[0])):
            async with side:
                _log(args[1], "enter", kind)
                await asyncio.sleep(random.uniform(0, 0.01))
                _log(args[1], "exit", kind)
        print("done", flush=True)
        await session.aclose()
        await client.aclose()
        return
    token = await side.acquire(timeout=20)
    print(json.dumps({"token": token.value}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    guard = client.fence(args[0])
    try:
        if kind == "read":
            print(_verdict(kind, token.value, guard, await guard.current()), flush=True)
        else:
            await guard.put(token, args[0] + "/data", f"from {os.getpid()}")
            print("accepted", flush=True)
    except ef.StaleTokenError:
        print("refused", flush=True)


if __name__ == "__main__":
    twin, endpoint, name, kind, mode, *rest = sys.argv[1:]
    if twin == "sync":
        run_sync(endpoint, name, kind, mode, rest)
    else:
        asyncio.run(run_async(endpoint, name, kind, mode, rest))

"""A holder process for tests/test_holder_reads.py: it holds a lock, an election term and
a leader elector's term, prints ``ready``, and on SIGCONT (after the test froze it past
its sessions' deadlines with SIGSTOP) reads every "am I still the holder?" answer at
once — the sync twin takes SIGCONT with sigwaitinfo() in the main thread, the async one
in a signal handler — and prints them as one JSON line.

Usage: ``python _paused_holder.py sync|async ENDPOINT NAMESPACE``
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from typing import Any

import etcdfence as ef

TTL = 2


def _reads(session: Any, lock: Any, election: Any, elector: Any) -> dict[str, Any]:
    """Every holder read, ``expired`` first (the one the keepalive worker used to set)."""
    out: dict[str, Any] = {"expired": session.expired}
    out["elector_session_expired"] = elector.session.expired
    out["lock_token"] = lock.token is not None
    out["election_token"] = election.token is not None
    out["elector_token"] = elector.token is not None
    out["elector_is_leader"] = elector.is_leader()
    out["expiry_reason"] = session.expiry_reason
    for name, target in (("check", session), ("elector_check", elector.session)):
        try:
            target.check()
            out[name] = "ok"
        except ef.SessionExpiredError:
            out[name] = "expired"
    return out


def _on_cont(session: Any, lock: Any, election: Any, elector: Any) -> None:
    """Read on SIGCONT. Every other thread was started with SIGCONT blocked (see the
    main block), so the kernel delivers it to the main thread, which runs the handler
    at once instead of at its next bytecode after some other thread took it."""

    def handler(signum: int, frame: Any) -> None:
        print(json.dumps(_reads(session, lock, election, elector)), flush=True)

    signal.signal(signal.SIGCONT, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCONT})


def run_sync(endpoint: str, ns: str) -> None:
    client = ef.Client(endpoint, timeout=5)
    session = client.session(TTL, margin=0.2)
    session.open()
    lock = session.lock(ns + "/lock")
    lock.acquire(timeout=10)
    election = session.election(ns + "/election")
    election.campaign("me", timeout=10)
    elected = threading.Event()
    elector = ef.LeaderElector(
        client,
        ns + "/elector",
        identity="me",
        ttl=TTL,
        margin=0.2,
        on_elected=lambda token: elected.set(),
    )
    threading.Thread(target=elector.run, args=(lambda t, stop: stop.wait(),), daemon=True).start()
    elected.wait(10)
    # SIGCONT is blocked in every thread: take it synchronously here (a handler would
    # need the kernel to pick the main thread, and pause() to be the call it interrupts)
    print("ready", flush=True)
    signal.sigwaitinfo({signal.SIGCONT})
    print(json.dumps(_reads(session, lock, election, elector)), flush=True)
    while True:
        signal.pause()


async def run_async(endpoint: str, ns: str) -> None:
    client = ef.AsyncClient(endpoint, timeout=5)
    session = client.session(TTL, margin=0.2)
    await session.open()
    lock = session.lock(ns + "/lock")
    await lock.acquire(timeout=10)
    election = session.election(ns + "/election")
    await election.campaign("me", timeout=10)
    elected = asyncio.Event()
    elector = ef.AsyncLeaderElector(
        client,
        ns + "/elector",
        identity="me",
        ttl=TTL,
        margin=0.2,
        on_elected=lambda token: elected.set(),
    )
    runner = asyncio.ensure_future(elector.run(lambda t, stop: stop.wait()))
    await asyncio.wait_for(elected.wait(), 10)
    # a plain handler, not loop.add_signal_handler: it runs when the loop's select()
    # returns EINTR, before any task (the deadline worker included) gets a turn
    _on_cont(session, lock, election, elector)
    print("ready", flush=True)
    await runner


if __name__ == "__main__":
    kind, endpoint, namespace = sys.argv[1:4]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})  # inherited by every thread
    if kind == "sync":
        run_sync(endpoint, namespace)
    else:
        asyncio.run(run_async(endpoint, namespace))

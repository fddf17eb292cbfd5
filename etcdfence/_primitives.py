"""The primitives the fence engine needs, in both forms, without gRPC.

The fence engine (:mod:`etcdfence.fence._async.engine`) pauses between resent claims
and lets one claim of a writer fly at a time; the Redis and SQL fences run on it
without etcd's client, so what it needs must not load ``grpc``
(``etcdfence/_acompat.py`` does, for channels). ``_acompat`` re-exports these pairs,
so the core twins keep saying ``_compat.sleep`` / ``_compat.Lock``.
"""

from __future__ import annotations

import asyncio
import threading
import time


async def asleep(seconds: float) -> None:
    """Sleep ``seconds`` (a negative duration returns at once)."""
    await asyncio.sleep(max(0.0, seconds))


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` (a negative duration returns at once)."""
    time.sleep(max(0.0, seconds))


#: A lock of one writer's claims: an asyncio lock, and a thread lock for the sync twin.
ALock = asyncio.Lock
Lock = threading.Lock

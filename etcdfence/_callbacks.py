"""The types of a leader's ``work`` and of the elector's callbacks, for both twins.

The async source names the ``Async…`` forms; ``tools/async_to_sync.py`` renames them
to the plain forms in the sync twin. On the asyncio side ``work`` must be a
coroutine function (a plain function would block the event loop and could not be
cancelled on loss), so ``mypy --strict`` rejects a sync ``work`` given to
:class:`~etcdfence.AsyncLeaderElector`; callbacks may be plain functions or
coroutine functions, and a returned awaitable is awaited. On the sync side
everything is a plain function; an awaitable returned there is refused at run time
(:class:`~etcdfence.errors.InvalidTypeError`), never silently dropped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from .token import FencingToken
from .types import Leader

__all__ = [
    "AsyncOnElected",
    "AsyncOnLeaderChange",
    "AsyncOnLost",
    "AsyncWork",
    "OnElected",
    "OnLeaderChange",
    "OnLost",
    "Work",
]

#: ``async def work(token, stop: asyncio.Event)``: runs while leading, cancelled on loss.
AsyncWork: TypeAlias = Callable[[FencingToken, asyncio.Event], Awaitable[object]]
#: ``def work(token, stop: threading.Event)``: runs while leading, must return once
#: ``stop`` is set.
Work: TypeAlias = Callable[[FencingToken, threading.Event], object]

#: ``on_elected(token)``: a plain function or a coroutine function (awaited).
AsyncOnElected: TypeAlias = Callable[[FencingToken], Awaitable[object] | None]
OnElected: TypeAlias = Callable[[FencingToken], object]

#: ``on_lost()``: a plain function or a coroutine function (awaited).
AsyncOnLost: TypeAlias = Callable[[], Awaitable[object] | None]
OnLost: TypeAlias = Callable[[], object]

#: ``on_leader_change(leader_or_none)``: a plain function or a coroutine function.
AsyncOnLeaderChange: TypeAlias = Callable[[Leader | None], Awaitable[object] | None]
OnLeaderChange: TypeAlias = Callable[[Leader | None], object]

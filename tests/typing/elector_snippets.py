"""Checked by tests/test_typing.py with mypy --strict; each line with an ``E:`` comment must
be reported with that message fragment, and no other line may be."""

from __future__ import annotations

import asyncio
import threading

import etcdfence as ef


async def async_work(token: ef.FencingToken, stop: asyncio.Event) -> None:
    await stop.wait()


def sync_work(token: ef.FencingToken, stop: threading.Event) -> None:
    stop.wait()


def blocking_work(token: ef.FencingToken, stop: asyncio.Event) -> None:
    """Right parameters, but a plain function: it would block the event loop."""


async def async_on_elected(token: ef.FencingToken) -> None:
    await asyncio.sleep(0)


def sync_on_elected(token: ef.FencingToken) -> None:
    pass


async def main(client: ef.AsyncClient, sync_client: ef.Client) -> None:
    elector = ef.AsyncLeaderElector(
        client, "svc", identity="a", on_elected=async_on_elected, on_lost=lambda: None
    )
    await elector.run(async_work)
    ef.AsyncLeaderElector(client, "svc", identity="a", on_elected=sync_on_elected)
    await elector.run(sync_work)  # E: to "run" of "AsyncLeaderElector"
    await elector.run(blocking_work)  # E: to "run" of "AsyncLeaderElector"
    await elector.run(lambda token, stop: None)  # E: "None"

    sync_elector = ef.LeaderElector(sync_client, "svc", identity="a", on_elected=print)
    sync_elector.run(sync_work)
    sync_elector.run(async_work)  # E: to "run" of "LeaderElector"
    ef.LeaderElector(sync_client, "svc", identity="a", on_elected=1)  # E: "on_elected"

"""Async callbacks are awaited; what one twin cannot run is refused, never dropped.

0.2 typed ``on_elected`` as ``Callable[..., Any]`` and called it without awaiting: an
``async def on_elected`` type-checked and never ran. Now the async elector awaits
coroutine callbacks (in order: elected before work, lost after work ended), refuses a
plain ``work`` (it would block the loop) and the sync elector refuses anything that
returns an awaitable, with :class:`InvalidTypeError`, ending ``run()``.
"""

from __future__ import annotations

import asyncio
import threading
import warnings

import pytest

import etcdfence as ef

pytestmark = pytest.mark.integration


async def test_async_callbacks_are_awaited_in_order(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    events: list[str] = []
    changes: list[ef.Leader | None] = []

    async def on_elected(token: ef.FencingToken) -> None:
        await asyncio.sleep(0.05)  # a real suspension: a dropped coroutine never gets here
        events.append(f"elected {token.value > 0}")

    async def on_lost() -> None:
        await asyncio.sleep(0.05)
        events.append("lost")

    async def on_leader_change(leader: ef.Leader | None) -> None:
        await asyncio.sleep(0)
        changes.append(leader)

    elector = ef.AsyncLeaderElector(
        async_etcd_client,
        etcd_namespace + "/svc",
        identity="a",
        ttl=5,
        on_elected=on_elected,
        on_lost=on_lost,
        on_leader_change=on_leader_change,
    )

    async def work(token: ef.FencingToken, stop: asyncio.Event) -> None:
        events.append("work")
        for _ in range(200):  # until the awaited on_leader_change has seen us lead
            if any(leader is not None and leader.value == b"a" for leader in changes):
                break
            await asyncio.sleep(0.025)
        elector.stop()
        await asyncio.sleep(3600)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        await asyncio.wait_for(elector.run(work), 10)
    assert events == ["elected True", "work", "lost"]
    assert any(leader is not None and leader.value == b"a" for leader in changes), changes


async def test_async_elector_refuses_a_plain_work(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/svc"
    ran: list[bool] = []
    elector = ef.AsyncLeaderElector(async_etcd_client, name, identity="a", ttl=5)

    def blocking(token: ef.FencingToken, stop: asyncio.Event) -> None:
        ran.append(True)

    with pytest.raises(ef.InvalidTypeError, match="coroutine function"):
        await asyncio.wait_for(elector.run(blocking), 10)  # type: ignore[arg-type]
    assert ran == [True]
    assert await async_etcd_client.leader(name) is None, "the term ended and resigned"


def test_sync_elector_refuses_async_work_and_callbacks(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = etcd_namespace + "/svc"

    async def async_work(token: ef.FencingToken, stop: threading.Event) -> None:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the coroutine is closed, not leaked
        elector = ef.LeaderElector(etcd_client, name, identity="a", ttl=5)
        with pytest.raises(ef.InvalidTypeError, match="AsyncLeaderElector"):
            elector.run(async_work)
        assert etcd_client.leader(name) is None

        async def on_elected(token: ef.FencingToken) -> None:
            pass

        ran: list[int] = []
        elector = ef.LeaderElector(etcd_client, name, identity="a", ttl=5, on_elected=on_elected)
        with pytest.raises(ef.InvalidTypeError, match="callback returned an awaitable"):
            elector.run(lambda token, stop: ran.append(1))
        assert ran == [], "work must not start when on_elected was refused"
        assert etcd_client.leader(name) is None

"""Sessions against a real etcd: lease, keepalive, local deadline, close/orphan, expiry.

Every test runs on both twins (``api`` is ``sync`` or ``async``).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, lease_ttl, poll, revoke_lease

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()


async def test_lease_granted_with_requested_ttl(api: Api, etcd_namespace: str) -> None:
    async with api.session(ttl=2) as session:
        assert session.lease_id > 0 and session.ttl == 2 and not session.expired
        assert 0 < await lease_ttl(api, session.lease_id) <= 2
        assert session.deadline > time.monotonic()
        # a key attached through the session carries the lease
        token = await api(session.lock(etcd_namespace + "/l").acquire)
        kv = await api(api.client.get, token.key)
        assert kv is not None and kv.lease_id == session.lease_id == token.lease_id


async def test_first_use_opens_the_session(api: Api, etcd_namespace: str) -> None:
    session = api.client.session(2)
    try:
        token = await api(session.lock(etcd_namespace + "/l").acquire)
        assert token.lease_id == session.lease_id > 0
    finally:
        await api.close(session)
    assert await api(api.client.get, token.key) is None


async def test_keepalive_outlives_several_ttls_on_one_stream(api: Api, etcd_namespace: str) -> None:
    """ttl=1: the keys survive >2 TTLs; 3 locks + 2 elections share one keepalive stream."""
    calls = api.count_calls(api.client)
    async with api.session(ttl=1) as session:
        tokens = [await api(session.lock(f"{etcd_namespace}/lock{i}").acquire) for i in range(3)]
        tokens += [
            await api(session.election(f"{etcd_namespace}/el{i}").campaign, b"v") for i in range(2)
        ]
        started, sent = time.monotonic(), session.keepalives_sent
        assert not await api(session.wait_expired, 2.3)
        assert await lease_ttl(api, session.lease_id) >= 0  # whole seconds left; -1 = gone
        for token in tokens:
            kv = await api(api.client.get, token.key)
            assert kv is not None and kv.create_revision == token.create_revision
        assert await api(session.lock(f"{etcd_namespace}/lock0").is_owner)
        elapsed = time.monotonic() - started
        # one keepalive every ttl/3 for the whole session, not one per lock/election
        # (counted from `started`: how long the acquires took does not matter)
        assert elapsed / 0.34 - 2 <= session.keepalives_sent - sent <= elapsed / 0.3 + 2
        assert calls["stream:LeaseKeepAlive"] == 1
        assert calls["LeaseGrant"] == 1


async def test_close_revokes_at_once(api: Api, etcd_namespace: str) -> None:
    session = await api.open_session(ttl=30)
    fired: list[float] = []
    session.on_expired(lambda: fired.append(time.monotonic()))
    token = await api(session.lock(etcd_namespace + "/l").acquire)
    election_token = await api(session.election(etcd_namespace + "/e").campaign, b"x")
    await api.close(session)
    assert session.expired
    # no waiting for the TTL: the lease is revoked, its keys are gone now
    assert await api(api.client.get, token.key) is None
    assert await api(api.client.get, election_token.key) is None
    assert await lease_ttl(api, session.lease_id) == -1
    with pytest.raises(ef.SessionExpired):
        await api(session.lock(etcd_namespace + "/l2").acquire)
    await api.close(session)  # closing twice is harmless


async def test_orphan_expires_locally_before_the_server_drops_the_keys(
    api: Api, etcd_namespace: str
) -> None:
    session = await api.open_session(ttl=1)
    try:
        lock = session.lock(etcd_namespace + "/l")
        election = session.election(etcd_namespace + "/e")
        token = await api(lock.acquire)
        await api(election.campaign, b"leader")
        fired: list[float] = []
        session.on_expired(lambda: fired.append(time.monotonic()))
        session.on_expired(lambda: fired.append(-1.0))
        assert not await api(session.wait_expired, 0.05)

        await api(session.orphan)
        orphaned = time.monotonic()
        # the keepalive stopped, but the lease was not revoked
        assert await api(api.client.get, token.key) is not None
        assert await api(session.wait_expired, 2.0)
        assert session.expired
        assert orphaned - 0.1 < fired[0] <= orphaned + 1.5  # by ttl - margin after last ack
        gone = await poll(
            lambda: _gone_at(api, token.key), timeout=4.0, what="the server expiring the lease"
        )
        assert fired[0] < gone, "the session must expire locally before etcd drops its keys"

        # once, and only once
        assert sorted(fired) == sorted([fired[0], -1.0])
        late: list[int] = []
        session.on_expired(lambda: late.append(1))  # registered after expiry: runs at once
        assert late == [1]

        # every later operation refuses
        with pytest.raises(ef.SessionExpired):
            await api(lock.acquire)
        with pytest.raises(ef.SessionExpired):
            await api(lock.try_acquire)
        with pytest.raises(ef.SessionExpired):
            await api(session.lock(etcd_namespace + "/other").acquire, timeout=1)
        with pytest.raises(ef.SessionExpired):
            await api(session.election(etcd_namespace + "/e2").campaign, b"x")
        with pytest.raises(ef.SessionExpired):
            await api(election.proclaim, b"still me?")
        assert not await api(lock.is_owner)
        assert not await api(election.is_leader)
        assert len(fired) == 2
    finally:
        await api.close(session)


async def _gone_at(api: Api, key: str) -> float | None:
    return time.monotonic() if await api(api.client.get, key) is None else None


async def test_server_side_revoke_expires_the_session(api: Api, etcd_namespace: str) -> None:
    async with api.session(ttl=2) as session:
        fired: list[int] = []
        session.on_expired(lambda: fired.append(1))
        token = await api(session.lock(etcd_namespace + "/l").acquire)
        await revoke_lease(api, session.lease_id)
        # the next keepalive (every ttl/3) learns that the lease is gone
        assert await api(session.wait_expired, 2.0)
        assert fired == [1]
        assert await api(api.client.get, token.key) is None
        with pytest.raises(ef.SessionExpired):
            await api(session.lock(etcd_namespace + "/l").acquire)


@pytest.mark.parametrize("ttl", [0, -1])
async def test_ttl_below_one_is_a_value_error(api: Api, ttl: int) -> None:
    with pytest.raises(ef.InvalidArgument) as info:
        api.client.session(ttl)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError):
        api.Elector(api.client, "svc", identity="a", ttl=ttl)


@pytest.mark.parametrize("ttl", [True, 1.5, 2.0, "2", None])
async def test_ttl_of_the_wrong_type_is_a_type_error(api: Api, ttl: object) -> None:
    with pytest.raises(ef.InvalidType) as info:
        api.client.session(ttl)
    assert isinstance(info.value, TypeError)


async def test_same_name_same_contender(api: Api, etcd_namespace: str) -> None:
    async with api.session(ttl=5) as session:
        name = etcd_namespace + "/x"
        lock = session.lock(name)  # live while referenced (or acquiring, or held)
        assert session.lock(name) is lock
        assert session.election(name + "e") is session.election(name + "e")
        assert session.lock(name) is not session.lock(name + "2")
        with pytest.raises(ValueError):
            session.election(name)  # the same key cannot be a lock and a candidate
        # two handles would be one contender: the second acquire is the same hold
        token = await api(session.lock(name).acquire)
        assert await api(session.lock(name).is_owner)
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [token.key]


async def test_one_session_many_contenders_one_lease(api: Api, etcd_namespace: str) -> None:
    async with api.session(ttl=5) as session:
        tokens = [await api(session.lock(f"{etcd_namespace}/m{i}").acquire) for i in range(10)]
        assert {t.lease_id for t in tokens} == {session.lease_id}
        assert [t.key for t in tokens] == [
            f"{etcd_namespace}/m{i}/{session.lease_id:x}" for i in range(10)
        ]
    for token in tokens:
        assert await api(api.client.get, token.key) is None


async def test_a_session_keeps_only_its_live_contenders(api: Api, etcd_namespace: str) -> None:
    """Issue #21: a long-lived session kept every contender it ever made (~490 B per name
    locked once). It keeps the live ones — acquiring, held — and the same name gives the
    same object while it is live, even when the caller dropped its reference."""
    import asyncio
    import gc
    import weakref

    async with api.session(ttl=30) as session:
        held = session.lock(etcd_namespace + "/held")
        await api(held.acquire)
        ref: weakref.ref[Any] = weakref.ref(held)
        del held
        gc.collect()
        assert session.lock(etcd_namespace + "/held") is ref() is not None

        async def once(i: int) -> None:
            lock = session.lock(f"{etcd_namespace}/n{i}")
            await api(lock.acquire)
            await api(lock.release)

        for start in range(0, 10_000, 25):
            await asyncio.gather(*(once(i) for i in range(start, start + 25)))
            # the held one, this round's, and the sync twin's threads' last calls
            assert len(session._contenders) <= 1 + 2 * 25
        # (a sync twin's worker thread lets go of its last call a moment after it returned)
        await poll(lambda: len(session._contenders) == 1, timeout=5, what="idle ones forgotten")
        assert session.lock(etcd_namespace + "/held") is ref()
        await api(session.lock(etcd_namespace + "/held").release)
        await poll(lambda: len(session._contenders) == 0, timeout=5, what="all forgotten")


@pytest.mark.integration
def test_threads_asking_for_one_forgotten_name_get_one_object(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """Review of issue #21: the registry forgets idle contenders nobody references, and
    its get-or-create was three steps without a lock, so threads asking ``lock(name)`` at
    once could get two objects of one name — which share one lease-derived key, so both
    acquired with the same token. (Seen in 1-3 of 300 rounds before the fix.)"""
    switch = sys.getswitchinterval()
    with ef.Client(etcd_endpoints) as client, client.session(ttl=30) as session:
        sys.setswitchinterval(1e-6)  # threads interleave inside the get-or-create
        try:
            for i in range(300):
                gc.collect()  # the name's previous object is forgotten
                got = _ask_at_once(session, f"{etcd_namespace}/same{i % 2}")
                assert len({id(lock) for lock in got}) == 1, (i, got)
        finally:
            sys.setswitchinterval(switch)


def _ask_at_once(session: Any, name: str, threads: int = 8) -> list[Any]:
    """``session.lock(name)`` from ``threads`` threads released at once."""
    start = threading.Barrier(threads)
    got: list[Any] = []

    def ask() -> None:
        start.wait()
        got.append(session.lock(name))

    workers = [threading.Thread(target=ask) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return got

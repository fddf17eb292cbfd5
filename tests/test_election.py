"""Elections against a real etcd: campaign, proclaim, resign, leader queries, observe
(including across compaction). Both twins (``api``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()


def brief(leader: ef.Leader | None) -> tuple[str, bytes] | None:
    return None if leader is None else (leader.key, leader.value)


async def test_campaign_and_leader_queries(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    assert await api(api.client.leader, name) is None
    async with api.session(ttl=5) as session:
        election = session.election(name)
        assert not await api(election.is_leader)
        token = await api(election.campaign, b"node-a")
        assert token.key == election.key == f"{name}/{session.lease_id:x}"
        assert await api(election.is_leader)
        kv = await api(api.client.get, token.key)
        assert kv.value == b"node-a" and kv.lease_id == session.lease_id
        assert token.value == token.create_revision == kv.create_revision  # uncontended
        for leader in (await api(election.leader), await api(api.client.leader, name)):
            assert isinstance(leader, ef.Leader)
            assert (leader.name, leader.key, leader.value) == (name, token.key, b"node-a")
            assert leader.create_revision == token.create_revision
            assert leader.lease_id == session.lease_id
            assert leader.revision >= token.value
        # str values are UTF-8
        other = session.election(name + "-str")
        await api(other.campaign, "nœud")
        assert (await api(other.leader)).value == "nœud".encode()
    assert await api(api.client.leader, name) is None  # closing the session ended the term


async def test_second_candidate_waits_and_times_out_cleanly(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    async with api.session(ttl=5) as a, api.session(ttl=5) as b:
        ta = await api(a.election(name).campaign, b"a")
        with pytest.raises(ef.AcquireTimeout):
            await api(b.election(name).campaign, b"b", timeout=0.2)
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [ta.key]
        assert not await api(b.election(name).is_leader)
        assert brief(await api(b.election(name).leader)) == (ta.key, b"a")


async def test_proclaim_changes_the_value_in_the_same_term(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    async with api.session(ttl=5) as session:
        election = session.election(name)
        token = await api(election.campaign, b"v1")
        revision = await api(election.proclaim, b"v2")
        assert revision > token.value
        leader = await api(api.client.leader, name)
        assert leader.value == b"v2" and leader.create_revision == token.create_revision
        await api(election.proclaim, "v3")
        assert (await api(election.leader)).value == b"v3"
        assert await api(election.is_leader)


async def test_proclaim_when_not_leading_raises_not_leader(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    async with api.session(ttl=5) as a, api.session(ttl=5) as b:
        never = b.election(name)
        with pytest.raises(ef.NotLeader) as info:
            await api(never.proclaim, b"x")  # never campaigned
        assert isinstance(info.value, ef.NotOwnerError)

        election = a.election(name)
        await api(election.campaign, b"a")
        await api(election.resign)
        assert not await api(election.is_leader)
        with pytest.raises(ef.NotLeader):
            await api(election.proclaim, b"after resign")

        token = await api(election.campaign, b"a again")
        await api(api.client.delete, token.key)  # lost behind its back
        # someone else campaigns and leads now; the old leader must not overwrite anything
        tb = await api(never.campaign, b"b", timeout=2)
        with pytest.raises(ef.NotLeader):
            await api(election.proclaim, b"zombie")
        assert await api(api.client.get, token.key) is None  # not re-created
        assert brief(await api(api.client.leader, name)) == (tb.key, b"b")
        assert not await api(election.is_leader)


async def test_resign_hands_over_with_a_higher_token(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    async with api.session(ttl=5) as a, api.session(ttl=5) as b:
        ta = await api(a.election(name).campaign, b"a")
        waiting = api.spawn(b.election(name).campaign, b"b")
        await poll(lambda: _count_is(api, name, 2))
        assert not waiting.done()
        await api(a.election(name).resign)
        tb = await asyncio.wait_for(waiting, 5)
        assert tb > ta
        assert brief(await api(api.client.leader, name)) == (tb.key, b"b")
        await api(a.election(name).resign)  # resigning again is a no-op
        assert await api(b.election(name).is_leader)


async def _count_is(api: Api, name: str, count: int) -> bool:
    return len(await keys_under(api, name)) == count


async def test_observe_yields_every_change(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/svc"
    iterator = api.client.observe(name)
    try:
        assert await api.next(iterator) is None  # nobody leads yet
        async with api.session(ttl=5) as a, api.session(ttl=5) as b:
            ea, eb = a.election(name), b.election(name)
            ta = await api(ea.campaign, b"a1")
            assert brief(await api.next(iterator)) == (ta.key, b"a1")
            await api(ea.proclaim, b"a2")
            leader = await api.next(iterator)
            assert brief(leader) == (ta.key, b"a2")
            assert leader.create_revision == ta.create_revision

            waiting = api.spawn(eb.campaign, b"b1")  # queues: no leader change, no item
            await poll(lambda: _count_is(api, name, 2))
            await api(ea.resign)
            tb = await asyncio.wait_for(waiting, 5)
            assert brief(await api.next(iterator)) == (tb.key, b"b1")
            await api(eb.resign)
            assert await api.next(iterator) is None
            ta2 = await api(ea.campaign, b"a3")
            assert brief(await api.next(iterator)) == (ta2.key, b"a3")
    finally:
        await api.close_iterator(iterator)


async def test_observe_recovers_after_compaction(api: Api, etcd_namespace: str) -> None:
    """History the observer still needs is compacted away while it is between items:
    it re-reads the contenders and keeps yielding the current leader and later changes."""
    name = etcd_namespace + "/svc"
    async with api.session(ttl=5) as a, api.session(ttl=5) as b:
        ea, eb = a.election(name), b.election(name)
        iterator = ea.observe()
        try:
            assert await api.next(iterator) is None
            # changes the observer has not consumed yet, then compact them away
            ta = await api(ea.campaign, b"a1")
            await api(ea.proclaim, b"a2")
            await api(api.client.compact, await api(api.client.revision))
            assert brief(await api.next(iterator)) == (ta.key, b"a2")

            # compact while the observer is watching; it goes on seeing every change
            await api(ea.proclaim, b"a3")
            assert brief(await api.next(iterator)) == (ta.key, b"a3")
            await api(api.client.compact, await api(api.client.revision))
            await api(ea.proclaim, b"a4")
            assert brief(await api.next(iterator)) == (ta.key, b"a4")

            # and once more between items, now with a leader change in the gap
            waiting = api.spawn(eb.campaign, b"b1")
            await poll(lambda: _count_is(api, name, 2))
            await api(ea.resign)
            tb = await asyncio.wait_for(waiting, 5)
            await api(api.client.compact, await api(api.client.revision))
            assert brief(await api.next(iterator)) == (tb.key, b"b1")
            await api(eb.resign)
            assert await api.next(iterator) is None
        finally:
            await api.close_iterator(iterator)


async def test_leader_of_an_unknown_election_is_none(api: Api, etcd_namespace: str) -> None:
    assert await api(api.client.leader, etcd_namespace + "/nobody") is None


async def test_campaign_values_must_be_bytes_or_str(api: Api, etcd_namespace: str) -> None:
    async with api.session(ttl=5) as session:
        election: Any = session.election(etcd_namespace + "/svc")
        with pytest.raises(TypeError):
            await api(election.campaign, 42)
        assert await keys_under(api, etcd_namespace + "/svc") == []


async def test_observe_ends_with_an_error_once_its_client_is_closed(
    api: Api, etcd_namespace: str
) -> None:
    """Closing the client ends an observer blocked on its watch with EtcdUnavailable
    (not a raw gRPC error, not a watch thread/task retrying forever)."""
    client = await api.new_client()
    iterator = client.observe(etcd_namespace + "/svc")
    assert await api.next(iterator) is None
    pending = asyncio.ensure_future(api.next(iterator, timeout=5))
    await asyncio.sleep(0.2)  # the observer is parked on its watch
    await api.close(client)
    with pytest.raises(ef.EtcdUnavailable):
        await pending

    def watchers() -> list[str]:
        names = (
            [t.get_name() for t in asyncio.all_tasks() if not t.done()]
            if api.is_async
            else [t.name for t in threading.enumerate()]
        )
        return [n for n in names if n.startswith("etcdfence-watch")]

    await poll(lambda: not watchers(), what="the watch thread/task to end")

"""Interoperability with the real ``etcdctl lock`` / ``etcdctl elect`` (Go's concurrency
package) on the same names: one queue, one leader, one token sequence. Both twins."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _contender_proc import Api, LineReader, api_fixture, keys_under, poll, stop_process

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()

#: etcdctl's environment: API v3, none of the caller's ETCD_*/ETCDCTL_* settings
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
ENV["ETCDCTL_API"] = "3"

#: a command run under ``etcdctl lock``: a fenced write with the token etcdctl exports
#: (ETCD_LOCK_REV), report it, then hold the lock until the flag file appears
CHILD = """
import os, sys, time
import structlog
import etcdfence as ef
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
endpoints, resource, key, flag = sys.argv[1:5]
token = ef.FencingToken.from_env()
with ef.Client(endpoints.split(",")) as client:
    try:
        client.fence(resource).put(token, key, "etcdctl")
        result = "ok"
    except ef.StaleTokenError:
        result = "stale"
print(token.value, token.key, result, flush=True)
while not os.path.exists(flag):
    time.sleep(0.02)
"""


def ctl(etcdctl: str, endpoints: list[str], *args: str) -> list[str]:
    return [etcdctl, "--endpoints=" + ",".join(endpoints), "--dial-timeout=3s", *args]


def start(args: list[str]) -> tuple[subprocess.Popen[str], LineReader]:
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV
    )
    assert proc.stdout is not None
    return proc, LineReader(proc.stdout)


async def _count_is(api: Api, name: str, count: int) -> bool:
    return len(await keys_under(api, name)) == count


def lease_of(key: str) -> int:
    assert re.fullmatch(r".+/[0-9a-f]+", key), key
    return int(key.rsplit("/", 1)[1], 16)


async def test_etcdctl_lock_waits_for_an_etcdfence_holder(
    api: Api, etcd_namespace: str, etcdctl: str, etcd_endpoints: list[str]
) -> None:
    name = etcd_namespace + "/lock"
    async with api.session(ttl=5) as session:
        token = await api(session.lock(name).acquire)
        script = "echo $ETCD_LOCK_KEY $ETCD_LOCK_REV"
        proc, out = start(ctl(etcdctl, etcd_endpoints, "lock", name, "--", "sh", "-c", script))
        try:
            await poll(lambda: _count_is(api, name, 2), what="etcdctl queued behind us")
            await asyncio.sleep(0.2)
            assert proc.poll() is None and not out.lines, "etcdctl ran while we held it"
            await api(session.lock(name).release)
            key, rev = (await out.aline(5) or "").split()
            assert key.startswith(name + "/") and lease_of(key) > 0
            assert int(rev) > token.value
            assert await asyncio.to_thread(proc.wait, 5) == 0
            await poll(lambda: _count_is(api, name, 0), what="etcdctl unlocking")
        finally:
            stop_process(proc)


async def test_etcdfence_waits_for_an_etcdctl_holder(
    api: Api, etcd_namespace: str, etcdctl: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    name = etcd_namespace + "/lock"
    flag = tmp_path / "release"
    script = f'echo $ETCD_LOCK_KEY $ETCD_LOCK_REV; while [ ! -e "{flag}" ]; do sleep 0.02; done'
    proc, out = start(ctl(etcdctl, etcd_endpoints, "lock", name, "--", "sh", "-c", script))
    try:
        key, rev = (await out.aline(10) or "").split()
        kv = await api(api.client.get, key)
        assert kv is not None and kv.value == b"" and kv.lease_id == lease_of(key)
        assert kv.create_revision == int(rev)  # uncontended: its token is the create revision
        async with api.session(ttl=5) as session:
            waiting = api.spawn(session.lock(name).acquire)
            await poll(lambda: _count_is(api, name, 2), what="etcdfence queued")
            await asyncio.sleep(0.2)
            assert not waiting.done(), "acquired while etcdctl's command was still running"
            flag.touch()
            token = await asyncio.wait_for(waiting, 10)
            assert token.value > int(rev)
            assert await asyncio.to_thread(proc.wait, 5) == 0
            assert [kv.key.decode() for kv in await keys_under(api, name)] == [token.key]
    finally:
        stop_process(proc)


async def test_etcdctl_elect_leader_is_seen_by_etcdfence(
    api: Api, etcd_namespace: str, etcdctl: str, etcd_endpoints: list[str]
) -> None:
    name = etcd_namespace + "/svc"
    proc, out = start(ctl(etcdctl, etcd_endpoints, "elect", name, "ctl-node"))
    try:
        key = await out.aline(10)
        assert await out.aline(5) == "ctl-node"
        leader = await api(api.client.leader, name)
        assert leader is not None
        assert key is not None
        assert (leader.key, leader.value, leader.lease_id) == (key, b"ctl-node", lease_of(key))
        async with api.session(ttl=5) as session:
            election = session.election(name)
            waiting = api.spawn(election.campaign, b"fence-node")
            await poll(lambda: _count_is(api, name, 2), what="etcdfence queued")
            await asyncio.sleep(0.1)
            assert not waiting.done()
            proc.send_signal(signal.SIGINT)  # etcdctl resigns on interrupt
            token = await asyncio.wait_for(waiting, 10)
            assert token.value > leader.create_revision
            leader = await api(api.client.leader, name)
            assert (leader.key, leader.value) == (token.key, b"fence-node")
    finally:
        stop_process(proc, signal.SIGINT)


async def test_etcdfence_leader_is_seen_by_etcdctl_elect_listen(
    api: Api, etcd_namespace: str, etcdctl: str, etcd_endpoints: list[str]
) -> None:
    name = etcd_namespace + "/svc"
    async with api.session(ttl=5) as a, api.session(ttl=5) as b:
        token = await api(a.election(name).campaign, b"fence-a")
        proc, out = start(ctl(etcdctl, etcd_endpoints, "elect", "-l", name))
        try:
            assert [await out.aline(10), await out.aline(5)] == [token.key, "fence-a"]
            await api(a.election(name).proclaim, b"fence-a2")
            assert [await out.aline(5), await out.aline(5)] == [token.key, "fence-a2"]
            waiting = api.spawn(b.election(name).campaign, b"fence-b")
            await poll(lambda: _count_is(api, name, 2))
            await api(a.election(name).resign)
            tb = await asyncio.wait_for(waiting, 5)
            assert [await out.aline(5), await out.aline(5)] == [tb.key, "fence-b"]
        finally:
            stop_process(proc, signal.SIGINT)


async def test_tokens_of_etcdctl_and_etcdfence_share_one_guard(
    api: Api, etcd_namespace: str, etcdctl: str, etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """Alternate etcdfence and ``etcdctl lock`` (each queued behind the other): every
    holder writes through one FenceGuard with its token — etcdctl's child reads
    ETCD_LOCK_REV via FencingToken.from_env(). All are accepted, in increasing order."""
    name = etcd_namespace + "/lock"
    resource = etcd_namespace + "/res"
    data = resource + "/data"
    guard = api.client.fence(resource)
    accepted: list[int] = []
    async with api.session(ttl=5) as session:
        lock = session.lock(name)
        token = await api(lock.acquire)
        for i in range(2):
            await api(guard.put, token, data, f"fence-{i}")
            accepted.append(token.value)
            flag = tmp_path / f"flag{i}"
            child = [sys.executable, "-c", CHILD, ",".join(etcd_endpoints), resource, data]
            proc, out = start(ctl(etcdctl, etcd_endpoints, "lock", name, "--", *child, str(flag)))
            try:
                await poll(lambda: _count_is(api, name, 2), what="etcdctl queued")
                await api(lock.release)
                rev, key, result = (await out.aline(15) or "").split()
                assert result == "ok" and key.startswith(name + "/")
                accepted.append(int(rev))
                assert await api(api.client.get, data) is not None
                waiting = api.spawn(lock.acquire)
                await poll(lambda: _count_is(api, name, 2), what="etcdfence queued")
                assert not waiting.done()
                flag.touch()
                token = await asyncio.wait_for(waiting, 10)
                assert await asyncio.to_thread(proc.wait, 5) == 0
            finally:
                stop_process(proc)
        await api(guard.put, token, data, "fence-last")
        accepted.append(token.value)
        await api(lock.release)
    assert accepted == sorted(set(accepted)), accepted  # strictly increasing
    assert await api(guard.current) == accepted[-1]
    assert (await api(api.client.get, data)).value == b"fence-last"
    with pytest.raises(ef.StaleTokenError) as info:
        await api(guard.put, ef.FencingToken(accepted[-2]), data, "late etcdctl holder")
    assert info.value.current == accepted[-1]
    assert (await api(api.client.get, data)).value == b"fence-last"

"""The recipes against a real etcd: read-write lock, semaphore, group membership.

In-process tests run on both twins (``api``); the exclusion properties run holders in
separate processes (``_recipe_holder.py``) that log each hold into one append-only
file, on the single node and on the 3-member cluster; the chaos cases freeze a reader
or a permit holder past its TTL (the others proceed, its token is then refused by a
fence) and SIGKILL a group member (it leaves within its TTL).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _contender_proc import Api, api_fixture, keys_under, poll

import etcdfence as ef

pytestmark = pytest.mark.integration

api = api_fixture()

HOLDER = str(Path(__file__).with_name("_recipe_holder.py"))


async def _keys(api: Api, prefix: str) -> list[str]:
    return sorted(kv.key.decode() for kv in await keys_under(api, prefix))


# ----------------------------------------------------------------------------- rwlock


async def test_readers_share_and_a_writer_excludes_them(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/catalog"
    async with api.session(5) as a, api.session(5) as b, api.session(5) as w:
        ra, rb, wl = a.rwlock(name).read(), b.rwlock(name).read(), w.rwlock(name).write()
        ta = await api(ra.acquire)
        tb = await api(rb.acquire, 1.0)  # shared: no wait
        assert ra.key == ta.key == f"{name}/read/{a.lease_id:x}"
        assert await api(ra.is_owner) and await api(rb.is_owner)
        assert await api(wl.try_acquire) is None  # readers hold: no writer, no key left
        with pytest.raises(ef.AcquireTimeoutError):
            await api(wl.acquire, 0.3)
        assert await _keys(api, name) == sorted([ta.key, tb.key])
        await api(ra.release)
        writing = api.spawn(wl.acquire, 10)
        await poll(lambda: _count(api, name, 2))
        await asyncio.sleep(0.2)
        assert not writing.done()  # one reader left
        await api(rb.release)
        tw = await asyncio.wait_for(writing, 5)
        assert tw.key == f"{name}/write/{w.lease_id:x}" and tw.value > max(ta.value, tb.value)
        assert (ta.lock, tw.lock) == (f"{name}/read", f"{name}/write")  # the keys' parents
        assert await api(wl.is_owner)
        assert await api(ra.try_acquire) is None  # a writer holds: no reader
        assert await _keys(api, name) == [tw.key]
        await api(wl.release)
        assert (await api(ra.try_acquire)) is not None
        await api(ra.release)


async def test_a_reader_queues_behind_a_waiting_writer(api: Api, etcd_namespace: str) -> None:
    """A reader waits only for writers created before it: one that queued behind a
    waiting writer does not starve it, and gets in once the writer is done."""
    name = etcd_namespace + "/catalog"
    async with api.session(5) as a, api.session(5) as b, api.session(5) as w:
        await api(a.rwlock(name).read().acquire)
        writing = api.spawn(w.rwlock(name).write().acquire, 10)
        await poll(lambda: _count(api, name, 2))
        with pytest.raises(ef.AcquireTimeoutError):  # behind the writer, not beside a
            await api(b.rwlock(name).read().acquire, 0.3)
        reading = api.spawn(b.rwlock(name).read().acquire, 10)
        await poll(lambda: _count(api, name, 3))
        await api(a.rwlock(name).read().release)
        tw = await asyncio.wait_for(writing, 5)
        await asyncio.sleep(0.2)
        assert not reading.done()
        await api(w.rwlock(name).write().release)
        assert (await asyncio.wait_for(reading, 5)).value > tw.value
        await api(b.rwlock(name).read().release)


async def test_a_crowd_of_readers_gets_in_together_and_writers_one_by_one(
    api: Api, etcd_namespace: str
) -> None:
    """Waiters of one client share its queue view: five readers queued behind a writer
    all hold at once when it leaves; three writers queued behind them hold one by one."""
    name = etcd_namespace + "/catalog"
    client = await api.new_client()
    first = await api.open_session(10)
    readers = [await api.open_session(10, client=client) for _ in range(5)]
    writers = [await api.open_session(10, client=client) for _ in range(3)]
    try:
        await api(first.rwlock(name).write().acquire)
        reading = [api.spawn(s.rwlock(name).read().acquire, 10) for s in readers]
        await poll(lambda: _count(api, name, 6))
        writing = [api.spawn(s.rwlock(name).write().acquire, 10) for s in writers]
        await poll(lambda: _count(api, name, 9))
        assert not any(t.done() for t in reading + writing)
        await api(first.rwlock(name).write().release)
        await asyncio.wait_for(asyncio.gather(*reading), 10)  # all five, none released
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in writing)
        for s in readers:
            await api(s.rwlock(name).read().release)
        holders = []
        for _ in writers:
            done, _ = await asyncio.wait(
                [t for t in writing if t not in holders], timeout=10, return_when="FIRST_COMPLETED"
            )
            assert len(done) == 1  # one writer at a time
            task = done.pop()
            holders.append(task)
            await asyncio.sleep(0.1)
            assert sum(t.done() for t in writing) == len(holders)
            await api(writers[writing.index(task)].rwlock(name).write().release)
        assert await _keys(api, name) == []
    finally:
        for s in [first, *readers, *writers]:
            await api.close(s)


async def test_writer_tokens_increase_and_fence(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/catalog"
    guard = api.client.fence(etcd_namespace + "/res")
    tokens = []
    async with api.session(5) as a, api.session(5) as b:
        for session in (a, b, a):
            async with _held(api, session.rwlock(name).write()) as token:
                await api(guard.put, token, etcd_namespace + "/res/data", "x")
                tokens.append(token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    with pytest.raises(ef.StaleTokenError):
        await api(guard.put, tokens[0], etcd_namespace + "/res/data", "late")


async def test_one_side_per_session_and_one_kind_per_name(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/catalog"
    async with api.session(5) as s:
        rw = s.rwlock(name)
        assert s.rwlock(name) is rw
        await api(rw.read().acquire)
        with pytest.raises(ef.AlreadyHeldError):
            await api(rw.write().acquire, 0.1)
        await api(rw.read().release)
        with pytest.raises(ef.InvalidArgumentError):
            s.lock(name)
        sem = s.semaphore(etcd_namespace + "/sem", permits=2)
        with pytest.raises(ef.InvalidArgumentError):
            s.semaphore(etcd_namespace + "/sem", permits=3)
        with pytest.raises(ef.InvalidArgumentError):
            s.lock(etcd_namespace + "/sem")  # a semaphore is not a lock
        assert s.semaphore(etcd_namespace + "/sem", permits=2) is sem
        for bad in (0, -1, True, 2.5, "2"):
            with pytest.raises((ef.InvalidArgumentError, ef.InvalidTypeError)):
                s.semaphore(etcd_namespace + "/other", permits=bad)


async def test_a_session_refuses_nested_names(api: Api, etcd_namespace: str) -> None:
    """Review #25: in one session ``lock("a/read")`` and ``rwlock("a").read()`` held
    the same key (releasing one ended the other's hold); ``lock("a")`` would queue
    behind ``lock("a/b")``'s key. A name nested in (or around) a live one's is refused
    when it would become live; once the other is idle it is allowed."""
    a = etcd_namespace + "/a"
    async with api.session(5) as s:
        lock = s.lock(a + "/read")
        await api(lock.acquire, 2)
        with pytest.raises(ef.InvalidArgumentError, match="overlaps"):
            await api(s.rwlock(a).read().acquire, 2)
        with pytest.raises(ef.InvalidArgumentError, match="overlaps"):
            await api(s.lock(a + "/read/x").try_acquire)
        assert s.rwlock(a).read().token is None and not s.rwlock(a).read().live()
        assert [kv.key.decode() for kv in await keys_under(api, a)] == [lock.key]
        assert await api(lock.is_owner)
        await api(lock.release)
        token = await api(s.rwlock(a).read().acquire, 2)  # no longer nested in a live one
        assert token.key == f"{a}/read/{s.lease_id:x}"
        await api(s.lock(a + "-b").acquire, 2)  # a sibling with a common prefix is fine
        await api(s.lock(a + "-b").release)
        await api(s.rwlock(a).read().release)


async def test_semaphore_refuses_mismatched_permits(api: Api, etcd_namespace: str) -> None:
    """Review #25: ``semaphore(name, 1)`` and ``semaphore(name, 3)`` across processes
    admitted 4 holders while the first believed itself alone. Each key records its
    permits; an acquire that reads another count (or a mutex's empty key) refuses and
    leaves no key behind."""
    name = etcd_namespace + "/mix"
    async with api.session(5) as a, api.session(5) as b, api.session(5) as c:
        one = a.semaphore(name, permits=1)
        await api(one.acquire, 2)
        with pytest.raises(ef.InvalidArgumentError, match="permits=1"):
            await api(b.semaphore(name, permits=3).try_acquire)
        with pytest.raises(ef.InvalidArgumentError, match="permits=1"):
            await api(c.semaphore(name, permits=3).acquire, 2)
        assert [kv.key.decode() for kv in await keys_under(api, name)] == [one.key]
        await api(one.release)
        three = b.semaphore(name, permits=3)
        await api(three.acquire, 2)
        with pytest.raises(ef.InvalidArgumentError, match="permits=3"):
            await api(c.semaphore(name, permits=2).acquire, 2)
        await api(three.release)
        await api(c.lock(etcd_namespace + "/m").acquire, 2)  # a mutex's key: empty value
        with pytest.raises(ef.InvalidArgumentError, match="mutex"):
            await api(a.semaphore(etcd_namespace + "/m", permits=2).acquire, 2)
        await api(c.lock(etcd_namespace + "/m").release)


# -------------------------------------------------------------------------- semaphore


async def test_semaphore_admits_n_and_no_more(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/exports"
    async with api.session(5) as a, api.session(5) as b, api.session(5) as c:
        sa, sb, sc = (s.semaphore(name, permits=2) for s in (a, b, c))
        ta, tb = await api(sa.acquire), await api(sb.acquire, 1.0)
        assert ta.key == f"{name}/{a.lease_id:x}" and ta != tb
        assert await api(sa.is_owner) and await api(sb.is_owner)
        assert await api(sc.try_acquire) is None
        with pytest.raises(ef.AcquireTimeoutError):
            await api(sc.acquire, 0.3)
        assert await _keys(api, name) == sorted([ta.key, tb.key])  # nothing left behind
        waiting = api.spawn(sc.acquire, 10)
        await poll(lambda: _count(api, name, 3))
        assert not await api(sc.is_owner)
        await api(sa.release)  # the first holder leaves: the third is admitted
        tc = await asyncio.wait_for(waiting, 5)
        assert tc.value > ta.value and await api(sc.is_owner)
        await api(sb.release)
        await api(sc.release)


async def test_a_crowd_of_one_client_never_exceeds_the_permits(
    api: Api, etcd_namespace: str
) -> None:
    """Eight holders of one client (a crowd sharing one view) on 3 permits: never
    more than 3 inside, and everyone gets through."""
    name = etcd_namespace + "/exports"
    client = await api.new_client()
    sessions = [await api.open_session(10, client=client) for _ in range(8)]
    inside, peak = 0, 0

    async def hold(session: Any) -> None:
        nonlocal inside, peak
        sem = session.semaphore(name, permits=3)
        for _ in range(3):
            await api(sem.acquire, 20)
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1
            await api(sem.release)

    try:
        await asyncio.wait_for(asyncio.gather(*(hold(s) for s in sessions)), 60)
        assert 1 <= peak <= 3
        assert await _keys(api, name) == []
    finally:
        for s in sessions:
            await api.close(s)


# ---------------------------------------------------------------------- across processes


def _check_log(path: Path, permits: int | None) -> int:
    """Replay the holders' log; assert the exclusion property; return the holds seen.
    ``permits=None``: readers/writers (one writer alone, or readers only)."""
    readers = writers = holders = peak = holds = 0
    for line in path.read_text().splitlines():
        what, kind, _ = line.split()
        step = 1 if what == "enter" else -1
        holds += what == "enter"
        if kind == "read":
            readers += step
        elif kind == "write":
            writers += step
        else:
            holders += step
        peak = max(peak, holders, readers)
        if permits is None:
            assert writers <= 1 and not (writers and readers), line
        else:
            assert holders <= permits, line
    return peak if permits is not None else holds


def _spawn(twin: str, endpoint: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, HOLDER, twin, endpoint, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0 and "done" in out, out


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_readers_and_writers_exclude_across_processes(
    twin: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "holds.log"
    kinds = ["read", "read", "read", "write", "write"]
    procs = [
        _spawn(twin, etcd_endpoints[0], etcd_namespace + "/rw", k, "stress", "12", str(log))
        for k in kinds
    ]
    _finish(procs)
    assert _check_log(log, None) == 12 * len(kinds)


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_semaphore_holders_bounded_across_processes(
    twin: str, etcd_endpoints: list[str], etcd_namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "holds.log"
    procs = [
        _spawn(twin, etcd_endpoints[0], etcd_namespace + "/sem", "sem:2", "stress", "12", str(log))
        for _ in range(5)
    ]
    _finish(procs)
    assert _check_log(log, 2) >= 1


@pytest.mark.cluster
def test_rwlock_and_semaphore_exclude_on_the_cluster(
    etcd_cluster: Any, etcd_namespace: str, tmp_path: Path
) -> None:
    """The same properties through the 3-member cluster, each process on another member."""
    endpoints = list(etcd_cluster.endpoints)
    rw_log, sem_log = tmp_path / "rw.log", tmp_path / "sem.log"
    procs = [
        _spawn("sync", endpoints[i % 3], etcd_namespace + "/rw", k, "stress", "8", str(rw_log))
        for i, k in enumerate(["read", "write", "read", "write"])
    ] + [
        _spawn(
            "async", endpoints[i % 3], etcd_namespace + "/sem", "sem:2", "stress", "8", str(sem_log)
        )
        for i in range(4)
    ]
    _finish(procs)
    assert _check_log(rw_log, None) == 32
    assert _check_log(sem_log, 2) >= 1


# -------------------------------------------------------------------------------- chaos


def _token_of(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the holder died before holding"
    return int(json.loads(line)["token"])


def _act(proc: subprocess.Popen[str]) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_paused_permit_holder_is_fenced_off_its_slot(
    twin: str, etcd_client: ef.Client, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """Two permits: holder A freezes (SIGSTOP) past its 2 s TTL; a third process waiting
    for a permit gets A's, takes A's slot over and writes it through the slot's fence;
    A thaws and writes the slot with its old token: refused."""
    name, slot = etcd_namespace + "/sem", etcd_namespace + "/slot-a"
    a = _spawn(twin, etcd_endpoints[0], name, "sem:2", "hold", slot)
    b = _spawn(twin, etcd_endpoints[0], name, "sem:2", "hold", etcd_namespace + "/slot-b")
    try:
        token_a, _ = _token_of(a), _token_of(b)
        etcd_client.fence(slot).put(token_a, slot + "/data", "a's first write")
        a.send_signal(signal.SIGSTOP)
        session = etcd_client.session(5)
        with session:
            sem = session.semaphore(name, permits=2)
            token_c = sem.acquire(timeout=10)  # admitted once A's lease ran out
            assert token_c.value > token_a
            etcd_client.fence(slot).put(token_c, slot + "/data", "c's write")
            a.send_signal(signal.SIGCONT)
            assert _act(a) == "refused"
            kv = etcd_client.get(slot + "/data")
            assert kv is not None and kv.value == b"c's write"
    finally:
        for proc in (a, b):
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_paused_reader_lets_the_writer_in_and_is_fenced_afterwards(
    twin: str, etcd_client: ef.Client, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """A reader freezes past its TTL: the writer waiting behind it gets in (the paused
    reader's lease ran out), writes through the fence; the thawed reader checks its
    token against the mark before serving its read: refused."""
    name, res = etcd_namespace + "/rw", etcd_namespace + "/res"
    reader = _spawn(twin, etcd_endpoints[0], name, "read", "hold", res)
    try:
        token_r = _token_of(reader)
        reader.send_signal(signal.SIGSTOP)
        session = etcd_client.session(5)
        with session:
            started = time.monotonic()
            token_w = session.rwlock(name).write().acquire(timeout=10)
            assert time.monotonic() - started < 6  # within the reader's TTL (2 s) and some
            assert token_w.value > token_r
            etcd_client.fence(res).put(token_w, res + "/data", "new")
            reader.send_signal(signal.SIGCONT)
            assert _act(reader) == "refused"
    finally:
        reader.send_signal(signal.SIGCONT)
        reader.kill()
        reader.wait(10)


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_killed_member_leaves_within_its_ttl(
    twin: str, etcd_client: ef.Client, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    name = etcd_namespace + "/workers"
    group = etcd_client.group(name)
    member = _spawn(twin, etcd_endpoints[0], name, "member:w1", "join", "2")
    try:
        assert member.stdout is not None and member.stdout.readline().strip() == "joined"
        assert group.members() == {"w1": b"caps"}
        watch = group.watch().start()
        try:
            with pytest.raises(TimeoutError):
                watch.get(0.2)  # nothing changes while it lives
            member.kill()
            killed = time.monotonic()
            changes = watch.get(6)
            assert time.monotonic() - killed < 4.5  # TTL 2 s, and etcd's expiry tick
            assert [(c.kind, c.member_id, c.capabilities) for c in changes] == [
                ("leave", "w1", b"caps")
            ]
            assert group.members() == {}
        finally:
            watch.close()
    finally:
        member.kill()
        member.wait(10)


@pytest.mark.cluster
def test_group_watch_survives_the_member_it_talks_to_dying(
    etcd_cluster: Any, etcd_namespace: str
) -> None:
    """The watcher's client talks to one member; that member is killed while members
    join and leave through another: the watch moves on and reports every change."""
    victim = etcd_cluster.leader_index()
    assert victim is not None
    endpoints = [etcd_cluster.endpoints[victim]] + [
        e for i, e in enumerate(etcd_cluster.endpoints) if i != victim
    ]
    other = endpoints[1:]
    name = etcd_namespace + "/workers"
    with ef.Client(endpoints, timeout=3.0) as watcher, ef.Client(other, timeout=3.0) as peer:
        group = watcher.group(name)
        watch = group.watch().start()
        try:
            with peer.session(5) as session:
                peer.group(name).join("a", b"1", session=session)
                assert _brief(watch.get(5)) == [("join", "a", b"1")]
                etcd_cluster.kill(victim)
                try:
                    etcd_cluster.wait_for_leader(10)
                    peer.group(name).join("b", b"2", session=session)
                    peer.group(name).leave("a")
                    seen: list[Any] = []
                    deadline = time.monotonic() + 20
                    while len(seen) < 2 and time.monotonic() < deadline:
                        seen += _brief(watch.get(deadline - time.monotonic()))
                    assert seen == [("join", "b", b"2"), ("leave", "a", b"1")]
                finally:
                    etcd_cluster.restart(victim)
                    etcd_cluster.wait_for_leader(10)
        finally:
            watch.close()


# ------------------------------------------------------------------------------ groups


async def test_group_membership(api: Api, etcd_namespace: str) -> None:
    name = etcd_namespace + "/workers"
    group = api.client.group(name)
    assert not await api(group.exists)
    async with api.session(5) as a, api.session(5) as b:
        with pytest.raises(ef.GroupNotFoundError):
            await api(group.join, "w1", b"x", session=a, create=False)
        assert await api(group.create) and not await api(group.create)
        assert name in await api(api.client.groups, etcd_namespace + "/")
        await api(group.join, "w1", b"cpu=4", session=a)
        await api(group.join, b"\x00raw/id", "gpu", session=b)  # bytes ids, str capabilities
        await api(group.join, "w/2 ü", session=b)
        assert await api(group.members) == {"w1": b"cpu=4", b"\x00raw/id": b"gpu", "w/2 ü": b""}
        with pytest.raises(ef.MemberExistsError):
            await api(group.join, "w1", session=b)
        await api(group.join, "w1", b"cpu=8", session=a)  # rejoin: new capabilities
        info = await api(group.member, "w1")
        assert info.capabilities == b"cpu=8" and info.lease_id == a.lease_id
        assert await api(group.member, b"w1") is None  # str and bytes ids are distinct
        assert await api(group.update, "w1", b"cpu=2")
        assert (await api(group.member, "w1")).lease_id == a.lease_id  # lease kept
        assert not await api(group.update, "nobody", b"")
        with pytest.raises(ef.GroupNotEmptyError):
            await api(group.delete)
        assert await api(group.leave, "w1") and not await api(group.leave, "w1")
        await api(b.aclose if api.is_async else b.close)  # b's members go with its lease
        assert await api(group.members) == {}
        await api(group.delete)
        assert not await api(group.exists)
        with pytest.raises(ef.GroupNotFoundError):
            await api(group.delete)
        for bad in ("", b"", 3, None):
            with pytest.raises((ef.InvalidArgumentError, ef.InvalidTypeError)):
                await api(group.join, bad, session=a)


async def test_group_watch_reports_changes_across_compaction(api: Api, etcd_namespace: str) -> None:
    group = api.client.group(etcd_namespace + "/workers")
    async with api.session(5) as a, api.session(5) as b:
        await api(group.join, "a", b"1", session=a)
        watch = group.watch(initial=True)
        try:
            assert _brief(await api(watch.get, 5)) == [("join", "a", b"1")]
            # changes while the watcher is between calls, then compacted away
            await api(group.join, "b", b"2", session=b)
            await api(group.update, "a", b"1+")
            await api(group.leave, "b")
            await api(group.join, "c", b"3", session=b)
            await api(api.client.compact, await api(api.client.revision))
            got = _brief(await api(watch.get, 5))
            assert sorted(got) == [("join", "c", b"3"), ("update", "a", b"1+")]  # b coalesced
            # compacted while watching: every later change is still seen, in order
            await api(group.update, "a", b"1++")
            assert _brief(await api(watch.get, 5)) == [("update", "a", b"1++")]
            await api(api.client.compact, await api(api.client.revision))
            await api(group.leave, "a")
            assert _brief(await api(watch.get, 5)) == [("leave", "a", b"1++")]
            await api(b.aclose if api.is_async else b.close)
            assert _brief(await api(watch.get, 5)) == [("leave", "c", b"3")]
            with pytest.raises(TimeoutError):
                await api(watch.get, 0.2)
            assert watch.members == {}
        finally:
            await api.close(watch)


async def test_group_members_are_direct_children_only(api: Api, etcd_namespace: str) -> None:
    """Review #25: group ``G/members/s.x`` put its marker at ``G/members/s.x/group``,
    which ``G`` listed as member ``"x/group"`` (its watch reported a join, its delete
    refused). Such names are refused, and keys below the members prefix that are not
    direct children (another recipe's under that name) are not members."""
    name = etcd_namespace + "/G"
    for bad in (name + "/members/s.x", name + "/members", "a/members/b"):
        with pytest.raises(ef.InvalidArgumentError, match="members"):
            api.client.group(bad)
    api.client.group("members/ok")  # a first segment named members owns nothing
    group = api.client.group(name)
    assert await api(group.create)
    watch = group.watch()
    try:
        await api(watch.start)
        await api(api.client.put, name + "/members/s.x/group", b"")
        await api(api.client.put, name + "/members/b.61/members/s.y", b"")
        assert await api(group.members) == {}
        with pytest.raises(TimeoutError):
            await api(watch.get, 0.5)
        async with api.session(5) as s:
            await api(group.join, "x/group", session=s)  # the encoded id has no '/'
            assert await api(group.members) == {"x/group": b""}
            assert _brief(await api(watch.get, 5)) == [("join", "x/group", b"")]
            with pytest.raises(ef.GroupNotEmptyError):
                await api(group.delete)
        assert _brief(await api(watch.get, 5)) == [("leave", "x/group", b"")]
        await api(group.delete)  # the non-member keys below do not keep it
        assert not await api(group.exists)
    finally:
        await api.close(watch)


async def test_a_stale_leave_or_update_spares_the_replacement(
    api: Api, etcd_namespace: str
) -> None:
    """Review #25: a member whose session ended (a process paused past its TTL) and
    whose id another process joined since must not remove or change the new member
    with its late ``leave()``/``update()``: both are guarded by the joining lease."""
    name = etcd_namespace + "/workers"
    old_view, new_view = api.client.group(name), api.client.group(name)
    async with api.session(5) as a:
        await api(old_view.join, "w1", b"A", session=a)
        old_lease = a.lease_id
    async with api.session(5) as b:  # a's lease was revoked: w1 is free again
        await api(new_view.join, "w1", b"B", session=b)
        assert not await api(old_view.update, "w1", b"A2")
        assert not await api(old_view.leave, "w1")
        assert not await api(new_view.leave, "w1", session=a)  # by session, too
        member = await api(new_view.member, "w1")
        assert member.capabilities == b"B" and member.lease_id == b.lease_id != old_lease
        assert await api(new_view.update, "w1", b"B2")
        assert await api(new_view.leave, "w1", session=b)
        assert await api(new_view.members) == {}


def _brief(changes: list[ef.GroupChange]) -> list[tuple[str, Any, bytes]]:
    return [(c.kind, c.member_id, c.capabilities) for c in changes]


async def _count(api: Api, name: str, count: int) -> bool:
    return len(await keys_under(api, name)) == count


class _held:
    """``async with _held(api, lock) as token`` for either twin."""

    def __init__(self, api: Api, lock: Any) -> None:
        self._api, self._lock = api, lock

    async def __aenter__(self) -> Any:
        return await self._api(self._lock.acquire, 10)

    async def __aexit__(self, *exc: object) -> None:
        await self._api(self._lock.release)


del os

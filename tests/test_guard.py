"""FenceGuard / AsyncFenceGuard on real etcd: the resource decides, not the writer."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable

import pytest
from conftest import advance_revision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etcdfence as ef
from etcdfence.history import Event, Layout, parse_events
from etcdfence.testing import EtcdServer
from etcdfence.testing.procs import LineReader, start, stop, wait_until

pytestmark = pytest.mark.integration

#: The largest made-up token these tests write (a token above etcd's revision is refused).
TOKENS_UP_TO = 100


@pytest.fixture(autouse=True)
def _tokens_below_the_revision(revision_past: Callable[[int], int]) -> None:
    """The made-up tokens below (7, 33, 100, ...) are all at or below etcd's revision."""
    revision_past(TOKENS_UP_TO)


def test_put_advances_mark_and_equal_tokens_pass(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    guard = etcd_client.fence(f"{etcd_namespace}/cfg")
    assert guard.current() == 0
    guard.put(10, f"{etcd_namespace}/cfg/a", "1")
    guard.put(10, f"{etcd_namespace}/cfg/a", "2")  # same term writes again
    assert guard.current() == 10
    raw = etcd_client.get(guard.key)
    assert raw is not None and raw.value == b"00000000000000000010"  # readable with etcdctl
    guard.delete(12, f"{etcd_namespace}/cfg/a")
    assert etcd_client.get(f"{etcd_namespace}/cfg/a") is None
    assert guard.current() == 12


def test_stale_token_writes_nothing(etcd_client: ef.Client, etcd_namespace: str) -> None:
    guard = etcd_client.fence(f"{etcd_namespace}/cfg")
    guard.txn(
        34, [ef.Put(f"{etcd_namespace}/cfg/x", "new"), ef.Put(f"{etcd_namespace}/cfg/y", "new")]
    )
    before = etcd_client.revision()
    with pytest.raises(ef.StaleTokenError) as info:
        guard.txn(
            33, [ef.Put(f"{etcd_namespace}/cfg/x", "old"), ef.Delete(f"{etcd_namespace}/cfg/y")]
        )
    err = info.value
    assert (err.resource, err.token, err.current) == (f"{etcd_namespace}/cfg", 33, 34)
    assert etcd_client.revision() == before  # not a single write happened
    assert etcd_client.get(f"{etcd_namespace}/cfg/x").value == b"new"  # type: ignore[union-attr]
    assert etcd_client.get(f"{etcd_namespace}/cfg/y") is not None
    with pytest.raises(ef.StaleTokenError):
        guard.advance(1)
    assert guard.current() == 34


@pytest.mark.parametrize("bad", [0, -1, "7", 7.0, None, True])
def test_bad_tokens_touch_nothing(etcd_client: ef.Client, etcd_namespace: str, bad: object) -> None:
    guard = etcd_client.fence(f"{etcd_namespace}/r")
    guard.advance(5)
    with pytest.raises(ef.InvalidToken):
        guard.put(bad, f"{etcd_namespace}/r/k", "v")  # type: ignore[arg-type]
    assert guard.current() == 5
    assert etcd_client.get(f"{etcd_namespace}/r/k") is None


def test_bad_resource_and_ops(etcd_client: ef.Client, etcd_namespace: str) -> None:
    for bad in ["", " ", "a/"]:
        with pytest.raises(ValueError):
            etcd_client.fence(bad)
    guard = etcd_client.fence(f"{etcd_namespace}/r")
    with pytest.raises(TypeError):
        guard.txn(3, [("k", "v")])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        guard.txn(3, [ef.Put(guard.key, "999")])  # cannot overwrite the mark itself
    assert guard.current() == 0


def test_resources_have_independent_marks(etcd_client: ef.Client, etcd_namespace: str) -> None:
    a, b = etcd_client.fence(f"{etcd_namespace}/a"), etcd_client.fence(f"{etcd_namespace}/b")
    a.advance(100)
    b.put(3, f"{etcd_namespace}/b/k", "v")  # a's mark does not fence b
    assert (a.current(), b.current()) == (100, 3)


def test_require_owner_rejects_a_writer_that_lost_its_lock(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    name = f"{etcd_namespace}/lock"
    guard = etcd_client.fence(f"{etcd_namespace}/res", require_owner=True)
    with etcd_client.session(ttl=5) as session:
        token = session.lock(name).acquire()
        guard.put(token, f"{etcd_namespace}/res/k", "1")
        etcd_client.delete(token.key)  # type: ignore[arg-type]  # lost behind its back
        before = etcd_client.revision()
        with pytest.raises(ef.NotOwnerError):
            guard.put(token, f"{etcd_namespace}/res/k", "2")
        assert etcd_client.revision() == before
        assert etcd_client.get(f"{etcd_namespace}/res/k").value == b"1"  # type: ignore[union-attr]
        with pytest.raises(TypeError):
            guard.put(token.value, f"{etcd_namespace}/res/k", "3")  # plain int has no owner


def test_kleppmann_33_34(etcd_client: ef.Client, etcd_namespace: str) -> None:
    """Client 1 gets token 33, pauses; its lease expires; client 2 gets 34 and
    writes; client 1 wakes and writes with 33 -> rejected, 34's data survives."""
    name, res = f"{etcd_namespace}/lock", f"{etcd_namespace}/file"
    guard = etcd_client.fence(res)
    s1 = etcd_client.session(ttl=1)
    t33 = s1.lock(name).acquire()
    s1.orphan()  # "GC pause": no more keepalives, the process does nothing
    with etcd_client.session(ttl=5) as s2:
        t34 = s2.lock(name).acquire(timeout=10)  # granted once the lease has run out
        assert t34 > t33
        guard.put(t34, f"{res}/data", "written by 34")
        with pytest.raises(ef.StaleTokenError):
            guard.put(t33, f"{res}/data", "written by 33")
    assert etcd_client.get(f"{res}/data").value == b"written by 34"  # type: ignore[union-attr]
    s1.close()


def test_racing_writers_only_the_newer_lands(etcd_client: ef.Client, etcd_namespace: str) -> None:
    for round_ in range(20):
        res = f"{etcd_namespace}/race{round_}"
        guard = etcd_client.fence(res)
        barrier = threading.Barrier(2)
        outcome: dict[int, str] = {}

        def write(
            token: int,
            barrier: threading.Barrier = barrier,
            guard: ef.FenceGuard = guard,
            res: str = res,
            outcome: dict[int, str] = outcome,
        ) -> None:
            barrier.wait()
            try:
                guard.put(token, f"{res}/v", str(token))
                outcome[token] = "ok"
            except ef.StaleTokenError:
                outcome[token] = "stale"

        threads = [threading.Thread(target=write, args=(t,)) for t in (7, 8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcome[8] == "ok"
        assert etcd_client.get(f"{res}/v").value == b"8"  # type: ignore[union-attr]
        assert guard.current() == 8


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tokens=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=15))
def test_property_accepted_tokens_never_decrease(
    etcd_client: ef.Client, etcd_namespace: str, tokens: list[int]
) -> None:
    res = f"{etcd_namespace}/p{time.monotonic_ns()}"
    guard = etcd_client.fence(res)
    accepted: list[int] = []
    highest = 0
    for tok in tokens:
        try:
            guard.put(tok, f"{res}/v", str(tok))
            accepted.append(tok)
            assert tok >= highest, f"stale token {tok} accepted after {highest}"
        except ef.StaleTokenError as err:
            assert tok < highest and err.current == highest  # only ever below the max
        highest = max(highest, tok)
    assert accepted == sorted(accepted)
    assert guard.current() == max(tokens)
    assert etcd_client.get(f"{res}/v").value == str(max(tokens)).encode()  # type: ignore[union-attr]


async def test_async_guard_concurrent_resources(
    async_etcd_client: ef.AsyncClient, etcd_namespace: str
) -> None:
    guards = [async_etcd_client.fence(f"{etcd_namespace}/r{i}") for i in range(32)]
    await asyncio.gather(
        *(g.put(10 + i, f"{etcd_namespace}/d{i}", "x") for i, g in enumerate(guards))
    )
    assert [await g.current() for g in guards] == [10 + i for i in range(32)]
    with pytest.raises(ef.StaleTokenError):
        await guards[0].advance(9)


def test_mark_survives_server_restart(tmp_path: object) -> None:
    with EtcdServer() as server:
        advance_revision([server.endpoint], 77)
        with ef.Client(server.endpoint, timeout=3.0) as client:
            client.fence("durable").advance(77)
        server.restart()
        with ef.Client(server.endpoint, timeout=5.0) as client:
            assert client.fence("durable").current() == 77
            with pytest.raises(ef.StaleTokenError):
                client.fence("durable").put(76, "durable/x", "late")


def _pause_scenario(endpoint: str, ns: str, fenced: bool) -> tuple[list[Event], bytes, Event]:
    """Process A (``python -m etcdfence.testing.contender --mode naive``: it trusts its
    lease and never looks at its deadline) leads and writes every 50 ms; it is
    SIGSTOPped past its TTL; B is elected and writes; A is resumed and keeps writing
    with its old token. Returns A's events, the final data and the outcome of A's first
    write made after it was resumed."""
    layout = Layout(f"{ns}/run{int(fenced)}")
    key = layout.data_key("res")
    command = [sys.executable, "-m", "etcdfence.testing.contender", "--mode", "naive",
               "--endpoints", endpoint, "--root", layout.root, "--id", "A", "--ttl", "1",
               "--timeout", "3", *([] if fenced else ["--unsafe"])]  # fmt: skip
    proc = start(command)
    out = LineReader(proc.stdout)
    try:
        out.wait_for(lambda line: '"kind":"accepted"' in line, 15)  # its first write
        proc.send_signal(signal.SIGSTOP)
        with ef.Client(endpoint) as client, client.session(ttl=5) as session:
            new = session.election(layout.election).campaign("B", timeout=15)
            layout.guard(client, "res").put(new, key, "new-leader")
            resumed = time.monotonic()
            proc.send_signal(signal.SIGCONT)

            def late_outcome() -> Event | None:
                events = parse_events(out.lines)
                late = {e.write_id for e in events if e.kind == "write" and e.t > resumed}
                done = ("accepted", "rejected", "unknown")
                return next((e for e in events if e.kind in done and e.write_id in late), None)

            outcome = wait_until(late_outcome, 15, "the outcome of A's first write after SIGCONT")
            stop(proc)
            final = client.get(key)
            assert final is not None
            return parse_events(out.lines), final.value, outcome
    finally:
        stop(proc)


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "fencing-off"])
def test_cross_process_pause(etcd_endpoints: list[str], etcd_namespace: str, fenced: bool) -> None:
    events, final, late = _pause_scenario(etcd_endpoints[0], etcd_namespace, fenced)
    # invariant: the write of the new leader is not lost to the zombie
    violated = final != b"new-leader"
    if fenced:
        assert not violated, [e.describe() for e in events]
        assert late.kind == "rejected", late.describe()
    else:
        # the same scenario without fencing must be caught: proves the check can fail
        assert violated, "without fencing the zombie should have overwritten the new leader"

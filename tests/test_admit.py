"""Token admission (issue #24): what binding and the future check cost, the verifier's
cache and its sequencer check against real etcd, other clusters, bad ``lock=`` /
``verify=``, and the HTTP gates (a real uvicorn and a real wsgiref server) refusing a
foreign, future or bare token before the app runs. Every backend's refusals are in
``test_fence_shape.py`` (the kit)."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import etcdfence as ef
from etcdfence.errors import InvalidArgumentError, InvalidTypeError
from etcdfence.fence._async.admit import AsyncVerifier
from etcdfence.fence._sync.admit import Verifier
from etcdfence.http import FencingMiddleware, WSGIFencingMiddleware
from etcdfence.sql import SQLFence

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def held(endpoints: list[str], name: str) -> Iterator[ef.FencingToken]:
    """A real token of lock ``name`` from a client of its own, held while the block runs."""
    with ef.Client(endpoints, timeout=5.0) as client, client.session(ttl=30) as session:
        lock = session.lock(name)
        yield lock.acquire(timeout=10)
        lock.release()


def counting(client: Any) -> Counter[str]:
    counts: Counter[str] = Counter()
    client.on_call(lambda record: counts.update([record.method]))
    return counts


def n(field: int | None) -> int:
    """A field every real token has (mypy: not None)."""
    assert field is not None
    return field


def forged(token: ef.FencingToken, **changes: Any) -> ef.FencingToken:
    fields: dict[str, Any] = dict(
        key=token.key,
        create_revision=token.create_revision,
        lease_id=token.lease_id,
        cluster_id=token.cluster_id,
    )
    value = changes.pop("value", token.value)
    fields.update(changes)
    return ef.FencingToken(value, **fields)


# -- the normal path costs no request -----------------------------------------------------


def test_a_bound_guard_sends_no_extra_request_on_the_normal_path(etcd_endpoints: list[str]) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with held(etcd_endpoints, f"{name}/lock") as token, ef.Client(etcd_endpoints) as client:
        bound = client.fence(f"{name}/bound", lock=f"{name}/lock")
        unbound = client.fence(f"{name}/unbound")
        counts = counting(client)
        # the token is above anything this client has seen: one read to learn etcd's revision
        bound.put(token, f"{name}/k", "0")
        assert counts["Range"] == 1
        unbound.put(token, f"{name}/k", "0")  # its first write: claims its epoch
        counts.clear()
        for i in range(5):
            bound.put(token, f"{name}/k", str(i))
            unbound.put(token, f"{name}/k", str(i))
        assert counts == Counter({"Txn": 10})


async def test_async_bound_guard_sends_no_extra_request(etcd_endpoints: list[str]) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with held(etcd_endpoints, f"{name}/lock") as token:
        async with ef.AsyncClient(etcd_endpoints) as client:
            guard = client.fence(f"{name}/r", lock=f"{name}/lock")
            await guard.put(token, f"{name}/k", "0")
            counts = counting(client)
            for i in range(5):
                await guard.put(token, f"{name}/k", str(i))
            assert counts == Counter({"Txn": 5})


def test_an_unbound_guard_refuses_a_token_from_the_future(etcd_endpoints: list[str]) -> None:
    """Every etcd fence, bound or not, refuses a token above etcd's revision, writes
    nothing, and takes a token equal to the revision (the highest a lock can have issued)."""
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with ef.Client(etcd_endpoints) as client:
        guard = client.fence(f"{name}/r")
        assert guard.lock is None
        revision = client.revision()
        for ahead in (2**63 - 1, revision + 1000, ef.FencingToken(revision + 1000)):
            with pytest.raises(ef.FutureTokenError) as info:
                guard.put(ahead, f"{name}/k", "future")
            value = ahead.value if isinstance(ahead, ef.FencingToken) else ahead
            assert info.value.token == value and revision <= info.value.revision < value
            with pytest.raises(ef.FutureTokenError):
                guard.fence_off(ahead)
        assert client.get(f"{name}/k") is None and client.get(guard.key) is None
        assert client.revision() == revision  # not a single write happened
        now = client.revision()
        guard.put(now, f"{name}/k", "now")  # a token equal to the current revision
        assert guard.current() == now and client.get(f"{name}/k").value == b"now"  # type: ignore[union-attr]


async def test_an_unbound_async_guard_refuses_a_token_from_the_future(
    etcd_endpoints: list[str],
) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    async with ef.AsyncClient(etcd_endpoints) as client:
        guard = client.fence(f"{name}/r")
        revision = await client.revision()
        for ahead in (2**63 - 1, revision + 1000):
            with pytest.raises(ef.FutureTokenError):
                await guard.put(ahead, f"{name}/k", "future")
        assert await client.get(guard.key) is None and await client.revision() == revision
        await guard.put(revision, f"{name}/k", "now")
        assert await guard.current() == revision


def test_an_unbound_guard_sends_no_extra_request_on_the_normal_path(
    etcd_endpoints: list[str],
) -> None:
    """The future check of an unbound guard reads etcd only for a token above the
    highest revision its client has seen: with a real token, never after the first."""
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with held(etcd_endpoints, f"{name}/lock") as token, ef.Client(etcd_endpoints) as client:
        guard = client.fence(f"{name}/r")
        counts = counting(client)
        guard.put(token, f"{name}/k", "0")  # this client has seen no revision yet: one read
        assert counts["Range"] == 1
        counts.clear()
        for i in range(5):
            guard.put(token, f"{name}/k", str(i))
        assert counts == Counter({"Txn": 5})
        guard.fence_off(token)  # claims an epoch (its own txns), reads nothing to admit
        assert set(counts) == {"Txn"}
        seen = ef.Client(etcd_endpoints)  # a client that has seen a revision: no read at all
        try:
            seen.get(f"{name}/k")
            counts = counting(seen)
            seen.fence(f"{name}/r2").put(token, f"{name}/k2", "y")
            assert counts == Counter({"Txn": 1})
        finally:
            seen.close()


# -- the verifier ----------------------------------------------------------------------


def test_the_verifier_reads_etcd_once_per_new_sequencer(etcd_endpoints: list[str]) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with ef.Client(etcd_endpoints) as client:
        verifier = Verifier(client, cache_size=2)
        counts = counting(client)
        with held(etcd_endpoints, f"{name}/a") as a, held(etcd_endpoints, f"{name}/b") as b:
            verifier(a)
            assert counts == Counter({"Range": 1}) and verifier.reads == 1
            for _ in range(3):
                verifier(a)  # cached: no request
            assert counts == Counter({"Range": 1})
            verifier(b)
            assert counts == Counter({"Range": 2})
            later = forged(a, value=b.value)  # the same hold, confirmed at a later revision
            verifier(later)
            assert counts == Counter({"Range": 3})
            verifier(a)  # a was dropped (cache_size=2, least recently used): read again
            assert counts == Counter({"Range": 4})


def test_the_verifier_confirms_the_sequencer(etcd_endpoints: list[str]) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with ef.Client(etcd_endpoints) as client:
        verifier = Verifier(client)
        with held(etcd_endpoints, f"{name}/a") as token:
            with pytest.raises(ef.ForeignTokenError, match="not confirmed"):
                verifier(forged(token, create_revision=n(token.create_revision) - 1))
            with pytest.raises(ef.ForeignTokenError, match="not confirmed"):
                verifier(forged(token, key=f"{name}/a/{n(token.lease_id) + 1:x}", lease_id=None))
            with pytest.raises(ef.ForeignTokenError, match="not confirmed"):
                verifier(forged(token, lease_id=n(token.lease_id) + 1))
            with pytest.raises(ef.ForeignTokenError, match="another etcd cluster"):
                verifier(forged(token, cluster_id=n(token.cluster_id) + 1))
        # the hold ended: the key is gone, its history still confirms the token (2 reads)
        before = verifier.reads
        verifier(token)
        assert verifier.reads == before + 2
        # a new sequencer of that ended hold once etcd compacted its revision: refused
        for i in range(3):
            client.put(f"{name}/later", str(i))
        client.compact(int(client.status()["revision"]))
        later = forged(token, value=token.value + 1)
        with pytest.raises(ef.ForeignTokenError, match="compacted"):
            verifier(later)
        verifier(token)  # confirmed earlier: cached


async def test_async_verifier_and_a_callable(etcd_endpoints: list[str]) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    async with ef.AsyncClient(etcd_endpoints) as client:
        verifier = AsyncVerifier(client)
        with held(etcd_endpoints, f"{name}/a") as token:
            await verifier(token)
            await verifier(token)
            assert verifier.reads == 1
            with pytest.raises(ef.FutureTokenError):
                await verifier(forged(token, value=token.value + 10**6))


def test_verify_callables_and_bad_arguments(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "v.db")
    seen: list[int] = []

    def no(token: ef.FencingToken) -> bool:
        seen.append(token.value)
        return token.value < 100

    fence = SQLFence(conn, "r", verify=no)
    fence.ensure_schema()
    fence.put(5, "k", b"v")
    with pytest.raises(ef.ForeignTokenError, match="refused by its verifier"):
        fence.put(100, "k", b"w")
    assert seen == [5, 100] and fence.get("k") == b"v" and fence.current() == 5
    for bad in ("", " x", "a/", 5, b"a"):
        with pytest.raises((InvalidArgumentError, InvalidTypeError)):
            SQLFence(conn, "r", lock=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        SQLFence(conn, "r", verify="http://etcd")
    with ef.Client(["http://127.0.0.1:1"]) as client:
        for bad in ("", "a/"):
            with pytest.raises(InvalidArgumentError):
                client.fence("r", lock=bad)


def test_a_bound_guard_refuses_a_token_of_another_cluster(etcd_endpoints: list[str]) -> None:
    name = f"admit-{uuid.uuid4().hex[:8]}"
    with held(etcd_endpoints, f"{name}/lock") as token, ef.Client(etcd_endpoints) as client:
        guard = client.fence(f"{name}/r", lock=f"{name}/lock")
        with pytest.raises(ef.ForeignTokenError, match="another etcd cluster") as info:
            guard.put(forged(token, cluster_id=n(token.cluster_id) ^ 1), f"{name}/k", "x")
        assert info.value.cluster_id == token.cluster_id
        no_cluster = forged(token, cluster_id=None)  # etcdctl's ETCD_LOCK_KEY: lock, no cluster
        guard.put(no_cluster, f"{name}/k", "y")
        assert client.get(f"{name}/k").value == b"y"  # type: ignore[union-attr]


# -- the HTTP gates ----------------------------------------------------------------------


def _apps(written: list[bytes]) -> tuple[Any, Any]:
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # uvicorn's lifespan
            return
        written.append(b"asgi")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def wsgi(environ: Any, start_response: Any) -> list[bytes]:
        written.append(b"wsgi")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return asgi, wsgi


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_the_http_gates_refuse_foreign_future_and_bare_tokens(
    etcd_endpoints: list[str], kind: str
) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_http import serve_asgi, serve_wsgi

    name = f"admit-{uuid.uuid4().hex[:8]}"
    written: list[bytes] = []
    asgi, wsgi = _apps(written)
    with contextlib.ExitStack() as stack:
        if kind == "asgi":
            # made outside any loop: its channel opens on uvicorn's loop, at its first call
            verify: Any = ef.AsyncClient(etcd_endpoints)
            server = serve_asgi(FencingMiddleware(asgi, lock=f"{name}/orders", verify=verify))
        else:
            verify = stack.enter_context(ef.Client(etcd_endpoints))
            server = serve_wsgi(WSGIFencingMiddleware(wsgi, lock=f"{name}/orders", verify=verify))
        url = stack.enter_context(server)
        with (
            held(etcd_endpoints, f"{name}/orders") as ours,
            held(etcd_endpoints, f"{name}/billing") as theirs,
            httpx.Client(base_url=url) as http,
        ):

            def put(token: Any) -> httpx.Response:
                value = token if isinstance(token, str) else token.to_text()
                return http.put("/", content=b"x", headers={"Fencing-Token": value})

            refused = {
                "foreign": put(theirs),
                "bare": put(str(ours.value)),
                "future": put(forged(ours, value=ours.value + 10**6)),
                "unconfirmed": put(forged(ours, create_revision=n(ours.create_revision) - 1)),
            }
            for what, response in refused.items():
                assert response.status_code == 409, (what, response.text)
                body = response.json()
                assert body["reason"] == ("future" if what == "future" else "foreign"), what
                assert body["token"] is not None
            assert put("abc").status_code == 400  # malformed stays the client's 400
            assert written == [], {k: (r.status_code, r.text) for k, r in refused.items()}
            assert put(ours).status_code == 200
            assert len(written) == 1

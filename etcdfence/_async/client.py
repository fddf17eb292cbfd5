"""The asyncio client: KV helpers, watches, sessions, leaders and fence guards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from .._keys import (
    DEFAULT_FENCE_PREFIX,
    check_lease_id,
    contender_prefix,
    prefix_range_end,
    to_bytes,
    to_key,
    validate_name,
)
from .._txn import MAX_TXN_OPS, range_request
from .._wire import messages as m
from ..errors import InvalidArgumentError, InvalidTypeError
from ..fence._async.etcd import AsyncFenceGuard
from ..types import CallRecord, KeyValue, Leader
from .connection import AsyncConnection
from .group import MARKER, AsyncGroup
from .keepalive import AsyncKeepAlives
from .observe import observe_leader
from .queue import AsyncQueueViews
from .session import AsyncSession
from .watch import DEFAULT_BUFFER, AsyncWatch, AsyncWatchHub


class AsyncClient:
    """An asyncio connection to an etcd cluster. Create one per process and share it.

    ``endpoints`` is one endpoint, a comma-separated string or a list
    (``http://h:p``, ``https://h:p`` or ``h:p``); calls fail over to the next
    endpoint when one is down. Without ``endpoints`` the client uses
    ``$ETCDFENCE_ENDPOINTS``, else ``$ETCDCTL_ENDPOINTS``, else
    ``http://127.0.0.1:2379`` (where ``etcdfence etcd`` listens). ``timeout``
    bounds every call. For TLS pass ``ca_file`` (and ``cert_file``/``key_file``
    for client certificates; ``server_name`` overrides the name checked in the
    server certificate); for
    password auth pass ``username``/``password`` — the token is refreshed
    automatically when it expires.

    Use ``async with AsyncClient(...) as client`` or call :meth:`aclose`.
    """

    def __init__(
        self,
        endpoints: str | list[str] | tuple[str, ...] | None = None,
        *,
        timeout: float = 5.0,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        server_name: str | None = None,
    ) -> None:
        self._conn = AsyncConnection(
            endpoints,
            timeout=timeout,
            username=username,
            password=password,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            server_name=server_name,
        )
        self._keepalives = AsyncKeepAlives(self._conn)
        self._watches = AsyncWatchHub(self._conn)  # every watch of this client, one stream
        AsyncQueueViews(self._conn)  # waiters of one name share a view of its queue

    @property
    def endpoints(self) -> list[str]:
        """The endpoints this client uses, normalised (``http://host:port``)."""
        return [str(e) for e in self._conn.endpoints]

    @property
    def timeout(self) -> float:
        """Default per-call timeout in seconds."""
        return self._conn.timeout

    @property
    def keepalives(self) -> AsyncKeepAlives:
        """Every session's lease of this client, kept alive on one stream (internal:
        sessions register here)."""
        return self._keepalives

    @property
    def connection(self) -> AsyncConnection:
        """The connection layer under this client: calls, streams, failover.

        Internal: etcdfence's own sessions, guards and electors run on it; an
        application uses the client's methods (and :meth:`on_call` to observe them).
        """
        return self._conn

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (it moves on when one fails)."""
        return str(self._conn.endpoint)

    def on_call(self, observer: Callable[[CallRecord], Any]) -> Callable[[], None]:
        """Call ``observer(record)`` after every request this client sends to etcd
        (each attempt, retries included) and every stream it opens; returns a function
        that removes the observer.

        Use it for metrics and tracing (method, endpoint, duration, outcome: see
        :class:`CallRecord`), and in tests to count requests. The observer runs
        inline, where the call was made, and must be quick. An exception it raises becomes the
        call's error — after etcd answered, so a test can make a reply "lost" after
        the server applied the request.
        """
        return self._conn.add_observer(observer)

    # -- plain KV ------------------------------------------------------------------

    async def put(
        self,
        key: str | bytes,
        value: str | bytes,
        *,
        lease_id: int = 0,
        timeout: float | None = None,
    ) -> int:
        """Write ``key`` unconditionally and return the header revision of the write.

        Use it for data that needs no fencing; protected data goes through
        :meth:`fence`.
        """
        request = m.PutRequest(
            key=to_key(key), value=to_bytes(value, "value"), lease=_lease(lease_id)
        )
        response = await self._conn.call("Put", request, timeout=timeout)
        revision: int = response.header.revision
        return revision

    async def get(self, key: str | bytes, *, timeout: float | None = None) -> KeyValue | None:
        """Read one key (linearizable); ``None`` if it does not exist."""
        response = await self._conn.call(
            "Range", range_request(to_key(key)), timeout=timeout, idempotent=True
        )
        return KeyValue.from_wire(response.kvs[0]) if response.kvs else None

    async def get_prefix(
        self, prefix: str | bytes, *, revision: int = 0, timeout: float | None = None
    ) -> list[KeyValue]:
        """Read every key that starts with ``prefix``, in key order — as of
        ``revision`` if given (history etcd has not compacted yet), else now."""
        request = range_request(to_key(prefix), prefix=True, revision=_revision(revision))
        response = await self._conn.call("Range", request, timeout=timeout, idempotent=True)
        return [KeyValue.from_wire(kv) for kv in response.kvs]

    async def delete(
        self, key: str | bytes, *, prefix: bool = False, timeout: float | None = None
    ) -> int:
        """Delete a key (or every key under a prefix); returns the header revision."""
        raw = to_key(key)
        request = m.DeleteRangeRequest(key=raw, range_end=prefix_range_end(raw) if prefix else b"")
        response = await self._conn.call("DeleteRange", request, timeout=timeout)
        revision: int = response.header.revision
        return revision

    async def revision(self, *, timeout: float | None = None) -> int:
        """The cluster's current revision (a linearizable read)."""
        response = await self._conn.call(
            "Range", range_request(b"\x00", count_only=True), timeout=timeout, idempotent=True
        )
        revision: int = response.header.revision
        return revision

    async def compact(self, revision: int, *, physical: bool = True) -> None:
        """Discard history before ``revision`` (what operators' auto-compaction does)."""
        await self._conn.call("Compact", m.CompactionRequest(revision=revision, physical=physical))

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke a lease: every key attached to it goes at once (what an operator's
        ``etcdctl lease revoke`` does; sessions revoke their own lease on close)."""
        await self._conn.call(
            "LeaseRevoke", m.LeaseRevokeRequest(ID=_lease(lease_id)), timeout=timeout
        )

    async def lease_time_to_live(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Seconds etcd will keep lease ``lease_id`` without a keepalive; -1 if it is gone."""
        response = await self._conn.call(
            "LeaseTimeToLive",
            m.LeaseTimeToLiveRequest(ID=_lease(lease_id)),
            timeout=timeout,
            idempotent=True,
        )
        ttl: int = response.TTL
        return ttl

    async def defragment(self, *, timeout: float | None = None) -> None:
        """Defragment the backend of the endpoint in use (an operator's maintenance)."""
        await self._conn.call("Defragment", m.DefragmentRequest(), timeout=timeout)

    async def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Status of the endpoint in use: version, cluster id (what every token of this
        cluster carries as ``cluster_id``), leader member id, db size, revision."""
        response = await self._conn.call(
            "Status", m.StatusRequest(), timeout=timeout, idempotent=True
        )
        return {
            "endpoint": str(self._conn.endpoint),
            "version": response.version,
            "cluster_id": response.header.cluster_id,
            "member_id": response.header.member_id,
            "leader": response.leader,
            "revision": response.header.revision,
            "raft_term": response.raftTerm,
            "db_size": response.dbSize,
            "db_size_in_use": response.dbSizeInUse,
        }

    async def txn_raw(self, request: Any, *, timeout: float | None = None) -> Any:
        """Send a wire-level ``TxnRequest`` (``etcdfence._wire.messages``) as is.

        For advanced use and tests; the outcome of a failed txn is reported as
        unknown, never resent.
        """
        return await self._conn.call("Txn", request, timeout=timeout)

    def watch(
        self,
        key: str | bytes,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        prev_kv: bool = False,
        buffer: int = DEFAULT_BUFFER,
    ) -> AsyncWatch:
        """Watch a key or prefix from ``start_revision`` (0: from now).

        Use ``async with client.watch(k) as w: async for batch in w: ...``. The
        watch resumes on another endpoint after a broken stream without losing or
        repeating events, and raises :class:`CompactedError` if etcd no longer
        has the history it needs. All watches of a client share one stream; at most
        ``buffer`` batches wait for a slow consumer, after which its watch pauses at
        etcd and resumes where it left off once the consumer catches up.
        """
        raw = to_key(key)
        return AsyncWatch(
            self._conn,
            raw,
            range_end=prefix_range_end(raw) if prefix else b"",
            start_revision=start_revision,
            prev_kv=prev_kv,
            buffer=buffer,
        )

    # -- coordination --------------------------------------------------------------

    def session(self, ttl: int = 60, *, margin: float | None = None) -> AsyncSession:
        """A lease-backed session for locks and elections (granted on ``async with``
        or first use). One session serves any number of locks and elections."""
        return AsyncSession(self, ttl, margin=margin)

    async def leader(self, name: str, *, timeout: float | None = None) -> Leader | None:
        """The current leader of election ``name`` (no session needed), or ``None``."""
        prefix = contender_prefix(validate_name(name)).encode("utf-8")
        response = await self._conn.call(
            "Range",
            range_request(prefix, prefix=True, first_created=True),
            timeout=timeout,
            idempotent=True,
        )
        if not response.kvs:
            return None
        return Leader.from_kv(name, response.kvs[0], response.header.revision)

    def observe(self, name: str) -> AsyncIterator[Leader | None]:
        """Yield the leader of ``name`` now and at every change (new leader, new
        proclaimed value, no leader). Survives compaction and broken streams."""
        return observe_leader(self._conn, validate_name(name))

    def group(self, name: str) -> AsyncGroup:
        """The membership group ``name``: members join on a session's lease (and leave
        when it ends), with capabilities; ``members()``, ``watch()`` (see :class:`AsyncGroup`)."""
        return AsyncGroup(self._conn, name)

    async def groups(self, prefix: str = "", *, timeout: float | None = None) -> list[str]:
        """The names of the groups created under ``prefix`` (keys only; reads every key
        under it: give groups a prefix of their own)."""
        raw = to_bytes(prefix, "prefix")
        request = range_request(raw or b"\x00", prefix=bool(raw), keys_only=True)
        if not raw:
            request.range_end = b"\x00"  # the whole keyspace
        response = await self._conn.call("Range", request, timeout=timeout, idempotent=True)
        tail = b"/" + MARKER.encode()
        return [
            kv.key[: -len(tail)].decode("utf-8", "replace")
            for kv in response.kvs
            if kv.key.endswith(tail) and b"/members/" not in kv.key[len(raw) :]
        ]

    def fence(
        self,
        resource: str,
        *,
        prefix: str = DEFAULT_FENCE_PREFIX,
        require_owner: bool = False,
        lock: str | None = None,
        max_txn_ops: int = MAX_TXN_OPS,
    ) -> AsyncFenceGuard:
        """The guard that protects ``resource`` with a fencing high-water mark in etcd;
        ``lock="jobs/nightly"`` binds it to that lock's tokens; ``max_txn_ops``: the
        cluster's ``--max-txn-ops`` if not etcd's default (see :class:`AsyncFenceGuard`)."""
        return AsyncFenceGuard(
            self,
            resource,
            prefix=prefix,
            require_owner=require_owner,
            lock=lock,
            max_txn_ops=max_txn_ops,
        )

    # -- lifecycle -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close every channel. Sessions should be closed first (they revoke leases)."""
        await self._keepalives.aclose()
        await self._watches.aclose()
        await self._conn.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.endpoints!r})"


def _revision(revision: object) -> int:
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise InvalidTypeError(f"revision must be int, got {type(revision).__name__}")
    if revision < 0:
        raise InvalidArgumentError(f"revision must be >= 0, got {revision}")
    return revision


def _lease(lease_id: object) -> int:
    return check_lease_id(lease_id)

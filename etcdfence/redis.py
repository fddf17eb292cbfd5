"""Fencing for data kept in Redis: the check, the mark and the writes in one Lua script.

Use :class:`RedisFence` (on ``redis.Redis``) or :class:`AsyncRedisFence` (on
``redis.asyncio.Redis``) when the resource a leader protects is a set of Redis keys.
Same shape as :class:`~etcdfence.FenceGuard`::

    import redis
    from etcdfence.redis import RedisFence, Put, Delete

    fence = RedisFence(redis.Redis(socket_timeout=5), "orders")   # mark: etcdfence:fence:{orders}
    fence.put(token, "{orders}:latest", b"...")                   # one EVALSHA (usually)
    fence.txn(token, [Put("{orders}:a", "1"), Delete("{orders}:b")])

Every guarded write is one ``EVALSHA`` of a script loaded once (``SCRIPT LOAD`` when
Redis answers ``NOSCRIPT``: restarted, or ``SCRIPT FLUSH``). Redis runs a script
atomically, so the check of the caller's ``(token, epoch)`` against the mark, the
mark's advance, the writes and the resource's version happen together or not at all; a
stale token raises :class:`~etcdfence.errors.StaleTokenError` with nothing written.
Equal tokens pass (one term writes many times). The mark is stored as FenceGuard stores
it in etcd (``00000000000000000123``, then ``:0000000001`` once a writer's epoch moved),
readable with ``redis-cli GET``. ``put`` / ``delete`` / ``txn`` return the resource's
*version* after the write: a counter beside the mark (``etcdfence:fence:{orders}:version``,
same hash slot) that the script raises by one with every accepted write. A mark written
by etcdfence 0.2 has no counter: it counts from 0.

**Redis Cluster.** A script may only touch keys of one hash slot. The mark's key is
``etcdfence:fence:{<resource>}`` (the resource is its hash tag), so data keys must carry
the same tag: ``{orders}:latest``. Keys of another slot are refused with
:class:`CrossSlotError` before anything is sent — also on a single Redis, so code that
works today keeps working on a cluster. The guards take a ``redis.Redis`` client
(standalone, or a Sentinel ``master_for``); ``RedisCluster`` clients are not supported
yet.

**Within a term, writes are ordered too** (see FenceGuard and :mod:`etcdfence.fence`:
the protocol is the fence engine's, shared by every backend).
A guard writes only at an epoch it claimed at the mark (its first write with a token
claims one: the script moves the mark to the smallest mark above it with that token and
writes there, in the same round trip), so no two guards — in one
process, a restarted one, another host — ever share an epoch. The claim is a
compare-and-set against what the guard was shown, as on etcd: the first guess claims
``(token, 0)`` only over a lower token (one round trip for a new term's first write);
on a resource another writer of the term already marked it is refused with the mark
and the version, and the second round trip claims above that mark only if neither
changed since. So a first write held in the network, delivered after the guard gave it
up and wrote on, is refused. A write whose reply is
lost (socket timeout, connection reset, cancellation, and on asyncio a send that timed
out) may still apply: its bytes can sit in the network, or in the server's input buffer,
and run after a later write. So the guard gives its epoch up before the error reaches
you (:class:`~etcdfence.errors.OutcomeUnknownError`) and claims a fresh one at once,
which puts the mark past the lost attempt (``fenced_off``). If that failed, call
:meth:`RedisFence.fence_off` — it returns only once the attempt can no longer apply —
then re-read the data and decide. Never resend blindly. This is also why the guards do
not use redis-py's command retry (which resends a command whose reply was lost): they
send the script on a connection of the client's pool themselves.

**Durability — read this.** The mark is only as durable as Redis's persistence. A Redis
that keeps nothing on disk (``save ""``, ``appendonly no``) forgets every mark when it
restarts, and then a zombie's stale token is accepted again: the first writer after the
restart sets the mark, whoever it is. With RDB snapshots only, a restart loses the marks
of the last snapshot interval. Use ``appendonly yes`` with ``appendfsync always`` for a
mark that survives a crash of Redis (``everysec`` can lose the last second). Having the
leader :meth:`~RedisFence.advance` right after a Redis restart only narrows the window:
until it does, the first writer sets the mark. Eviction loses
marks too: under an ``allkeys-*`` ``maxmemory-policy`` Redis may evict the mark like any
key; use ``noeviction`` or a ``volatile-*`` policy (the mark has no TTL), and never
``FLUSHALL`` a fenced Redis. Replication is
asynchronous: after a failover, the promoted replica may lack the newest marks (and
writes), so an old leader's token can be accepted there; ``WAIT`` narrows the window but
does not make Redis strongly consistent. Where that matters, keep the data in etcd
(``FenceGuard``) or SQL (``SQLFence``). The conformance kit's restart scenario shows the
difference.

Needs Redis >= 7.0 (the script's ``#!lua`` header: Redis checks memory, replica
read-only state and cluster slots before running it, never halfway through) and the
``redis`` package: ``pip install 'etcdfence[redis]'``.
"""

from __future__ import annotations

from .fence._async.redis import AsyncRedisFence
from .fence._redis_common import (
    DEFAULT_PREFIX,
    MAX_VALUE_BYTES,
    CrossSlotError,
    RedisRequestError,
    RedisUnavailableError,
    hash_slot,
)
from .fence._sync.redis import RedisFence
from .fence.ops import Delete, Put

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_VALUE_BYTES",
    "AsyncRedisFence",
    "CrossSlotError",
    "Delete",
    "Put",
    "RedisFence",
    "RedisRequestError",
    "RedisUnavailableError",
    "hash_slot",
]

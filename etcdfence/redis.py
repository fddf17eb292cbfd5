"""Fencing for data kept in Redis: the check, the mark and the writes in one Lua script.

Use :class:`RedisFence` (on ``redis.Redis``) or :class:`AsyncRedisFence` (on
``redis.asyncio.Redis``) when the resource a leader protects is a set of Redis keys.
Same shape as :class:`~etcdfence.FenceGuard`::

    import redis
    from etcdfence.redis import RedisFence, Put, Delete

    fence = RedisFence(redis.Redis(socket_timeout=5), "orders")   # mark: etcdfence:fence:{orders}
    fence.put(token, "{orders}:latest", b"...")                   # one EVALSHA, one round trip
    fence.txn(token, [Put("{orders}:a", "1"), Delete("{orders}:b")])

Every guarded write is one ``EVALSHA`` of a script loaded once (``SCRIPT LOAD`` when
Redis answers ``NOSCRIPT``: restarted, or ``SCRIPT FLUSH``). Redis runs a script
atomically, so the check of the caller's ``(token, epoch)`` against the mark, the
mark's advance and the writes happen together or not at all; a stale token raises
:class:`~etcdfence.errors.StaleTokenError` with nothing written. Equal tokens pass (one
term writes many times). The mark is stored as FenceGuard stores it in etcd
(``00000000000000000123``, then ``:0000000001`` once a writer's epoch moved), readable
with ``redis-cli GET``.

**Redis Cluster.** A script may only touch keys of one hash slot. The mark's key is
``etcdfence:fence:{<resource>}`` (the resource is its hash tag), so data keys must carry
the same tag: ``{orders}:latest``. Keys of another slot are refused with
:class:`CrossSlotError` before anything is sent — also on a single Redis, so code that
works today keeps working on a cluster. The guards take a ``redis.Redis`` client
(standalone, or a Sentinel ``master_for``); ``RedisCluster`` clients are not supported
yet.

**Within a term, writes are ordered too** (see FenceGuard and :mod:`etcdfence.epochs`).
A write whose reply is lost (socket timeout, connection reset, cancellation) may still
apply: its bytes can sit in the network, or in the server's input buffer, and run after
a later write of this writer. So the guard moves this writer to the next epoch before
the error reaches you (:class:`~etcdfence.errors.OutcomeUnknownError`) and tries at once
to raise the mark past the lost attempt (``fenced_off``). If that failed, call
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

import asyncio
import hashlib
import time
from collections.abc import Sequence
from typing import Any

from . import metrics
from ._keys import decode_mark_epoch, encode_mark, to_bytes, to_key, validate_name
from ._log import log
from ._txn import Delete, Put
from .epochs import WriterEpochs, lost_attempt
from .errors import (
    AuthError,
    ConsistencyError,
    EtcdfenceError,
    EtcdRequestError,
    EtcdUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
    OutcomeUnknownError,
    StaleTokenError,
    UnsupportedError,
)
from .token import FencingToken, coerce_token

try:
    import redis
    import redis.asyncio
    from redis import exceptions as _rx
except ImportError as exc:  # pragma: no cover - exercised in a venv without redis
    raise ImportError(
        "etcdfence.redis needs the redis package; install it with `pip install 'etcdfence[redis]'`"
    ) from exc

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

#: Where marks live: ``etcdfence:fence:{<resource>}``.
DEFAULT_PREFIX = "etcdfence:fence:"
#: Largest key or value sent, by default: Redis's own ``proto-max-bulk-len`` default
#: (512 MB). Redis drops the connection on a larger bulk string; we refuse it up front.
MAX_VALUE_BYTES = 512 * 1024 * 1024
#: Number of hash slots of Redis Cluster.
SLOTS = 16384

#: Attempts after adopting a higher epoch of our own term (see FenceGuard).
_ADOPT_ATTEMPTS = 8
#: How long the guard tries to fence off an attempt whose reply it lost, before raising.
_QUICK_FENCE_OFF = 1.0
#: How long :meth:`RedisFence.fence_off` keeps trying by default.
_FENCE_OFF_TIMEOUT = 10.0

_BACKEND = "redis"

# The whole guarded write. KEYS[1] is the mark, KEYS[2..] one data key per op. ARGV[1]
# is the offered mark as stored (20-digit token, then ':' and a 10-digit epoch when the
# epoch is not 0), ARGV[2] one letter per op ('P' set, 'D' delete), ARGV[3..] the values
# of the sets in order. Marks are compared as three numbers of at most 10 digits each
# (exact in Lua's doubles; an int64 token as one number would not be), never as strings
# (Lua compares strings with strcoll, i.e. by the server's locale). A mark that does not
# parse is an error, never 0. The common case, a term's writer meeting the mark it set,
# compares bytes and skips all of that. Returns {1} (accepted, written) or {0, mark}
# (refused, nothing written).
_SCRIPT = """#!lua
local function split(m)
  if (#m ~= 20 and #m ~= 31) or string.find(string.sub(m, 1, 20), '%D') then
    return nil
  end
  local epoch = 0
  if #m == 31 then
    if string.sub(m, 21, 21) ~= ':' or string.find(string.sub(m, 22), '%D') then
      return nil
    end
    epoch = tonumber(string.sub(m, 22))
  end
  return {tonumber(string.sub(m, 1, 10)), tonumber(string.sub(m, 11, 20)), epoch}
end
local mark = redis.call('GET', KEYS[1])
if mark ~= ARGV[1] then
  if mark then
    local held, offered = split(mark), split(ARGV[1])
    if not held then
      return redis.error_reply('ETCDFENCE fence mark at ' .. KEYS[1] .. ' is not <token>[:<epoch>]')
    end
    for i = 1, 3 do
      if held[i] > offered[i] then
        return {0, mark}
      end
      if held[i] < offered[i] then
        break
      end
    end
  end
  redis.call('SET', KEYS[1], ARGV[1])
end
local v = 3
for i = 1, #ARGV[2] do
  if string.sub(ARGV[2], i, i) == 'P' then
    redis.call('SET', KEYS[i + 1], ARGV[v])
    v = v + 1
  else
    redis.call('DEL', KEYS[i + 1])
  end
end
return {1}
"""
_SHA = hashlib.sha1(_SCRIPT.encode("utf-8")).hexdigest()


class RedisUnavailableError(EtcdUnavailableError):
    """Redis did not answer (refused connection, timeout, reset) before anything of the
    request was sent, or a read got no answer. A guarded *write* whose reply was lost
    raises :class:`~etcdfence.errors.OutcomeUnknownError` instead."""


class RedisRequestError(EtcdRequestError):
    """Redis refused the request with a definite answer (out of memory, a read-only
    replica, still loading its data set, a key of the wrong type): nothing was written."""


class CrossSlotError(InvalidArgumentError):
    """A key does not share the mark's Redis Cluster hash slot, so one script cannot
    touch both (``ops`` must use the resource as hash tag: ``{orders}:...``). Raised
    before anything is sent."""


# -- hash slots ------------------------------------------------------------------------
# The rule of the Redis Cluster specification ("Keys distribution model" and "Hash
# tags", redis.io/docs/reference/cluster-spec): HASH_SLOT = CRC16(key) mod 16384, with
# the CRC16 variant XMODEM (polynomial 0x1021, initial value 0, no reflection; the
# spec's check value: CRC16("123456789") = 0x31C3). If the key contains "{" and a "}"
# after it with at least one byte between them, only the bytes between the first "{"
# and the first "}" after it are hashed.


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16 = _crc16_table()


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc


def _hash_tag(key: bytes) -> bytes:
    """The part of ``key`` Redis Cluster hashes (see above)."""
    start = key.find(b"{")
    if start != -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def hash_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key`` (0..16383), as Redis computes it: the
    CRC16 of the key's hash tag (``{...}``) if it has one, else of the whole key."""
    return _crc16(_hash_tag(to_bytes(key, "key"))) % SLOTS


# -- what both guards share -------------------------------------------------------------


class _Prepared:
    """Validated ops, ready to send: data keys, op letters, set values."""

    __slots__ = ("codes", "keys", "values")

    def __init__(self, keys: list[bytes], codes: bytes, values: list[bytes]) -> None:
        self.keys = keys
        self.codes = codes
        self.values = values


_NO_OPS = _Prepared([], b"", [])


class _Lost(Exception):
    """Internal: the request went out and no answer came back (outcome unknown)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _RedisFenceBase:
    """The pure part of both guards: names, key checks, the command, reply handling."""

    _client_type: type[Any] = object

    def __init__(
        self,
        client: Any,
        resource: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_value_bytes: int = MAX_VALUE_BYTES,
    ) -> None:
        if not isinstance(client, self._client_type):
            raise InvalidTypeError(
                f"{type(self).__name__} needs a {self._client_type.__module__}."
                f"{self._client_type.__qualname__} client, got {type(client).__name__}"
            )
        if getattr(client, "single_connection_client", False) or getattr(
            client, "_single_connection_client", False
        ):
            raise InvalidArgumentError(
                f"{type(self).__name__} sends its script on a connection of the client's "
                "pool; give it a client without single_connection_client=True"
            )
        self.resource = validate_name(resource, "resource")
        if "}" in self.resource:
            raise InvalidArgumentError(
                f"resource must not contain '}}' (it is the mark key's hash tag): {resource!r}"
            )
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise InvalidArgumentError(f"prefix must be a non-empty str without braces: {prefix!r}")
        if isinstance(max_value_bytes, bool) or not isinstance(max_value_bytes, int):
            raise InvalidTypeError("max_value_bytes must be an int")
        if max_value_bytes < 1:
            raise InvalidArgumentError(f"max_value_bytes must be >= 1, got {max_value_bytes}")
        self.prefix = prefix
        self.max_value_bytes = max_value_bytes
        #: The mark's key: ``<prefix>{<resource>}``.
        self.key = f"{prefix}{{{self.resource}}}".encode()
        #: The hash slot every key of this resource must share.
        self.slot = hash_slot(self.key)
        self._tag = _hash_tag(self.key)
        self._reserved = prefix.encode("utf-8")
        self._client = client
        self._pool = client.connection_pool
        self._epochs = WriterEpochs()

    def epoch(self, token: FencingToken | int) -> int:
        """The epoch this writer's next write with ``token`` carries (0 until an
        outcome was lost or a higher epoch of the term was met)."""
        return self._epochs.get(coerce_token(token))

    def key_for(self, name: str) -> str:
        """A data key in this resource's hash slot: ``{<resource>}:<name>``."""
        return f"{{{self.resource}}}:{name}"

    def _bounded(self, data: bytes, what: str) -> bytes:
        if len(data) > self.max_value_bytes:
            raise InvalidArgumentError(
                f"{what} of {len(data)} bytes exceeds max_value_bytes={self.max_value_bytes}"
            )
        return data

    def _prepare(self, ops: object) -> _Prepared:
        """Check ``ops`` (before anything is sent) and lay them out for the script."""
        if isinstance(ops, (Put, Delete)) or not isinstance(ops, (list, tuple)):
            raise InvalidTypeError("ops must be a list of etcdfence Put / Delete")
        keys: list[bytes] = []
        codes = bytearray()
        values: list[bytes] = []
        for op in ops:
            if not isinstance(op, (Put, Delete)):
                raise InvalidTypeError(f"ops must be Put or Delete, got {type(op).__name__}")
            key = self._bounded(to_key(op.key), "key")
            if key.startswith(self._reserved):
                raise InvalidArgumentError(
                    f"ops must not touch fence marks: {key!r} is under {self._reserved!r}"
                )
            tag = _hash_tag(key)
            slot = self.slot if tag == self._tag else _crc16(tag) % SLOTS
            if slot != self.slot:
                raise CrossSlotError(
                    f"key {key!r} is in hash slot {slot}, the mark of {self.resource!r} in "
                    f"slot {self.slot}; one script cannot touch both on Redis Cluster. Use "
                    f"the resource as hash tag: {self.key_for('...')!r}"
                )
            keys.append(key)
            if isinstance(op, Put):
                if op.lease_id:
                    raise InvalidArgumentError("Redis has no etcd leases: Put(lease_id=...)")
                codes += b"P"
                values.append(self._bounded(to_bytes(op.value, "value"), "value"))
            else:
                if op.prefix:
                    raise InvalidArgumentError("Delete(prefix=True) is not supported on Redis")
                codes += b"D"
        return _Prepared(keys, bytes(codes), values)

    def _command(self, value: int, epoch: int, ops: _Prepared) -> tuple[Any, ...]:
        return (
            "EVALSHA",
            _SHA,
            1 + len(ops.keys),
            self.key,
            *ops.keys,
            encode_mark(value, epoch),
            ops.codes,
            *ops.values,
        )

    def _parse(self, reply: Any) -> tuple[bool, int, int]:
        """``(accepted, mark token, mark epoch)``; the mark only for a refusal."""
        if isinstance(reply, list) and reply and reply[0] == 1:
            return True, 0, 0
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == 0:
            mark = reply[1].encode() if isinstance(reply[1], str) else reply[1]
            if isinstance(mark, bytes):
                return (False, *decode_mark_epoch(mark))
        raise ConsistencyError(f"unexpected reply from the fence script: {reply!r}")

    def _settle(self, value: int, epoch: int, reply: Any, started: float) -> bool:
        """Handle the script's answer: True when written, False after adopting a higher
        epoch of our own term (send again); raises for a lower token."""
        elapsed = time.perf_counter() - started
        accepted, current, current_epoch = self._parse(reply)
        if accepted:
            metrics.fence_accepted(self.resource, value, elapsed, _BACKEND)
            return True
        if current == value and current_epoch > epoch:
            self._epochs.adopt(value, current_epoch)  # a writer of our term fenced off
            log.debug(
                "etcdfence.epoch_adopted", resource=self.resource, token=value, epoch=current_epoch
            )
            return False
        if current <= value:
            raise ConsistencyError(
                f"the fence script for {self.resource!r} refused {(value, epoch)} though "
                f"the mark {(current, current_epoch)} is not above it; nothing was written"
            )
        metrics.fence_rejected(self.resource, value, current, elapsed, _BACKEND)
        raise StaleTokenError(self.resource, value, current)

    def _settle_advance(self, value: int, epoch: int, reply: Any) -> None:
        """The answer to a mark-only write sent by a fence-off."""
        accepted, current, current_epoch = self._parse(reply)
        if accepted:
            self._epochs.adopt(value, epoch)
        elif current > value:
            raise StaleTokenError(self.resource, value, current)
        else:
            self._epochs.adopt(value, current_epoch)  # already past (value, epoch)

    def _restless(self, value: int) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"writers of token {value} on {self.resource!r} keep raising the epoch; "
            "nothing was written",
            resource=self.resource,
            token=value,
            epoch=self._epochs.get(value),
            fenced_off=True,
        )

    def _lost(self, value: int, epoch: int, cause: BaseException, fenced: bool) -> Exception:
        next_epoch = self._epochs.get(value)
        return lost_attempt(self.resource, value, epoch, next_epoch, fenced, f"Redis: {cause}")

    def _fence_off_failed(
        self, exc: EtcdfenceError | _Lost, deadline: float, quick: bool
    ) -> bool | None:
        """After a failed fence-off attempt: None to try again (it is idempotent), else
        whether the attempts are fenced off (``quick``); raises when not ``quick``."""
        if isinstance(exc, StaleTokenError):
            if quick:
                return True  # a higher token fenced every attempt of ours off already
            raise exc
        if isinstance(exc, (_Lost, RedisUnavailableError)) and time.monotonic() < deadline:
            return None
        if quick:
            return False
        if isinstance(exc, _Lost):
            raise _unavailable(exc.cause, "fencing off") from None
        raise exc

    def _decode_mark(self, raw: Any) -> tuple[int, int]:
        if raw is None:
            return (0, 0)
        return decode_mark_epoch(raw.encode() if isinstance(raw, str) else raw)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.resource!r} at {self.key.decode()!r}>"


_AUTH_ERRORS = tuple(
    getattr(_rx, name)
    for name in ("AuthenticationError", "AuthorizationError", "NoPermissionError")
    if hasattr(_rx, name)
)


def _definite(exc: BaseException) -> EtcdfenceError | None:
    """A Redis error that is a definite answer (nothing of the request ran) as our
    error; ``None`` when the request's outcome is unknown."""
    if isinstance(exc, _rx.BusyLoadingError):  # a ConnectionError subclass: check first
        return RedisRequestError(f"Redis is loading its data set: {exc}; nothing was written")
    if isinstance(exc, _AUTH_ERRORS):
        return AuthError(f"Redis refused the credentials or the command: {exc}")
    if isinstance(exc, _rx.ResponseError):
        text = str(exc)
        if text.startswith("ETCDFENCE"):
            return ConsistencyError(f"{text[len('ETCDFENCE ') :]}; nothing was written")
        if "compiling script" in text or "Unknown command" in text:
            return UnsupportedError(f"Redis cannot run the fence script (needs >= 7.0): {text}")
        return RedisRequestError(f"Redis refused the guarded write: {text}; nothing was written")
    return None


def _refused(exc: BaseException, what: str) -> EtcdfenceError:
    """An error before the request could run: a definite refusal, or Redis unreachable."""
    return _definite(exc) or _unavailable(exc, what)


def _unavailable(exc: BaseException, what: str) -> RedisUnavailableError:
    return RedisUnavailableError(f"Redis did not answer ({what}): {exc.__class__.__name__}: {exc}")


# -- the two guards ----------------------------------------------------------------------


class RedisFence(_RedisFenceBase):
    """Protects writes to Redis keys with a fencing high-water mark (sync, ``redis.Redis``).

    Use it when a lock holder or leader writes to Redis and a zombie must not: pass
    the holder's token to every write. ``RedisFence(client, "orders")`` keeps the mark
    at ``etcdfence:fence:{orders}``; data keys carry the same hash tag
    (:meth:`key_for` builds one). Thread-safe: share one per writer across threads.
    Give the client a ``socket_timeout``: a reply that never comes is how a lost write
    shows, and without a timeout a write waits for ever. The client's ``retry`` policy
    still applies to connecting and health checks (nothing of the write is sent yet, so
    that is safe), and its backoff adds to how long a write to a dead Redis takes to
    fail. Read the module docstring on durability: the mark survives a Redis restart
    only with persistence on.
    """

    _client_type = redis.Redis

    def _roundtrip(self, command: tuple[Any, ...]) -> Any:
        """Send one command on a pooled connection and read its answer; loads the
        script on NOSCRIPT. Raises :class:`_Lost` when the answer did not come."""
        try:
            conn = self._pool.get_connection()
        except (_rx.RedisError, OSError) as exc:
            raise _refused(exc, "connecting; nothing was sent") from None
        try:
            try:
                conn.send_command(*command)
            except (_rx.RedisError, OSError) as exc:
                # An incomplete command never runs: Redis waits for all of its bytes.
                conn.disconnect()
                raise _refused(exc, "sending; nothing was written") from None
            try:
                return _checked(conn.read_response())
            except _rx.NoScriptError:  # a definite "not run": load, then run
                conn.send_command("SCRIPT", "LOAD", _SCRIPT)
                _loaded(conn.read_response())
                conn.send_command(*command)
                return _checked(conn.read_response())
        except (_rx.RedisError, OSError) as exc:
            answer = _definite(exc)
            if answer is not None:
                raise answer from None
            conn.disconnect()
            raise _Lost(exc) from None
        except EtcdfenceError:
            raise
        except BaseException:
            conn.disconnect()  # the answer may still come: never hand it to another caller
            raise
        finally:
            self._pool.release(conn)

    def txn(self, token: FencingToken | int, ops: Sequence[Put | Delete]) -> None:
        """Apply ``ops`` atomically if ``token`` is not stale (one round trip).

        Raises :class:`StaleTokenError` (nothing written) when Redis already accepted a
        higher token, :class:`CrossSlotError` / ``InvalidArgument`` / ``InvalidType``
        for bad ops (nothing sent), and :class:`OutcomeUnknownError` when no answer came
        back (see the module docstring: never resend blindly; :meth:`fence_off` first).
        """
        value = coerce_token(token)
        prepared = self._prepare(ops)
        for _ in range(_ADOPT_ATTEMPTS):
            epoch = self._epochs.get(value)
            started = time.perf_counter()
            if self._settle(value, epoch, self._send(value, epoch, prepared), started):
                return
        raise self._restless(value)

    def _send(self, value: int, epoch: int, prepared: _Prepared) -> Any:
        try:
            return self._roundtrip(self._command(value, epoch, prepared))
        except _Lost as lost:
            self._epochs.bump(value, epoch)
            fenced = self._fence_off_until(value, time.monotonic() + _QUICK_FENCE_OFF, quick=True)
            raise self._lost(value, epoch, lost.cause, fenced) from None
        except EtcdfenceError:
            raise  # a definite answer: nothing ran
        except BaseException:  # interrupted in flight: the outcome is unknown
            self._epochs.bump(value, epoch)
            raise

    def _fence_off_until(self, value: int, deadline: float, *, quick: bool) -> bool:
        """Raise the mark past every attempt of ours so far (idempotent, so retried until
        ``deadline``). Returns whether that is done; ``quick`` swallows failures."""
        while True:
            epoch = self._epochs.get(value)
            try:
                reply = self._roundtrip(self._command(value, epoch, _NO_OPS))
                self._settle_advance(value, epoch, reply)
                return True
            except (EtcdfenceError, _Lost) as exc:
                done = self._fence_off_failed(exc, deadline, quick)
                if done is not None:
                    return done
            time.sleep(0.05)

    def fence_off(self, token: FencingToken | int, *, timeout: float = _FENCE_OFF_TIMEOUT) -> None:
        """Make sure no earlier attempt of this writer with ``token`` can apply any more;
        return only once that holds.

        Raises the mark to ``(token, epoch + 1)`` (idempotent, retried for ``timeout``
        seconds, then :class:`RedisUnavailableError`). Use it after
        :class:`OutcomeUnknownError` whose ``fenced_off`` is False, then re-read and
        decide. Raises :class:`StaleTokenError` if a higher token owns the mark.
        """
        value = coerce_token(token)
        self._epochs.bump(value, self._epochs.get(value))
        self._fence_off_until(value, time.monotonic() + timeout, quick=False)

    def put(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> None:
        """``SET key value`` if ``token`` is not stale (one round trip)."""
        self.txn(token, [Put(key, value)])

    def delete(self, token: FencingToken | int, key: str | bytes) -> None:
        """``DEL key`` if ``token`` is not stale (one round trip)."""
        self.txn(token, [Delete(key)])

    def advance(self, token: FencingToken | int) -> None:
        """Raise the mark to ``token`` without a data write (fence off older writers
        right after winning, before the first real write, and after a Redis restart)."""
        self.txn(token, [])

    def current(self) -> int:
        """The high-water mark: the highest token accepted so far, 0 if none."""
        return self.current_mark()[0]

    def current_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none."""
        try:
            return self._decode_mark(self._roundtrip(("GET", self.key)))
        except _Lost as lost:
            raise _unavailable(lost.cause, "reading the mark") from None


class AsyncRedisFence(_RedisFenceBase):
    """:class:`RedisFence` for asyncio (``redis.asyncio.Redis``): the same methods,
    awaited. Share one per writer across tasks. A cancelled write's outcome is unknown
    like a lost reply's: the writer moves to the next epoch before the cancellation
    propagates, so the attempt can never apply after a later write; the mark and the
    data stay consistent either way (one script)."""

    _client_type = redis.asyncio.Redis

    async def _roundtrip(self, command: tuple[Any, ...]) -> Any:
        """Send one command on a pooled connection and read its answer (see RedisFence)."""
        try:
            conn = await self._pool.get_connection()
        except (_rx.RedisError, OSError) as exc:
            raise _refused(exc, "connecting; nothing was sent") from None
        try:
            try:
                await conn.send_command(*command)
            except (_rx.RedisError, OSError) as exc:
                await conn.disconnect(nowait=True)
                raise _refused(exc, "sending; nothing was written") from None
            try:
                return _checked(await conn.read_response())
            except _rx.NoScriptError:
                await conn.send_command("SCRIPT", "LOAD", _SCRIPT)
                _loaded(await conn.read_response())
                await conn.send_command(*command)
                return _checked(await conn.read_response())
        except (_rx.RedisError, OSError) as exc:
            answer = _definite(exc)
            if answer is not None:
                raise answer from None
            await conn.disconnect(nowait=True)
            raise _Lost(exc) from None
        except EtcdfenceError:
            raise
        except BaseException:
            await conn.disconnect(nowait=True)  # an answer may still come: drop it
            raise
        finally:
            await self._pool.release(conn)

    async def txn(self, token: FencingToken | int, ops: Sequence[Put | Delete]) -> None:
        """Apply ``ops`` atomically if ``token`` is not stale; see :meth:`RedisFence.txn`."""
        value = coerce_token(token)
        prepared = self._prepare(ops)
        for _ in range(_ADOPT_ATTEMPTS):
            epoch = self._epochs.get(value)
            started = time.perf_counter()
            if self._settle(value, epoch, await self._send(value, epoch, prepared), started):
                return
        raise self._restless(value)

    async def _send(self, value: int, epoch: int, prepared: _Prepared) -> Any:
        try:
            return await self._roundtrip(self._command(value, epoch, prepared))
        except _Lost as lost:
            self._epochs.bump(value, epoch)
            deadline = time.monotonic() + _QUICK_FENCE_OFF
            fenced = await self._fence_off_until(value, deadline, quick=True)
            raise self._lost(value, epoch, lost.cause, fenced) from None
        except EtcdfenceError:
            raise
        except BaseException:  # cancelled in flight: the outcome is unknown
            self._epochs.bump(value, epoch)
            raise

    async def _fence_off_until(self, value: int, deadline: float, *, quick: bool) -> bool:
        """See :meth:`RedisFence._fence_off_until`."""
        while True:
            epoch = self._epochs.get(value)
            try:
                reply = await self._roundtrip(self._command(value, epoch, _NO_OPS))
                self._settle_advance(value, epoch, reply)
                return True
            except (EtcdfenceError, _Lost) as exc:
                done = self._fence_off_failed(exc, deadline, quick)
                if done is not None:
                    return done
            await asyncio.sleep(0.05)

    async def fence_off(
        self, token: FencingToken | int, *, timeout: float = _FENCE_OFF_TIMEOUT
    ) -> None:
        """See :meth:`RedisFence.fence_off`."""
        value = coerce_token(token)
        self._epochs.bump(value, self._epochs.get(value))
        await self._fence_off_until(value, time.monotonic() + timeout, quick=False)

    async def put(self, token: FencingToken | int, key: str | bytes, value: str | bytes) -> None:
        """``SET key value`` if ``token`` is not stale (one round trip)."""
        await self.txn(token, [Put(key, value)])

    async def delete(self, token: FencingToken | int, key: str | bytes) -> None:
        """``DEL key`` if ``token`` is not stale (one round trip)."""
        await self.txn(token, [Delete(key)])

    async def advance(self, token: FencingToken | int) -> None:
        """Raise the mark to ``token`` without a data write; see :meth:`RedisFence.advance`."""
        await self.txn(token, [])

    async def current(self) -> int:
        """The high-water mark: the highest token accepted so far, 0 if none."""
        return (await self.current_mark())[0]

    async def current_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none."""
        try:
            return self._decode_mark(await self._roundtrip(("GET", self.key)))
        except _Lost as lost:
            raise _unavailable(lost.cause, "reading the mark") from None


def _checked(reply: Any) -> Any:
    """redis-py returns some error replies instead of raising them."""
    if isinstance(reply, _rx.ResponseError):
        raise reply
    return reply


def _loaded(reply: Any) -> None:
    sha = reply.decode() if isinstance(reply, bytes) else reply
    if sha != _SHA:
        raise ConsistencyError(f"SCRIPT LOAD answered {reply!r}, expected {_SHA}")

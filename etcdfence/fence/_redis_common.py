"""The I/O-free part of the Redis fence, shared by both twins.

:mod:`etcdfence.fence._async.redis` (hand-written) and its generated sync twin send
what this module lays out and read back what it parses: the Lua script, the key names,
the Redis Cluster hash slot, the checks and layout of the ops, the reply and error
mapping. Nothing here touches a socket, so the two twins cannot drift in any of it.

The two client flavours differ in three things only, each a pair below whose async
form the generator renames to its sync form (``tools/async_to_sync.py``, ``NAMES``):
the client class, how a connection is dropped, and whether a failed *send* may still
deliver the command (see :data:`ASEND_MAY_LAND`).
"""

from __future__ import annotations

import binascii
import hashlib
import re
from collections.abc import Sequence
from typing import Any

from .._keys import decode_mark_epoch, encode_mark, to_bytes, to_key, validate_name
from ..errors import (
    AuthError,
    ConsistencyError,
    EtcdfenceError,
    InvalidArgumentError,
    InvalidTypeError,
    KeyExistsError,
    RequestError,
    UnavailableError,
    UnsupportedError,
)
from .epochs import claim_after
from .ops import Create, Delete, Put, check_creates, key_exists

try:
    import redis
    import redis.asyncio
    from redis import exceptions as _rx
except ImportError as exc:  # pragma: no cover - exercised in a venv without redis
    raise ImportError(
        "etcdfence.redis needs the redis package; install it with `pip install 'etcdfence[redis]'`"
    ) from exc

__all__ = [
    "BACKEND",
    "DEFAULT_PREFIX",
    "MAX_VALUE_BYTES",
    "SCRIPT",
    "SHA",
    "SLOTS",
    "CrossSlotError",
    "Prepared",
    "RedisLayout",
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
#: The ``backend`` label of metrics and log events.
BACKEND = "redis"
#: The request timeout (s) of a client without ``socket_timeout``: bounds ``fence_off``.
DEFAULT_TIMEOUT = 10.0
#: How often a round trip loads the script and resends after NOSCRIPT (a definite "not
#: run": a ``SCRIPT FLUSH`` may strike again between the load and the resend).
LOAD_ATTEMPTS = 8
#: Suffix of the version counter's key, beside the mark: ``<mark key>:version``.
VERSION_SUFFIX = b":version"

# -- the two client flavours -------------------------------------------------------------

#: The client class each twin takes.
AsyncRedisClient = redis.asyncio.Redis
RedisClient = redis.Redis

#: Whether a command whose *send* failed may still reach Redis. An asyncio transport
#: takes the whole command and drains it on its own (redis-py's disconnect flushes the
#: buffer), so a send that timed out may still deliver every byte: outcome unknown. A
#: blocking socket's partly sent command never runs (Redis waits for all of its bytes).
ASEND_MAY_LAND = True
SEND_MAY_LAND = False


async def adrop(conn: Any) -> None:
    """Close an asyncio connection at once (an answer may still come: never reuse it)."""
    await conn.disconnect(nowait=True)


def drop(conn: Any) -> None:
    """Close a blocking connection (an answer may still come: never reuse it)."""
    conn.disconnect()


# -- errors ------------------------------------------------------------------------------


class RedisUnavailableError(UnavailableError):
    """Redis did not answer (refused connection, timeout, reset) before anything of the
    request was sent, or a read got no answer. A guarded *write* whose reply was lost
    raises :class:`~etcdfence.errors.OutcomeUnknownError` instead."""


class RedisRequestError(RequestError):
    """Redis refused the request with a definite answer (out of memory, a read-only
    replica, still loading its data set, a key of the wrong type): nothing was written."""


class CrossSlotError(InvalidArgumentError):
    """A key does not share the mark's Redis Cluster hash slot, so one script cannot
    touch both (``ops`` must use the resource as hash tag: ``{orders}:...``). Raised
    before anything is sent."""


_AUTH_ERRORS = tuple(
    getattr(_rx, name)
    for name in ("AuthenticationError", "AuthorizationError", "NoPermissionError")
    if hasattr(_rx, name)
)
#: The errors a round trip catches: redis-py's and the socket's.
TRANSPORT_ERRORS = (_rx.RedisError, OSError)
NoScriptError = _rx.NoScriptError


def definite(exc: BaseException) -> EtcdfenceError | None:
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


def unavailable(exc: BaseException | str, what: str) -> RedisUnavailableError:
    """Redis did not answer ``what`` (a read, a connect, a send that never ran)."""
    name = f"{exc.__class__.__name__}: " if isinstance(exc, BaseException) else ""
    return RedisUnavailableError(f"Redis did not answer ({what}): {name}{exc}")


def refused(exc: BaseException, what: str) -> EtcdfenceError:
    """An error before the request could run: a definite refusal, or Redis unreachable."""
    return definite(exc) or unavailable(exc, what)


def checked(reply: Any) -> Any:
    """redis-py returns some error replies instead of raising them."""
    if isinstance(reply, _rx.ResponseError):
        raise reply
    return reply


def loaded(reply: Any, expected: str) -> None:
    """Check the answer to ``SCRIPT LOAD``."""
    sha = reply.decode() if isinstance(reply, bytes) else reply
    if sha != expected:
        raise ConsistencyError(f"SCRIPT LOAD answered {reply!r}, expected {expected}")


# -- hash slots --------------------------------------------------------------------------
# The rule of the Redis Cluster specification ("Keys distribution model" and "Hash
# tags", redis.io/docs/reference/cluster-spec): HASH_SLOT = CRC16(key) mod 16384, with
# the CRC16 variant XMODEM — the stdlib's binascii.crc_hqx with initial value 0. If the
# key contains "{" and a "}" after it with at least one byte between them, only the
# bytes between the first "{" and the first "}" after it are hashed.


def hash_tag(key: bytes) -> bytes:
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
    return binascii.crc_hqx(hash_tag(to_bytes(key, "key")), 0) % SLOTS


# -- the script --------------------------------------------------------------------------
# KEYS[1] is the mark, KEYS[2] the resource's version counter, KEYS[3..] one data key
# per op. ARGV[1] is the mark offered, as stored (20-digit token, then ':' and a 10-digit
# epoch when the epoch is not 0); ARGV[2] says what to do with it:
#   'W'  write at ARGV[1] if the mark is not above it (the writer owns that epoch);
#   'C'  claim: ARGV[1] is (token, 0); move the mark there and write, only if the mark
#        holds a lower token (or there is none) -- a writer's first guess;
#   'S'  claim at ARGV[1] (the smallest mark above the one the writer was shown) and
#        write, only if the mark is still ARGV[4] ('' for none) AND the version counter
#        still ARGV[5]: a compare-and-set against the refusal the writer last saw.
# Every applied run bumps the counter (a claim also moves the mark), so a claim sent
# against what it saw can never apply after anything else applied -- in particular not
# after a later acknowledged write of its own writer (a claim whose answer was lost and
# that arrives late is refused). ARGV[3] is one letter per op ('P' set, 'D' delete,
# 'C' create: a set only if the key does not exist), ARGV[6..] the values of the sets
# and creates in order. The creates' keys are checked (EXISTS) after the mark and
# before any write: one that exists refuses the whole run, mark and counter untouched.
# Marks are compared as three numbers of at most 10 digits each (exact in Lua's
# doubles; an int64 token as one number would not be), never as strings (Lua compares
# strings with strcoll, i.e. by the server's locale). A mark or counter that does not
# parse is an error, never 0; a missing counter (a mark written by 0.2) reads as 0.
# Everything that can fail runs before the first write (Redis does not roll a script
# back). Returns {1, mark written, version}, {0, mark or '', version} (refused, nothing
# written) or {2, op number, value} (op number's create found its key holding value --
# absent when not a string; nothing written).
SCRIPT = """#!lua
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
local function compare(a, b, n)
  for i = 1, n do
    if a[i] ~= b[i] then
      return a[i] > b[i] and 1 or -1
    end
  end
  return 0
end
local mark = redis.call('GET', KEYS[1])
local held = nil
if mark then
  held = split(mark)
  if not held then
    return redis.error_reply('ETCDFENCE fence mark at ' .. KEYS[1] .. ' is not <token>[:<epoch>]')
  end
end
local version = redis.call('GET', KEYS[2])
if version and version ~= '0' and (#version > 15 or not string.find(version, '^[1-9]%d*$')) then
  return redis.error_reply('ETCDFENCE fence version at ' .. KEYS[2] .. ' is not a number')
end
local count = tonumber(version or '0')
local new = ARGV[1]
local offered = split(new)
local refuse
if ARGV[2] == 'W' then
  refuse = held and compare(held, offered, 3) > 0
elseif ARGV[2] == 'C' then
  refuse = held and compare(held, offered, 2) >= 0
else
  if ARGV[4] == '' then
    refuse = held ~= nil
  else
    refuse = not held or compare(held, split(ARGV[4]), 3) ~= 0
  end
  refuse = refuse or count ~= tonumber(ARGV[5])
end
if refuse then
  return {0, mark or '', count}
end
for i = 1, #ARGV[3] do
  if string.sub(ARGV[3], i, i) == 'C' and redis.call('EXISTS', KEYS[i + 2]) == 1 then
    local found = false
    if redis.call('TYPE', KEYS[i + 2])['ok'] == 'string' then
      found = redis.call('GET', KEYS[i + 2])
    end
    return {2, i, found}
  end
end
if new ~= mark then
  redis.call('SET', KEYS[1], new)
end
local v = 6
for i = 1, #ARGV[3] do
  if string.sub(ARGV[3], i, i) ~= 'D' then
    redis.call('SET', KEYS[i + 2], ARGV[v])
    v = v + 1
  else
    redis.call('DEL', KEYS[i + 2])
  end
end
return {1, new, redis.call('INCR', KEYS[2])}
"""
SHA = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()

# The compare-and-set of a repair (:func:`etcdfence.fence._async.engine.repair`): KEYS[1]
# is the mark, ARGV[1] the mark exactly as read, ARGV[2] the mark to set. Sets it only if
# it is still byte for byte what was read (marks only grow, so an equal mark is the same
# one); returns {1} or {0, the mark now ('' if none)}. Sent with EVAL: it runs rarely.
LOWER_SCRIPT = """
local mark = redis.call('GET', KEYS[1])
if mark == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return {1}
end
return {0, mark or ''}
"""


# -- a resource's keys and requests -------------------------------------------------------


class Prepared:
    """Validated ops, ready to send: data keys, op letters, set values; ``given`` the ops
    as the caller gave them (a :class:`~etcdfence.errors.KeyExistsError` names its key
    and types its value so)."""

    __slots__ = ("codes", "given", "keys", "values")

    def __init__(
        self, keys: list[bytes], codes: bytes, values: list[bytes], given: Sequence[Any] = ()
    ) -> None:
        self.keys = keys
        self.codes = codes
        self.values = values
        self.given = given


#: No ops: a claim only, or an advance.
NO_OPS = Prepared([], b"", [])


class RedisLayout:
    """One resource's keys (mark, version counter, hash slot) and the requests for it;
    checks everything a fence is made with or given before anything is sent."""

    def __init__(
        self,
        resource: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_value_bytes: int = MAX_VALUE_BYTES,
    ) -> None:
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
        #: The version counter's key, in the mark's slot: ``<prefix>{<resource>}:version``.
        self.version_key = self.key + VERSION_SUFFIX
        #: The hash slot every key of this resource must share.
        self.slot = hash_slot(self.key)
        self._reserved = prefix.encode("utf-8")

    def key_for(self, name: str) -> str:
        """A data key in this resource's hash slot: ``{<resource>}:<name>``."""
        return f"{{{self.resource}}}:{name}"

    def _bounded(self, data: bytes, what: str) -> bytes:
        if len(data) > self.max_value_bytes:
            raise InvalidArgumentError(
                f"{what} of {len(data)} bytes exceeds max_value_bytes={self.max_value_bytes}"
            )
        return data

    def prepare(self, ops: object) -> Prepared:
        """Check ``ops`` (before anything is sent) and lay them out for the script."""
        if isinstance(ops, (Put, Delete, Create)) or not isinstance(ops, (list, tuple)):
            raise InvalidTypeError("ops must be a list of etcdfence Put / Delete / Create")
        keys: list[bytes] = []
        codes = bytearray()
        values: list[bytes] = []
        for op in ops:
            if not isinstance(op, (Put, Delete, Create)):
                raise InvalidTypeError(
                    f"ops must be Put, Delete or Create, got {type(op).__name__}"
                )
            keys.append(self._data_key(op.key))
            if isinstance(op, Create):
                codes += b"C"
                values.append(self._bounded(to_bytes(op.value, "value"), "value"))
            elif isinstance(op, Put):
                if op.lease_id:
                    raise InvalidArgumentError("Redis has no etcd leases: Put(lease_id=...)")
                codes += b"P"
                values.append(self._bounded(to_bytes(op.value, "value"), "value"))
            else:
                if op.prefix:
                    raise InvalidArgumentError("Delete(prefix=True) is not supported on Redis")
                codes += b"D"
        check_creates(ops, keys)
        return Prepared(keys, bytes(codes), values, list(ops))

    def _data_key(self, raw: object) -> bytes:
        key = self._bounded(to_key(raw), "key")
        if key.startswith(self._reserved):
            raise InvalidArgumentError(
                f"ops must not touch fence marks: {key!r} is under {self._reserved!r}"
            )
        slot = hash_slot(key)
        if slot != self.slot:
            raise CrossSlotError(
                f"key {key!r} is in hash slot {slot}, the mark of {self.resource!r} in "
                f"slot {self.slot}; one script cannot touch both on Redis Cluster. Use "
                f"the resource as hash tag: {self.key_for('...')!r}"
            )
        return key

    def command(
        self,
        token: int,
        epoch: int | None,
        ops: Prepared,
        expect: tuple[tuple[int, int], int] | None = None,
    ) -> tuple[Any, ...]:
        """The ``EVALSHA`` of one attempt (see the script): write at ``(token, epoch)``;
        or (``epoch`` None) claim an epoch of ``token`` and write there — with no
        ``expect``, at ``(token, 0)`` over a lower token only; with ``expect`` =
        ``(mark, version)`` (a refusal's), at the smallest mark above ``mark``, only if
        the mark and the version are still those."""
        if epoch is not None:
            mode, offered, seen, count = b"W", encode_mark(token, epoch), b"", b""
        elif expect is None:
            mode, offered, seen, count = b"C", encode_mark(token, 0), b"", b""
        else:
            (mark_token, mark_epoch), version = expect
            mode = b"S"
            offered = encode_mark(*claim_after(token, mark_token, mark_epoch))
            seen = (
                encode_mark(mark_token, mark_epoch) if (mark_token, mark_epoch) != (0, 0) else b""
            )
            count = str(version).encode()
        return (
            "EVALSHA",
            SHA,
            2 + len(ops.keys),
            self.key,
            self.version_key,
            *ops.keys,
            offered,
            mode,
            ops.codes,
            seen,
            count,
            *ops.values,
        )

    def parse(self, reply: Any) -> tuple[bool, int, int, int]:
        """The script's answer as ``(applied, mark token, mark epoch, version)``: the
        mark written and the version after it, or the mark that refused and the version
        beside it (the claim's compare-and-set stamp)."""
        if (
            isinstance(reply, list)
            and len(reply) == 3
            and reply[0] in (0, 1)
            and isinstance(reply[1], (bytes, str))
            and isinstance(reply[2], int)
            and not isinstance(reply[2], bool)
            and reply[2] >= 0
        ):
            mark = reply[1].encode() if isinstance(reply[1], str) else reply[1]
            if mark or reply[0] == 0:
                return (reply[0] == 1, *self.decode_mark(mark or None), reply[2])
        raise ConsistencyError(f"unexpected reply from the fence script: {reply!r}")

    def exists(self, reply: Any, ops: Prepared) -> KeyExistsError | None:
        """The error for a script answer saying a create found its key (``{2, op
        number, value}``); ``None`` for any other answer (:meth:`parse` reads it)."""
        if not (isinstance(reply, list) and reply and reply[0] == 2):
            return None
        index = reply[1] if len(reply) in (2, 3) else None
        if not isinstance(index, int) or not 1 <= index <= len(ops.keys):
            raise ConsistencyError(f"unexpected reply from the fence script: {reply!r}")
        found = reply[2] if len(reply) == 3 else None
        value = found.encode() if isinstance(found, str) else found
        op = ops.given[index - 1]
        if not isinstance(op, Create):
            raise ConsistencyError(f"the fence script named op {index}, not a Create: {reply!r}")
        return key_exists(self.resource, op, value)

    def lower_command(self, raw: bytes, new: tuple[int, int]) -> tuple[Any, ...]:
        """The ``EVAL`` that replaces the mark ``raw`` (as read) by ``new``."""
        return ("EVAL", LOWER_SCRIPT, 1, self.key, raw, encode_mark(*new))

    def parse_lower(self, reply: Any, expected: tuple[int, int]) -> tuple[int, int]:
        """The lower script's answer as the mark found (``expected``: replaced)."""
        if reply == [1]:
            return expected
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == 0:
            return self.decode_mark(reply[1] or None)
        raise ConsistencyError(f"unexpected reply from the repair script: {reply!r}")

    def decode_mark(self, raw: Any) -> tuple[int, int]:
        """A ``GET`` of the mark as ``(token, epoch)``; ``(0, 0)`` if none. A mark the
        script would refuse is a :class:`~etcdfence.errors.ConsistencyError`."""
        if raw is None:
            return (0, 0)
        data = raw.encode() if isinstance(raw, str) else raw
        if _MARK.fullmatch(data):
            return decode_mark_epoch(data)
        raise ConsistencyError(
            f"fence mark at {self.key.decode()!r} is not <token>[:<epoch>] in decimal: "
            f"{_shown(data)}; it points at a bug or a tampered resource"
        )

    def decode_version(self, raw: Any) -> int:
        """A ``GET`` of the version counter; 0 if none. A counter the script would
        refuse is a :class:`~etcdfence.errors.ConsistencyError`."""
        if raw is None:
            return 0
        data = raw.encode() if isinstance(raw, str) else raw
        if _VERSION.fullmatch(data):
            return int(data)
        raise ConsistencyError(
            f"fence version at {self.version_key.decode()!r} is not a number: "
            f"{_shown(data)}; it points at a bug or a tampered resource"
        )


#: The mark as the script accepts it: a 20-digit token, then ':' and a 10-digit epoch.
_MARK = re.compile(rb"[0-9]{20}(:[0-9]{10})?")
#: The version counter as the script accepts it: 0, or up to 15 digits without a 0 first.
_VERSION = re.compile(rb"0|[1-9][0-9]{0,14}")


def _shown(data: bytes) -> str:
    return f"{data[:48]!r}..." if len(data) > 48 else repr(data)

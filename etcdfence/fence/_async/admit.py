"""Token admission: the check every fence runs on a token before any write I/O.

Written once for every backend (etcd, Redis, SQL, the HTTP middlewares): a fence calls
:meth:`AsyncAdmission.admit` where it used to call ``coerce_token`` and gets the token's
int value, or an error with nothing written. Two rules, both from issue #24:

* **Binding** (``lock=NAME``): a bound resource takes tokens of lock ``NAME`` only. A
  token of another lock, of another etcd cluster (when the fence knows its cluster: the
  etcd fence from its client's response headers, the others from ``verify=client``) or a
  bare number with no lock raises :class:`~etcdfence.errors.ForeignTokenError`. A token
  with the right lock and no cluster id (etcdctl's ``ETCD_LOCK_KEY``) is accepted: it
  names its lock, and revisions are checked by the next rule.
* **No token from the future**: a token above etcd's current revision was never issued
  by a lock or election; a resource that accepted it would refuse every real holder
  until etcd's revision caught up. Every etcd fence, bound or not, knows a lower bound
  of that revision for free (the highest header revision its client has seen:
  :attr:`~etcdfence._async.connection.AsyncConnection.revision`) and reads etcd once only
  when a token exceeds it; the other fences ask a verifier (``verify=``) and cannot
  check it without one. Refused with
  :class:`~etcdfence.errors.FutureTokenError`: a separate class because it is not a
  question of binding (a verifier refuses it on an unbound fence too) and a caller may
  want to alert on it (a forged or mistyped token) rather than on a misrouted one.

What a verifier (``verify=``) confirms, and what a token must carry for it: see
:class:`AsyncVerifier` — the token's key must have *held* its lock at the token's
revision; a token with no key cannot be confirmed and is refused (a bound etcd fence
without a verifier still takes etcdctl-style tokens of its lock: it checks lock, cluster
and revision; ``require_owner=True`` adds the key check in the write's own txn).

Known limit — fencing stops zombies, not attackers: a holder's *own* sequencer with its
value raised to a later revision of the same hold is confirmed (the key did hold the lock
then); it fences off only that holder itself. Nothing short of authenticated tokens stops
a client that forges from a hold it really had.

An unbound Redis, SQL or HTTP fence without a verifier does no more than
``coerce_token``, exactly as before; the etcd fence adds one int compare on the normal
path, a bound fence a few attribute compares (and, on the etcd fence, the cluster
check).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._sequencer import lock_name_of, lock_problem
from ...errors import (
    CompactedError,
    ForeignTokenError,
    FutureTokenError,
    InvalidArgumentError,
    InvalidTypeError,
)
from ...token import FencingToken, Sequencer, coerce_token

if TYPE_CHECKING:
    from ..._async.client import AsyncClient
    from ..._async.connection import AsyncConnection

#: How many sequencers a verifier remembers as confirmed (least recently used dropped).
DEFAULT_CACHE = 1024


def check_lock(lock: object) -> str | None:
    """``lock=`` as given to a fence: ``None`` (unbound) or a valid lock/election name;
    :class:`~etcdfence.errors.InvalidArgumentError` naming the problem otherwise."""
    if lock is None:
        return None
    if not isinstance(lock, str):
        raise InvalidTypeError(f"lock must be a lock or election name (str), got {lock!r}")
    problem = lock_problem(lock)
    if problem is not None:
        raise InvalidArgumentError(f"lock={lock!r} is not a lock or election name: it {problem}")
    return lock


def _describe(token: FencingToken) -> str:
    """``token`` for an error message: its value, lock and cluster."""
    if token.bare:
        return f"bare token {token.value} (no lock)"
    cluster = "" if token.cluster_id is None else f", cluster {token.cluster_id}"
    return f"token {token.value} of lock {token.lock!r}{cluster}"


def future(token: int, revision: int, where: str) -> FutureTokenError:
    """The error for ``token`` above etcd's ``revision``."""
    return FutureTokenError(
        f"{where}: token {token} is above etcd's current revision {revision}: no lock or "
        "election has issued it (forged, mistyped or from another cluster); nothing was "
        "written",
        token=token,
        revision=revision,
    )


def _owner_prefix(lock: str) -> str:
    """The wait prefix whose first-created key(s) hold ``lock``: ``<lock>/`` for a mutex,
    an election or a semaphore; the read-write lock's ``<name>/`` for ``<name>/write`` and
    ``<name>/read`` (a writer holds once no key at all under ``<name>/`` is older than its
    own). See :class:`AsyncVerifier` for what this means for a reader and for a mutex whose
    name happens to end in ``/write`` or ``/read``."""
    parent, _, last = lock.rpartition("/")
    if parent and last in ("write", "read"):
        return parent + "/"
    return lock + "/"


class AsyncVerifier:
    """Checks tokens against etcd for a fence that cannot reach etcd itself (Redis, SQL,
    an HTTP service): pass it (or just the client) as ``verify=``.

    For each token it refuses, with nothing written:

    * one from another etcd cluster than the client's
      (:class:`~etcdfence.errors.ForeignTokenError`);
    * one above etcd's current revision (:class:`~etcdfence.errors.FutureTokenError`),
      read once when the token is above the highest revision the client has seen;
    * with ``confirm=True`` (the default), one whose *sequencer* etcd does not confirm
      (:class:`~etcdfence.errors.ForeignTokenError`). Confirmed means: the token's key
      is a contender key of the token's lock (``<lock>/<lease hex>``,
      :func:`~etcdfence.token.lock_name_of`) and it *held* the lock at the token's
      revision: it was the key created first under the lock's wait prefix at that
      revision (Go's ``concurrency`` rule, the rule of etcdfence's own acquire), with the
      token's create revision and lease. One Range (sorted by create revision, limit 1)
      answers it while the hold lasts: a key holding the lock now and created at or
      before the token's revision fences off only holds that already ended. Otherwise a
      second Range at the token's revision decides. A waiter's key, any other key, a key
      of another lock, and a token with no key at all (a bare number, or a lock name
      alone: there is nothing to confirm) are refused; so is an ended hold whose
      revision etcd compacted (it has no business writing: fail closed).

    Lock kinds the verifier cannot tell apart by name, and what it confirms for them:

    * a **semaphore** (``session.semaphore(name, permits=N)``): its tokens name ``name``
      like a mutex's; unless told ``permits={name: N}``, the verifier applies the mutex
      rule and refuses every holder but the first (fail closed). With ``permits``, a key
      among the first ``N`` created is confirmed.
    * a **read-write lock** (``<name>/write`` and ``<name>/read`` tokens): the key must
      be the first created under ``<name>/`` at the token's revision. That is exactly a
      writer's hold. A reader is confirmed only while it is the oldest key of the
      read-write lock (a reader's token must not write a fence mark anyway: readers do
      not fence each other); a mutex whose name ends in ``/write`` or ``/read`` is held
      to the same stricter rule (refused when an older key lives under its parent).

    What it cannot refuse (fencing stops zombies, not attackers): the *holder's own*
    sequencer with its value raised to a later revision of the same hold. That is a
    revision at which the key did hold the lock, so it is confirmed; it fences off only
    the holder itself (and nobody newer: a later holder's token is larger still). Only
    authenticated tokens would stop a client that forges from a hold it really had.

    With ``confirm=False`` only the cluster and the revision are checked (a token without
    a key is then accepted). Confirmed sequencers are cached (``cache_size``, least
    recently used dropped): a holder's later writes with the same token cost nothing.
    Under etcd auth the client's user needs read on the locks' wait prefixes (and on the
    key ``"\\0"`` for the revision probe); without it every token is refused with the
    :class:`~etcdfence.errors.AuthError` etcd answered (the HTTP gates answer 503).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        confirm: bool = True,
        permits: Mapping[str, int] | None = None,
        cache_size: int = DEFAULT_CACHE,
    ) -> None:
        conn = getattr(client, "connection", None)
        if conn is None or not hasattr(conn, "revision"):
            raise InvalidTypeError(
                f"{type(self).__name__} needs an etcdfence AsyncClient, got {type(client).__name__}"
            )
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise InvalidArgumentError(f"cache_size must be an int >= 1, got {cache_size!r}")
        self._conn: AsyncConnection = conn
        self.confirm = bool(confirm)
        self.permits = _check_permits(permits)
        self.cache_size = cache_size
        self._confirmed: OrderedDict[Sequencer, None] = OrderedDict()
        #: How many reads this verifier sent to etcd (for tests and the bench).
        self.reads = 0

    @property
    def cluster_id(self) -> int | None:
        """The cluster id of the client's etcd (``None`` until it has answered once)."""
        return self._conn.cluster_id

    async def __call__(self, token: FencingToken) -> None:
        """Raise unless etcd vouches for ``token`` (see the class docstring)."""
        seq = token.sequencer
        try:
            self._confirmed.move_to_end(seq)
            return
        except KeyError:
            pass
        if self.confirm:
            await self._confirm(token)
        else:
            await self._revision(token)
        self._confirmed[seq] = None
        while len(self._confirmed) > self.cache_size:
            try:
                self._confirmed.popitem(last=False)
            except KeyError:  # another thread emptied it
                break

    async def _revision(self, token: FencingToken, probe: bytes = b"\x00") -> None:
        """The cluster and revision of ``token``: one count-only read of ``probe`` when
        the token is above what the client has seen."""
        if token.value > self._conn.revision:
            await self._read(probe, 0, count_only=True)
        self._revision_checked(token)

    def _revision_checked(self, token: FencingToken) -> None:
        """The cluster and revision of ``token`` against what the client has seen."""
        cluster = self._conn.cluster_id
        if token.cluster_id is not None and cluster is not None and token.cluster_id != cluster:
            raise ForeignTokenError(
                f"{_describe(token)} is from another etcd cluster than the verifier's "
                f"({cluster}); nothing was written",
                token=token,
                cluster_id=cluster,
            )
        if token.value > self._conn.revision:
            raise future(token.value, self._conn.revision, "verifier")

    async def _read(
        self, key: bytes, revision: int, *, count_only: bool = False, first: int = 0
    ) -> Any:
        """One linearizable Range of ``key`` (at ``revision``; 0: now); with ``first``,
        the ``first`` keys created first under the prefix ``key``."""
        from ..._txn import first_created, range_request  # the wire layer: not for Redis

        self.reads += 1
        if first:
            request = first_created(key, first)
            request.revision = revision
        else:
            request = range_request(key, revision=revision, count_only=count_only)
        return await self._conn.call("Range", request, idempotent=True)

    def _refuse(self, token: FencingToken, why: str) -> ForeignTokenError:
        return ForeignTokenError(f"{_describe(token)} {why}; nothing was written", token=token)

    async def _confirm(self, token: FencingToken) -> None:
        """The sequencer check (see the class docstring): one read of the lock's holder(s)
        now, which answers while the hold lasts; one more, at ``token.value``, after it
        ended."""
        key, lock = token.key, token.lock
        if key is None or lock is None:
            await self._revision(token)  # one from the future says so (FutureTokenError)
            raise self._refuse(token, "cannot be confirmed: no key (a bare or lock-only token)")
        if lock_name_of(key) != lock:
            raise self._refuse(
                token, f"is not confirmed: key {key!r} is not a contender key of its lock"
            )
        prefix = _owner_prefix(lock).encode("utf-8")
        count = self.permits.get(lock, 1)
        now = await self._read(prefix, 0, first=count)
        self._revision_checked(token)
        # Holding now, and existing at the token's revision: every hold before it has
        # ended, so the token fences off nobody but older holders (see the docstring).
        kv = self._holder(token, now.kvs)
        if kv is not None and kv.create_revision <= token.value:
            return
        try:
            then = await self._read(prefix, token.value, first=count)
        except CompactedError:
            raise self._refuse(
                token,
                f"cannot be confirmed: etcd compacted revision {token.value} and key "
                f"{key!r} does not hold lock {lock!r} now",
            ) from None
        if self._holder(token, then.kvs) is None:
            raise self._refuse(
                token,
                f"is not confirmed by etcd: key {key!r} (create revision "
                f"{token.create_revision}) did not hold lock {lock!r} at revision {token.value}",
            )

    @staticmethod
    def _holder(token: FencingToken, first: Any) -> Any:
        """The token's key among ``first`` (the lock's holders), if it is the token's
        hold (create revision and lease as the token says), else ``None``."""
        key = token.key.encode("utf-8") if token.key is not None else None
        for kv in first:
            if kv.key != key:
                continue
            if token.create_revision is not None and kv.create_revision != token.create_revision:
                return None
            if token.lease_id is not None and kv.lease != token.lease_id:
                return None
            return kv
        return None


def _check_permits(permits: object) -> dict[str, int]:
    """``permits=`` of a verifier: semaphore name -> its permits."""
    if permits is None:
        return {}
    if not isinstance(permits, Mapping):
        raise InvalidTypeError(
            f"permits must map semaphore names to their permits, got {type(permits).__name__}"
        )
    from ..._async.semaphore import validate_permits

    checked: dict[str, int] = {}
    for name, count in permits.items():
        lock = check_lock(name)
        if lock is None:
            raise InvalidTypeError("permits: a semaphore name must be a str, got None")
        checked[lock] = validate_permits(count)
    return checked


Verify = Callable[[FencingToken], Any]


#: Whether this twin can run an async-function verifier: ``True`` in the async source,
#: ``False`` in its generated sync twin (where ``__call__`` below is a plain ``def``). A sync fence
#: has no event loop to run one on, so it refuses an async verifier (see :func:`as_verifier`).
_AWAITS = inspect.iscoroutinefunction(AsyncVerifier.__call__)


def _is_async(verify: object) -> bool:
    """Whether calling ``verify`` needs an event loop (an async function, or an
    object whose ``__call__`` is one, such as an :class:`AsyncVerifier`)."""
    if inspect.iscoroutinefunction(verify):
        return True
    return not inspect.isroutine(verify) and inspect.iscoroutinefunction(type(verify).__call__)


def as_verifier(verify: object) -> Verify | None:
    """``verify=`` as given to a fence: ``None``, an etcdfence AsyncClient (wrapped in an
    :class:`AsyncVerifier`), a verifier, or any callable taking the
    :class:`~etcdfence.FencingToken` that raises an
    :class:`~etcdfence.errors.InvalidTokenError` or returns ``False`` to refuse it (on
    an async fence it may be an async function). A sync fence refuses an async verifier
    (an async function, an async client's verifier) with
    :class:`~etcdfence.errors.InvalidTypeError`: it has no event loop to run it on."""
    if verify is None:
        return None
    if not _AWAITS and _is_async(verify):
        raise InvalidTypeError(
            f"verify={type(verify).__name__} is asynchronous (an async function or an async "
            "client's verifier): a sync fence has no event loop to run it on; give a sync "
            "Client, a Verifier or a plain function"
        )
    if isinstance(verify, AsyncVerifier):
        return verify
    from ..._async.client import AsyncClient

    if isinstance(verify, AsyncClient):
        return AsyncVerifier(verify)
    if callable(verify):
        return verify  # type: ignore[no-any-return]
    raise InvalidTypeError(
        "verify must be an etcdfence AsyncClient, a verifier or a callable, "
        f"got {type(verify).__name__}"
    )


class AsyncAdmission:
    """The admission of one fence: its binding (``lock``), the etcd connection it can
    check revisions on (the etcd fence's own) and its verifier. See the module docstring."""

    __slots__ = ("_conn", "_plain", "_probe", "_verify", "lock", "resource")

    def __init__(
        self,
        resource: str,
        *,
        lock: object = None,
        verify: object = None,
        conn: AsyncConnection | None = None,
        probe: bytes = b"\x00",
    ) -> None:
        self.resource = resource
        self.lock = check_lock(lock)
        self._verify = as_verifier(verify)
        self._conn = conn
        self._probe = probe  # the key the etcd fence reads to learn etcd's revision
        self._plain = self.lock is None and self._verify is None and conn is None

    @property
    def cluster_id(self) -> int | None:
        """The cluster id the fence knows (its client's, or its verifier's), or ``None``."""
        if self._conn is not None:
            return self._conn.cluster_id
        return getattr(self._verify, "cluster_id", None)

    async def admit(self, token: object) -> int:
        """``token``'s value once it passes every rule of this fence; raises (nothing
        written) otherwise. No I/O unless the token is above the revision known."""
        value = coerce_token(token)
        if self._plain:
            return value
        full = token if isinstance(token, FencingToken) else None
        if self.lock is not None:
            full = full or FencingToken(value)
            if full.lock != self.lock:
                why = "a bound resource takes no bare number" if full.bare else "is not of its lock"
                raise self._foreign(full, why)
        conn = self._conn
        if conn is not None:
            if value > conn.revision:
                from ..._txn import range_request

                probe = range_request(self._probe, count_only=True)
                await conn.call("Range", probe, idempotent=True)
                if value > conn.revision:
                    raise future(value, conn.revision, f"fence {self.resource!r}")
            cluster = full.cluster_id if self.lock is not None and full is not None else None
            if cluster is not None and conn.cluster_id is not None and cluster != conn.cluster_id:
                raise self._foreign(full, "is from another etcd cluster")  # type: ignore[arg-type]
        if self._verify is not None:
            await self._ask(self._verify, full or FencingToken(value))
        return value

    async def _ask(self, verify: Verify, token: FencingToken) -> None:
        """Run the verifier on ``token``; raise if it refuses."""
        result = verify(token)
        # async-only: begin
        if inspect.isawaitable(result):
            result = await result
        # async-only: end
        if inspect.isawaitable(result):  # the sync twin: no loop to run it on (fail closed)
            close = getattr(result, "close", None)
            if close is not None:
                close()  # no "never awaited" warning at exit
            raise self._foreign(
                token, "was refused: its verifier returned an async result a sync fence cannot run"
            )
        if result is False:
            raise self._foreign(token, "was refused by its verifier")

    def _foreign(self, token: FencingToken, why: str) -> ForeignTokenError:
        cluster = self.cluster_id
        bound = f"lock {self.lock!r}" if self.lock is not None else "no lock"
        if cluster is not None:
            bound += f", cluster {cluster}"
        return ForeignTokenError(
            f"{_describe(token)} {why}: resource {self.resource!r} is bound to {bound}; "
            "nothing was written",
            token=token,
            lock=self.lock,
            cluster_id=cluster,
        )

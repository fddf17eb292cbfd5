"""The campaign → lead → step down → re-campaign loop most services want."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _txn, metrics
from .._backoff import jittered
from .._callbacks import AsyncOnElected, AsyncOnLeaderChange, AsyncOnLost, AsyncWork
from .._keys import to_bytes, validate_name
from .._log import log
from ..errors import EtcdfenceError, InvalidArgumentError, InvalidTypeError
from ..token import FencingToken
from . import _compat
from .contender import KeyMonitor
from .observe import observe_leader

_FORMER_LEASES = 16  # this elector's latest leases remembered for ``reclaim``

if TYPE_CHECKING:
    from .client import AsyncClient
    from .election import AsyncElection
    from .session import AsyncSession


class _Stopped(EtcdfenceError):
    """Internal: ``stop()`` interrupted a campaign."""


class _Predicate:
    """A no-argument method result that refuses to be used as a bool itself."""

    __slots__ = ("_check", "_name")

    def __init__(self, check: Callable[[], bool], name: str) -> None:
        self._check = check
        self._name = name

    def __call__(self) -> bool:
        return self._check()

    def __bool__(self) -> bool:
        raise TypeError(f"{self._name} is a method: call {self._name}()")


class _Term:
    """Where one term's end is recorded, once, and every surface reads it.

    ``lost`` is the work's ``stop`` event. :meth:`end` records the reason and sets it;
    for a loss (the session expired, the key deleted, or the work declared the term
    lost with :meth:`AsyncLeaderElector.step_down`) the ``is_leader`` gauge and the
    election's hold (``lock_held``) flip at that moment — while the work may still be
    stopping — not when it returned. A routine end (stopped, work returned) is reported
    by :meth:`report` when the term is over.
    """

    def __init__(self, name: str, identity: str, election: AsyncElection) -> None:
        self.name = name
        self.identity = identity
        self.election = election
        self.lost = _compat.Event()
        self.reason = "stopped"
        self.key_deleted = False  # the term's watch saw etcd delete the leader key
        self._reported = False
        self._guard = threading.Lock()

    def end(self, reason: str, *, hold: str | None = None) -> None:
        """The term is lost (``reason``); ``hold``: how the election's hold ended
        (``expired``/``deleted``; ``None`` when the session reports it itself)."""
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()
        if hold is not None:
            self.election._lose_hold(hold)
        self.report()

    def report(self) -> None:
        """Report the end to metrics and the log (the first call only)."""
        with self._guard:
            if self._reported:
                return
            self._reported = True
        metrics.leader_lost(self.name, self.identity, self.reason)


def _term_key_gone(term: _Term, reason: str, deleted: bool) -> None:
    """The term's key watch ended: etcd deleted the leader key (``deleted``), or the
    watch lost track of it; either way the term is over."""
    if deleted:  # also after a stop: the work may still run
        term.key_deleted = True
        reason = "leader key deleted"
    else:
        reason = reason.replace("the key", "the leader key", 1)
    if not term.lost.is_set():
        term.end(reason, hold="deleted")


class AsyncLeaderElector:
    """Run ``work`` only while this process leads election ``name``.

    ``run(work)`` campaigns with ``identity`` as the value; once elected it calls
    ``on_elected(token)`` and runs ``work(token, stop)``. The moment leadership
    is lost — the session's local deadline passed, the lease was revoked, or the
    key was deleted — ``stop`` is set and the work task is cancelled, then
    ``on_lost()`` runs and the elector campaigns again with a fresh session.
    ``stop()`` ends the loop and resigns. ``on_leader_change(leader)`` is called
    for every leader change seen (any candidate); if it raises — anything,
    ``SystemExit`` included, except ``KeyboardInterrupt`` — the error is logged
    (``etcdfence.on_leader_change_failed``) and it is called again on the next change.
    ``work`` is an ``async def``
    function and each callback a plain or an ``async def`` function (awaited).
    After an etcd error it campaigns again after ``retry_interval`` seconds, jittered
    to 50–100 % of it so electors that failed together do not retry together.

    ``reclaim=True``: a key of this election that holds ``identity`` on a lease
    THIS elector granted in an earlier term (its session is closed or expired
    locally, e.g. its lease outlived an etcd restart, or etcd was unreachable when
    the session closed) is this elector's own leftover: each campaign first deletes
    it, instead of waiting up to a TTL behind itself. A key holding ``identity`` on
    any other lease is never touched — it may be a live process given the same
    identity by mistake, or a frozen earlier instance whose lease still runs: the
    elector logs a warning (``etcdfence.identity_in_use``) and queues behind it like
    any candidate. (A process restart is therefore not reclaimed: the new process
    waits for the old lease, at most a TTL.) The delete is a transaction guarded by
    the key's create revision, lease and value.

    Pass ``token`` with every write the work makes (e.g. ``client.fence(...)``):
    the elector stops work promptly, fencing makes it safe even when it is late.
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        identity: str,
        ttl: int = 10,
        on_elected: AsyncOnElected | None = None,
        on_lost: AsyncOnLost | None = None,
        on_leader_change: AsyncOnLeaderChange | None = None,
        margin: float | None = None,
        retry_interval: float = 1.0,
        reclaim: bool = False,
    ) -> None:
        self.name = validate_name(name)
        if not isinstance(identity, str):
            raise InvalidTypeError(f"identity must be str, got {type(identity).__name__}")
        if not identity or "\x00" in identity:
            raise InvalidArgumentError("identity must be a non-empty str without NUL")
        to_bytes(identity, "identity")  # a lone surrogate is refused now, not at campaign
        if isinstance(retry_interval, bool) or not isinstance(retry_interval, (int, float)):
            raise InvalidTypeError(f"retry_interval must be a number, got {retry_interval!r}")
        if not math.isfinite(retry_interval) or retry_interval < 0:
            raise InvalidArgumentError(
                f"retry_interval must be finite and >= 0, got {retry_interval}"
            )
        self.identity = identity
        self._client = client
        self._ttl = ttl
        self._margin = margin
        self._retry_interval = retry_interval
        self._reclaim = bool(reclaim)
        self._former_leases: collections.deque[int] = collections.deque(maxlen=_FORMER_LEASES)
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._on_leader_change = on_leader_change
        self._stop_requested = _compat.Event()
        self._loop: Any = None  # the event loop run() runs on (async), for stop()
        self._current: _Term | None = None
        self._session: AsyncSession | None = None
        self._election: AsyncElection | None = None
        self._token: FencingToken | None = None
        self._release_by: float | None = None  # see limit_release()
        self._release = True
        self._release_guard = threading.Lock()  # limit_release() from any thread
        self.terms = 0
        client.session(ttl, margin=margin)  # validates ttl/margin now, not on first run

    @property
    def is_leader(self) -> _Predicate:
        """``is_leader()``: whether this elector believes it leads now (a term is running).

        A method, like :meth:`AsyncElection.is_leader` (there it asks etcd; here it is
        the local belief, no I/O); false from the moment a loss is known, while the
        work may still be stopping. Written as 0.1's property (``if elector.is_leader:``)
        it raises :class:`TypeError` instead of being silently always true.
        """
        return _Predicate(self._leading, "is_leader")

    def _leading(self) -> bool:
        term = self._current
        return self.token is not None and term is not None and not term.lost.is_set()

    @property
    def token(self) -> FencingToken | None:
        """The current term's token; ``None`` between terms and as soon as the term's
        session expired (its local deadline passed — the same answer as the session's
        ``check()``, even before the term's end was noticed)."""
        token, session = self._token, self._session
        if token is None or session is None or session.expired:
            return None
        return token

    @property
    def session(self) -> AsyncSession | None:
        """The session of the current or latest term (``None`` before the first).

        Use its ``deadline``/``expired`` to bound work that must end before another
        process can lead, as the ``etcdfence run`` supervisor does."""
        return self._session

    def stop(self) -> None:
        """End ``run()``: stop the work, resign, return. Safe from any thread or task:
        from another thread it wakes the elector's event loop at once."""
        _compat.call_threadsafe(self._loop, self._stop_now)

    def step_down(self, reason: str = "stepped down") -> None:
        """End the current term now, as a loss: ``stop`` is set, and ``is_leader`` and
        ``lock_held`` turn 0 at once, while the work may still be stopping (then the
        elector resigns, if the lease still holds, and campaigns again). For work that
        knows before the elector does that it can no longer lead — e.g. its lease
        cannot be renewed in time to stop a command before etcd may expire it. Safe
        from any thread (it wakes the event loop); a no-op between terms."""
        _compat.call_threadsafe(self._loop, lambda: self._lose_term(reason))

    def key_taken(self) -> bool:
        """Whether etcd has taken the current term's key away: the term's watch saw it
        deleted (``etcdctl del``, a revoke), or a keepalive answer said the lease is
        gone on the server. From then on another candidate may already lead, so work
        still running must end at once — a grace period protects nothing any more.
        False while the key is this elector's, between terms, and when only the local
        deadline passed (etcd may still hold the lease: stop within it). Safe from any
        thread; no I/O. For supervisors that stop a command at a term's end (``etcdfence
        run`` kills it without a grace period once this is true)."""
        term, session = self._current, self._session
        if term is not None and term.key_deleted:
            return True
        return session is not None and session._gone_on_server()

    def limit_release(self, deadline: float | None, *, release: bool = True) -> None:
        """Bound the end of the current (or next) term: its resign, the revoke of its
        session's lease and the join of its key watcher must be done by ``deadline``
        (a ``time.monotonic()`` time; ``None``: each step's own timeout); a step with
        no time left is skipped (the key then goes with the lease, within its TTL).
        ``release=False``: neither resign nor revoke — the key stays until etcd expires
        the lease by its TTL, so no other candidate can lead before then. For work
        that must stop within a budget (``etcdfence run``) and for work that could not
        prove it stopped. Call it before the work returns; it lasts until ``run()``
        ends or the next term starts."""
        with self._release_guard:  # both only tighten within a term, whatever the threads
            if deadline is not None:
                by = self._release_by
                self._release_by = deadline if by is None else min(by, deadline)
            if not release:
                self._release = False

    def _release_left(self, cap: float | None = None) -> float | None:
        """Seconds left for a step of the term's end (``None``: unbounded), at most ``cap``."""
        by = self._release_by
        if by is None:
            return cap
        left = max(0.0, by - _compat.monotonic())
        return left if cap is None else min(cap, left)

    def _lose_term(self, reason: str) -> None:
        term = self._current
        if term is not None and not term.lost.is_set():
            term.end(reason, hold="expired")

    def _stop_now(self) -> None:
        self._stop_requested.set()
        term = self._current
        if term is not None and not term.lost.is_set():
            # the decision to stop is the term's end: `stop`, is_leader and lock_held
            # say so together now, while the work may still be stopping (then resign)
            term.end("stopped", hold="resigned")
        session = self._session
        if session is not None:
            session.interrupt_waiters(_Stopped("elector stopped"))

    async def run(self, work: AsyncWork) -> None:
        """Campaign, run ``work(token, stop)`` while leading, repeat until :meth:`stop`.

        An exception from ``work`` or from a callback (``on_elected``, ``on_lost``)
        ends the term like a loss — the work is stopped, leadership resigned, the
        term's watch closed — and then propagates out of ``run()``. etcd errors
        (unavailable, session expired) do not end ``run()``: it campaigns again.
        """
        self._loop = _compat.owner_loop()
        observer = None
        if self._on_leader_change is not None:
            observer = _compat.Background(self._observe, name=f"etcdfence-observe-{self.name}")
        try:
            while not self._stop_requested.is_set():
                try:
                    await self._term(work)
                except _Stopped:
                    break
                except InvalidTypeError:  # a work or callback this twin cannot run
                    raise
                except EtcdfenceError as err:
                    log.warning("etcdfence.elector_retry", election=self.name, error=str(err))
                if not self._stop_requested.is_set():
                    await _compat.wait_event(self._stop_requested, jittered(self._retry_interval))
        finally:
            if observer is not None:
                observer.cancel()

    async def _term(self, work: AsyncWork) -> None:
        if not self._stop_requested.is_set():
            with self._release_guard:
                self._release_by, self._release = None, True
        session = await self._client.session(self._ttl, margin=self._margin).open()
        try:
            await self._campaign_and_work(session, work)
        finally:
            # revoke (unless limit_release() said not to) within what is left of it
            await session.aclose(timeout=self._release_left(), revoke=self._release)

    async def _campaign_and_work(self, session: AsyncSession, work: AsyncWork) -> None:
        self._session = session
        if self._stop_requested.is_set():  # stop() may have missed this session
            return
        election = session.election(self.name)
        self._election = election
        if self._reclaim:
            await self._take_back_stale_keys(session)
        token = await election.campaign(self.identity)
        term = _Term(self.name, self.identity, election)
        lost = term.lost
        self._current = term
        session.on_expired(lambda: term.end("session expired"))
        monitor = KeyMonitor(
            session.connection, token, lambda why, deleted: _term_key_gone(term, why, deleted)
        )
        self._token = token
        self.terms += 1
        try:
            metrics.leader_elected(self.name, token.value, self.identity, self.is_leader)
            if self._on_elected is not None and self.token is not None:
                await _compat.run_callback(self._on_elected, token)
            if self._stop_requested.is_set():
                lost.set()
            if self.token is None:  # the session's one answer, asked before user code
                term.end("session expired")  # gets the token: past the deadline (a
                return  # blocking on_elected, say) the term is lost, work never starts
            finished = await _compat.run_term(work, token, lost)
            if finished:
                term.reason = "work returned"
        except BaseException as exc:
            if not lost.is_set():  # e.g. its fenced write was refused (AuthError)
                term.reason = f"work failed: {exc!r}"
            raise
        finally:
            await self._end_term(session, election, monitor, term)

    async def _take_back_stale_keys(self, session: AsyncSession) -> None:
        """Delete this identity's keys left on this elector's former leases; warn
        about the identity on any other lease (see ``reclaim``)."""
        lease = await session.lease()
        mine = to_bytes(self.identity, "identity")
        prefix = (self.name + "/").encode("utf-8")
        conn = session.connection
        read = await conn.call("Range", _txn.range_request(prefix, prefix=True), idempotent=True)
        former = set(self._former_leases)
        self._former_leases.append(lease)  # from now on, one of ours
        for kv in read.kvs:
            if kv.value != mine or kv.lease == lease:
                continue
            key = kv.key.decode("utf-8", "replace")
            if kv.lease not in former:  # not ours: maybe alive; never delete it
                log.warning(
                    "etcdfence.identity_in_use",
                    election=self.name,
                    identity=self.identity,
                    key=key,
                    lease_id=f"{kv.lease:x}",
                    detail="another session holds a key with this identity (the same "
                    "identity given twice, or an earlier instance still alive or frozen); "
                    "waiting behind it",
                )
                continue
            request = _txn.stale_key_delete(kv.key, kv.create_revision, kv.lease, mine)
            done = await conn.call("Txn", request, idempotent=True)
            if done.succeeded:
                log.info(
                    "etcdfence.stale_key_reclaimed",
                    election=self.name,
                    identity=self.identity,
                    key=key,
                    lease_id=f"{kv.lease:x}",
                )

    async def _end_term(
        self,
        session: AsyncSession,
        election: AsyncElection,
        monitor: KeyMonitor,
        term: _Term,
    ) -> None:
        """Everything a term's end must do, whatever ended it; each step runs even if
        an earlier one fails (a raising ``on_lost`` included)."""
        term.lost.set()  # however the term ended, `stop` now says so
        self._token = None
        self._current = None
        try:
            await monitor.aclose(self._release_left(1.0) or 0.0)
            term.report()
            if self._on_lost is not None:
                await _compat.run_callback(self._on_lost)
        finally:
            left = self._release_left()
            if not session.expired and self._release and (left is None or left > 0):
                try:
                    await election.resign(left)
                except EtcdfenceError as err:
                    log.info("etcdfence.resign_failed", election=self.name, error=str(err))

    async def _tell_leader_change(self, callback: Any, leader: Any) -> None:
        """Call ``on_leader_change``; one that raises is logged and called again on the
        next change (a bad call must not end the observer for the elector's life).

        Any exception counts, ``SystemExit`` included (a callback cannot end the
        process from inside the observer, and must not silently end the
        observer). Only ``KeyboardInterrupt`` (a Ctrl-C) and the observer's own
        cancellation propagate; the interrupt is logged first."""
        try:
            await _compat.run_callback(callback, leader)
        except _compat.Aborted:  # the observer is being cancelled (stop)
            raise
        except KeyboardInterrupt:
            log.error("etcdfence.on_leader_change_interrupted", election=self.name)
            raise
        except BaseException:
            log.exception("etcdfence.on_leader_change_failed", election=self.name)

    async def _observe(self) -> None:
        callback = self._on_leader_change
        assert callback is not None
        while not self._stop_requested.is_set():
            try:
                async for leader in observe_leader(
                    self._client.connection, self.name, self._stop_requested
                ):
                    if self._stop_requested.is_set():
                        return
                    await self._tell_leader_change(callback, leader)
            except EtcdfenceError as err:
                log.info("etcdfence.observe_retry", election=self.name, error=str(err))
                await _compat.wait_event(self._stop_requested, jittered(self._retry_interval))

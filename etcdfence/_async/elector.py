"""The campaign → lead → step down → re-campaign loop most services want."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _txn, metrics
from .._backoff import jittered
from .._callbacks import AsyncOnElected, AsyncOnLeaderChange, AsyncOnLost, AsyncWork
from .._keys import to_bytes, validate_name
from .._log import log
from ..errors import CompactedError, EtcdfenceError, InvalidArgumentError, InvalidTypeError
from ..token import FencingToken
from . import _compat
from .observe import observe_leader
from .watch import AsyncWatch

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


class _TermMonitor:
    """Watches the leader's own key for the term and sets ``lost`` when it is deleted.

    Compaction is not a loss: when the watch falls behind a compaction (after a
    broken stream, say), the key is re-read; the term goes on if it is still our
    incarnation, and watching resumes after that read.
    """

    def __init__(self, conn: Any, token: FencingToken, lost: Any, reason: list[str]) -> None:
        self._conn = conn
        self._key = (token.key or "").encode("utf-8")
        self._create_revision = token.create_revision
        self._lost = lost
        self._reason = reason
        self._guard = threading.Lock()
        self._closed = False
        self._watch: AsyncWatch | None = None
        self._task = _compat.Background(
            self._run, token.value + 1, name=f"etcdfence-term-{self._key!r}"
        )

    def _adopt(self, watch: AsyncWatch) -> bool:
        with self._guard:
            if self._closed:
                return False
            self._watch = watch
            return True

    async def _run(self, start_revision: int) -> None:
        try:
            while True:
                watch = AsyncWatch(self._conn, self._key, start_revision=start_revision)
                if not self._adopt(watch):
                    return
                try:
                    await watch.start()
                    async for batch in watch:
                        if any(ev.type == "delete" for ev in batch.events):
                            self._end("leader key deleted")
                            return
                    return  # closed
                except CompactedError:
                    read = await self._conn.call(
                        "Range", _txn.range_request(self._key), idempotent=True
                    )
                    if not read.kvs or read.kvs[0].create_revision != self._create_revision:
                        self._end("leader key deleted")
                        return
                    start_revision = int(read.header.revision) + 1
                finally:
                    await watch.aclose()
        except EtcdfenceError as err:
            self._end(f"lost track of the leader key: {err}")

    def _end(self, reason: str) -> None:
        if not self._lost.is_set() and not self._closed:
            self._reason[0] = reason
            self._lost.set()

    async def aclose(self) -> None:
        with self._guard:
            self._closed = True
            watch = self._watch
        if watch is not None:
            await watch.aclose()
        self._task.cancel()
        await self._task.join(1.0)


class AsyncLeaderElector:
    """Run ``work`` only while this process leads election ``name``.

    ``run(work)`` campaigns with ``identity`` as the value; once elected it calls
    ``on_elected(token)`` and runs ``work(token, stop)``. The moment leadership
    is lost — the session's local deadline passed, the lease was revoked, or the
    key was deleted — ``stop`` is set and the work task is cancelled, then
    ``on_lost()`` runs and the elector campaigns again with a fresh session.
    ``stop()`` ends the loop and resigns. ``on_leader_change(leader)`` is called
    for every leader change seen (any candidate). ``work`` is an ``async def``
    function and each callback a plain or an ``async def`` function (awaited).
    After an etcd error it campaigns again after ``retry_interval`` seconds, jittered
    to 50–100 % of it so electors that failed together do not retry together.

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
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._on_leader_change = on_leader_change
        self._stop_requested = _compat.Event()
        self._loop: Any = None  # the event loop run() runs on (async), for stop()
        self._term_stop: Any = None
        self._session: AsyncSession | None = None
        self._election: AsyncElection | None = None
        self.token: FencingToken | None = None
        self.terms = 0
        client.session(ttl, margin=margin)  # validates ttl/margin now, not on first run

    @property
    def is_leader(self) -> _Predicate:
        """``is_leader()``: whether this elector believes it leads now (a term is running).

        A method, like :meth:`AsyncElection.is_leader` (there it asks etcd; here it is
        the local belief, no I/O). Written as 0.1's property (``if elector.is_leader:``)
        it raises :class:`TypeError` instead of being silently always true.
        """
        return _Predicate(lambda: self.token is not None, "is_leader")

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

    def _stop_now(self) -> None:
        self._stop_requested.set()
        term_stop = self._term_stop
        if term_stop is not None:
            term_stop.set()
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
        async with self._client.session(self._ttl, margin=self._margin) as session:
            self._session = session
            if self._stop_requested.is_set():  # stop() may have missed this session
                return
            election = session.election(self.name)
            self._election = election
            token = await election.campaign(self.identity)
            lost = _compat.Event()
            self._term_stop = lost
            reason = ["stopped"]

            def on_expired() -> None:
                reason[0] = "session expired"
                lost.set()

            session.on_expired(on_expired)
            monitor = _TermMonitor(session.connection, token, lost, reason)
            self.token = token
            self.terms += 1
            try:
                metrics.leader_elected(self.name, token.value, self.identity)
                if self._on_elected is not None:
                    await _compat.run_callback(self._on_elected, token)
                if self._stop_requested.is_set():
                    lost.set()
                finished = await _compat.run_term(work, token, lost)
                if finished:
                    reason[0] = "work returned"
            except BaseException as exc:
                if not lost.is_set():  # e.g. its fenced write was refused (AuthError)
                    reason[0] = f"work failed: {exc!r}"
                raise
            finally:
                await self._end_term(session, election, monitor, lost, reason[0])

    async def _end_term(
        self,
        session: AsyncSession,
        election: AsyncElection,
        monitor: _TermMonitor,
        lost: Any,
        reason: str,
    ) -> None:
        """Everything a term's end must do, whatever ended it; each step runs even if
        an earlier one fails (a raising ``on_lost`` included)."""
        lost.set()  # however the term ended, `stop` now says so
        self.token = None
        self._term_stop = None
        try:
            await monitor.aclose()
            metrics.leader_lost(self.name, self.identity, reason)
            if self._on_lost is not None:
                await _compat.run_callback(self._on_lost)
        finally:
            if not session.expired:
                try:
                    await election.resign()
                except EtcdfenceError as err:
                    log.info("etcdfence.resign_failed", election=self.name, error=str(err))

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
                    await _compat.run_callback(callback, leader)
            except EtcdfenceError as err:
                log.info("etcdfence.observe_retry", election=self.name, error=str(err))
                await _compat.wait_event(self._stop_requested, jittered(self._retry_interval))

"""The campaign → lead → step down → re-campaign loop most services want."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from .. import metrics
from .._keys import validate_name
from ..errors import EtcdfenceError
from ..token import FencingToken
from ..types import Leader
from . import _compat
from .observe import observe_leader
from .watch import AsyncWatch

if TYPE_CHECKING:
    from .client import AsyncClient
    from .election import AsyncElection
    from .session import AsyncSession

log = structlog.get_logger("etcdfence")


class _Stopped(EtcdfenceError):
    """Internal: ``stop()`` interrupted a campaign."""


class AsyncLeaderElector:
    """Run ``work`` only while this process leads election ``name``.

    ``run(work)`` campaigns with ``identity`` as the value; once elected it calls
    ``on_elected(token)`` and runs ``work(token, stop)``. The moment leadership
    is lost — the session's local deadline passed, the lease was revoked, or the
    key was deleted — ``stop`` is set and the work task is cancelled, then
    ``on_lost()`` runs and the elector campaigns again with a fresh session.
    ``stop()`` ends the loop and resigns. ``on_leader_change(leader)`` is called
    for every leader change seen (any candidate).

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
        on_elected: Callable[[FencingToken], Any] | None = None,
        on_lost: Callable[[], Any] | None = None,
        on_leader_change: Callable[[Leader | None], Any] | None = None,
        margin: float | None = None,
        retry_interval: float = 1.0,
    ) -> None:
        self.name = validate_name(name)
        if not isinstance(identity, str) or not identity:
            raise ValueError("identity must be a non-empty str")
        self.identity = identity
        self._client = client
        self._ttl = ttl
        self._margin = margin
        self._retry_interval = retry_interval
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._on_leader_change = on_leader_change
        self._stop_requested = _compat.Event()
        self._term_stop: Any = None
        self._session: AsyncSession | None = None
        self._election: AsyncElection | None = None
        self.token: FencingToken | None = None
        self.terms = 0
        client.session(ttl, margin=margin)  # validates ttl/margin now, not on first run

    @property
    def is_leader(self) -> bool:
        """Whether this elector currently believes it leads (a term is running)."""
        return self.token is not None

    def stop(self) -> None:
        """End ``run()``: stop the work, resign, return. Safe from any thread/task."""
        self._stop_requested.set()
        term_stop = self._term_stop
        if term_stop is not None:
            term_stop.set()
        session = self._session
        if session is not None:
            session.interrupt_waiters(_Stopped("elector stopped"))

    async def run(self, work: Callable[..., Any]) -> None:
        """Campaign, run ``work(token, stop)`` while leading, repeat until :meth:`stop`."""
        observer = None
        if self._on_leader_change is not None:
            observer = _compat.Background(self._observe, name=f"etcdfence-observe-{self.name}")
        try:
            while not self._stop_requested.is_set():
                try:
                    await self._term(work)
                except _Stopped:
                    break
                except EtcdfenceError as err:
                    log.warning("etcdfence.elector_retry", election=self.name, error=str(err))
                if not self._stop_requested.is_set():
                    await _compat.wait_event(self._stop_requested, self._retry_interval)
        finally:
            if observer is not None:
                observer.cancel()

    async def _term(self, work: Callable[..., Any]) -> None:
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
            watch = AsyncWatch(
                session.client._conn,
                token.key.encode("utf-8") if token.key else b"",
                start_revision=token.value + 1,
            )
            monitor = _compat.Background(
                self._monitor, watch, lost, reason, name=f"etcdfence-term-{self.name}"
            )
            self.token = token
            self.terms += 1
            metrics.leader_elected(self.name, token.value, self.identity)
            if self._on_elected is not None:
                self._on_elected(token)
            try:
                if self._stop_requested.is_set():
                    lost.set()
                finished = await _compat.run_term(work, token, lost)
                if finished:
                    reason[0] = "work returned"
            except Exception as exc:
                if not lost.is_set():  # e.g. its fenced write was refused (AuthError)
                    reason[0] = f"work failed: {exc}"
                raise
            finally:
                lost.set()  # however the term ended, `stop` now says so
                self.token = None
                self._term_stop = None
                await watch.close()
                monitor.cancel()
                await monitor.join(1.0)
                metrics.leader_lost(self.name, self.identity, reason[0])
                if self._on_lost is not None:
                    self._on_lost()
                if not session.expired:
                    try:
                        await election.resign()
                    except EtcdfenceError as err:
                        log.info("etcdfence.resign_failed", election=self.name, error=str(err))

    async def _monitor(self, watch: AsyncWatch, lost: Any, reason: list[str]) -> None:
        """Set ``lost`` when our key is deleted or replaced behind our back."""
        try:
            await watch.start()
            async for batch in watch:
                if any(ev.type == "delete" for ev in batch.events):
                    reason[0] = "leader key deleted"
                    lost.set()
                    return
        except EtcdfenceError as err:
            if not lost.is_set():
                reason[0] = f"lost track of the leader key: {err}"
                lost.set()

    async def _observe(self) -> None:
        callback = self._on_leader_change
        assert callback is not None
        while not self._stop_requested.is_set():
            try:
                async for leader in observe_leader(
                    self._client._conn, self.name, self._stop_requested
                ):
                    if self._stop_requested.is_set():
                        return
                    callback(leader)
            except EtcdfenceError as err:
                log.info("etcdfence.observe_retry", election=self.name, error=str(err))
                await _compat.wait_event(self._stop_requested, self._retry_interval)

"""Leader election compatible with Go's ``concurrency.Election`` and ``etcdctl elect``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .. import _txn
from .._keys import to_bytes
from ..errors import NotLeaderError
from ..token import FencingToken
from ..types import Leader
from .contender import AsyncContender
from .observe import observe_leader


class AsyncElection(AsyncContender):
    """One candidate in election ``name``; the leader is the earliest campaigner alive.

    Get it from :meth:`AsyncSession.election`. ``campaign(value)`` waits until
    this candidate leads and returns the term's :class:`FencingToken`;
    ``proclaim`` changes the advertised value, ``resign`` steps down. For a
    ready-made campaign/work/re-campaign loop use :class:`AsyncLeaderElector`.
    """

    _kind = "election"

    async def campaign(self, value: str | bytes, timeout: float | None = None) -> FencingToken:
        """Become leader advertising ``value``; returns the term's fencing token.

        Raises :class:`AcquireTimeoutError` after ``timeout`` seconds (our candidacy is
        withdrawn) or :class:`SessionExpiredError` if the session died while waiting.
        """
        return await self._contend(to_bytes(value, "value"), timeout)

    async def proclaim(self, value: str | bytes) -> int:
        """Change the leader's advertised value without a new election.

        Raises :class:`NotLeaderError` if this candidate does not lead (any more).
        Returns the revision of the update.
        """
        raw = to_bytes(value, "value")
        token = self._token
        if token is None or token.key is None:
            raise NotLeaderError(f"not the leader of {self.name!r}: campaign first")
        self._session.check()
        response = await self._conn.call(
            "Txn",
            _txn.guarded_put(
                token.key.encode("utf-8"), raw, self._session.lease_id, self._create_revision
            ),
            idempotent=True,
        )
        if not response.succeeded:
            self._token = None
            self._create_revision = 0
            self._end_hold("deleted")
            raise NotLeaderError(f"leadership of {self.name!r} was lost (key gone)")
        revision: int = response.header.revision
        return revision

    async def resign(self, timeout: float | None = None) -> None:
        """Step down (no-op if not leading). The delete is guarded by create revision.

        ``timeout`` bounds the delete (default: the client's timeout), e.g. to fit a
        stop budget; if etcd does not answer in time the key goes with the lease."""
        await self._give_up(timeout)

    async def is_leader(self) -> bool:
        """Whether etcd still says this candidate leads."""
        return await self._holds()

    async def leader(self) -> Leader | None:
        """The current leader of this election (maybe another candidate), or ``None``."""
        return await self._session.client.leader(self.name)

    def observe(self) -> AsyncIterator[Leader | None]:
        """Every leader change of this election; see :meth:`AsyncClient.observe`."""
        return observe_leader(self._conn, self.name)

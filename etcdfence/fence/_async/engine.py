"""The within-term protocol, written once: every fence runs its writes through here.

A backend supplies a :class:`AsyncStore` — one round trip per :meth:`~AsyncStore.attempt`
(check the mark, move it, apply the ops, atomically) — and an :class:`AsyncWriter` does
the rest, identically for etcd, Redis and SQL (:mod:`etcdfence.fence.epochs` explains
the protocol):

* a write with no epoch owned *claims* one in the same round trip as the write;
* a write refused by a higher epoch of its own token (another writer of the term
  claimed one) gives its epoch up and retries with a fresh claim, at most
  :data:`~etcdfence.fence.epochs.ADOPT_ATTEMPTS` times; a claim that lost a race with
  another claim re-reads and retries, at most
  :data:`~etcdfence.fence.epochs.CLAIM_ATTEMPTS` times;
* a write whose answer was lost gives its epoch up before anything else, then tries
  once, briefly (:data:`~etcdfence.fence.epochs.QUICK_FENCE_OFF`), to claim a fresh
  epoch, which fences the lost attempt off, and raises
  :class:`~etcdfence.errors.OutcomeUnknownError` saying whether that worked;
* a write cancelled in flight gives its epoch up too.

Use it when adding a backend: implement :class:`AsyncStore` (and nothing of the
above) and put an :class:`AsyncWriter` behind the public methods of
:class:`~etcdfence.fence.base.AsyncFence`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from ... import metrics
from ..._keys import MAX_EPOCH, validate_timeout
from ..._log import log
from ..._primitives import ALock, asleep
from ...errors import (
    EtcdfenceError,
    InvalidArgumentError,
    KeyExistsError,
    OutcomeUnknownError,
    RepairRefusedError,
    RequestError,
    StaleTokenError,
)
from ..epochs import (
    ADOPT_ATTEMPTS,
    CLAIM_ATTEMPTS,
    QUICK_FENCE_OFF,
    WriterEpochs,
    claim_after,
    lost_attempt,
)

#: How long a fence-off waits before resending a claim whose answer was lost at once
#: (a refused connection fails in microseconds; this keeps the loop from spinning).
_RESEND_PAUSE = 0.05


@dataclass(frozen=True)
class Reply:
    """A store's answer to one :meth:`AsyncStore.attempt`.

    ``applied``: the write (and the claim, if the attempt claimed) applied; then
    ``epoch`` is the epoch it was written at and ``version`` the resource's version after
    it. Otherwise ``mark`` is the ``(token, epoch)`` that refused it and ``seen`` the
    store's version of that mark (etcd: its mod revision; 0: no mark), which the next
    claim compares against. ``extra`` is the backend's own payload.
    """

    applied: bool
    epoch: int = 0
    mark: tuple[int, int] = (0, 0)
    seen: int = 0
    version: int = 0
    extra: Any = None


class Lost(Exception):
    """Raised by a store when an attempt's answer was lost: it may or may not have
    applied. ``cause`` says why (it ends up in the :class:`OutcomeUnknownError`)."""

    def __init__(self, cause: BaseException | str) -> None:
        super().__init__(str(cause))
        self.cause = cause


class AsyncStore(Protocol):
    """What a backend implements: one atomic round trip, and the names it reports."""

    #: The resource whose mark this store keeps.
    resource: str
    #: The ``backend`` label of metrics and log events (``"etcd"``, ``"redis"``, …).
    backend: str
    #: The backend's own request timeout, seconds (bounds the quick fence-off).
    timeout: float

    async def attempt(
        self, token: int, epoch: int | None, ops: Any, hint: Reply | None, timeout: float | None
    ) -> Reply:
        """One round trip, atomically. ``epoch`` given: apply ``ops`` if the mark is not
        above ``(token, epoch)``, moving the mark there. ``epoch`` None: *claim* — move
        the mark to the smallest mark strictly above it with ``token``
        (:func:`claim_target` of ``hint``, the previous refusal, for a store that
        compares versions) — and apply ``ops`` (None: claim only). Raises :class:`Lost`
        when the answer was lost, any other error when nothing applied:
        :class:`~etcdfence.errors.KeyExistsError` when a Create of ``ops`` found its key
        (checked after the mark: a stale or higher-epoch mark refuses first; nothing
        written, the mark not moved, so the writer keeps its epoch), and likewise a
        :class:`~etcdfence.errors.RequestError` for a request the store refused whole
        (etcd's "too many operations", a request too large)."""
        ...


def check_fence_off_timeout(timeout: object) -> float:
    """A ``fence_off`` timeout given by the caller: a finite number of seconds above 0."""
    seconds = validate_timeout(timeout, "fence_off timeout")
    if not seconds:  # None is handled by the caller; 0 allows no attempt at all
        raise InvalidArgumentError(f"fence_off timeout must be above 0 seconds, got {timeout!r}")
    return seconds


def claim_target(token: int, hint: Reply | None) -> tuple[int, tuple[int, int]]:
    """``(seen, target)`` for a store that claims by compare-and-set: the version the
    mark must still have, and the mark to set. Without a hint the guess is "no mark
    yet" (one round trip on a fresh resource; elsewhere the refusal returns the mark)."""
    if hint is None:
        return 0, (token, 0)
    return hint.seen, claim_after(token, *hint.mark)


class AsyncWriter:
    """One writer's side of the protocol over one store: one per fence object, and one
    fence object per writer."""

    def __init__(self, store: AsyncStore, *, durable_replies: bool = True) -> None:
        """``durable_replies``: an applied reply means the write is durable (etcd,
        Redis), so a claim is owned as soon as it is answered, and one claim of this
        writer flies at a time — concurrent first writes wait for it and then write at
        its epoch instead of racing it. False for a store whose caller commits later
        (SQL, which serializes its writers itself)."""
        self.store = store
        self.epochs = WriterEpochs()
        self._durable = durable_replies
        self._claiming = ALock()

    def epoch(self, token: int) -> int:
        """The epoch this writer claimed last for ``token`` (0 if none)."""
        return self.epochs.get(token)

    async def write(self, token: int, ops: Any) -> Reply:
        """Apply ``ops`` with ``token`` (see the module docstring); the store's reply."""
        started = time.perf_counter()
        reply = await self.accept(token, ops)
        self.acknowledged(token, reply, time.perf_counter() - started)
        return reply

    def acknowledged(self, token: int, reply: Reply, seconds: float = 0.0) -> None:
        """``reply``'s write is durable (committed): if it claimed, the epoch is owned now.
        A store whose applied replies are not durable yet (SQL: before COMMIT) counts the
        accepted write here, ``seconds`` after its attempt began, not at :meth:`accept`."""
        self.epochs.claimed(token, reply.epoch)
        if not self._durable:
            metrics.fence_accepted(self.store.resource, token, seconds, self.store.backend)

    async def accept(self, token: int, ops: Any) -> Reply:
        """The attempts until one applies; does not record a claim (see
        :meth:`acknowledged`). Raises :class:`StaleTokenError` (nothing written) or
        :class:`OutcomeUnknownError`."""
        hint: Reply | None = None
        adopts = claims = 0
        while True:
            epoch, reply, elapsed = await self._try(token, ops, hint)
            if reply.applied:
                if self._durable:  # else counted once committed (acknowledged)
                    metrics.fence_accepted(self.store.resource, token, elapsed, self.store.backend)
                return reply
            current = reply.mark[0]
            if current > token:
                metrics.fence_rejected(
                    self.store.resource, token, current, elapsed, self.store.backend
                )
                raise StaleTokenError(self.store.resource, token, current)
            hint = reply
            if epoch is None:  # our claim raced another writer's: claim above theirs
                claims += 1
                if claims >= CLAIM_ATTEMPTS:
                    raise self._restless(token, "keep moving the mark; no epoch was claimed")
                continue
            self.epochs.give_up(token, epoch)  # another writer of our term claimed above
            log.debug(
                "etcdfence.epoch_claimed_over",
                resource=self.store.resource,
                token=token,
                epoch=reply.mark[1],
            )
            adopts += 1
            if adopts >= ADOPT_ATTEMPTS:
                raise self._restless(token, "keep raising the epoch")

    async def _try(
        self, token: int, ops: Any, hint: Reply | None
    ) -> tuple[int | None, Reply, float]:
        """One attempt at the epoch owned, or a claim: the epoch tried (None: claimed),
        the reply and its seconds. Claims of a durable store fly one at a time."""
        epoch = self.epochs.owned(token)
        if epoch is not None or not self._durable:
            started = time.perf_counter()
            reply = await self._attempt(token, epoch, ops, hint)
            return epoch, reply, time.perf_counter() - started
        async with self._claiming:
            epoch = self.epochs.owned(token)  # a claim that finished meanwhile serves us
            started = time.perf_counter()
            reply = await self._attempt(token, epoch, ops, hint)
            if epoch is None and reply.applied:
                self.epochs.claimed(token, reply.epoch)
            return epoch, reply, time.perf_counter() - started

    async def _attempt(self, token: int, epoch: int | None, ops: Any, hint: Reply | None) -> Reply:
        try:
            return await self.store.attempt(token, epoch, ops, hint, None)
        except Lost as lost:
            raise await self.lost(token, epoch, lost.cause) from None
        except (KeyExistsError, RequestError):
            raise  # a definite refusal: nothing applied, the epoch is still ours
        except BaseException:  # cancelled or interrupted in flight: the outcome is unknown
            if epoch is not None:
                self.epochs.give_up(token, epoch)
            raise

    async def lost(
        self, token: int, epoch: int | None, cause: BaseException | str
    ) -> OutcomeUnknownError:
        """The attempt at ``(token, epoch)`` (``None``: a claim) got no answer: give the
        epoch up, try the quick fence-off, and return the error to raise."""
        if epoch is not None:
            self.epochs.give_up(token, epoch)
        budget = min(QUICK_FENCE_OFF, self.store.timeout)
        try:
            next_epoch, _ = await self._claim_until(token, budget)
            fenced = next_epoch is not None
        except StaleTokenError:  # a higher token fenced every attempt of ours off already
            next_epoch, fenced = None, True
        except EtcdfenceError:  # the claim was refused: the lost attempt may still apply
            next_epoch, fenced = None, False
        return lost_attempt(self.store.resource, token, epoch, next_epoch, fenced, cause)

    async def fence_off(self, token: int, timeout: float | None = None) -> int:
        """Return only once no earlier attempt with ``token`` can apply any more; the
        epoch claimed. ``timeout``: seconds, a finite number above 0 (0 would allow no
        attempt at all, so it is refused like a negative one), default the store's
        request timeout. Raises :class:`StaleTokenError` when a higher token owns the
        resource, :class:`OutcomeUnknownError` (``fenced_off`` False) when ``timeout``
        passed without a claim, :class:`InvalidArgumentError` /
        :class:`InvalidTypeError` for a bad ``timeout`` (before anything is sent)."""
        budget = self.store.timeout if timeout is None else check_fence_off_timeout(timeout)
        owned = self.epochs.owned(token)
        if owned is not None:
            self.epochs.give_up(token, owned)
        epoch, why = await self._claim_until(token, budget)
        if epoch is None:
            raise OutcomeUnknownError(
                f"could not fence off earlier writes of token {token} on "
                f"{self.store.resource!r} within {budget:g}s: {why}; "
                "an earlier attempt may still apply — retry fence_off before re-reading",
                resource=self.store.resource,
                token=token,
                epoch=self.epochs.get(token),
                fenced_off=False,
            )
        return epoch

    async def _claim_until(self, token: int, budget: float) -> tuple[int | None, str]:
        """Claim an epoch (no ops), resending lost claims — a claim only raises the mark,
        so a resend is harmless and does not count — until ``budget`` seconds passed or
        :data:`CLAIM_ATTEMPTS` claims were refused by other writers' moves; ``(epoch,
        "")``, or ``(None, why not)``. Raises StaleTokenError."""
        deadline = time.monotonic() + budget
        hint: Reply | None = None
        refused = 0
        why = "the store did not answer"
        while refused < CLAIM_ATTEMPTS:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, why
            try:
                reply = await self.store.attempt(token, None, None, hint, left)
            except Lost as lost:
                why = f"the store did not answer ({lost.cause})"
                await asleep(max(0.0, min(_RESEND_PAUSE, deadline - time.monotonic())))
                continue
            if reply.applied:
                self.epochs.claimed(token, reply.epoch)
                return reply.epoch, ""
            if reply.mark[0] > token:
                raise StaleTokenError(self.store.resource, token, reply.mark[0])
            hint = reply
            refused += 1
        return None, f"other writers of the term moved the mark {refused} times in a row"

    def _restless(self, token: int, what: str) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"writers of token {token} on {self.store.resource!r} {what}; nothing was written",
            resource=self.store.resource,
            token=token,
            epoch=self.epochs.get(token),
            fenced_off=True,
        )


# -- repair: lowering a forged mark -----------------------------------------------------
# A mark whose token is above etcd's current revision cannot come from a lock or an
# election of that cluster (a token is the revision its key was created at): someone
# wrote it behind the fences' backs (a forged or typo'd token, a mark copied from another
# cluster). Such a mark refuses every real holder until etcd's revision passes it.


@dataclass(frozen=True)
class Repaired:
    """What :func:`repair` did: the mark ``old``, judged forged against etcd's
    ``revision``, was replaced by ``new`` (:func:`sealed_at` ``revision``)."""

    resource: str
    old: tuple[int, int]
    new: tuple[int, int]
    revision: int

    def as_dict(self) -> dict[str, Any]:
        """The record ``etcdfence fence repair`` prints."""
        return {
            "resource": self.resource,
            "old_mark": list(self.old),
            "new_mark": list(self.new),
            "revision": self.revision,
        }


class AsyncRepairable(Protocol):
    """What a store adds for :func:`repair`: a read of the mark and a compare-and-set."""

    resource: str

    async def read_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none."""
        ...

    async def lower(self, expected: tuple[int, int], new: tuple[int, int]) -> tuple[int, int]:
        """Atomically: if the mark is exactly ``expected``, set it to ``new``. Returns
        the mark found (``expected`` iff it was replaced). Writes nothing else (no data,
        no version bump)."""
        ...


class AsyncRevisionSource(Protocol):
    """Where :func:`repair` learns etcd's current revision: an etcd client
    (:meth:`~etcdfence.AsyncClient.revision`, a linearizable read)."""

    async def revision(self) -> int:
        """etcd's current revision."""
        ...


def sealed_at(revision: int) -> tuple[int, int]:
    """The mark a repair leaves: ``(revision, MAX_EPOCH)``. It refuses every token up to
    ``revision`` with every epoch — every term issued so far, so no write that was fenced
    off before the forgery can apply after the repair — and accepts the next token etcd
    issues (above ``revision``). A holder whose token is at most ``revision`` is refused
    too and must re-acquire: the safe direction."""
    return (revision, MAX_EPOCH)


async def repair(store: AsyncRepairable, etcd: AsyncRevisionSource) -> Repaired:
    """Lower ``store``'s mark if it is provably forged, to :func:`sealed_at` etcd's
    current revision; what was done. Raises :class:`RepairRefusedError` (nothing
    changed) when the mark's token is not above that revision, or when the mark changed
    in between (the compare-and-set is on the exact mark judged, so a legitimate write
    in between is never undone).

    The mark is read *before* the revision: every real token the mark can hold when read
    is at most the revision read after it, so a mark above it is forged for sure."""
    found = await store.read_mark()
    revision = await etcd.revision()
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
        raise InvalidArgumentError(f"etcd's revision must be a positive int, got {revision!r}")
    if found[0] <= revision:
        raise RepairRefusedError(
            f"the mark of {store.resource!r} is {found}, not above etcd's current revision "
            f"{revision}: a lock or election may have issued it, so it is not provably "
            "forged; nothing changed",
            resource=store.resource,
            mark=found,
            revision=revision,
        )
    new = sealed_at(revision)
    now = await store.lower(found, new)
    if now != found:
        raise RepairRefusedError(
            f"the mark of {store.resource!r} moved from {found} to {now} while it was "
            "being repaired; nothing changed (run the repair again to judge the new mark)",
            resource=store.resource,
            mark=now,
            revision=revision,
        )
    log.warning(
        "etcdfence.fence_repaired",
        resource=store.resource,
        old_mark=list(found),
        new_mark=list(new),
        revision=revision,
    )
    return Repaired(store.resource, found, new, revision)

"""The epochs a writer owns, per token: the writer's side of within-term ordering.

Every guard (etcd, SQL, Redis) orders the writes *within* a term the same way: the
resource's mark is ``(token, epoch)``; a write carries an epoch and is accepted only if
the mark is not above it.

**An epoch is claimed at the resource, and owned by one writer.** A writer (one guard
object: one *incarnation* of a writer — a new guard, a restarted process, a CLI call)
writes with a token only at an epoch it claimed: a claim moves the mark atomically to
the smallest mark strictly above it — ``(token, 0)`` when the mark holds a lower token,
``(token, e + 1)`` when it holds ``(token, e)`` — and the claimer owns that epoch. No
two claims get one epoch, so no two incarnations ever share one; and a write of an
earlier incarnation, at an epoch it claimed earlier, is refused wherever it lands after
a write of a later claim. (Keeping epochs in one guard's memory, as 0.2 did, let a new
guard start at an epoch a lost attempt of an earlier one still carried.)

The writer gives its epoch up (:meth:`WriterEpochs.give_up`) when a write's outcome is
lost, before the error reaches the caller, and when the mark shows a higher epoch of
its token (a later incarnation claimed one: the refusal proves the attempt did not
apply). Its next write claims afresh. The "quick fence-off" after a lost outcome *is*
that claim: once it succeeded, the mark is above the lost attempt, so it can never
apply. ``fence_off`` (and ``etcdfence fence off``) is a claim too.

A claim is a compare-and-set against what the writer was shown: its first guess
takes ``(token, 0)`` only over a lower token (or no mark); after a refusal it claims
above the refused mark only if the mark (and the store's version of it: etcd's mod
revision, Redis's counter) did not change since. So a claim carrying a write, whose
answer was lost and that reaches the store late — after the fence-off or a later
acknowledged write of its writer moved the mark — is refused. A bare claim whose answer
is lost only raises the mark, and nobody writes at an epoch whose claim was not
acknowledged. Only the newest token's epoch is kept: once
a writer uses a newer token, the older term is over. Thread-safe: one guard serves all
threads of a writer.
"""

from __future__ import annotations

import threading

from .._keys import MAX_EPOCH
from ..errors import InvalidArgumentError, OutcomeUnknownError

__all__ = [
    "ADOPT_ATTEMPTS",
    "CLAIM_ATTEMPTS",
    "QUICK_FENCE_OFF",
    "WriterEpochs",
    "claim_after",
    "lost_attempt",
]

#: How often a write claims a fresh epoch and retries after meeting a higher epoch of
#: its own token (another writer of the term claimed one); each retry follows a proven
#: refusal, so nothing was written. Past it the write fails (OutcomeUnknownError with
#: ``fenced_off=True``: nothing was written, the writers of the term keep racing).
ADOPT_ATTEMPTS = 8
#: How often a claim re-reads the mark after another writer moved it in between.
CLAIM_ATTEMPTS = 64
#: How long (seconds) a fence tries, once, to fence off a write whose outcome it lost
#: before it raises OutcomeUnknownError (capped by the backend's own request timeout).
QUICK_FENCE_OFF = 1.0


def claim_after(token: int, mark_token: int, mark_epoch: int) -> tuple[int, int]:
    """The mark a claim with ``token`` moves ``(mark_token, mark_epoch)`` to: the
    smallest mark strictly above it with ``token`` (the caller checks that
    ``mark_token <= token`` first)."""
    if mark_token < token:
        return token, 0
    if mark_epoch >= MAX_EPOCH:
        raise InvalidArgumentError(
            f"the epochs of token {token} are used up ({MAX_EPOCH}), or a repair sealed "
            "the mark at this token: acquire the lock again for a new token"
        )
    return token, mark_epoch + 1


class WriterEpochs:
    """The epoch one writer owns for its newest token (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._token = 0
        self._epoch = 0
        self._owned = False

    def get(self, token: int) -> int:
        """The epoch this writer claimed last for ``token`` (0 if none), owned or not;
        for diagnostics and tests."""
        with self._lock:
            return self._epoch if token == self._token else 0

    def owned(self, token: int) -> int | None:
        """The epoch this writer may write ``token`` at, or ``None``: claim one first."""
        with self._lock:
            return self._epoch if token == self._token and self._owned else None

    def claimed(self, token: int, epoch: int) -> None:
        """A claim of ``(token, epoch)`` was acknowledged: this writer owns it now."""
        with self._lock:
            if token > self._token or (token == self._token and epoch >= self._epoch):
                self._token, self._epoch, self._owned = token, epoch, True

    def give_up(self, token: int, epoch: int) -> None:
        """An attempt at ``(token, epoch)`` was lost, or refused by a higher epoch of its
        token: never write at ``epoch`` again (the next write claims afresh)."""
        with self._lock:
            if token == self._token and epoch == self._epoch:
                self._owned = False


def lost_attempt(
    resource: str,
    token: int,
    epoch: int | None,
    next_epoch: int | None,
    fenced: bool,
    cause: object,
) -> OutcomeUnknownError:
    """The error for a guarded write ``(token, epoch)`` that got no answer (``cause``);
    ``epoch`` None: the write was claiming a fresh epoch; ``next_epoch``: the epoch this
    writer claimed after it (``None``: not yet); ``fenced``: the attempt can no longer
    apply."""
    moved = (
        f"This writer claimed epoch {next_epoch}"
        if next_epoch is not None
        else "This writer claims a fresh epoch before its next write"
    )
    at = "claiming an epoch" if epoch is None else f"epoch {epoch}"
    return OutcomeUnknownError(
        f"guarded write to {resource!r} (token {token}, {at}) got no answer: "
        f"{cause}. {moved}; the attempt "
        + (
            "is fenced off: re-read, then decide"
            if fenced
            else "may still apply: call fence_off(token), then re-read"
        ),
        resource=resource,
        token=token,
        epoch=-1 if epoch is None else epoch,
        fenced_off=fenced,
    )

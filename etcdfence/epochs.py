"""The epochs a writer knows, per token: the writer's side of within-term ordering.

Every guard (etcd, SQL, Redis) orders one writer's writes *within* a term the same
way: the resource's mark is ``(token, epoch)``; a write carries the epoch its writer
knows and is accepted only if the mark is not above it. When a write's outcome is
lost, the writer moves to the next epoch (:meth:`WriterEpochs.bump`) before the error
reaches the caller, so the lost attempt — whenever its bytes arrive — is rejected. A
writer that meets a higher epoch of its own token (another writer of the term moved
on) adopts it (:meth:`WriterEpochs.adopt`); its rejected attempt provably did not apply.

Only the highest token's epoch is kept: once a writer uses a newer token, the older
term is over and its epochs are dropped. Thread-safe: one guard serves all threads of
a writer.
"""

from __future__ import annotations

import threading

from .errors import OutcomeUnknownError

__all__ = ["WriterEpochs", "lost_attempt"]


class WriterEpochs:
    """Epoch per token for one resource (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._token = 0
        self._epoch = 0

    def get(self, token: int) -> int:
        """The epoch the next write with ``token`` carries (0 for a token never seen,
        and for tokens older than the newest one seen, whose term is over)."""
        with self._lock:
            return self._epoch if token == self._token else 0

    def adopt(self, token: int, epoch: int) -> int:
        """Know at least ``epoch`` for ``token``; returns the epoch now known."""
        with self._lock:
            if token > self._token:
                self._token, self._epoch = token, epoch
            elif token == self._token:
                self._epoch = max(self._epoch, epoch)
            else:
                return epoch  # an older term: nothing to remember
            return self._epoch

    def bump(self, token: int, lost: int) -> int:
        """An attempt with ``(token, lost)`` has an unknown outcome: move past it.
        Returns the epoch later writes carry (at least ``lost + 1``)."""
        return self.adopt(token, lost + 1)


def lost_attempt(
    resource: str, token: int, epoch: int, next_epoch: int, fenced: bool, cause: object
) -> OutcomeUnknownError:
    """The error for a guarded write ``(token, epoch)`` that got no answer (``cause``),
    after its writer moved to ``next_epoch``; ``fenced``: the attempt can no longer apply."""
    return OutcomeUnknownError(
        f"guarded write to {resource!r} (token {token}, epoch {epoch}) got no answer: "
        f"{cause}. This writer moved to epoch {next_epoch}; the attempt "
        + (
            "is fenced off: re-read, then decide"
            if fenced
            else "may still apply: call fence_off(token), then re-read"
        ),
        resource=resource,
        token=token,
        epoch=epoch,
        fenced_off=fenced,
    )

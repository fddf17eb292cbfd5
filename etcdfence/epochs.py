"""Moved to :mod:`etcdfence.fence.epochs` (this path keeps working)."""

from .fence.epochs import WriterEpochs, claim_after, lost_attempt

__all__ = ["WriterEpochs", "claim_after", "lost_attempt"]

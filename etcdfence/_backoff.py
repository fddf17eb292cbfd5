"""Jitter for retry waits (pure; shared by both twins).

Clients that lost etcd together (a member restarted, a network blip) would otherwise
reconnect, re-campaign and retry in lock step, every one of them at the same
instants. Each wait is drawn from the upper half of its nominal value ("equal
jitter"): never more than asked for, at least half of it.
"""

from __future__ import annotations

import random

__all__ = ["jittered"]


def jittered(seconds: float) -> float:
    """``seconds`` scaled by a random factor in [0.5, 1.0]."""
    return seconds * random.uniform(0.5, 1.0)

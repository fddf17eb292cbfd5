"""Moved to :mod:`etcdfence.history`; this module re-exports it for existing imports.

Import from :mod:`etcdfence.history` in new code.
"""

from __future__ import annotations

from ..history import *  # noqa: F403
from ..history import __all__ as __all__

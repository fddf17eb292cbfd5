"""Fencing for SQL databases — the public import path of :mod:`etcdfence.fence.sql`.

``from etcdfence.sql import SQLFence`` keeps working; the fence itself (the bound
:class:`SQLFence`, the dialect classes, the deprecated 0.2 form) lives in the fence
package.
"""

from __future__ import annotations

from .fence.sql import *  # noqa: F403
from .fence.sql import __all__ as __all__

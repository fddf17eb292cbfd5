"""Where one run keeps its keys: the election, the fence marks and the data, under one root."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """Where one run keeps its keys, all under ``root/`` so one watch sees them all.

    - the election is ``root/election`` (contender keys ``root/election/<lease hex>``);
    - high-water marks live under ``root/fence/`` (``FenceGuard(..., prefix=...)``);
    - the data of resource ``r`` is the key ``root/data/r``.
    """

    root: str

    @property
    def election(self) -> str:
        """The election name (pass it to ``session.election()`` / ``LeaderElector``)."""
        return f"{self.root}/election"

    @property
    def fence_prefix(self) -> str:
        """The ``prefix=`` for :class:`~etcdfence.FenceGuard`."""
        return f"{self.root}/fence/"

    @property
    def data_prefix(self) -> str:
        """Where the protected data lives."""
        return f"{self.root}/data/"

    @property
    def watch_prefix(self) -> str:
        """The prefix an :class:`Observer` watches: everything of this run."""
        return f"{self.root}/"

    def mark_key(self, resource: str) -> str:
        """The key of ``resource``'s high-water mark."""
        return self.fence_prefix + resource

    def data_key(self, resource: str) -> str:
        """The data key of ``resource``."""
        return self.data_prefix + resource

    def guard(self, client: Any, resource: str, **kwargs: Any) -> Any:
        """``client.fence(resource, prefix=self.fence_prefix)`` (sync or async client)."""
        return client.fence(resource, prefix=self.fence_prefix, **kwargs)

    def classify(self, key: str) -> tuple[str, str] | None:
        """``("election", key)``, ``("mark", resource)``, ``("data", resource)`` or None."""
        if key.startswith(self.election + "/"):
            return ("election", key)
        if key.startswith(self.fence_prefix):
            return ("mark", key[len(self.fence_prefix) :])
        if key.startswith(self.data_prefix):
            return ("data", key[len(self.data_prefix) :])
        return None

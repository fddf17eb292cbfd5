"""The 0.2 form of the SQL fence: one object per connection, the resource per call.

Deprecated: ``SQLFence(connection)`` (no resource) returns an :class:`UnboundSQLFence`
and warns. Bind the fence to its resource instead — ``SQLFence(connection, resource)``
— and call ``guarded(token)``, ``current()``, ``fence_off(token)`` (which returns the
epoch, not the mark). An :class:`UnboundSQLFence` keeps one bound
:class:`~etcdfence.fence.sql.SQLFence` per resource over its connection (as
``SQLFence.for_resource`` makes them) and delegates to it, so both forms run the same code.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...token import FencingToken
from ._session import OnSession, Session
from .fence import (
    DEFAULT_DATA_TABLE,
    DEFAULT_TABLE,
    DialectLike,
    SQLFence,
    validate_resource,
    validate_token,
)

__all__ = ["DEPRECATION", "UnboundSQLFence"]

#: The DeprecationWarning of the 0.2 form.
DEPRECATION = (
    "SQLFence(connection) without a resource is the etcdfence 0.2 form; bind the fence "
    "to its resource: SQLFence(connection, resource), then fence.guarded(token), "
    "fence.current(), fence.fence_off(token) (which returns the epoch)"
)


class UnboundSQLFence(OnSession):
    """What ``SQLFence(connection)`` returns: the etcdfence 0.2 API (deprecated; see
    the module docstring). Its writer epochs are kept per resource, per object."""

    def __init__(
        self,
        connection: Any,
        *,
        table: str = DEFAULT_TABLE,
        data_table: str = DEFAULT_DATA_TABLE,
        dialect: DialectLike = None,
    ) -> None:
        warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
        self._setup(connection, table=table, data_table=data_table, dialect=dialect)

    @classmethod
    def _made(cls, connection: Any, **kwargs: Any) -> UnboundSQLFence:
        """One made by ``SQLFence(connection)``, which warned already."""
        fence = object.__new__(cls)
        fence._setup(connection, **kwargs)
        return fence

    def _setup(self, connection: Any, **tables_and_dialect: Any) -> None:
        self._session = Session(connection, **tables_and_dialect)
        self._fences: dict[str, SQLFence] = {}
        self._lock = threading.Lock()

    def bound(self, resource: str) -> SQLFence:
        """The bound fence this object delegates ``resource``'s calls to."""
        resource = validate_resource(resource)
        with self._lock:
            fence = self._fences.get(resource)
            if fence is None:
                fence = self._fences[resource] = SQLFence._over(self._session, resource)
            return fence

    def __repr__(self) -> str:
        return f"SQLFence(dialect={self.dialect!r}, table={self.table!r})"

    def ensure_schema(self) -> None:
        """Create the fences table if it does not exist, or add the columns a table made
        by an older etcdfence lacks (see :meth:`SQLFence.ensure_schema`; the 0.2 form has
        no ``put``, so no data table is made), and commit."""
        self._session.ensure_schema(data=False)

    def current(self, resource: str) -> int:
        """0.2 form of :meth:`SQLFence.current`."""
        return self.bound(resource).current()

    def current_mark(self, resource: str) -> tuple[int, int]:
        """0.2 form of :meth:`SQLFence.current_mark`."""
        return self.bound(resource).current_mark()

    def epoch(self, resource: str, token: FencingToken | int) -> int:
        """0.2 form of :meth:`SQLFence.epoch`."""
        return self.bound(resource).epoch(token)

    def fence_off(self, resource: str, token: FencingToken | int) -> tuple[int, int]:
        """0.2 form of :meth:`SQLFence.fence_off`; returns the mark ``(token, epoch)``."""
        value = validate_token(token)
        return value, self.bound(resource).fence_off(value)

    def advance(self, resource: str, token: FencingToken | int) -> None:
        """0.2 form of :meth:`SQLFence.advance`."""
        value = validate_token(token)
        self.bound(resource).advance(value)

    @contextmanager
    def guarded(self, resource: str, token: FencingToken | int) -> Iterator[Any]:
        """0.2 form of :meth:`SQLFence.guarded`."""
        value = validate_token(token)
        with self.bound(resource).guarded(value) as cur:
            yield cur

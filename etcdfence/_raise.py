"""One exception object per waiter when one cause fails many of them.

A cause such as "the client is closed" reaches every waiter through ``interrupt(error)``
(watches, queue turns, session waits). Raising that one object in each of N waiters
makes each ``raise`` append its frames to the shared ``__traceback__``: N² frames, and
seconds to format a few hundred of them. Each receiver keeps :func:`own_copy` instead.
"""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)


def own_copy(error: _E) -> _E:
    """A new exception of ``error``'s type with its arguments, attributes and chained
    causes, but no traceback of its own yet (``__init__`` is not called again: subclasses
    with their own signatures copy alike)."""
    cls = type(error)
    try:
        twin = cls.__new__(cls, *error.args)
        twin.args = error.args
        twin.__dict__.update(error.__dict__)
    except Exception:  # an exotic exception type that cannot be rebuilt: share it
        return error
    twin.__cause__ = error.__cause__
    twin.__context__ = error.__context__
    twin.__suppress_context__ = error.__suppress_context__
    return twin

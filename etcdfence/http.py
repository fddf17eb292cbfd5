"""HTTP write gates: carry a fencing token to an HTTP service, and check it there.

Client side: :class:`FencingTransport` / :class:`AsyncFencingTransport` (httpx, extra
``http``) stamp every request with the holder's ``Fencing-Token`` and refuse to send once
the holder lost its lock. Server side: :class:`FencingMiddleware` (ASGI) and
:class:`WSGIFencingMiddleware` (WSGI) parse the header, hand the token to the handler
(:func:`fencing_token`) and answer ``409`` (:func:`conflict_body`) when the handler's
fenced write raises :class:`~etcdfence.StaleTokenError`.

This is the public face of :mod:`etcdfence.fence.http`, where the gates live beside the
other fences (the full story is in that module's docstring). Importing it needs no
httpx: the transports import it when first used and raise :class:`ImportError` naming
the extra when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .fence import http as _impl
from .fence.http import (
    ENVIRON_KEY,
    STATE_KEY,
    UNSAFE_METHODS,
    WEBSOCKET,
    FencingMiddleware,
    TokenHolder,
    WSGIFencingMiddleware,
    conflict_body,
    fencing_token,
    request_token,
)

if TYPE_CHECKING:
    from .fence._httpx import AsyncFencingTransport, FencingTransport

__all__ = [
    "ENVIRON_KEY",
    "STATE_KEY",
    "UNSAFE_METHODS",
    "WEBSOCKET",
    "AsyncFencingTransport",
    "FencingMiddleware",
    "FencingTransport",
    "TokenHolder",
    "WSGIFencingMiddleware",
    "conflict_body",
    "fencing_token",
    "request_token",
]


def __getattr__(name: str) -> Any:
    """``FencingTransport`` and ``AsyncFencingTransport``, importing httpx on first use."""
    return _impl.transport(name, __name__)

"""The one boundary where gRPC errors become etcdfence errors."""

from __future__ import annotations

import grpc

from ..errors import (
    AuthError,
    CompactedError,
    EtcdfenceError,
    EtcdRequestError,
    EtcdUnavailable,
    LeaseNotFound,
    TLSError,
)

_TLS_HINTS = ("ssl", "handshake", "certificate", "tls", "wrong_version_number")
_AUTH_HINTS = (
    "authentication failed",
    "invalid auth token",
    "user name is empty",
    "permission denied",
    "auth: revision in header is old",
)


def is_invalid_token(err: grpc.RpcError) -> bool:
    """etcd's simple/JWT token expired or is unknown: re-authenticate and retry."""
    details = (_details(err) or "").lower()
    return "invalid auth token" in details or "auth: revision in header is old" in details


def never_sent(err: grpc.RpcError) -> bool:
    """True when gRPC failed before the request could reach any server.

    Such a failure is safe to retry on another endpoint even for writes; any other
    UNAVAILABLE leaves the outcome of a write unknown.
    """
    details = (_details(err) or "").lower()
    return err.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details
        or "connection refused" in details
        or "connect failed" in details
        or "no connection" in details
        or "dns resolution failed" in details
    )


def _details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    return str(details() if callable(details) else "") or ""


def translate(err: grpc.RpcError, endpoint: str, timeout: float | None) -> EtcdfenceError:
    """Map a gRPC error to the etcdfence exception a caller can act on."""
    code = err.code()
    details = _details(err)
    low = details.lower()
    where = f"etcd at {endpoint}"
    if any(h in low for h in _TLS_HINTS) and code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        return TLSError(f"TLS handshake with {where} failed: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
        h in low for h in _AUTH_HINTS
    ):
        return AuthError(f"{where} refused the credentials: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EtcdUnavailable(f"{where} did not answer within {timeout}s ({details})")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return EtcdUnavailable(f"{where} is unavailable: {details}")
    if "compacted" in low:
        return CompactedError(f"{where}: {details}", 0)
    if "lease not found" in low:
        return LeaseNotFound(f"{where}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return EtcdRequestError(f"request too large or rate-limited by {where}: {details}")
    return EtcdRequestError(f"{where} rejected the request ({code.name}): {details}")

"""The one boundary where gRPC errors become etcdfence errors."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import grpc

from ..errors import (
    AuthError,
    AuthTokenExpiredError,
    CompactedError,
    EtcdfenceError,
    LeaseNotFoundError,
    RequestError,
    TLSError,
    UnavailableError,
)

_TLS_HINTS = (
    "ssl",
    "handshake",
    "certificate",
    "tls",
    "wrong_version_number",
    "hostname verification",
)
#: OpenSSL/BoringSSL alerts by which a server refuses the client's certificate (in the
#: TLS 1.2 handshake) ...
_CLIENT_CERT_ALERTS = (
    "alert_bad_certificate",
    "alert_unknown_ca",
    "alert_certificate_expired",
    "alert_certificate_required",
    "alert_certificate_unknown",
    "alert_unsupported_certificate",
    "alert_handshake_failure",
)
#: ... and how it looks with TLS 1.3, where the client finishes its handshake before
#: the server has checked the client certificate: the server's alert arrives as the
#: first "application data" and gRPC only reports that it could not decrypt it.
_POST_HANDSHAKE_ALERT = ("tsi_data_corrupted", "unwrap failed")
#: Transport failures gRPC reports as INTERNAL/UNKNOWN: the connection broke under the
#: call (a reset, a proxy or member going away). The server may have applied a write.
_TRANSPORT_HINTS = (
    "rst_stream",
    "stream removed",
    "socket closed",
    "goaway",
    "connection reset",
    "broken pipe",
    "end of tcp stream",
)


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


def refused_unapplied(err: grpc.RpcError) -> bool:
    """True when etcd refused the request before proposing it, so it was not applied and
    is safe to resend, writes included: "too many requests" is etcd's backpressure when
    its applied index lags the committed one by more than 5,000 entries, checked before
    the request enters raft (``processInternalRaftRequestOnce`` in etcd's
    server/etcdserver/v3_server.go)."""
    return "etcdserver: too many requests" in _details(err)


def plaintext_refused(err: grpc.RpcError) -> bool:
    """A plaintext connection the server closed at once: what a TLS-only etcd does to
    an ``http://`` client (worth a :func:`~etcdfence._endpoints.speaks_tls` probe)."""
    details = (_details(err) or "").lower()
    return err.code() == grpc.StatusCode.UNAVAILABLE and "socket closed" in details


def _details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    return str(details() if callable(details) else "") or ""


def _client_cert_refused(low: str) -> bool:
    """True when the server refused this client's certificate (or its absence)."""
    return any(alert in low for alert in _CLIENT_CERT_ALERTS) or (
        "failed to connect" in low and any(h in low for h in _POST_HANDSHAKE_ALERT)
    )


def describe_client_cert(cert_file: str | None, cert_pem: bytes | None) -> str:
    """Why etcd most likely refused this client's certificate, from the certificate itself.

    etcd (Go's TLS stack) sends the same "bad certificate" alert for a missing, an
    expired and an unknown-issuer certificate; checking our own certificate tells the
    user which it is. Reads dates and issuer with ``cryptography`` when it is installed.
    """
    if cert_file is None:
        return (
            "etcd requires a client certificate (--client-cert-auth) and none is "
            "configured (pass cert_file= and key_file=)"
        )
    try:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(cert_pem or b"")
        utc = datetime.timezone.utc
        not_after = getattr(cert, "not_valid_after_utc", None) or (
            cert.not_valid_after.replace(tzinfo=utc)
        )
        not_before = getattr(cert, "not_valid_before_utc", None) or (
            cert.not_valid_before.replace(tzinfo=utc)
        )
        issuer = cert.issuer.rfc4514_string()
    except Exception:  # no cryptography, or a certificate it cannot parse: say less
        return (
            f"etcd refused the client certificate {cert_file}: it is expired or not "
            "signed by a CA etcd trusts (--trusted-ca-file)"
        )
    now = datetime.datetime.now(utc)
    if not_after < now:
        return (
            f"etcd refused the client certificate {cert_file}: it expired on "
            f"{not_after:%Y-%m-%d %H:%M} UTC"
        )
    if not_before > now:
        return (
            f"etcd refused the client certificate {cert_file}: it is not valid before "
            f"{not_before:%Y-%m-%d %H:%M} UTC"
        )
    return (
        f"etcd refused the client certificate {cert_file} (issued by {issuer}, valid "
        f"until {not_after:%Y-%m-%d}): is its issuer in etcd's --trusted-ca-file?"
    )


def _tls_cause(low: str, describe_cert: Callable[[], str] | None) -> str:
    """The likely cause of a TLS failure, in words a user can act on."""
    if _client_cert_refused(low):
        if describe_cert is not None:
            return describe_cert()
        return (
            "etcd refused the client certificate: it is missing, expired, or not signed "
            "by a CA etcd trusts (--trusted-ca-file)"
        )
    if "certificate_verify_failed" in low or "certificate verify failed" in low:
        if "expired" in low:
            return "etcd's server certificate has expired"
        return "etcd's server certificate is not signed by a CA in ca_file (wrong ca_file?)"
    if "peer name" in low or "hostname" in low or "subject alternative" in low:
        return "etcd's server certificate does not name this host (see server_name=)"
    if "wrong_version_number" in low or "handshake read failed" in low:
        return "the server did not answer TLS (is it a plaintext http:// endpoint?)"
    return "the TLS handshake failed"


#: etcd's own error descriptions (``api/v3rpc/rpctypes/error.go`` in etcd: the
#: ``ErrGRPC*`` values and the server's ``errStringToError`` table, 3.4 and 3.5
#: wording), in the order they are matched, and the error a caller can act on.
#: Matched as substrings of the gRPC status details, lower-cased.
ETCD_ERRORS: tuple[tuple[str, type[EtcdfenceError]], ...] = (
    ("etcdserver: invalid auth token", AuthTokenExpiredError),
    ("etcdserver: revision of auth store is old", AuthTokenExpiredError),
    ("auth: revision in header is old", AuthTokenExpiredError),
    ("etcdserver: permission denied", AuthError),
    ("etcdserver: authentication failed", AuthError),
    ("etcdserver: user name is empty", AuthError),
    ("etcdserver: user name not found", AuthError),
    ("etcdserver: authentication is not enabled", AuthError),
    ("etcdserver: mvcc: required revision has been compacted", CompactedError),
    ("etcdserver: requested lease not found", LeaseNotFoundError),
    ("etcdserver: no leader", UnavailableError),
    ("etcdserver: not leader", UnavailableError),
    ("etcdserver: leader changed", UnavailableError),
    ("etcdserver: request timed out", UnavailableError),
    ("etcdserver: unhealthy cluster", UnavailableError),
    ("etcdserver: too many requests", UnavailableError),
    ("etcdserver: request is too large", RequestError),
    ("etcdserver: too many operations in txn request", RequestError),
    ("etcdserver: duplicate key given in txn request", RequestError),
    ("etcdserver: mvcc: database space exceeded", RequestError),
    ("etcdserver: lease ttl is too large", RequestError),
)


def _from_table(low: str) -> type[EtcdfenceError] | None:
    for text, kind in ETCD_ERRORS:
        if text.removeprefix("etcdserver: ") in low:  # stream cancel reasons lack the prefix
            return kind
    return None


def translate(
    err: grpc.RpcError,
    endpoint: str,
    timeout: float | None,
    *,
    describe_cert: Callable[[], str] | None = None,
) -> EtcdfenceError:
    """Map a gRPC error to the etcdfence exception a caller can act on.

    In order: TLS handshake failures (naming the cause), etcd's own errors
    (:data:`ETCD_ERRORS`), then what the gRPC status says of the transport.
    ``describe_cert`` explains a refused client certificate (see
    :func:`describe_client_cert`); without it the message lists the possible causes.
    """
    code = err.code()
    details = _details(err)
    low = details.lower()
    where = f"etcd at {endpoint}"
    if (any(h in low for h in _TLS_HINTS) or _client_cert_refused(low)) and code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        cause = _tls_cause(low, describe_cert)
        raw = details.removesuffix(": OK")  # grpc appends the (irrelevant) TSI status
        return TLSError(f"TLS handshake with {where} failed: {cause} (gRPC: {raw})")
    kind = _from_table(low)
    if kind is None and code in (
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    ):
        kind = AuthError
    if kind is AuthError and (code == grpc.StatusCode.PERMISSION_DENIED or "permission" in low):
        return AuthError(
            f"{where} denied the request: {details} (the user's roles do not grant "
            "access to every key it touches)"
        )
    if kind is not None and issubclass(kind, AuthError):
        return kind(f"{where} refused the credentials: {details}")
    if kind is CompactedError:
        return CompactedError(f"{where}: {details}", 0)
    if kind is UnavailableError:
        return UnavailableError(f"{where} cannot serve the request now: {details}")
    if kind is not None:
        return kind(f"{where} rejected the request: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UnavailableError(f"{where} did not answer within {timeout}s ({details})")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return UnavailableError(f"{where} is unavailable: {details}")
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and any(
        h in low for h in _TRANSPORT_HINTS
    ):
        return UnavailableError(f"the connection to {where} broke: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestError(f"request too large or rate-limited by {where}: {details}")
    return RequestError(f"{where} rejected the request ({code.name}): {details}")

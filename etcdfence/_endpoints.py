"""Parsing of endpoint lists (pure; shared by the sync and async clients)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import InvalidArgumentError, InvalidTypeError


@dataclass(frozen=True)
class Endpoint:
    """One etcd endpoint: ``host:port`` plus whether it speaks TLS."""

    host: str
    port: int
    tls: bool

    @property
    def target(self) -> str:
        """The gRPC target string (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.target}"


#: One DNS label (RFC 1123; underscores allowed, as resolvers accept them in practice).
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def _valid_host(host: str) -> bool:
    """An IP literal or a DNS name; refuses spaces, commas and other garbage up front
    instead of letting it fail as an unreachable endpoint after the whole timeout."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def parse_endpoint(text: object) -> Endpoint:
    """Parse ``http://h:p``, ``https://h:p`` or ``h:p`` (port defaults to 2379)."""
    if not isinstance(text, str):
        raise InvalidTypeError(f"endpoint must be str, got {type(text).__name__}")
    raw = text.strip()
    if not raw:
        raise InvalidArgumentError("endpoint must not be empty")
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgumentError(f"malformed endpoint {text!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidArgumentError(f"endpoint {text!r}: scheme must be http or https")
    if not parts.hostname:
        raise InvalidArgumentError(f"endpoint {text!r} has no host")
    if not _valid_host(parts.hostname):
        raise InvalidArgumentError(
            f"endpoint {text!r}: {parts.hostname!r} is not a host name or IP"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidArgumentError(f"endpoint {text!r} must be scheme://host:port only")
    return Endpoint(parts.hostname, 2379 if port is None else port, parts.scheme == "https")


#: Where a client with no endpoints connects when the environment names none.
DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
#: Environment variables naming the endpoints, in the order they are consulted.
ENDPOINTS_ENV = ("ETCDFENCE_ENDPOINTS", "ETCDCTL_ENDPOINTS")


def default_endpoints() -> str:
    """The endpoints a client uses when given none: ``$ETCDFENCE_ENDPOINTS``, else
    ``$ETCDCTL_ENDPOINTS`` (etcdctl's variable, so a shell set up for etcdctl works
    as is), else ``http://127.0.0.1:2379`` — where ``etcdfence etcd`` and a default
    etcd listen. A variable that is set but blank counts as unset."""
    for name in ENDPOINTS_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return DEFAULT_ENDPOINT


def parse_endpoints(endpoints: object) -> list[Endpoint]:
    """Parse one endpoint, a comma-separated string or a list of endpoints
    (``None``: :func:`default_endpoints`)."""
    if endpoints is None:
        endpoints = default_endpoints()
    if isinstance(endpoints, str):
        items: list[object] = [e for e in endpoints.split(",") if e.strip()] or [endpoints]
    elif isinstance(endpoints, (list, tuple)):
        items = list(endpoints)
    else:
        raise InvalidTypeError(
            f"endpoints must be a str or a list of str, got {type(endpoints).__name__}"
        )
    if not items:
        raise InvalidArgumentError("at least one endpoint is required")
    parsed = [parse_endpoint(e) for e in items]
    if len({e.tls for e in parsed}) > 1:
        raise InvalidArgumentError("endpoints mix http and https; use one scheme for all")
    return parsed


def speaks_tls(endpoint: Endpoint, timeout: float = 1.0) -> bool:
    """Whether ``endpoint`` answers a TLS handshake (blocking; a short probe).

    Used only to explain a failure: a plaintext (``http://``) client against a TLS
    etcd sees nothing but "socket closed", which looks like an unreachable server and
    would otherwise be retried for the whole timeout. Any TLS reply — a finished
    handshake or a TLS alert (etcd demanding a client certificate) — counts.
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        address = (endpoint.host, endpoint.port)
        with (
            socket.create_connection(address, timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=endpoint.host) as tls,
        ):
            tls.do_handshake()
        return True
    except ssl.SSLError as err:
        return "alert" in str(err).lower()
    except OSError:
        return False

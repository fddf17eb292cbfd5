"""Throw-away TLS material for tests against a TLS-enabled etcd.

Use :func:`make_test_pki` in a fixture (with ``tmp_path``) to get a CA, a server
certificate valid for ``127.0.0.1``/``localhost`` and client certificates, then pass the
returned :class:`TLSFiles` to :class:`~etcdfence.testing.EtcdServer`. It also makes the
material for negative tests: an unrelated CA (and a client certificate it signed) and an
expired client certificate. Keys are ECDSA P-256, so generating a full set takes
milliseconds. Requires the ``cryptography`` package. Never use this outside tests.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["TLSFiles", "make_test_pki"]


@dataclass(frozen=True)
class TLSFiles:
    """Paths of the PEM files a TLS-enabled test etcd and its clients use.

    :func:`make_test_pki` fills every field; build one by hand to run
    :class:`~etcdfence.testing.EtcdServer` with your own certificates (only ``ca``,
    ``server_cert`` and ``server_key`` are needed for that, plus ``client_cert`` and
    ``client_key`` with ``client_cert_auth=True``). ``ca`` signed ``server_cert`` and
    ``client_cert``; ``other_ca`` is unrelated (a client that trusts only it must refuse
    the server, and the server must refuse ``other_client_cert``);
    ``expired_client_cert`` is signed by ``ca`` but expired.
    """

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path | None = None
    client_key: Path | None = None
    other_ca: Path | None = None
    other_client_cert: Path | None = None
    other_client_key: Path | None = None
    expired_client_cert: Path | None = None
    expired_client_key: Path | None = None
    ca_key: Path | None = None
    client_cn: str = "root"


if TYPE_CHECKING:
    _Key = ec.EllipticCurvePrivateKey


def _new_key() -> _Key:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "etcdfence tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: _Key) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _make_ca(common_name: str, now: _dt.datetime) -> tuple[x509.Certificate, _Key]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _new_key()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(hours=1))
        .not_valid_after(now + _dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    *,
    common_name: str,
    ca_cert: x509.Certificate,
    ca_key: _Key,
    not_before: _dt.datetime,
    not_after: _dt.datetime,
    usages: Sequence[x509.ObjectIdentifier],
    hosts: Sequence[str] = (),
) -> tuple[x509.Certificate, _Key]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _new_key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _cryptography_oids() -> Any:
    """``cryptography``'s ExtendedKeyUsageOID, or an ImportError naming the extra."""
    try:
        from cryptography.x509.oid import ExtendedKeyUsageOID
    except ImportError as exc:
        raise ImportError(
            "make_test_pki needs the cryptography package: pip install 'etcdfence[testing]'"
        ) from exc
    return ExtendedKeyUsageOID


def make_test_pki(
    directory: str | os.PathLike[str],
    *,
    client_cn: str = "root",
    hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"),
) -> TLSFiles:
    """Write a complete test PKI into ``directory`` (created if missing) and return it.

    ``client_cn`` is the client certificate's common name; etcd takes it as the user name
    when auth is enabled. The server certificate carries both ``serverAuth`` and
    ``clientAuth`` usages: etcd's grpc-gateway dials its own gRPC port with the server
    certificate, which ``--client-cert-auth`` would otherwise reject.
    """
    ExtendedKeyUsageOID = _cryptography_oids()

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc)
    valid_from = now - _dt.timedelta(hours=1)
    valid_to = now + _dt.timedelta(days=30)
    server_usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    client_usage = [ExtendedKeyUsageOID.CLIENT_AUTH]

    ca_cert, ca_key = _make_ca("etcdfence test CA", now)
    server_cert, server_key = _make_leaf(
        common_name="etcd server",
        ca_cert=ca_cert,
        ca_key=ca_key,
        not_before=valid_from,
        not_after=valid_to,
        usages=server_usage,
        hosts=hosts,
    )
    client_cert, client_key = _make_leaf(
        common_name=client_cn,
        ca_cert=ca_cert,
        ca_key=ca_key,
        not_before=valid_from,
        not_after=valid_to,
        usages=client_usage,
    )
    expired_cert, expired_key = _make_leaf(
        common_name=client_cn,
        ca_cert=ca_cert,
        ca_key=ca_key,
        not_before=now - _dt.timedelta(days=2),
        not_after=now - _dt.timedelta(days=1),
        usages=client_usage,
    )
    other_ca_cert, other_ca_key = _make_ca("unrelated test CA", now)
    other_cert, other_key = _make_leaf(
        common_name=client_cn,
        ca_cert=other_ca_cert,
        ca_key=other_ca_key,
        not_before=valid_from,
        not_after=valid_to,
        usages=client_usage,
    )

    files = _files_in(out, client_cn)
    writes: list[tuple[Path | None, x509.Certificate | _Key]] = [
        (files.ca, ca_cert),
        (files.ca_key, ca_key),
        (files.server_cert, server_cert),
        (files.server_key, server_key),
        (files.client_cert, client_cert),
        (files.client_key, client_key),
        (files.other_ca, other_ca_cert),
        (files.other_client_cert, other_cert),
        (files.other_client_key, other_key),
        (files.expired_client_cert, expired_cert),
        (files.expired_client_key, expired_key),
    ]
    for path, item in writes:
        assert path is not None
        _write_pem(path, item)
    return files


def _files_in(out: Path, client_cn: str) -> TLSFiles:
    """Where :func:`make_test_pki` puts each file in ``out``."""
    return TLSFiles(
        ca=out / "ca.pem",
        ca_key=out / "ca-key.pem",
        server_cert=out / "server.pem",
        server_key=out / "server-key.pem",
        client_cert=out / "client.pem",
        client_key=out / "client-key.pem",
        other_ca=out / "other-ca.pem",
        other_client_cert=out / "other-client.pem",
        other_client_key=out / "other-client-key.pem",
        expired_client_cert=out / "expired-client.pem",
        expired_client_key=out / "expired-client-key.pem",
        client_cn=client_cn,
    )


def _write_pem(path: Path, item: x509.Certificate | _Key) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(item, ec.EllipticCurvePrivateKey):
        _write_key(path, item)
    else:
        _write_cert(path, item)

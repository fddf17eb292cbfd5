"""TLS with client certificates and password auth with expiring tokens, on real etcd."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import etcdfence as ef
from etcdfence.testing import EtcdServer, TLSFiles, find_etcdctl, make_test_pki

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: TLSFiles) -> Iterator[EtcdServer]:
    with EtcdServer(tls=pki, client_cert_auth=True) as server:
        yield server


def test_tls_with_client_certificate(tls_server: EtcdServer, pki: TLSFiles) -> None:
    with ef.Client(
        tls_server.endpoint,
        ca_file=str(pki.ca),
        cert_file=str(pki.client_cert),
        key_file=str(pki.client_key),
    ) as client:
        rev = client.put("tls/k", "v")
        assert client.get("tls/k").mod_revision == rev  # type: ignore[union-attr]
        with client.session(ttl=2) as session:
            assert session.lock("tls/lock").acquire(timeout=5).value > rev


def test_tls_wrong_ca_is_a_clear_error(tls_server: EtcdServer, pki: TLSFiles) -> None:
    with (
        ef.Client(
            tls_server.endpoint,
            ca_file=str(pki.other_ca),
            cert_file=str(pki.client_cert),
            key_file=str(pki.client_key),
            timeout=2.0,
        ) as client,
        pytest.raises(ef.EtcdUnavailable) as info,
    ):
        client.get("tls/k")
    assert (
        isinstance(info.value, ef.TLSError)
        or "ssl" in str(info.value).lower()
        or "handshake" in str(info.value).lower()
    )


def test_tls_server_refuses_missing_client_cert(tls_server: EtcdServer, pki: TLSFiles) -> None:
    with (
        ef.Client(tls_server.endpoint, ca_file=str(pki.ca), timeout=2.0) as client,
        pytest.raises(ef.EtcdUnavailable),
    ):
        client.get("tls/k")


def test_plaintext_client_against_tls_server(tls_server: EtcdServer) -> None:
    """An http:// client against a TLS etcd: TLSError naming the cause, at once (0.1
    retried "socket closed" for the whole timeout and reported EtcdUnavailable)."""
    plain = tls_server.endpoint.replace("https://", "http://")
    started = time.monotonic()
    with ef.Client(plain, timeout=5.0) as client, pytest.raises(ef.TLSError, match="https://"):
        client.get("tls/k")
    assert time.monotonic() - started < 2.5


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_tls_hostname_mismatch_is_a_quick_tls_error(
    tls_server: EtcdServer, pki: TLSFiles, twin: str
) -> None:
    kw: dict[str, object] = dict(
        ca_file=str(pki.ca),
        cert_file=str(pki.client_cert),
        key_file=str(pki.client_key),
        server_name="not-this-host.example",
        timeout=5.0,
    )
    started = time.monotonic()
    with pytest.raises(ef.TLSError, match="does not name this host"):
        if twin == "sync":
            with ef.Client(tls_server.endpoint, **kw) as client:  # type: ignore[arg-type]
                client.get("tls/k")
        else:

            async def attempt() -> None:
                async with ef.AsyncClient(tls_server.endpoint, **kw) as client:  # type: ignore[arg-type]
                    await client.get("tls/k")

            asyncio.run(attempt())
    assert time.monotonic() - started < 2.5


def test_unreadable_ca_file_is_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(ef.InvalidArgument, match="CA file"):
        ef.Client("https://127.0.0.1:2379", ca_file=str(tmp_path / "missing.pem"))


@pytest.fixture(scope="module")
def auth_server() -> Iterator[EtcdServer]:
    # simple tokens that expire after 2 s: long-lived streams must outlive them
    with EtcdServer(extra_args=["--auth-token-ttl", "2"]) as server:
        ctl = [find_etcdctl(), f"--endpoints={server.endpoint}"]
        env = {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}
        for args in (
            ["user", "add", "root:rootpw"],
            ["user", "add", "app:apppw"],
            ["role", "add", "app"],
            ["role", "grant-permission", "app", "--prefix=true", "readwrite", "app1/"],
            ["user", "grant-role", "app", "app"],
            ["auth", "enable"],
        ):
            cmd = ctl + args
            if args[0] == "auth":
                cmd += ["--user", "root:rootpw"]
            subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=20)
        yield server


def test_wrong_password_is_auth_error(auth_server: EtcdServer) -> None:
    with (
        ef.Client(auth_server.endpoint, username="root", password="nope") as client,
        pytest.raises(ef.AuthError),
    ):
        client.get("k")


def test_no_credentials_against_auth_server_is_auth_error(auth_server: EtcdServer) -> None:
    with ef.Client(auth_server.endpoint) as client, pytest.raises(ef.AuthError):
        client.put("k", "v")


def test_permission_denied_outside_role_prefix(auth_server: EtcdServer) -> None:
    with ef.Client(auth_server.endpoint, username="app", password="apppw") as client:
        assert client.put("app1/ok", "1") > 0
        with pytest.raises(ef.AuthError):
            client.put("app2/nope", "1")


def test_token_expiry_is_handled_across_keepalive(auth_server: EtcdServer) -> None:
    with ef.Client(auth_server.endpoint, username="root", password="rootpw") as client:
        client.put("auth/k", "1")
        with client.session(ttl=1) as session:
            lock = session.lock("auth/lock")
            token = lock.acquire(timeout=5)
            time.sleep(4.5)  # > 2x the auth token TTL and > 4x the lease TTL
            assert not session.expired, "keepalive must survive auth token expiry"
            assert lock.is_owner()
            assert client.fence("auth/res").put(token, "auth/data", "x") > token.value
        assert client.get("auth/k") is not None

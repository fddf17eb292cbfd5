"""Which gRPC failures are safe to resend (pure logic: errors as grpc reports them)."""

from __future__ import annotations

import grpc
import pytest

from etcdfence._wire.errors import never_sent, refused_unapplied, translate
from etcdfence.errors import EtcdUnavailableError


class _Failed(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_etcd_backpressure_was_not_applied_and_may_be_resent() -> None:
    # etcd answers ResourceExhausted before the request enters raft
    err = _Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests")
    assert refused_unapplied(err)
    assert isinstance(translate(err, "127.0.0.1:2379", None), EtcdUnavailableError)


@pytest.mark.parametrize(
    "code, details",
    [
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed"),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out"),
    ],
)
def test_a_failure_after_sending_leaves_a_write_unknown(
    code: grpc.StatusCode, details: str
) -> None:
    err = _Failed(code, details)
    assert not refused_unapplied(err) and not never_sent(err)


def test_a_connection_never_made_is_safe_to_resend() -> None:
    err = _Failed(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert never_sent(err) and not refused_unapplied(err)

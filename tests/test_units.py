"""Pure logic: tokens, names, endpoints, txn builders, the wire messages. No server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import etcdfence as ef
from etcdfence import _keys, _txn
from etcdfence._endpoints import parse_endpoints
from etcdfence._wire import messages as m

ROOT = Path(__file__).resolve().parent.parent


# -- tokens -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "5", 5.0, None, True, b"5"])
def test_token_rejects_non_positive_ints(bad: object) -> None:
    with pytest.raises(ef.InvalidToken) as info:
        ef.FencingToken(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ef.EtcdfenceError)


def test_token_orders_and_converts_by_value_only() -> None:
    a = ef.FencingToken(7, key="x/1", create_revision=3, lease_id=1)
    b = ef.FencingToken(7, key="y/2", create_revision=5, lease_id=2)
    c = ef.FencingToken(9)
    assert a == b and hash(a) == hash(b)
    assert a < c and max(a, c) is c
    assert int(c) == 9 and str(c) == "9"
    assert sorted([c, a]) == [a, c]


def test_token_from_env_prefers_etcdfence_then_etcdctl() -> None:
    env = {"ETCD_LOCK_REV": "12", "ETCD_LOCK_KEY": "jobs/1a"}
    tok = ef.FencingToken.from_env(env)
    assert tok.value == 12 and tok.key == "jobs/1a"
    env["ETCDFENCE_TOKEN"] = "15"
    assert ef.FencingToken.from_env(env).value == 15
    with pytest.raises(ef.InvalidToken):
        ef.FencingToken.from_env({})
    with pytest.raises(ef.InvalidToken):
        ef.FencingToken.from_env({"ETCDFENCE_TOKEN": "12abc"})


def test_token_header_and_metadata_round_trip() -> None:
    tok = ef.FencingToken(4242)
    name, value = tok.to_header()
    assert name == "Fencing-Token"
    assert ef.FencingToken.from_header(value) == tok
    assert ef.FencingToken.from_metadata({"Fencing-Token": b"4242"}) == tok
    assert ef.FencingToken.from_env(tok.to_env()) == tok
    for bad in ["", "-3", "0", "1e3", " ", "١٢"]:
        with pytest.raises(ef.InvalidToken):
            ef.FencingToken.from_header(bad)
    with pytest.raises(ef.InvalidToken):
        ef.FencingToken.from_header(None)


# -- names and keys -------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "   ", "a/", " a", "a\x00b"])
def test_invalid_names(bad: str) -> None:
    with pytest.raises(ef.InvalidArgument):
        _keys.validate_name(bad)


def test_non_str_name_is_type_error() -> None:
    with pytest.raises(TypeError):
        _keys.validate_name(b"jobs")


def test_contender_key_matches_go_layout() -> None:
    # Go: fmt.Sprintf("%s%x", pfx, leaseID) with pfx = name + "/"
    assert (
        _keys.contender_key("jobs/nightly", 0x694D71DDACFDA227) == "jobs/nightly/694d71ddacfda227"
    )
    assert _keys.contender_key("e", 10) == "e/a"


@given(
    st.integers(min_value=0, max_value=10**20 - 1), st.integers(min_value=0, max_value=10**20 - 1)
)
def test_mark_byte_order_equals_numeric_order(a: int, b: int) -> None:
    ea, eb = _keys.encode_mark(a), _keys.encode_mark(b)
    assert len(ea) == 20
    assert (ea < eb) == (a < b) and (ea == eb) == (a == b)
    assert _keys.decode_mark(ea) == a


def test_prefix_range_end() -> None:
    assert _keys.prefix_range_end(b"abc/") == b"abc0"
    assert _keys.prefix_range_end(b"a\xff") == b"b"
    assert _keys.prefix_range_end(b"\xff\xff") == b"\x00"


def test_keys_and_values_types() -> None:
    assert _keys.to_key("k") == b"k"
    with pytest.raises(TypeError):
        _keys.to_key(5)
    with pytest.raises(ValueError):
        _keys.to_key("")


# -- endpoints ----------------------------------------------------------------------------


def test_endpoint_forms() -> None:
    eps = parse_endpoints("http://127.0.0.1:2379, 127.0.0.1:2380,localhost")
    assert [e.target for e in eps] == ["127.0.0.1:2379", "127.0.0.1:2380", "localhost:2379"]
    assert parse_endpoints(["https://[::1]:2379"])[0].target == "[::1]:2379"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "ftp://h:1",
        "http://:2379",
        "http://h:99999",
        "http://h:1/path",
        [],
        ["http://a:1", "https://b:2"],
    ],
)
def test_bad_endpoints(bad: object) -> None:
    with pytest.raises(ef.InvalidArgument):
        ef.Client(bad)  # type: ignore[arg-type]


def test_bad_endpoint_type() -> None:
    with pytest.raises(ef.InvalidType):
        ef.Client(2379)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, True, "5", float("inf"), float("nan")])
def test_bad_timeout(timeout: object) -> None:
    with pytest.raises((ef.InvalidArgument, ef.InvalidType)):
        ef.Client("127.0.0.1:1", timeout=timeout)  # type: ignore[arg-type]


# -- wire -------------------------------------------------------------------------------------


def test_wire_field_numbers_match_etcd() -> None:
    # Facts from etcd's api/etcdserverpb/rpc.proto: tag = (field number << 3) | wire type.
    req = m.PutRequest(key=b"k", value=b"v", lease=1)
    assert req.SerializeToString() == b"\x0a\x01k\x12\x01v\x18\x01"
    cmp = m.Compare(
        key=b"k", target=m.CompareTarget.CREATE, result=m.CompareResult.EQUAL, create_revision=0
    )
    # result=0 omitted, target=1 (field 2), key (field 3), create_revision=0 (field 5, oneof: kept)
    assert cmp.SerializeToString() == b"\x10\x01\x1a\x01k\x28\x00"
    assert m.Compare(range_end=b"z").SerializeToString() == b"\x82\x04\x01z"  # field 64
    assert m.WatchResponse(events=[m.Event()]).SerializeToString() == b"\x5a\x00"  # field 11


def test_acquire_txn_shape() -> None:
    txn = _txn.acquire_txn(b"n/1", b"", 1, b"n/")
    assert [c.target for c in txn.compare] == [m.CompareTarget.CREATE]
    assert txn.success[0].request_put.lease == 1
    owner = txn.success[1].request_range
    assert (owner.sort_target, owner.sort_order, owner.limit) == (
        m.SortTarget.CREATE,
        m.SortOrder.ASCEND,
        1,
    )
    assert txn.failure[0].request_range.key == b"n/1"


def test_fence_txn_with_owner_is_one_nested_txn() -> None:
    txn = _txn.fence_txn(b"/f/r", 42, _txn.user_ops([ef.Put("a", "b")]), owner=(b"n/1", 7))
    assert txn.compare[0].result == m.CompareResult.GREATER
    assert txn.compare[0].value == _keys.encode_mark(42)
    nested = txn.failure[0].request_txn
    assert nested.compare[0].create_revision == 7
    assert [op.WhichOneof("request") for op in nested.success] == ["request_put", "request_put"]


def test_user_ops_validation() -> None:
    with pytest.raises(TypeError):
        _txn.user_ops(ef.Put("a", "b"))
    with pytest.raises(TypeError):
        _txn.user_ops([("a", "b")])
    with pytest.raises(TypeError):
        _txn.user_ops([ef.Put("a", 5)])  # type: ignore[arg-type]


def test_session_ttl_validation() -> None:
    client = ef.Client("127.0.0.1:1")
    try:
        for bad in (0, -5, True, 1.5):
            with pytest.raises((ef.InvalidArgument, ef.InvalidType)):
                client.session(bad)  # type: ignore[arg-type]
    finally:
        client.close()


def test_sync_twin_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "async_to_sync.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_sync_and_async_share_names() -> None:
    for name in ["Client", "Session", "Lock", "Election", "FenceGuard", "LeaderElector", "Watch"]:
        sync_cls, async_cls = getattr(ef, name), getattr(ef, "Async" + name)
        sync_api = {n for n in vars(sync_cls) if not n.startswith("_")}
        async_api = {n.replace("aclose", "close") for n in vars(async_cls) if not n.startswith("_")}
        assert sync_api == async_api, name


def test_elector_is_leader_is_a_method_and_refuses_bool_use() -> None:
    client = ef.Client("127.0.0.1:1")
    try:
        elector = ef.LeaderElector(client, "svc", identity="a")
        assert elector.is_leader() is False
        with pytest.raises(TypeError, match=r"call is_leader\(\)"):
            bool(elector.is_leader)  # 0.1's property style must not be silently true
    finally:
        client.close()


def test_0_1_error_names_are_the_same_classes() -> None:
    assert ef.SessionExpired is ef.SessionExpiredError
    assert ef.EtcdUnavailable is ef.EtcdUnavailableError
    assert ef.AcquireTimeout is ef.AcquireTimeoutError
    assert issubclass(ef.OutcomeUnknownError, ef.EtcdUnavailable)
    from etcdfence.sql import TransactionInProgress

    assert TransactionInProgress is ef.TransactionInProgressError
    errors = [getattr(ef, n) for n in ef.__all__ if isinstance(getattr(ef, n), type)]
    for cls in errors:
        if issubclass(cls, BaseException) and cls.__name__ != "TLSError":
            assert cls.__name__.endswith("Error"), cls

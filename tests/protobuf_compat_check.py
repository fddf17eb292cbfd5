"""Run by `make test-protobuf5` in a separate venv pinned to protobuf 5.27.

The main venv runs the newest protobuf (7.x); this proves the wire layer builds
and talks to etcd on the oldest supported major too.
"""

from __future__ import annotations

import google.protobuf  # type: ignore[import-untyped]

import etcdfence as ef
from etcdfence.testing import EtcdServer


def test_protobuf_major_and_round_trip() -> None:
    print("protobuf", google.protobuf.__version__)
    with EtcdServer() as server, ef.Client(server.endpoint) as client:
        rev = client.put("pb/k", "v")
        assert client.get("pb/k").mod_revision == rev  # type: ignore[union-attr]
        with client.session(ttl=2) as session:
            token = session.lock("pb/lock").acquire(timeout=5)
            assert client.fence("pb").put(token, "pb/data", "1") > token.value
            try:
                client.fence("pb").put(token.value - 1, "pb/data", "0")
            except ef.StaleTokenError as err:
                assert err.current == token.value
            else:
                raise AssertionError("stale token accepted")

"""No gRPC stream call object of the sync client outlives ``client.close()``.

A ``grpc`` call object that is still alive when the interpreter finalizes is collected
then, and its ``__del__`` takes its state's lock — which one of gRPC's daemon threads,
frozen by the finalization, may hold: the process hangs at exit. Five rwlock holder
processes (tests/_recipe_holder.py) hung that way about once in 40 rounds on etcd 3.4
and 3.5 (py-spy: ``_Rendezvous.__del__`` waiting in ``Condition.__enter__``). Cancelled
streams now drop their call objects at once, so none is left for the finalization.
"""

from __future__ import annotations

import gc

import grpc._channel
import pytest

import etcdfence as ef

pytestmark = pytest.mark.integration


def _calls() -> list[object]:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, grpc._channel._Rendezvous)]


def test_closing_the_sync_client_leaves_no_stream_call_object(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    before = len(_calls())
    client = ef.Client(etcd_endpoints[0], timeout=5)
    session = client.session(ttl=10)
    session.open()  # a keepalive stream
    rw = session.rwlock(etcd_namespace + "/rw")
    other = client.session(ttl=10)
    other.open()
    with rw.read():
        writer = other.rwlock(etcd_namespace + "/rw").write()
        with pytest.raises(ef.AcquireTimeoutError):
            writer.acquire(timeout=0.5)  # waits on a watch stream, gives up
    other.close()
    session.close()
    client.close()
    assert len(_calls()) == before, "a gRPC call object outlived client.close()"

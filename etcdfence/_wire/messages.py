"""A project-written subset of etcd's v3 gRPC messages, built at import time.

Field names and numbers are facts taken from etcd's public API definitions
(``api/etcdserverpb/rpc.proto`` and ``api/mvccpb/kv.proto``, etcd v3.4/v3.5).
Protobuf serializes by field number, so these messages are wire-compatible
with etcd while living in a *private* package (``etcdfence.wire``) of a
*private* descriptor pool. That avoids two failure modes of generated
``_pb2`` modules: the ``duplicate file name rpc.proto`` collision when another
etcd client is imported in the same process, and the gencode/runtime version
check that ties generated code to one protobuf major. Building descriptors
from ``descriptor_pb2`` works unchanged on protobuf 5.27 through 7.x.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "etcdfence.wire"
_FILE = "etcdfence/_wire/etcd_v3_subset.proto"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "uint32": _F.TYPE_UINT32,
    "bool": _F.TYPE_BOOL,
    "bytes": _F.TYPE_BYTES,
    "string": _F.TYPE_STRING,
}

# message name -> list of (field name, number, type, repeated?, oneof name or None)
# A type that is not a scalar names a message or enum of this file.
_Field = tuple[str, int, str, bool, "str | None"]

_ENUMS: dict[str, list[tuple[str, int]]] = {
    "SortOrder": [("NONE", 0), ("ASCEND", 1), ("DESCEND", 2)],
    "SortTarget": [("KEY", 0), ("VERSION", 1), ("CREATE", 2), ("MOD", 3), ("VALUE", 4)],
    "CompareResult": [("EQUAL", 0), ("GREATER", 1), ("LESS", 2), ("NOT_EQUAL", 3)],
    "CompareTarget": [("VERSION", 0), ("CREATE", 1), ("MOD", 2), ("VALUE", 3), ("LEASE", 4)],
    "EventType": [("PUT", 0), ("DELETE", 1)],
    "FilterType": [("NOPUT", 0), ("NODELETE", 1)],
}


def _f(
    name: str, number: int, type_: str, repeated: bool = False, oneof: str | None = None
) -> _Field:
    return (name, number, type_, repeated, oneof)


_HEADER = _f("header", 1, "ResponseHeader")

_MESSAGES: dict[str, list[_Field]] = {
    # mvccpb
    "KeyValue": [
        _f("key", 1, "bytes"),
        _f("create_revision", 2, "int64"),
        _f("mod_revision", 3, "int64"),
        _f("version", 4, "int64"),
        _f("value", 5, "bytes"),
        _f("lease", 6, "int64"),
    ],
    "Event": [_f("type", 1, "EventType"), _f("kv", 2, "KeyValue"), _f("prev_kv", 3, "KeyValue")],
    # etcdserverpb
    "ResponseHeader": [
        _f("cluster_id", 1, "uint64"),
        _f("member_id", 2, "uint64"),
        _f("revision", 3, "int64"),
        _f("raft_term", 4, "uint64"),
    ],
    "RangeRequest": [
        _f("key", 1, "bytes"),
        _f("range_end", 2, "bytes"),
        _f("limit", 3, "int64"),
        _f("revision", 4, "int64"),
        _f("sort_order", 5, "SortOrder"),
        _f("sort_target", 6, "SortTarget"),
        _f("serializable", 7, "bool"),
        _f("keys_only", 8, "bool"),
        _f("count_only", 9, "bool"),
        _f("min_mod_revision", 10, "int64"),
        _f("max_mod_revision", 11, "int64"),
        _f("min_create_revision", 12, "int64"),
        _f("max_create_revision", 13, "int64"),
    ],
    "RangeResponse": [
        _HEADER,
        _f("kvs", 2, "KeyValue", True),
        _f("more", 3, "bool"),
        _f("count", 4, "int64"),
    ],
    "PutRequest": [
        _f("key", 1, "bytes"),
        _f("value", 2, "bytes"),
        _f("lease", 3, "int64"),
        _f("prev_kv", 4, "bool"),
        _f("ignore_value", 5, "bool"),
        _f("ignore_lease", 6, "bool"),
    ],
    "PutResponse": [_HEADER, _f("prev_kv", 2, "KeyValue")],
    "DeleteRangeRequest": [
        _f("key", 1, "bytes"),
        _f("range_end", 2, "bytes"),
        _f("prev_kv", 3, "bool"),
    ],
    "DeleteRangeResponse": [
        _HEADER,
        _f("deleted", 2, "int64"),
        _f("prev_kvs", 3, "KeyValue", True),
    ],
    "RequestOp": [
        _f("request_range", 1, "RangeRequest", oneof="request"),
        _f("request_put", 2, "PutRequest", oneof="request"),
        _f("request_delete_range", 3, "DeleteRangeRequest", oneof="request"),
        _f("request_txn", 4, "TxnRequest", oneof="request"),
    ],
    "ResponseOp": [
        _f("response_range", 1, "RangeResponse", oneof="response"),
        _f("response_put", 2, "PutResponse", oneof="response"),
        _f("response_delete_range", 3, "DeleteRangeResponse", oneof="response"),
        _f("response_txn", 4, "TxnResponse", oneof="response"),
    ],
    "Compare": [
        _f("result", 1, "CompareResult"),
        _f("target", 2, "CompareTarget"),
        _f("key", 3, "bytes"),
        _f("version", 4, "int64", oneof="target_union"),
        _f("create_revision", 5, "int64", oneof="target_union"),
        _f("mod_revision", 6, "int64", oneof="target_union"),
        _f("value", 7, "bytes", oneof="target_union"),
        _f("lease", 8, "int64", oneof="target_union"),
        _f("range_end", 64, "bytes"),
    ],
    "TxnRequest": [
        _f("compare", 1, "Compare", True),
        _f("success", 2, "RequestOp", True),
        _f("failure", 3, "RequestOp", True),
    ],
    "TxnResponse": [
        _HEADER,
        _f("succeeded", 2, "bool"),
        _f("responses", 3, "ResponseOp", True),
    ],
    "CompactionRequest": [_f("revision", 1, "int64"), _f("physical", 2, "bool")],
    "CompactionResponse": [_HEADER],
    "WatchRequest": [
        _f("create_request", 1, "WatchCreateRequest", oneof="request_union"),
        _f("cancel_request", 2, "WatchCancelRequest", oneof="request_union"),
        _f("progress_request", 3, "WatchProgressRequest", oneof="request_union"),
    ],
    "WatchCreateRequest": [
        _f("key", 1, "bytes"),
        _f("range_end", 2, "bytes"),
        _f("start_revision", 3, "int64"),
        _f("progress_notify", 4, "bool"),
        _f("filters", 5, "FilterType", True),
        _f("prev_kv", 6, "bool"),
        _f("watch_id", 7, "int64"),
        _f("fragment", 8, "bool"),
    ],
    "WatchCancelRequest": [_f("watch_id", 1, "int64")],
    "WatchProgressRequest": [],
    "WatchResponse": [
        _HEADER,
        _f("watch_id", 2, "int64"),
        _f("created", 3, "bool"),
        _f("canceled", 4, "bool"),
        _f("compact_revision", 5, "int64"),
        _f("cancel_reason", 6, "string"),
        _f("fragment", 7, "bool"),
        _f("events", 11, "Event", True),
    ],
    "LeaseGrantRequest": [_f("TTL", 1, "int64"), _f("ID", 2, "int64")],
    "LeaseGrantResponse": [
        _HEADER,
        _f("ID", 2, "int64"),
        _f("TTL", 3, "int64"),
        _f("error", 4, "string"),
    ],
    "LeaseRevokeRequest": [_f("ID", 1, "int64")],
    "LeaseRevokeResponse": [_HEADER],
    "LeaseKeepAliveRequest": [_f("ID", 1, "int64")],
    "LeaseKeepAliveResponse": [_HEADER, _f("ID", 2, "int64"), _f("TTL", 3, "int64")],
    "LeaseTimeToLiveRequest": [_f("ID", 1, "int64"), _f("keys", 2, "bool")],
    "LeaseTimeToLiveResponse": [
        _HEADER,
        _f("ID", 2, "int64"),
        _f("TTL", 3, "int64"),
        _f("grantedTTL", 4, "int64"),
        _f("keys", 5, "bytes", True),
    ],
    "AuthenticateRequest": [_f("name", 1, "string"), _f("password", 2, "string")],
    "AuthenticateResponse": [_HEADER, _f("token", 2, "string")],
    "StatusRequest": [],
    "StatusResponse": [
        _HEADER,
        _f("version", 2, "string"),
        _f("dbSize", 3, "int64"),
        _f("leader", 4, "uint64"),
        _f("raftIndex", 5, "uint64"),
        _f("raftTerm", 6, "uint64"),
        _f("raftAppliedIndex", 7, "uint64"),
        _f("errors", 8, "string", True),
        _f("dbSizeInUse", 9, "int64"),
        _f("isLearner", 10, "bool"),
    ],
    "DefragmentRequest": [],
    "DefragmentResponse": [_HEADER],
}


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name=_FILE, package=_PACKAGE, syntax="proto3")
    for enum_name, values in _ENUMS.items():
        enum = fdp.enum_type.add(name=enum_name)
        for value_name, number in values:
            # enum value names are scoped to the package in protobuf: prefix them
            enum.value.add(name=f"{enum_name}_{value_name}", number=number)
    for msg_name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=msg_name)
        oneofs: dict[str, int] = {}
        for name, number, type_, repeated, oneof in fields:
            field = msg.field.add(name=name, number=number, json_name=name)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_ in _SCALARS:
                field.type = _SCALARS[type_]
            elif type_ in _ENUMS:
                field.type = _F.TYPE_ENUM
                field.type_name = f".{_PACKAGE}.{type_}"
            else:
                field.type = _F.TYPE_MESSAGE
                field.type_name = f".{_PACKAGE}.{type_}"
            if oneof is not None:
                if oneof not in oneofs:
                    oneofs[oneof] = len(msg.oneof_decl)
                    msg.oneof_decl.add(name=oneof)
                field.oneof_index = oneofs[oneof]
    return fdp


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_build_file())


def _message(name: str) -> Any:
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


KeyValue: Any = _message("KeyValue")
Event: Any = _message("Event")
ResponseHeader: Any = _message("ResponseHeader")
RangeRequest: Any = _message("RangeRequest")
RangeResponse: Any = _message("RangeResponse")
PutRequest: Any = _message("PutRequest")
PutResponse: Any = _message("PutResponse")
DeleteRangeRequest: Any = _message("DeleteRangeRequest")
DeleteRangeResponse: Any = _message("DeleteRangeResponse")
RequestOp: Any = _message("RequestOp")
ResponseOp: Any = _message("ResponseOp")
Compare: Any = _message("Compare")
TxnRequest: Any = _message("TxnRequest")
TxnResponse: Any = _message("TxnResponse")
CompactionRequest: Any = _message("CompactionRequest")
CompactionResponse: Any = _message("CompactionResponse")
WatchRequest: Any = _message("WatchRequest")
WatchCreateRequest: Any = _message("WatchCreateRequest")
WatchCancelRequest: Any = _message("WatchCancelRequest")
WatchProgressRequest: Any = _message("WatchProgressRequest")
WatchResponse: Any = _message("WatchResponse")
LeaseGrantRequest: Any = _message("LeaseGrantRequest")
LeaseGrantResponse: Any = _message("LeaseGrantResponse")
LeaseRevokeRequest: Any = _message("LeaseRevokeRequest")
LeaseRevokeResponse: Any = _message("LeaseRevokeResponse")
LeaseKeepAliveRequest: Any = _message("LeaseKeepAliveRequest")
LeaseKeepAliveResponse: Any = _message("LeaseKeepAliveResponse")
LeaseTimeToLiveRequest: Any = _message("LeaseTimeToLiveRequest")
LeaseTimeToLiveResponse: Any = _message("LeaseTimeToLiveResponse")
AuthenticateRequest: Any = _message("AuthenticateRequest")
AuthenticateResponse: Any = _message("AuthenticateResponse")
StatusRequest: Any = _message("StatusRequest")
StatusResponse: Any = _message("StatusResponse")
DefragmentRequest: Any = _message("DefragmentRequest")
DefragmentResponse: Any = _message("DefragmentResponse")


# Enum numbers (wire values), named as in etcd.
class SortOrder:
    NONE, ASCEND, DESCEND = 0, 1, 2


class SortTarget:
    KEY, VERSION, CREATE, MOD, VALUE = 0, 1, 2, 3, 4


class CompareResult:
    EQUAL, GREATER, LESS, NOT_EQUAL = 0, 1, 2, 3


class CompareTarget:
    VERSION, CREATE, MOD, VALUE, LEASE = 0, 1, 2, 3, 4


class EventType:
    PUT, DELETE = 0, 1


#: gRPC method paths: (service method, request class, response class).
#: The paths are etcd's real ones, independent of our private proto package.
METHODS: dict[str, tuple[str, Any, Any]] = {
    "Range": ("/etcdserverpb.KV/Range", RangeRequest, RangeResponse),
    "Put": ("/etcdserverpb.KV/Put", PutRequest, PutResponse),
    "DeleteRange": ("/etcdserverpb.KV/DeleteRange", DeleteRangeRequest, DeleteRangeResponse),
    "Txn": ("/etcdserverpb.KV/Txn", TxnRequest, TxnResponse),
    "Compact": ("/etcdserverpb.KV/Compact", CompactionRequest, CompactionResponse),
    "LeaseGrant": ("/etcdserverpb.Lease/LeaseGrant", LeaseGrantRequest, LeaseGrantResponse),
    "LeaseRevoke": ("/etcdserverpb.Lease/LeaseRevoke", LeaseRevokeRequest, LeaseRevokeResponse),
    "LeaseTimeToLive": (
        "/etcdserverpb.Lease/LeaseTimeToLive",
        LeaseTimeToLiveRequest,
        LeaseTimeToLiveResponse,
    ),
    "Authenticate": ("/etcdserverpb.Auth/Authenticate", AuthenticateRequest, AuthenticateResponse),
    "Status": ("/etcdserverpb.Maintenance/Status", StatusRequest, StatusResponse),
    "Defragment": ("/etcdserverpb.Maintenance/Defragment", DefragmentRequest, DefragmentResponse),
}
#: Bidirectional streams.
STREAMS: dict[str, tuple[str, Any, Any]] = {
    "LeaseKeepAlive": (
        "/etcdserverpb.Lease/LeaseKeepAlive",
        LeaseKeepAliveRequest,
        LeaseKeepAliveResponse,
    ),
    "Watch": ("/etcdserverpb.Watch/Watch", WatchRequest, WatchResponse),
}

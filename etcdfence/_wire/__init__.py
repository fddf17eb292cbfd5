"""etcdfence's own etcd v3 gRPC layer: messages (``messages``) and error mapping (``errors``)."""

"""Generated protobuf messages of the KServe v2 gRPC service (see grpc_service.proto)."""

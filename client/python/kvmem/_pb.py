"""The generated stubs (kvmem.v1.*_pb2), with a useful error when missing.

They are a build product: `cmake --build build` writes them to build/python/
(put it on PYTHONPATH beside client/python), or generate them by hand, see
client/python/README.md.
"""
try:
    from kvmem.v1 import service_pb2, service_pb2_grpc, trace_pb2, types_pb2  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kvmem: the generated stubs kvmem.v1 are missing or broken (" + str(e) +
        "). Build them (cmake --build build; then PYTHONPATH=build/python:"
        "client/python) or run: protoc -I proto --python_out=OUT "
        "--grpc_out=OUT --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin "
        "proto/kvmem/v1/types.proto proto/kvmem/v1/service.proto "
        "proto/kvmem/v1/trace.proto "
        "and put OUT on PYTHONPATH.") from e

__all__ = ["service_pb2", "service_pb2_grpc", "trace_pb2", "types_pb2"]

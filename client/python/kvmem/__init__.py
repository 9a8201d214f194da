"""kvmem: Python client of kvmem-server (the KV-cache memory service).

    import kvmem
    with kvmem.Client("unix:/run/kvmem.sock") as c:
        c.open_stream("cam-0", kvmem.StreamConfig(
            geometry=kvmem.StreamGeometry(layers=4, kv_heads=2, head_dim=64,
                                          dtype=kvmem.DType.FP16,
                                          max_tokens_per_frame=32),
            hot_window_tokens=512))
        c.append_frames("cam-0", [kv])          # kv: (4, 2, 2, 32, 64) array
        r = c.recall("cam-0", query, max_tokens=160)
        blocks = c.fetch_blocks("cam-0", r.block_ids)

The generated protobuf stubs live in the subpackage kvmem.v1, generated into
another directory on sys.path (build/python by the CMake build); this package
extends its own __path__ so that kvmem.v1 is found there.
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)  # noqa: F821 (kvmem.v1 lives elsewhere)

from kvmem.errors import (AlreadyExistsError, DeadlineExceededError,  # noqa: E402
                          FailedPreconditionError, InvalidArgumentError,
                          KvmemError, NotFoundError, PermissionDeniedError,
                          ResourceExhaustedError, UnauthenticatedError,
                          UnavailableError)
from kvmem.kv import (bf16_to_float32, decode_kv, encode_frame,  # noqa: E402
                      float32_to_bf16, numpy_dtype, stack_kv)
from kvmem.messages import (AcceleratorStats, AppendAck,  # noqa: E402
                            AppendFramesResponse, BlockPolicy, ColdPrecision,
                            DeliveredBlock, Detection,
                            DType, FrameSignals, IndexPolicy, IndexStats,
                            IngestCpu,
                            LayerRecallSet, OpenStreamResponse, PayloadLayout,
                            PolicyStats, RecallBudget, RecallChannels,
                            RecallDefaults,
                            RecalledBlock, RecallPolicy, RecallResponse,
                            RecallTiming, ReplacementPolicy, ScoreMode,
                            SegmentMode, ShmRegion,
                            StreamConfig, StreamGeometry, StreamStats, Tier,
                            TierPolicy, TierStats)
from kvmem.client import (STREAM_ID_HEADER, Client, FetchedBlock,  # noqa: E402
                          Frame, Session, connect)
from kvmem.shm import Delivery, SharedBlock  # noqa: E402

__all__ = [
    "AcceleratorStats", "AlreadyExistsError", "AppendAck", "AppendFramesResponse",
    "BlockPolicy", "Client", "ColdPrecision", "DType", "DeadlineExceededError", "DeliveredBlock",
    "Delivery", "Detection",
    "FailedPreconditionError", "FetchedBlock", "Frame", "FrameSignals",
    "IndexPolicy", "IndexStats", "IngestCpu", "InvalidArgumentError",
    "KvmemError",
    "LayerRecallSet", "NotFoundError", "OpenStreamResponse", "PayloadLayout",
    "PermissionDeniedError", "PolicyStats", "RecallBudget", "RecallChannels",
    "RecallDefaults",
    "RecallPolicy", "RecallResponse", "RecallTiming", "RecalledBlock",
    "ReplacementPolicy", "ResourceExhaustedError", "STREAM_ID_HEADER",
    "ScoreMode", "SharedBlock", "ShmRegion",
    "SegmentMode", "Session", "StreamConfig", "StreamGeometry", "StreamStats",
    "Tier", "TierPolicy", "TierStats", "UnauthenticatedError",
    "UnavailableError", "bf16_to_float32", "connect", "decode_kv",
    "encode_frame", "float32_to_bf16", "numpy_dtype", "stack_kv",
]

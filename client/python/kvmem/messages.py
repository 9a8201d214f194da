"""Typed mirrors of the kvmem.v1 messages (proto/kvmem/v1/types.proto and
service.proto), as dataclasses with the proto's field names, and their
conversion to and from the generated protobuf classes.

Each dataclass holds the fields of the message of the same name (a test
checks the two stay in step); enums are IntEnums with the proto's numbers.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, Type, TypeVar

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

# --------------------------------------------------------------------------
# Enums (same numbers as the proto; the proto name is PREFIX_ + member name).


class DType(enum.IntEnum):
    """Payload element type (kvmem.v1.DType)."""

    UNSPECIFIED = 0
    FP16 = 1
    BF16 = 2
    FP32 = 3

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.FP32 else 2


class SegmentMode(enum.IntEnum):
    UNSPECIFIED = 0
    FIXED = 1
    SHOT = 2


class ReplacementPolicy(enum.IntEnum):
    UNSPECIFIED = 0
    LRU = 1
    HEAT = 2


class ColdPrecision(enum.IntEnum):
    UNSPECIFIED = 0
    FULL = 1
    INT8 = 2
    INT4 = 3


class ScoreMode(enum.IntEnum):
    """How recall scores candidates: MASS (estimated attention mass per KV
    head, the default) or SUMMED (raw logits summed over heads)."""

    UNSPECIFIED = 0
    MASS = 1
    SUMMED = 2


class Tier(enum.IntEnum):
    UNSPECIFIED = 0
    WARM = 1
    COLD = 2
    DEGRADED = 3
    EVICTED = 4


class PayloadLayout(enum.IntEnum):
    """FetchBlocks and delivery layout: FRAME_MAJOR (frames as appended),
    BLOCK_LAYER_MAJOR (per layer, K then V, [kv_heads][block tokens][head_dim])
    or TOKEN_LAYER_MAJOR (the same with only the chosen tokens: a recall's
    recalled tokens, or those fetch_blocks' tokens name)."""

    UNSPECIFIED = 0
    FRAME_MAJOR = 1
    BLOCK_LAYER_MAJOR = 2
    TOKEN_LAYER_MAJOR = 3


# The proto enum type name of each IntEnum (used by the consistency test).
PROTO_ENUMS: dict[type, str] = {
    DType: "DType",
    SegmentMode: "SegmentMode",
    ReplacementPolicy: "ReplacementPolicy",
    ColdPrecision: "ColdPrecision",
    ScoreMode: "ScoreMode",
    Tier: "Tier",
    PayloadLayout: "PayloadLayout",
}

# --------------------------------------------------------------------------
# Stream configuration.


@dataclass
class StreamGeometry:
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    dtype: DType = DType.FP16
    max_tokens_per_frame: int = 0

    def frame_shape(self, tokens: int) -> tuple[int, int, int, int, int]:
        """Shape of one frame's KV array: (layers, 2 [K, V], kv_heads, tokens, head_dim)."""
        return (self.layers, 2, self.kv_heads, tokens, self.head_dim)

    def payload_bytes(self, tokens: int) -> int:
        """Bytes of a frame of ``tokens`` tokens on the wire."""
        return self.layers * 2 * self.kv_heads * tokens * self.head_dim * DType(self.dtype).itemsize


@dataclass
class BlockPolicy:
    frames_per_block: int = 0
    mode: SegmentMode = SegmentMode.UNSPECIFIED
    shot_similarity_threshold: float = 0.0
    max_tokens_per_block: int = 0


@dataclass
class TierPolicy:
    warm_budget_bytes: int = 0
    cold_budget_bytes: int = 0
    storage_cap_bytes: int = 0
    replacement: ReplacementPolicy = ReplacementPolicy.UNSPECIFIED
    heat_half_life_frames: int = 0
    prefetch_blocks: int = 0
    stage_budget_bytes: int = 0
    rebuild_every_blocks: int = 0
    rebuild_every_seconds: int = 0
    cold_precision: ColdPrecision = ColdPrecision.UNSPECIFIED
    ingest_precision: ColdPrecision = ColdPrecision.UNSPECIFIED


@dataclass
class RecallPolicy:
    model_weight: float = 0.0
    track_weight: float = 0.0
    iou_weight: float = 0.0
    scene_weight: float = 0.0
    score: ScoreMode = ScoreMode.UNSPECIFIED
    scorer: str = ""
    # The identity channel's share of each recall set's budget, in [0, 1];
    # None: unset (the default, 0.25).
    identity_share: Optional[float] = None


@dataclass
class IndexPolicy:
    indexed_layers: list[int] = field(default_factory=list)
    index_factory: str = ""
    groups_per_block: int = 0


@dataclass
class RecallDefaults:
    top_k: int = 0
    max_tokens: int = 0
    gate_temperature: float = 0.0


@dataclass
class StreamConfig:
    geometry: StreamGeometry = field(default_factory=StreamGeometry)
    hot_window_tokens: int = 0
    block_policy: BlockPolicy = field(default_factory=BlockPolicy)
    index_policy: IndexPolicy = field(default_factory=IndexPolicy)
    recall_defaults: RecallDefaults = field(default_factory=RecallDefaults)
    labels: dict[str, str] = field(default_factory=dict)
    tier_policy: TierPolicy = field(default_factory=TierPolicy)
    recall_policy: RecallPolicy = field(default_factory=RecallPolicy)


# --------------------------------------------------------------------------
# Frame signals.


@dataclass
class Detection:
    track_id: int = 0
    class_id: int = 0
    x_min: float = 0.0
    y_min: float = 0.0
    x_max: float = 0.0
    y_max: float = 0.0
    score: float = 0.0


@dataclass
class FrameSignals:
    detections: list[Detection] = field(default_factory=list)
    scene_embedding: list[float] = field(default_factory=list)


# --------------------------------------------------------------------------
# Recall.


@dataclass
class RecalledBlock:
    block_id: int = 0
    first_frame: int = 0
    last_frame: int = 0
    first_token_position: int = 0
    end_token_position: int = 0
    token_count: int = 0
    score: float = 0.0
    gate_weight: float = 0.0
    tier: Tier = Tier.UNSPECIFIED
    payload_bytes: int = 0
    degraded: bool = False
    was_staged: bool = False
    priority: float = 0.0
    semantic_score: float = 0.0
    token_offsets: list[int] = field(default_factory=list)
    mass: float = 0.0
    # The chosen tokens the identity channel took: for the query as a
    # whole, and for the query's tracks; the others came from attention.
    query_offsets: list[int] = field(default_factory=list)
    track_offsets: list[int] = field(default_factory=list)

    @property
    def recalled_tokens(self) -> int:
        """Tokens this block adds to the recall set (its chosen token groups, or all)."""
        return len(self.token_offsets) if self.token_offsets else self.token_count


@dataclass
class RecallTiming:
    search_us: int = 0
    plan_us: int = 0
    total_us: int = 0
    modelled_us: float = 0.0
    modelled_dram_bytes: int = 0
    modelled_energy_uj: float = 0.0
    modelled_queue_us: float = 0.0
    injections: int = 0
    tokens_scored: int = 0
    token_us: int = 0
    reduce_us: int = 0


@dataclass
class RecallBudget:
    top_k: int = 0
    max_tokens: int = 0
    window_fraction: float = 0.0
    identity_share: Optional[float] = None  # None: the stream's.
    mass_target: float = 0.0


@dataclass
class RecallChannels:
    """A recall set's tokens by the channel that chose them."""

    attention_tokens: int = 0
    query_tokens: int = 0
    track_tokens: int = 0
    identity_budget: int = 0


@dataclass
class LayerRecallSet:
    layer: int = 0
    blocks: list[RecalledBlock] = field(default_factory=list)
    total_tokens: int = 0
    kv_head: int = 0
    channels: RecallChannels = field(default_factory=RecallChannels)
    cold_share: float = 0.0


@dataclass
class ShmRegion:
    """Bytes in a shared-memory arena: [offset, offset + length) under a lease."""

    lease_id: int = 0
    offset: int = 0
    length: int = 0


@dataclass
class DeliveredBlock:
    """A recalled block's bytes delivered with the recall: inline in data, or
    in shared memory at shm (Client.recall_delivered turns these into views)."""

    block_id: int = 0
    data: bytes = b""
    shm: ShmRegion = field(default_factory=ShmRegion)
    # TOKEN_LAYER_MAJOR: the tokens the bytes hold (offsets in the block).
    token_offsets: list[int] = field(default_factory=list)


@dataclass
class RecallResponse:
    """A recall set: blocks best first, never more than budget_tokens tokens."""

    blocks: list[RecalledBlock] = field(default_factory=list)
    total_tokens: int = 0
    candidates: int = 0
    budget_tokens: int = 0
    top_k: int = 0
    timing: RecallTiming = field(default_factory=RecallTiming)
    layer_sets: list[LayerRecallSet] = field(default_factory=list)
    recalled_mass: float = 0.0
    window_estimated: bool = False
    query_vectors: int = 0
    # With delivery: the blocks' bytes (those the client did not say it
    # holds), their total, and how many recalled blocks were left out.
    delivered: list[DeliveredBlock] = field(default_factory=list)
    delivered_bytes: int = 0
    held_blocks: int = 0
    # Tokens by channel (identity share), the vectors scored (a query of
    # more than 16 is reduced to 16), and the estimated share of the cold
    # attention mass the set holds.
    channels: RecallChannels = field(default_factory=RecallChannels)
    scored_query_vectors: int = 0
    cold_share: float = 0.0

    @property
    def block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]


# --------------------------------------------------------------------------
# Statistics.


@dataclass
class TierStats:
    blocks: int = 0
    bytes: int = 0


@dataclass
class PolicyStats:
    demotions: int = 0
    degradations: int = 0
    evictions: int = 0
    promotions: int = 0
    promotions_declined: int = 0
    staged: int = 0
    stage_hits: int = 0
    stage_misses: int = 0
    stage_bytes: int = 0
    rebuilds: int = 0
    shot_cuts: int = 0
    recall_us_p50: int = 0
    recall_us_p99: int = 0
    recall_us_max: int = 0


@dataclass
class IndexStats:
    factory: str = ""
    recall_samples: int = 0
    recall_at_k: float = 0.0
    bytes: int = 0  # RAM the indexes hold, besides summary_bytes.
    copied_in_place: int = 0  # Vectors copied under the writer's lock.


@dataclass
class AcceleratorStats:
    backend: str = ""
    searches: int = 0
    injections: int = 0
    measured_us: float = 0.0
    modelled_us: float = 0.0
    modelled_queue_us: float = 0.0
    modelled_dram_bytes: int = 0
    modelled_energy_uj: float = 0.0
    sram_bytes: int = 0
    sram_hot_bytes: int = 0
    sram_staging_bytes: int = 0
    sram_repartitions: int = 0
    recall_floor: float = 0.0
    warning: str = ""


@dataclass
class IngestCpu:
    """The append path's own CPU time by stage, nanoseconds."""
    validate_ns: int = 0
    summarize_ns: int = 0
    token_groups_ns: int = 0
    warm_copy_ns: int = 0
    seal_rest_ns: int = 0
    encode_ns: int = 0
    commit_ns: int = 0
    install_ns: int = 0


@dataclass
class StreamStats:
    stream_id: str = ""
    config: StreamConfig = field(default_factory=StreamConfig)
    closed: bool = False
    last_durable_frame: int = -1
    next_token_position: int = 0
    frames: int = 0
    tokens: int = 0
    sealed_blocks: int = 0
    open_block_frames: int = 0
    payload_bytes: int = 0
    summary_bytes: int = 0
    token_code_bytes: int = 0
    summary_dim: int = 0
    recalls: int = 0
    recalled_blocks: int = 0
    recalled_tokens: int = 0
    warm_bytes: int = 0
    cold_bytes: int = 0
    warm: TierStats = field(default_factory=TierStats)
    cold: TierStats = field(default_factory=TierStats)
    degraded: TierStats = field(default_factory=TierStats)
    evicted: TierStats = field(default_factory=TierStats)
    policy: PolicyStats = field(default_factory=PolicyStats)
    index: IndexStats = field(default_factory=IndexStats)
    accelerator: AcceleratorStats = field(default_factory=AcceleratorStats)
    ingest_cpu: IngestCpu = field(default_factory=IngestCpu)
    signal_bytes: int = 0
    track_histories: int = 0


# --------------------------------------------------------------------------
# Call results.


@dataclass
class OpenStreamResponse:
    created: bool = False
    stats: StreamStats = field(default_factory=StreamStats)


@dataclass
class AppendFramesResponse:
    last_durable_frame: int = -1
    frames_written: int = 0
    bytes_written: int = 0
    sealed_blocks: int = 0


@dataclass
class AppendAck:
    frame_index: int = 0
    last_durable_frame: int = -1
    sealed_block: bool = False


# Dataclass -> proto message name, for the consistency test.
MIRRORS: dict[type, str] = {
    StreamGeometry: "StreamGeometry",
    BlockPolicy: "BlockPolicy",
    TierPolicy: "TierPolicy",
    RecallPolicy: "RecallPolicy",
    IndexPolicy: "IndexPolicy",
    RecallDefaults: "RecallDefaults",
    StreamConfig: "StreamConfig",
    Detection: "Detection",
    FrameSignals: "FrameSignals",
    RecalledBlock: "RecalledBlock",
    RecallTiming: "RecallTiming",
    RecallBudget: "RecallBudget",
    LayerRecallSet: "LayerRecallSet",
    RecallChannels: "RecallChannels",
    RecallResponse: "RecallResponse",
    ShmRegion: "ShmRegion",
    DeliveredBlock: "DeliveredBlock",
    TierStats: "TierStats",
    PolicyStats: "PolicyStats",
    IndexStats: "IndexStats",
    AcceleratorStats: "AcceleratorStats",
    StreamStats: "StreamStats",
    OpenStreamResponse: "OpenStreamResponse",
    AppendFramesResponse: "AppendFramesResponse",
    AppendAck: "AppendAck",
}

# --------------------------------------------------------------------------
# Conversion.

T = TypeVar("T")


def _is_map(fd: FieldDescriptor) -> bool:
    return (fd.type == FieldDescriptor.TYPE_MESSAGE
            and fd.message_type.GetOptions().map_entry)


def _plain(v: Any) -> Any:
    """Numpy scalars and arrays to Python numbers and lists."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, enum.IntEnum):
        return int(v)
    return v


def to_proto(obj: Any, msg: Message) -> Message:
    """Copies a mirror dataclass into a protobuf message (fields by name)."""
    desc = msg.DESCRIPTOR
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        fd = desc.fields_by_name[f.name]
        if _is_map(fd):
            getattr(msg, f.name).update({str(k): str(x) for k, x in v.items()})
        elif fd.label == FieldDescriptor.LABEL_REPEATED:
            target = getattr(msg, f.name)
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                for item in v:
                    to_proto(item, target.add())
            else:
                target.extend(_plain(x) for x in _plain(v))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            to_proto(v, getattr(msg, f.name))
        else:
            setattr(msg, f.name, _plain(v))
    return msg


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap(t: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return t


def _enum(t: type, v: int) -> Any:
    try:
        return t(v)
    except ValueError:  # A value newer than this client: keep the number.
        return v


def from_proto(cls: Type[T], msg: Message) -> T:
    """Builds a mirror dataclass from a protobuf message (fields by name)."""
    desc = msg.DESCRIPTOR
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        fd = desc.fields_by_name[f.name]
        t = _unwrap(hints[f.name])
        v = getattr(msg, f.name)
        if _is_map(fd):
            kwargs[f.name] = dict(v)
        elif fd.label == FieldDescriptor.LABEL_REPEATED:
            (elem,) = typing.get_args(t)
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                kwargs[f.name] = [from_proto(elem, x) for x in v]
            else:
                kwargs[f.name] = list(v)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            kwargs[f.name] = from_proto(t, v)
        elif fd.type == FieldDescriptor.TYPE_ENUM:
            kwargs[f.name] = _enum(t, v)
        elif t is not hints[f.name] and not msg.HasField(f.name):
            kwargs[f.name] = None  # An optional field left unset.
        else:
            kwargs[f.name] = v
    return cls(**kwargs)

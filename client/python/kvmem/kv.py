"""KV payloads as numpy arrays.

A frame's payload is layer-major (types.proto, StreamGeometry): for each layer,
K then V, each [kv_heads][tokens][head_dim]. As an array that is the shape
(layers, 2, kv_heads, tokens, head_dim), index 0 of axis 1 the keys and 1 the
values, in C order: its bytes are exactly the wire payload.

dtypes: FP16 <-> numpy float16, FP32 <-> float32 (little-endian). numpy has no
bfloat16: BF16 payloads are uint16 arrays of the raw bits; floating arrays
given for a BF16 stream are rounded to bfloat16 (nearest even), and
bf16_to_float32 widens fetched bits.
"""
from __future__ import annotations

import numpy as np

from kvmem.messages import DType, StreamGeometry

_NUMPY = {DType.FP16: np.dtype("<f2"), DType.FP32: np.dtype("<f4"),
          DType.BF16: np.dtype("<u2")}


def numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype of a payload element (uint16 bits for BF16)."""
    try:
        return _NUMPY[DType(dtype)]
    except (KeyError, ValueError):
        raise ValueError(f"dtype {dtype!r} has no payload element type") from None


def float32_to_bf16(a: np.ndarray) -> np.ndarray:
    """Rounds to bfloat16 (nearest, ties to even) and returns the uint16 bits."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype("<u2")
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    out[nan] = 0x7FC0
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widens bfloat16 bits (uint16) to float32."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << np.uint32(16)).view("<f4")


def stack_kv(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Keys and values, each (layers, kv_heads, tokens, head_dim), as one
    (layers, 2, kv_heads, tokens, head_dim) frame array."""
    keys = np.asarray(keys)
    values = np.asarray(values)
    if keys.shape != values.shape or keys.ndim != 4:
        raise ValueError(
            f"keys {keys.shape} and values {values.shape} must both be "
            "(layers, kv_heads, tokens, head_dim)")
    return np.stack([keys, values], axis=1)


def encode_frame(geometry: StreamGeometry, kv: np.ndarray) -> tuple[int, bytes]:
    """Checks a frame array against the geometry; returns (token_count, payload)."""
    kv = np.asarray(kv)
    g = geometry
    if (kv.ndim != 5 or kv.shape[0] != g.layers or kv.shape[1] != 2
            or kv.shape[2] != g.kv_heads or kv.shape[4] != g.head_dim):
        raise ValueError(
            f"frame array has shape {kv.shape}; the stream needs "
            f"(layers={g.layers}, 2, kv_heads={g.kv_heads}, tokens, "
            f"head_dim={g.head_dim})")
    tokens = int(kv.shape[3])
    dt = DType(g.dtype)
    want = numpy_dtype(dt)
    floating = np.issubdtype(kv.dtype, np.floating)
    if dt is DType.BF16 and kv.dtype == np.uint16:
        payload = kv.astype(want, copy=False)  # Raw bfloat16 bits.
    elif not floating:
        raise ValueError(f"a {dt.name} stream takes floating arrays, not {kv.dtype}")
    elif dt is DType.BF16:
        payload = float32_to_bf16(kv)
    else:
        payload = kv.astype(want, copy=False)
    return tokens, np.ascontiguousarray(payload).tobytes()


def decode_kv(geometry: StreamGeometry, payload: bytes, layers: int) -> np.ndarray:
    """Layer-major bytes of ``layers`` layers -> (layers, 2, kv_heads, tokens, head_dim)."""
    g = geometry
    dt = numpy_dtype(DType(g.dtype))
    per_token = layers * 2 * g.kv_heads * g.head_dim * dt.itemsize
    if per_token == 0 or len(payload) % per_token:
        raise ValueError(
            f"{len(payload)} payload bytes are not a whole number of tokens of "
            f"{layers} layers x 2 x {g.kv_heads} heads x {g.head_dim} x "
            f"{dt.itemsize} bytes")
    tokens = len(payload) // per_token
    return np.frombuffer(payload, dtype=dt).reshape(layers, 2, g.kv_heads, tokens, g.head_dim)

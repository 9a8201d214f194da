"""kvmem.trace: record what a model's attention appends and asks, frame by
frame, as a trace `kvmem eval --trace DIR` replays through a real kvmem-server
and scores against exact attention (docs/traces.md; the format is
proto/kvmem/v1/trace.proto, version 1).

    w = kvmem.trace.TraceWriter("/tmp/my-trace", layers=4, kv_heads=2,
                                head_dim=64, max_tokens_per_frame=256,
                                query_heads_per_kv=4, query_tokens=256)
    for each frame:
        w.frame(kv, track_ids=ids)          # (layers, 2, kv_heads, t, head_dim)
        w.query(q)                          # (layers, query_heads, t, head_dim)
    w.close()

Or as hooks from an attention module (TraceRecorder): each layer hands its
frame's q, k, v to recorder.layer(l, q, k, v), and recorder.end_frame() writes
the frame and its query.

K/V are stored in fp16 (kvmem's wire layout); queries in fp32, RoPE applied as
the model applies it. Labels are optional: per token a track id (>= 0), -1 for
none, -2 for an attention sink; a query of kind "probe" names the re-entering
object, and its targets (the object's tokens before its current visit) are
found from the track ids recorded. numpy arrays or torch tensors (CPU or not)
are accepted; torch itself is not needed.
"""
from __future__ import annotations

import os
import struct
from typing import Optional, Sequence

import numpy as np
from google.protobuf import json_format

from kvmem import _pb
from kvmem.messages import FrameSignals, to_proto

trace_pb = _pb.trace_pb2
types_pb = _pb.types_pb2

FORMAT, VERSION = "kvmem-trace", 1


def _array(x, dtype) -> np.ndarray:
    """A numpy array of x (torch tensors detached and moved to the CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


class TraceWriter:
    """Writes one stream's trace into `directory` (created; its trace.json
    and frames.bin replaced). Use as a context manager, or call close():
    the header is written last, with the frame count."""

    def __init__(self, directory: str, *, layers: int, kv_heads: int, head_dim: int,
                 max_tokens_per_frame: int, query_heads_per_kv: int = 1,
                 query_tokens: int = 0, sink_tokens: int = 0, fps: float = 3.0,
                 values: bool = True, has_labels: bool = False,
                 labels: Optional[dict] = None) -> None:
        if layers < 1 or kv_heads < 1 or head_dim < 2 or head_dim % 2:
            raise ValueError(f"geometry {layers} x {kv_heads} x {head_dim}: layers and "
                             "kv_heads >= 1, head_dim even")
        if not 1 <= max_tokens_per_frame <= 4096:
            raise ValueError(f"max_tokens_per_frame {max_tokens_per_frame} not in [1, 4096]")
        if query_heads_per_kv < 1 or query_heads_per_kv * max(1, query_tokens) > 1024:
            raise ValueError("query_heads_per_kv x max(1, query_tokens) must be in [1, 1024]")
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        h = trace_pb.TraceHeader(format=FORMAT, version=VERSION,
                                 query_heads_per_kv=query_heads_per_kv,
                                 query_tokens=query_tokens, sink_tokens=sink_tokens,
                                 fps=fps, has_values=values, has_labels=has_labels)
        g = h.geometry
        g.layers, g.kv_heads, g.head_dim = layers, kv_heads, head_dim
        g.dtype = types_pb.DTYPE_FP16
        g.max_tokens_per_frame = max_tokens_per_frame
        for k, v in (labels or {}).items():
            h.labels[str(k)] = str(v)
        self.header = h
        self.vectors = query_heads_per_kv * max(1, query_tokens)
        self.summary_dim = layers * kv_heads * head_dim
        self._out = open(os.path.join(directory, "frames.bin"), "wb")
        self._pending: Optional[trace_pb.TraceFrame] = None
        self._frames = 0
        self._position = 0
        # Per track id: the frames (index, [positions]) it appeared in.
        self._seen: dict[int, list[tuple[int, list[int]]]] = {}

    # -- frames and queries ---------------------------------------------------

    def frame(self, kv, *, track_ids: Optional[Sequence[int]] = None,
              signals: Optional[FrameSignals] = None, timestamp_us: Optional[int] = None,
              first_token_position: Optional[int] = None) -> None:
        """Records one frame: kv (layers, 2, kv_heads, tokens, head_dim), [:, 0]
        the keys and [:, 1] the values as the model's attention reads them."""
        g = self.header.geometry
        a = _array(kv, np.float32)
        if (a.ndim != 5 or a.shape[0] != g.layers or a.shape[1] != 2
                or a.shape[2] != g.kv_heads or a.shape[4] != g.head_dim):
            raise ValueError(f"kv has shape {a.shape}; the trace needs (layers={g.layers}, "
                             f"2, kv_heads={g.kv_heads}, tokens, head_dim={g.head_dim})")
        n = a.shape[3]
        if not 1 <= n <= g.max_tokens_per_frame:
            raise ValueError(f"{n} tokens; 1..{g.max_tokens_per_frame} a frame")
        if not self.header.has_values:
            a = a.copy()
            a[:, 1] = 0
        if self.header.has_labels and (track_ids is None or len(track_ids) != n):
            raise ValueError(f"has_labels: {n} track ids needed")
        if not self.header.has_labels and track_ids is not None:
            raise ValueError("track_ids given to a trace without has_labels")
        pos = self._position if first_token_position is None else int(first_token_position)
        if pos != self._position:
            raise ValueError(f"first_token_position {pos}: a version-1 trace's frames are "
                             f"back to back from 0 (this one starts at {self._position})")
        self._flush()  # The previous frame and its queries are complete.
        f = trace_pb.TraceFrame()
        hd = f.header
        hd.frame_index = self._frames
        hd.timestamp_us = int(timestamp_us if timestamp_us is not None
                              else self._frames * 1e6 / self.header.fps)
        hd.first_token_position = pos
        hd.token_count = n
        if signals is not None:
            to_proto(signals, hd.signals)
        f.payload = a.astype("<f2").tobytes()
        if self.header.has_labels:
            ids = [int(t) for t in track_ids]
            f.track_ids.extend(ids)
            for t in set(i for i in ids if i >= 0):
                self._seen.setdefault(t, []).append(
                    (self._frames, [pos + k for k, i in enumerate(ids) if i == t]))
        self._position = pos + n
        self._pending = f

    def query(self, q, *, kind: str = "frame", object: int = -1,
              signals: Optional[FrameSignals] = None,
              position: Optional[int] = None) -> None:
        """Records a query after the last frame. q: (vectors, summary_dim)
        in kvmem's query convention, or (layers, query_heads, tokens,
        head_dim) per-layer query tokens (see query_vectors). kind "probe"
        needs has_labels and the re-entering object's track id."""
        if self._pending is None:
            raise ValueError("query() needs a frame() before it")
        a = _array(q, np.float32)
        if a.ndim == 4:
            a = query_vectors(a, self.header.geometry.kv_heads)
        a = a.reshape(-1, self.summary_dim) if a.size % self.summary_dim == 0 else a
        if a.ndim != 2 or a.shape != (self.vectors, self.summary_dim):
            raise ValueError(f"query has shape {a.shape}; the trace needs ({self.vectors}, "
                             f"{self.summary_dim}) vectors")
        if kind not in ("frame", "probe"):
            raise ValueError(f"kind is {kind!r}; use 'frame' or 'probe'")
        at = self._position if position is None else int(position)
        if at < self._position:
            raise ValueError(f"query position {at} is inside the frame (it ends at "
                             f"{self._position})")
        if kind == "probe" and (not self.header.has_labels or object < 0):
            raise ValueError("a probe needs has_labels and the object's track id")
        tq = trace_pb.TraceQuery(
            kind=trace_pb.TraceQuery.KIND_PROBE if kind == "probe"
            else trace_pb.TraceQuery.KIND_FRAME,
            object=int(object), position=at)
        if signals is not None:
            to_proto(signals, tq.signals)
        if kind == "probe":
            tq.earlier.extend(self._earlier(int(object)))
        tq.q_heads.extend(a.ravel().tolist())
        self._pending.queries.append(tq)  # Only a query that passed every check.

    def _earlier(self, obj: int) -> list[int]:
        """[begin, end) pairs of obj's positions before its current visit
        (the run of consecutive frames ending now that show it)."""
        frames = self._seen.get(obj, [])
        k = len(frames)
        current = self._frames  # The pending frame's index.
        while k > 0 and frames[k - 1][0] == current:
            k -= 1
            current -= 1
        out: list[int] = []
        for _, positions in frames[:k]:
            for p in positions:
                if out and out[-1] == p:
                    out[-1] = p + 1
                else:
                    out.extend([p, p + 1])
        return out

    def _flush(self) -> None:
        if self._pending is None:
            return
        rec = self._pending.SerializeToString()
        self._out.write(struct.pack("<Q", len(rec)))
        self._out.write(rec)
        self._pending = None
        self._frames += 1

    def close(self) -> None:
        """Writes the last frame and the header."""
        if self._out.closed:
            return
        self._flush()
        self._out.close()
        self.header.frames = self._frames
        text = json_format.MessageToJson(self.header, preserving_proto_field_name=True,
                                         including_default_value_fields=True,
                                         sort_keys=True)
        with open(os.path.join(self.dir, "trace.json"), "w") as fh:
            fh.write(text + "\n")

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def query_vectors(q: np.ndarray, kv_heads: int) -> np.ndarray:
    """(layers, query_heads, tokens, head_dim) query tokens -> (tokens *
    group, layers * kv_heads * head_dim): vector t * group + m is token t's
    query head kv_head * group + m of every KV head (kvmem.v1's convention)."""
    layers, hq, t, d = q.shape
    if hq % kv_heads:
        raise ValueError(f"{hq} query heads are not a multiple of {kv_heads} KV heads")
    g = hq // kv_heads
    v = q.reshape(layers, kv_heads, g, t, d).transpose(3, 2, 0, 1, 4)
    return np.ascontiguousarray(v.reshape(t * g, layers * kv_heads * d), dtype=np.float32)


class TraceRecorder:
    """Hooks for an attention module: per frame, each layer calls
    layer(l, q, k, v) with its frame's q (query_heads, tokens, head_dim) and
    k, v (kv_heads, tokens, head_dim), RoPE applied; end_frame() writes the
    frame and, when query_tokens is set, its last query_tokens query tokens
    as the frame's query (a probe when `probe` names a track id)."""

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self._q: dict[int, np.ndarray] = {}
        self._kv: dict[int, np.ndarray] = {}

    def layer(self, layer: int, q, k, v) -> None:
        self._q[layer] = _array(q, np.float32)
        self._kv[layer] = np.stack([_array(k, np.float32), _array(v, np.float32)])

    def end_frame(self, *, track_ids=None, probe: int = -1,
                  signals: Optional[FrameSignals] = None) -> None:
        try:
            layers = self.writer.header.geometry.layers
            missing = [l for l in range(layers) if l not in self._kv]
            if missing:
                raise ValueError(f"layers {missing} were not recorded this frame")
            tq = self.writer.header.query_tokens
            q = None
            if tq:
                if any(self._q[l].shape[1] < tq for l in range(layers)):
                    raise ValueError(f"a frame of fewer than query_tokens={tq} query tokens")
                q = np.stack([self._q[l][:, -tq:] for l in range(layers)])
            kv = np.stack([self._kv[l] for l in range(layers)])
            self.writer.frame(kv, track_ids=track_ids, signals=signals)
            if q is not None:
                self.writer.query(q, kind="probe" if probe >= 0 else "frame",
                                  object=probe, signals=signals)
        finally:
            self._q.clear()
            self._kv.clear()

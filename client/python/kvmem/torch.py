"""kvmem.torch: a model stream's front-end KV cache in PyTorch tensors.

    import kvmem, kvmem.torch
    client = kvmem.Client("unix:/run/kvmem.sock")
    cache = kvmem.torch.StreamCache(client, "cam-0", config, query_heads=32)
    for frame in video:
        cache.append(frame_kv)            # (layers, 2, kv_heads, tokens, head_dim)
        recalled = cache.recall(q)        # q: (layers, query_heads, tokens, head_dim)
        out = cache.attend(q[l], layer=l) # sinks + window + recalled tokens

What the cache holds itself, per layer: the attention sinks (the stream's first
`sink_tokens` positions) and the window (the newest `hot_window_tokens` tokens
after the sinks, the window kvmem does not recall from; kvmem recalls any token
before it, those of the block that straddles its start too, since the cache's
frames follow each other without position gaps), as tensors of the stream's
dtype. `margin_tokens` (0 by default) keeps that many more behind the window.
Every frame also goes to kvmem over one Session, which keeps it as the stream's
memory.

recall(q) turns the frame's query tokens into kvmem's query: with grouped-query
attention, one vector per query token and query head of each KV group,
[indexed_layer][kv_head][head_dim] (docs/api.md), with `window_lse`, each
vector's log-sum-exp over the sinks and the window at each indexed layer and
KV head, computed here from the cached keys (q . k / sqrt(head_dim), fp32).
The recalled tokens come back with the recall (PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR:
only the chosen tokens) through shared memory when the client's target is a
unix socket (`delivery="shm"`), else inline.

Copies: each recalled block's KV is a tensor over the shared-memory mapping,
not a copy (`RecalledKV.blocks[i].kv`; read-only memory: never write to it;
valid until the next recall or release()). The per-layer keys and values that
attention reads are one tensor per layer: the block's own view when one block
was recalled, else one copy joining the blocks (`RecalledKV.copied` says which).
CPU PyTorch 1.13 has no fp16 matmul: attend() computes in fp32 (a conversion
per call).

Positions: the cache appends frames back to back (each frame's first token
position is the end of the previous one), so a recalled token's position is
its block's first_token_position plus its offset in the block. Recalled tokens
at positions the cache holds itself (the sinks, the window) are dropped.

attend(q, layer) is the attention docs/recall.md#gates-and-the-recalled-mass
describes: "joint" (default), one softmax over sinks, window and recalled
tokens; "gated", for a front end that attends to them apart:
(1 - recalled_mass) * o_window + recalled_mass * sum_b gate_b * o_b, where
o_window attends to the sinks and the window and o_b to block b's recalled
tokens alone. recalled_mass is estimated with window_lse over what the cache
held at the recall: keys passed to attend() as extra_kv (the frame's own) are
not in it.

Errors are the client's: kvmem.UnavailableError when the server is gone,
kvmem.NotFoundError when the stream is, and so on (kvmem.errors).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

import kvmem.trace
from kvmem.client import Client, Frame, Session
from kvmem.messages import (DType, FrameSignals, PayloadLayout, RecallResponse,
                            StreamConfig)
from kvmem.shm import Delivery

_TORCH = {DType.FP16: torch.float16, DType.FP32: torch.float32,
          DType.BF16: torch.bfloat16}


def _to_numpy_payload(t: torch.Tensor) -> np.ndarray:
    """A CPU numpy array of a tensor's values (bfloat16 as its uint16 bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _from_numpy(a: np.ndarray, dtype: DType) -> torch.Tensor:
    """A tensor over a numpy array's memory (no copy; read-only arrays too)."""
    bf16 = DType(dtype) is DType.BF16
    with warnings.catch_warnings():
        # The shared-memory views are read-only mappings: torch warns that
        # writing would be undefined; nothing here writes to them.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(a.view(np.int16) if bf16 else a)
    return t.view(torch.bfloat16) if bf16 else t


@dataclass
class RecalledBlockKV:
    """One recalled block's tokens: kv (layers, 2, kv_heads, tokens, head_dim),
    a view of the delivered bytes (shared memory: no copy), their positions,
    offsets in the block, and the block's gate weight."""

    block_id: int
    kv: torch.Tensor
    positions: torch.Tensor
    offsets: list[int]
    gate_weight: float
    mass: float


@dataclass
class RecalledKV:
    """A recall's tokens as tensors, per layer (the layers delivered).

    keys[l] and values[l]: (kv_heads, n_l, head_dim) in the stream's dtype;
    positions[l]: (n_l,) int64; gates[l]: (n_l,) the gate weight of each
    token's block; block_index[l]: (n_l,) which entry of `blocks` each token
    came from. With a shared set every layer has the same tokens.
    """

    response: RecallResponse
    blocks: list[RecalledBlockKV] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)
    gates: list[torch.Tensor] = field(default_factory=list)
    block_index: list[torch.Tensor] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)  # the layers delivered
    copied: bool = False  # keys/values are a copy (else views of the delivery)
    shared_memory: bool = False  # delivered through the shared-memory arena
    delivered_bytes: int = 0
    dropped_tokens: int = 0  # recalled at positions the cache holds itself
    _delivery: Optional[Delivery] = None

    @property
    def tokens(self) -> int:
        return int(self.positions[0].numel()) if self.positions else 0

    def layer_index(self, layer: int) -> int:
        """Where `layer` is in keys/values; ValueError when not delivered."""
        try:
            return self.layers.index(layer)
        except ValueError:
            raise ValueError(f"layer {layer} was not delivered (layers "
                             f"{self.layers})") from None

    def release(self, now: bool = False) -> None:
        """Gives the delivery's lease back: with the client's next recall, or
        at once (a round trip of its own) with now; the views are invalid
        after it."""
        d, self._delivery = self._delivery, None
        self.blocks, self.keys, self.values = [], [], []
        if d is not None:
            d.release() if now else d.release_later()


class StreamCache:
    """A front end's KV cache for one model stream, backed by kvmem.

    config: the stream's kvmem.StreamConfig (its geometry is the model's:
    layers, kv_heads, head_dim, dtype, max_tokens_per_frame; its
    hot_window_tokens is the window kept here). query_heads: the model's
    query heads (a multiple of kv_heads; grouped-query attention).
    sink_tokens: the stream's first tokens, kept for good. delivery: "shm"
    (shared memory, the client's target must be this host's unix socket) or
    "inline". The stream is opened (or resumed) with config on a Session;
    a resumed stream starts with an empty window here.
    """

    def __init__(self, client: Client, stream_id: str, config: StreamConfig, *,
                 query_heads: Optional[int] = None, sink_tokens: int = 4,
                 delivery: str = "shm", margin_tokens: int = 0) -> None:
        g = config.geometry
        if g.layers <= 0 or g.kv_heads <= 0 or g.head_dim <= 0:
            raise ValueError(f"config.geometry {g} needs layers, kv_heads and head_dim")
        self.query_heads = int(query_heads or g.kv_heads)
        if self.query_heads % g.kv_heads:
            raise ValueError(f"query_heads {self.query_heads} is not a multiple of "
                             f"kv_heads {g.kv_heads}")
        if delivery not in ("shm", "inline"):
            raise ValueError(f"delivery is {delivery!r}; use 'shm' or 'inline'")
        if sink_tokens < 0:
            raise ValueError(f"sink_tokens is {sink_tokens}")
        if margin_tokens < 0:
            raise ValueError(f"margin_tokens is {margin_tokens}")
        self.client = client
        self.stream_id = stream_id
        self.delivery = delivery
        self.sink_tokens = int(sink_tokens)
        self.session: Session = client.session(stream_id, config)
        stats = self.session.opened.stats
        self.config = stats.config
        self.geometry = self.config.geometry
        self.window_tokens = int(self.config.hot_window_tokens)
        # kvmem recalls every token before its window at token resolution,
        # those of the block that straddles the window's start too (its
        # frames' positions follow each other, as the cache appends them):
        # no margin is needed. One kept anyway is held exactly, and kvmem's
        # recalls of its tokens are dropped (dropped_tokens).
        self.margin_tokens = int(margin_tokens)
        self.indexed_layers = list(self.config.index_policy.indexed_layers) or \
            list(range(self.geometry.layers))
        self.dtype = _TORCH[DType(self.geometry.dtype)]
        self.next_position = int(stats.next_token_position)
        self.recalled: Optional[RecalledKV] = None
        shape = (self.geometry.layers, 2, self.geometry.kv_heads, 0, self.geometry.head_dim)
        self._sinks = torch.zeros(shape, dtype=self.dtype)
        self._sink_pos = torch.zeros(0, dtype=torch.int64)
        self._window = torch.zeros(shape, dtype=self.dtype)
        self._window_pos = torch.zeros(0, dtype=torch.int64)

    # -- what the cache holds ---------------------------------------------

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.query_heads // self.geometry.kv_heads

    def held(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys, values, positions) the cache holds at `layer`: the sinks
        then the window, keys/values (kv_heads, n, head_dim)."""
        k = torch.cat([self._sinks[layer, 0], self._window[layer, 0]], dim=1)
        v = torch.cat([self._sinks[layer, 1], self._window[layer, 1]], dim=1)
        return k, v, torch.cat([self._sink_pos, self._window_pos])

    def held_bytes(self) -> int:
        """Bytes of KV the cache holds itself (sinks and window)."""
        return (self._sinks.numel() + self._window.numel()) * self._sinks.element_size()

    # -- append -------------------------------------------------------------

    def append(self, frame_kv, *, signals: Optional[FrameSignals] = None,
               timestamp_us: int = 0):
        """Streams one frame to kvmem and into the window; returns its ack.

        frame_kv: a (layers, 2, kv_heads, tokens, head_dim) tensor ([:, 0] the
        keys, [:, 1] the values), or a (keys, values) pair of (layers,
        kv_heads, tokens, head_dim) tensors.
        """
        if isinstance(frame_kv, (tuple, list)):
            if len(frame_kv) != 2:
                raise ValueError("frame_kv as a pair is (keys, values)")
            frame_kv = torch.stack([torch.as_tensor(frame_kv[0]),
                                    torch.as_tensor(frame_kv[1])], dim=1)
        kv = torch.as_tensor(frame_kv)
        g = self.geometry
        if (kv.dim() != 5 or kv.shape[0] != g.layers or kv.shape[1] != 2
                or kv.shape[2] != g.kv_heads or kv.shape[4] != g.head_dim):
            raise ValueError(
                f"frame_kv has shape {tuple(kv.shape)}; the stream needs "
                f"(layers={g.layers}, 2, kv_heads={g.kv_heads}, tokens, "
                f"head_dim={g.head_dim})")
        ack = self.session.append(Frame(kv=_to_numpy_payload(kv.to(self.dtype)),
                                        first_token_position=self.next_position,
                                        timestamp_us=timestamp_us, signals=signals))
        tokens = int(kv.shape[3])
        pos = torch.arange(self.next_position, self.next_position + tokens)
        self.next_position += tokens
        kv = kv.detach().to(device="cpu", dtype=self.dtype)
        # The sinks are the stream's first positions (none on a stream
        # resumed past them).
        start = int(pos[0]) if tokens else self.next_position
        take = max(0, min(tokens, self.sink_tokens - start))
        if take:
            self._sinks = torch.cat([self._sinks, kv[:, :, :, :take]], dim=3)
            self._sink_pos = torch.cat([self._sink_pos, pos[:take]])
        self._window = torch.cat([self._window, kv[:, :, :, take:]], dim=3)
        self._window_pos = torch.cat([self._window_pos, pos[take:]])
        over = int(self._window_pos.numel()) - self.window_tokens - self.margin_tokens
        if over > 0:
            self._window = self._window[:, :, :, over:].clone()
            self._window_pos = self._window_pos[over:].clone()
        return ack

    # -- recall -------------------------------------------------------------

    def query_vectors(self, q: torch.Tensor) -> torch.Tensor:
        """kvmem's query vectors of a frame's query tokens.

        q: (layers, query_heads, tokens, head_dim) (every layer), or
        (len(indexed_layers), query_heads, tokens, head_dim) (the indexed
        ones). Returns (tokens * group, summary_dim) fp32: for token t and
        group member m, [indexed_layer][kv_head][head_dim] of query head
        kv_head * group + m."""
        q = self._indexed_queries(q).float().numpy()
        return torch.from_numpy(kvmem.trace.query_vectors(q, self.geometry.kv_heads))

    def window_lse(self, q: torch.Tensor) -> torch.Tensor:
        """Each query vector's log-sum-exp over what the cache holds, laid out
        [vector][indexed_layer][kv_head] (RecallRequest.window_lse); -inf
        rows mean an empty cache."""
        q = self._indexed_queries(q).float()
        li, hq, t, d = q.shape
        kv = self.geometry.kv_heads
        out = torch.empty(t, self.group, li, kv)
        scale = 1.0 / math.sqrt(d)
        for i, layer in enumerate(self.indexed_layers):
            k, _, _ = self.held(layer)
            k = k.float()  # (kv, n, d)
            qq = q[i].reshape(kv, self.group, t, d)
            logits = torch.einsum("hgtd,hnd->hgtn", qq, k) * scale
            out[:, :, i, :] = torch.logsumexp(logits, dim=-1).permute(2, 1, 0)
        return out.reshape(-1)

    def recall(self, q: torch.Tensor, *, max_tokens: int = 0,
               signals: Optional[FrameSignals] = None, per_layer: bool = False,
               layers: Optional[Sequence[int]] = None,
               identity_share: Optional[float] = None, mass_target: float = 0.0,
               send_window_lse: bool = True) -> RecalledKV:
        """Asks kvmem for the frame's recall set and returns its tokens.

        q: the frame's query tokens (see query_vectors). per_layer: a set per
        indexed layer (the other layers get every delivered token). layers:
        the layers to deliver (default every layer). The previous recall's
        views are released (its lease goes back with this call)."""
        if self.recalled is not None:
            self.recalled.release()
            self.recalled = None
        vectors = self.query_vectors(q)
        lse = self.window_lse(q) if send_window_lse and self._held_tokens() else None
        layers = list(range(self.geometry.layers)) if layers is None else list(layers)
        resp, delivery = self.session.recall_delivered(
            vectors.numpy(), mode=self.delivery,
            layout=PayloadLayout.TOKEN_LAYER_MAJOR, layers=layers,
            max_tokens=max_tokens, signals=signals, per_layer=per_layer,
            window_lse=None if lse is None else lse.numpy(),
            identity_share=identity_share, mass_target=mass_target)
        self.recalled = self._recalled_kv(resp, delivery, layers, per_layer)
        return self.recalled

    def _held_tokens(self) -> int:
        return int(self._sink_pos.numel() + self._window_pos.numel())

    def _indexed_queries(self, q: torch.Tensor) -> torch.Tensor:
        q = torch.as_tensor(q)
        g = self.geometry
        if q.dim() != 4 or q.shape[1] != self.query_heads or q.shape[3] != g.head_dim:
            raise ValueError(f"q has shape {tuple(q.shape)}; need (layers, "
                             f"query_heads={self.query_heads}, tokens, "
                             f"head_dim={g.head_dim})")
        if q.shape[0] == g.layers and len(self.indexed_layers) != g.layers:
            q = q[self.indexed_layers]
        if q.shape[0] != len(self.indexed_layers):
            raise ValueError(f"q has {q.shape[0]} layers; need {g.layers} (every "
                             f"layer) or {len(self.indexed_layers)} (the indexed ones)")
        return q.detach().cpu()

    def _recalled_kv(self, resp: RecallResponse, delivery: Delivery,
                     layers: list[int], per_layer: bool) -> RecalledKV:
        out = RecalledKV(response=resp, shared_memory=delivery._arena is not None,
                         delivered_bytes=delivery.nbytes, layers=list(layers),
                         _delivery=delivery)
        info = {}
        for b in resp.blocks:
            info[b.block_id] = b
        for s in resp.layer_sets:
            for b in s.blocks:
                info.setdefault(b.block_id, b)
        held = set(self._sink_pos.tolist()) | set(self._window_pos.tolist())
        keep_blocks = []  # (block entry, kept token indices in its kv)
        for sb in delivery.blocks:
            b = info.get(sb.block_id)
            if b is None or sb.kv is None:
                continue
            offsets = sb.token_offsets if sb.token_offsets is not None else \
                list(range(sb.kv.shape[3]))
            kv = _from_numpy(sb.kv, self.geometry.dtype)
            pos = torch.tensor([b.first_token_position + o for o in offsets],
                               dtype=torch.int64)
            out.blocks.append(RecalledBlockKV(sb.block_id, kv, pos, offsets,
                                              b.gate_weight, b.mass))
            keep = [i for i, p in enumerate(pos.tolist()) if p not in held]
            out.dropped_tokens += len(offsets) - len(keep)
            keep_blocks.append(keep)
        # The union of every block's kept tokens, in delivery order.
        parts_k, parts_v, parts_p, parts_g, parts_b = [], [], [], [], []
        views = True  # every part is a block's view, not a gathered copy
        for bi, (blk, keep) in enumerate(zip(out.blocks, keep_blocks)):
            if not keep:
                continue
            whole = len(keep) == len(blk.offsets)
            views = views and whole
            idx = torch.tensor(keep, dtype=torch.int64)
            kv = blk.kv if whole else blk.kv.index_select(3, idx)
            parts_k.append(kv[:, 0])
            parts_v.append(kv[:, 1])
            parts_p.append(blk.positions[idx])
            parts_g.append(torch.full((len(keep),), blk.gate_weight))
            parts_b.append(torch.full((len(keep),), bi, dtype=torch.int64))
        g = self.geometry
        if parts_k:
            keys = parts_k[0] if len(parts_k) == 1 else torch.cat(parts_k, dim=2)
            values = parts_v[0] if len(parts_v) == 1 else torch.cat(parts_v, dim=2)
            out.copied = not (views and len(parts_k) == 1)
            pos, gates, bidx = torch.cat(parts_p), torch.cat(parts_g), torch.cat(parts_b)
        else:
            keys = values = torch.zeros((len(layers), g.kv_heads, 0, g.head_dim),
                                        dtype=self.dtype)
            pos = torch.zeros(0, dtype=torch.int64)
            gates = torch.zeros(0)
            bidx = torch.zeros(0, dtype=torch.int64)
        sets = {s.layer: s for s in resp.layer_sets} if per_layer else {}
        for i, layer in enumerate(layers):
            s = sets.get(layer)
            if s is None:
                out.keys.append(keys[i])
                out.values.append(values[i])
                out.positions.append(pos)
                out.gates.append(gates)
                out.block_index.append(bidx)
                continue
            # This layer's own set: the delivered tokens it names.
            chosen = set()
            for b in s.blocks:
                offs = b.token_offsets or range(b.token_count)
                chosen.update(b.first_token_position + o for o in offs)
            mask = torch.tensor([p in chosen for p in pos.tolist()], dtype=torch.bool)
            out.keys.append(keys[i][:, mask])
            out.values.append(values[i][:, mask])
            out.positions.append(pos[mask])
            out.gates.append(gates[mask])
            out.block_index.append(bidx[mask])
            out.copied = True
        return out

    # -- attention ----------------------------------------------------------

    def attend(self, q: torch.Tensor, layer: int, *, mode: str = "joint",
               recalled: Optional[RecalledKV] = None,
               q_positions: Optional[torch.Tensor] = None,
               extra_kv: Optional[tuple] = None) -> torch.Tensor:
        """Attention of one layer's query tokens over the sinks, the window
        and the recalled tokens (docs/recall.md#gates-and-the-recalled-mass).

        q: (query_heads, tokens, head_dim). mode "joint" or "gated".
        recalled: default the last recall (None after release: sinks and
        window only). q_positions: (tokens,) positions of the query tokens;
        keys at later positions are masked (causal within the frame).
        extra_kv: (keys, values, positions) the cache does not hold yet,
        e.g. the current frame's own (kv_heads, n, head_dim) before it is
        appended: attended as part of the window. Returns (query_heads,
        tokens, head_dim) fp32."""
        if mode not in ("joint", "gated"):
            raise ValueError(f"mode is {mode!r}; use 'joint' or 'gated'")
        r = self.recalled if recalled is None else recalled
        k_h, v_h, p_h = self.held(layer)
        if extra_kv is not None:
            k_x, v_x, p_x = extra_kv
            k_h = torch.cat([k_h.float(), torch.as_tensor(k_x).float()], dim=1)
            v_h = torch.cat([v_h.float(), torch.as_tensor(v_x).float()], dim=1)
            p_h = torch.cat([p_h, torch.as_tensor(p_x, dtype=torch.int64)])
        if r is not None and r.keys:
            li = r.layer_index(layer)
            k_r, v_r, p_r = r.keys[li], r.values[li], r.positions[li]
        else:
            k_r = v_r = torch.zeros((self.geometry.kv_heads, 0, self.geometry.head_dim))
            p_r = torch.zeros(0, dtype=torch.int64)
        q = torch.as_tensor(q).float()
        if mode == "joint":
            return attention(q, torch.cat([k_h.float(), k_r.float()], dim=1),
                              torch.cat([v_h.float(), v_r.float()], dim=1),
                              torch.cat([p_h, p_r]), q_positions, self.group)
        o_w = attention(q, k_h.float(), v_h.float(), p_h, q_positions, self.group)
        if r is None or p_r.numel() == 0:
            return o_w
        if r.response.layer_sets:
            raise ValueError("gated attention needs a shared recall set "
                             "(per_layer=False)")
        li = r.layer_index(layer)
        bidx = r.block_index[li]
        o_r = torch.zeros_like(o_w)
        total_gate = 0.0
        for bi, blk in enumerate(r.blocks):
            sel = bidx == bi
            if not bool(sel.any()):
                continue
            o_b = attention(q, k_r[:, sel].float(), v_r[:, sel].float(), p_r[sel],
                             q_positions, self.group)
            o_r += blk.gate_weight * o_b
            total_gate += blk.gate_weight
        if total_gate <= 0:
            return o_w
        m = float(r.response.recalled_mass)
        return (1.0 - m) * o_w + m * (o_r / total_gate)

    # -- lifetime -----------------------------------------------------------

    def _drop_recalled(self) -> None:
        """Gives the last recall's lease back now (not with a next call)."""
        r, self.recalled = self.recalled, None
        if r is None:
            return
        try:
            r.release(now=True)
        except Exception:  # A lease the server reclaimed, or a lost server.
            pass

    def close(self) -> None:
        """Releases the last recall's lease and half-closes the Session."""
        self._drop_recalled()
        self.session.close()

    def __enter__(self) -> "StreamCache":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._drop_recalled()
            self.session.cancel()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              k_pos: torch.Tensor, q_pos: Optional[torch.Tensor],
              group: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v per query head; query head h reads KV head
    h // group; with q_pos, keys at later positions than a query's are
    masked. q (hq, t, d), k/v (hkv, n, d) fp32; an empty key set gives
    zeros. What attend() computes over the keys it gathers."""
    hq, t, d = q.shape
    if k.shape[1] == 0:
        return torch.zeros(hq, t, v.shape[2])
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    logits = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(d)
    if q_pos is not None:
        mask = k_pos.view(1, 1, -1) > torch.as_tensor(q_pos).view(1, -1, 1)
        logits = logits.masked_fill(mask, float("-inf"))
    w = torch.softmax(logits, dim=-1)
    return torch.nan_to_num(torch.matmul(w, v))

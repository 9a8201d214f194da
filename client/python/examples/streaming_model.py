#!/usr/bin/env python3
"""A streaming video model in PyTorch, run three ways: with full attention,
with a window only, and with kvmem (kvmem.torch.StreamCache). It prints, per
block of frames, each run's attention output error against full attention,
the KV memory the front end holds, and kvmem's recall + delivery latency,
and writes a CSV and (with gnuplot) a plot.

The model: a small GQA transformer with RoPE and random weights (seeded; no
downloads): `--layers` blocks of pre-norm attention (query heads share each KV
head) and an MLP. Its keys and queries share a projection, so a token attends
to tokens like it: what it saw before. The video: `--tokens` embeddings a
frame, most of them a scene (one of a few, cut between every few seconds) and
a few an object; objects leave and come back after long absences (tens of
seconds), so attention reaches far behind any window.

kvmem's run, per frame: a draft pass attending to the sinks and window gives
every layer's queries; one recall with them (window_lse computed by the cache;
only the recalled tokens delivered, through shared memory); then the real pass
attends to sinks + window + recalled tokens + the frame's own (causal), and the
frame's K/V are appended. The error is the relative L2 error of the last
layer's hidden states of the frame's tokens against the full-attention run's
(each run keeps its own caches, so errors propagate as they would).

    build/bin/kvmem-server --unix_socket=/tmp/kvmem.sock --data_dir=/tmp/kvmem-data &
    PYTHONPATH=build/python:client/python /usr/bin/python3 \\
        client/python/examples/streaming_model.py --addr=unix:/tmp/kvmem.sock \\
        --frames=2000 --out=/tmp/streaming-model
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time

import torch

import kvmem
import kvmem.torch as kt
import kvmem.trace


class Model:
    """A GQA transformer with RoPE and random, seeded weights."""

    def __init__(self, layers: int, d_model: int, query_heads: int, kv_heads: int,
                 seed: int, rope_base: float, sharpness: float) -> None:
        g = torch.Generator().manual_seed(seed)
        self.layers, self.hq, self.hkv = layers, query_heads, kv_heads
        self.hd = d_model // query_heads
        self.rope_base = rope_base

        def w(i, o, scale=1.0):
            return torch.randn(i, o, generator=g) * (scale / math.sqrt(i))

        self.wk = [w(d_model, kv_heads * self.hd, sharpness) for _ in range(layers)]
        # Each query head reads its KV head's key projection (plus a little
        # of its own): tokens attend to tokens like them.
        self.wq = [k.view(d_model, kv_heads, self.hd)
                   .repeat_interleave(query_heads // kv_heads, dim=1)
                   .reshape(d_model, query_heads * self.hd)
                   + w(d_model, query_heads * self.hd, 0.3 * sharpness)
                   for k in self.wk]
        self.wv = [w(d_model, kv_heads * self.hd) for _ in range(layers)]
        self.wo = [w(query_heads * self.hd, d_model, 0.5) for _ in range(layers)]
        self.w1 = [w(d_model, 2 * d_model) for _ in range(layers)]
        self.w2 = [w(2 * d_model, d_model, 0.5) for _ in range(layers)]

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x (heads, t, hd) rotated by position (pairs of dimensions)."""
        half = self.hd // 2
        freq = self.rope_base ** (-torch.arange(half, dtype=torch.float32) / half)
        ang = pos.float()[:, None] * freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, attend):
        """One frame's tokens x (t, d_model) through every layer;
        attend(layer, q, k, v) -> (hq, t, hd). Returns the hidden states,
        the frame's K/V (layers, 2, hkv, t, hd) and its queries (layers, hq,
        t, hd)."""
        t = x.shape[0]
        kvs, qs = [], []
        for l in range(self.layers):
            h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
            q = self.rope((h @ self.wq[l]).view(t, self.hq, self.hd).transpose(0, 1), pos)
            k = self.rope((h @ self.wk[l]).view(t, self.hkv, self.hd).transpose(0, 1), pos)
            v = (h @ self.wv[l]).view(t, self.hkv, self.hd).transpose(0, 1)
            o = attend(l, q, k, v)
            x = x + o.transpose(0, 1).reshape(t, self.hq * self.hd) @ self.wo[l]
            h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
            x = x + torch.nn.functional.gelu(h @ self.w1[l]) @ self.w2[l]
            kvs.append(torch.stack([k, v]))
            qs.append(q)
        return x, torch.stack(kvs), torch.stack(qs)


def attention(q, k, v, k_pos, q_pos, group):
    """Causal softmax attention, query head h reading KV head h // group."""
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    logits = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(k_pos.view(1, 1, -1) > q_pos.view(1, -1, 1), float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


class Video:
    """Frame embeddings: a scene's tokens and an object's, seeded."""

    def __init__(self, d_model: int, tokens: int, seed: int, fps: float) -> None:
        self.g = torch.Generator().manual_seed(seed + 1)
        self.tokens, self.d = tokens, d_model
        self.scenes = torch.randn(4, d_model, generator=self.g) * 2
        self.objects = torch.randn(12, d_model, generator=self.g) * 2
        self.fps = fps
        self.scene, self.obj, self.left = 0, 0, 0
        self.seen: set[int] = set()
        self.reentry = False  # This frame starts a visit of an object seen before.

    def frame(self, f: int) -> torch.Tensor:
        self.reentry = False
        if self.left <= 0:  # A cut: a new scene and object for 3-10 s.
            self.scene = int(torch.randint(0, 4, (1,), generator=self.g))
            obj = int(torch.randint(0, 12, (1,), generator=self.g))
            self.reentry = obj != self.obj and obj in self.seen
            self.obj = obj
            self.seen.add(obj)
            self.left = int(self.fps * float(torch.empty(1).uniform_(3, 10, generator=self.g)))
        self.left -= 1
        n_obj = self.tokens // 4
        x = torch.randn(self.tokens, self.d, generator=self.g)
        x[:-n_obj] += self.scenes[self.scene]
        x[-n_obj:] += self.objects[self.obj]
        return x

    def track_ids(self, f: int, sinks: int) -> list[int]:
        """Per token of the frame just made: its object, -1 scene, -2 sink."""
        n_obj = self.tokens // 4
        ids = [-1] * (self.tokens - n_obj) + [self.obj] * n_obj
        if f == 0:
            ids[:sinks] = [-2] * sinks
        return ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", default="unix:/tmp/kvmem.sock")
    ap.add_argument("--stream", default="torch-model")
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=16, help="tokens a frame")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--query_heads", type=int, default=8)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--window", type=int, default=256, help="hot window tokens")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--budget", type=int, default=128, help="recalled tokens a frame")
    ap.add_argument("--rope_base", type=float, default=1e6)
    ap.add_argument("--sharpness", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--report_every", type=int, default=100, help="frames per row")
    ap.add_argument("--out", default="", help="directory for CSV and plot")
    ap.add_argument("--trace", default="",
                    help="record the full-attention run as a kvmem trace in this "
                         "directory (kvmem.trace; replay: kvmem eval --trace DIR)")
    ap.add_argument("--no_kvmem", action="store_true",
                    help="full attention and the window only (no server needed)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = Model(a.layers, a.d_model, a.query_heads, a.kv_heads, a.seed, a.rope_base,
                  a.sharpness)
    video = Video(a.d_model, a.tokens, a.seed, fps=3.0)
    group, hd = a.query_heads // a.kv_heads, model.hd
    config = kvmem.StreamConfig(
        geometry=kvmem.StreamGeometry(layers=a.layers, kv_heads=a.kv_heads, head_dim=hd,
                                      dtype=kvmem.DType.FP32,
                                      max_tokens_per_frame=a.tokens),
        hot_window_tokens=a.window,
        labels={"example": "streaming_model.py"})
    client = cache = None
    if not a.no_kvmem:
        client = kvmem.Client(a.addr, timeout=60)
        try:
            client.delete_stream(a.stream)
        except kvmem.NotFoundError:
            pass
        cache = kt.StreamCache(client, a.stream, config, query_heads=a.query_heads,
                               sink_tokens=a.sinks,
                               delivery="shm" if a.addr.startswith("unix:") else "inline")
    recorder = None
    if a.trace:
        recorder = kvmem.trace.TraceRecorder(kvmem.trace.TraceWriter(
            a.trace, layers=a.layers, kv_heads=a.kv_heads, head_dim=hd,
            max_tokens_per_frame=a.tokens, query_heads_per_kv=group,
            query_tokens=a.tokens, sink_tokens=a.sinks, fps=3.0, has_labels=True,
            labels={"model": "examples/streaming_model.py", "seed": a.seed,
                    "layers": a.layers, "d_model": a.d_model,
                    "rope_base": a.rope_base}))
    full_kv = torch.zeros(a.layers, 2, a.kv_heads, 0, hd)  # The full run's cache.
    win = {"kv": torch.zeros(a.layers, 2, a.kv_heads, 0, hd),
           "pos": torch.zeros(0, dtype=torch.int64)}
    rows, acc = [], {"full": 0.0, "win": 0.0, "kv": 0.0, "n": 0, "lat": [], "tok": 0}
    for f in range(a.frames):
        x = video.frame(f)
        pos = torch.arange(f * a.tokens, (f + 1) * a.tokens)
        all_pos = torch.arange(0, f * a.tokens)

        def full_attend(l, q, k, v):
            if recorder is not None:
                recorder.layer(l, q, k, v)
            keys = torch.cat([full_kv[l, 0], k], dim=1)
            vals = torch.cat([full_kv[l, 1], v], dim=1)
            return attention(q, keys, vals, torch.cat([all_pos, pos]), pos, group)

        h_full, kv_full, _ = model.forward(x, pos, full_attend)
        full_kv = torch.cat([full_kv, kv_full], dim=3)
        if recorder is not None:
            recorder.end_frame(track_ids=video.track_ids(f, a.sinks),
                               probe=video.obj if video.reentry else -1)

        def win_attend(l, q, k, v):
            keys = torch.cat([win["kv"][l, 0], k], dim=1)
            vals = torch.cat([win["kv"][l, 1], v], dim=1)
            return attention(q, keys, vals, torch.cat([win["pos"], pos]), pos, group)

        h_win, kv_win, _ = model.forward(x, pos, win_attend)
        win["kv"] = torch.cat([win["kv"], kv_win], dim=3)
        win["pos"] = torch.cat([win["pos"], pos])
        keep = (win["pos"] < a.sinks) | (win["pos"] >= (f + 1) * a.tokens - a.window)
        win["kv"], win["pos"] = win["kv"][:, :, :, keep], win["pos"][keep]

        h_kv, recalled, lat = h_full, None, 0.0
        if cache is not None:
            # kvmem: draft pass (sinks + window) for the queries, recall, real pass.
            def draft_attend(l, q, k, v):
                kh, vh, ph = cache.held(l)
                return kt.attention(q, torch.cat([kh.float(), k], dim=1),
                                    torch.cat([vh.float(), v], dim=1),
                                    torch.cat([ph, pos]), pos, group)

            _, _, q_draft = model.forward(x, pos, draft_attend)
            t0 = time.perf_counter()
            recalled = cache.recall(q_draft, max_tokens=a.budget) if f * a.tokens > a.window \
                else None
            lat = time.perf_counter() - t0

            def kvmem_attend(l, q, k, v):
                return cache.attend(q, l, q_positions=pos, extra_kv=(k, v, pos))

            h_kv, kv_kv, _ = model.forward(x, pos, kvmem_attend)
            cache.append(kv_kv)
        norm = float(h_full.norm())
        acc["win"] += float((h_win - h_full).norm()) / norm
        acc["kv"] += float((h_kv - h_full).norm()) / norm
        acc["n"] += 1
        if recalled is not None:
            acc["lat"].append(lat)
            acc["tok"] += recalled.tokens
        if (f + 1) % a.report_every == 0 or f + 1 == a.frames:
            lat_ms = sorted(1e3 * t for t in acc["lat"])
            row = {
                "frame": f + 1,
                "window_rel_error": acc["win"] / acc["n"],
                "kvmem_rel_error": acc["kv"] / acc["n"] if cache is not None else float("nan"),
                "full_kib": full_kv.numel() * 4 / 1024,
                "window_kib": win["kv"].numel() * 4 / 1024,
                "kvmem_kib": 0.0 if cache is None else
                (cache.held_bytes() + (recalled.tokens if recalled else 0)
                 * a.layers * 2 * a.kv_heads * hd * 4) / 1024,
                "recalled_tokens": acc["tok"] / max(1, len(acc["lat"])),
                "recall_p50_ms": lat_ms[len(lat_ms) // 2] if lat_ms else 0.0,
                "recall_p99_ms": lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))]
                if lat_ms else 0.0,
            }
            rows.append(row)
            if not a.json:
                print(f"frames {row['frame']:5d}  rel. error: window {row['window_rel_error']:.4f}"
                      f"  kvmem {row['kvmem_rel_error']:.4f}  |  KiB held: full "
                      f"{row['full_kib']:.0f}  window {row['window_kib']:.0f}  kvmem "
                      f"{row['kvmem_kib']:.0f}  |  recall+delivery p50 "
                      f"{row['recall_p50_ms']:.2f} ms p99 {row['recall_p99_ms']:.2f} ms "
                      f"({row['recalled_tokens']:.0f} tokens)", flush=True)
            acc = {"full": 0.0, "win": 0.0, "kv": 0.0, "n": 0, "lat": [], "tok": 0}
    if cache is not None:
        cache.close()
        client.close()
    if recorder is not None:
        recorder.writer.close()
        print(f"wrote a trace of {a.frames} frames to {a.trace}", file=sys.stderr)
    if a.out:
        write_outputs(a.out, rows)
    if a.json:
        print(json.dumps({"rows": rows, "args": vars(a)}, indent=1))
    return 0


def write_outputs(out: str, rows: list) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "streaming_model.csv")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}", file=sys.stderr)
    if shutil.which("gnuplot") is None:
        return
    script = (
        "set terminal pngcairo size 1000,600 font 'sans,11' noenhanced\n"
        "set output 'streaming_model.png'\nset datafile separator ','\n"
        "set key autotitle columnhead\nset xlabel 'frame'\n"
        "set ylabel 'output rel. error vs full attention'\n"
        "set title 'Reference model: window only vs kvmem (mean per row of frames)'\n"
        "plot 'streaming_model.csv' using 1:2 with linespoints title 'window only', "
        "'' using 1:3 with linespoints title 'kvmem'\n"
        "set output 'streaming_model_cost.png'\n"
        "set title 'Reference model: what each run holds, and kvmem recall + delivery'\n"
        "set ylabel 'KiB of KV held'\nset y2label 'ms'\nset y2tics\nset logscale y\n"
        "plot 'streaming_model.csv' using 1:4 with linespoints title 'full KiB', "
        "'' using 1:5 with linespoints title 'window KiB', "
        "'' using 1:6 with linespoints title 'kvmem KiB', "
        "'' using 1:8 axes x1y2 with linespoints title 'recall p50 ms', "
        "'' using 1:9 axes x1y2 with linespoints title 'recall p99 ms'\n")
    subprocess.run(["gnuplot"], input=script.encode(), cwd=out, check=False)
    for png in ("streaming_model.png", "streaming_model_cost.png"):
        print(f"wrote {os.path.join(out, png)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

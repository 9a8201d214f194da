#!/usr/bin/env python3
"""An inference front end, played with numpy: streams one camera's KV cache
into kvmem-server, asks which old blocks to bring back for a few queries,
fetches them and checks their bytes.

The camera cuts between a few scenes (places). Every token's key at layer l,
head h is 4 * u[scene, l, h] + N(0, 1), with u a unit direction per scene, so a
block's mean key points at its scene; a query for a scene is its directions
u[scene] (plus a little noise). Recall should then return the old blocks of
that scene: the summary prints the share of recalled tokens that are.

Everything is a function of --seed and the frame index, so a rerun resumes an
existing stream where it stopped (at last_durable_frame + 1) with the same
data.

    PYTHONPATH=build/python:client/python /usr/bin/python3 \\
        client/python/examples/frontend.py --addr=unix:/tmp/kvmem.sock --frames=96
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Iterator

import numpy as np

import kvmem

# The `kvmem demo` defaults.
LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 64
TOKENS_PER_FRAME, FRAMES_PER_BLOCK, HOT_WINDOW = 32, 4, 512
KEY_SCALE = 4.0
SHOT_FRAMES = (3, 10)  # Shortest and longest shot, frames.


def stream_config() -> kvmem.StreamConfig:
    return kvmem.StreamConfig(
        geometry=kvmem.StreamGeometry(layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                      dtype=kvmem.DType.FP16,
                                      max_tokens_per_frame=TOKENS_PER_FRAME),
        hot_window_tokens=HOT_WINDOW,
        block_policy=kvmem.BlockPolicy(frames_per_block=FRAMES_PER_BLOCK,
                                       mode=kvmem.SegmentMode.SHOT),
        labels={"camera": "frontend.py"})


def scene_directions(seed: int, scenes: int) -> np.ndarray:
    """Unit key directions, (scenes, layers, kv_heads, head_dim)."""
    rng = np.random.default_rng([seed, 1])
    u = rng.standard_normal((scenes, LAYERS, KV_HEADS, HEAD_DIM))
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def scene_schedule(seed: int, frames: int, scenes: int) -> list[int]:
    """The scene of each frame: shots of 3..10 frames, never the same scene twice in a row."""
    rng = np.random.default_rng([seed, 2])
    out: list[int] = []
    scene = -1
    while len(out) < frames:
        choices = [s for s in range(scenes) if s != scene] or [0]
        scene = int(rng.choice(choices))
        out += [scene] * int(rng.integers(SHOT_FRAMES[0], SHOT_FRAMES[1] + 1))
    return out[:frames]


def make_frame(seed: int, index: int, direction: np.ndarray) -> np.ndarray:
    """Frame `index`: (layers, 2, kv_heads, tokens, head_dim) fp16; keys around
    KEY_SCALE * direction, values N(0, 1)."""
    rng = np.random.default_rng([seed, 3, index])
    kv = rng.standard_normal((LAYERS, 2, KV_HEADS, TOKENS_PER_FRAME, HEAD_DIM), dtype=np.float32)
    kv[:, 0] += KEY_SCALE * direction[:, :, None, :].astype(np.float32)
    return kv.astype(np.float16)


def make_query(seed: int, scene: int, directions: np.ndarray) -> np.ndarray:
    """A query for a scene: [layer][kv_head][head_dim] fp32 (the stream indexes every layer)."""
    rng = np.random.default_rng([seed, 4, scene])
    q = directions[scene] + 0.05 * rng.standard_normal(directions[scene].shape)
    return q.astype(np.float32).ravel()


def run(args: argparse.Namespace) -> dict:
    directions = scene_directions(args.seed, args.scenes)
    with kvmem.Client(args.addr, api_key=args.api_key or None,
                      root_certificates=args.tls_ca or None, timeout=60) as client:
        client.wait_ready(10)
        return run_with(client, args, directions)


def run_with(client: kvmem.Client, args: argparse.Namespace, directions: np.ndarray) -> dict:
    opened = client.open_stream(args.stream, stream_config())
    start = opened.stats.last_durable_frame + 1
    total = max(start, args.frames)  # The stream may already hold more.
    schedule = scene_schedule(args.seed, total, args.scenes)

    def frames() -> Iterator[kvmem.Frame]:
        for i in range(start, args.frames):
            yield kvmem.Frame(kv=make_frame(args.seed, i, directions[schedule[i]]),
                              frame_index=i, first_token_position=i * TOKENS_PER_FRAME,
                              timestamp_us=i * 333_333)

    t0 = time.perf_counter()
    appended = (client.append_frames(args.stream, frames(), chunk_bytes=args.chunk_bytes)
                if start < args.frames else kvmem.AppendFramesResponse(
                    last_durable_frame=opened.stats.last_durable_frame))
    append_s = time.perf_counter() - t0
    if args.close:  # Seals the open block (a later OpenStream reopens the stream).
        client.close_stream(args.stream)
    stats = client.stats(args.stream)

    # Query the scenes with the most frames outside the hot window.
    old = schedule[: max(0, total - HOT_WINDOW // TOKENS_PER_FRAME)]
    counts = {s: old.count(s) for s in set(old)}
    scenes = sorted(counts, key=lambda s: (-counts[s], s))[: args.queries]

    recalls = []
    for scene in scenes:
        query = make_query(args.seed, scene, directions)
        r = client.recall(args.stream, query, top_k=args.top_k, max_tokens=args.max_tokens)
        fetched = client.fetch_blocks(args.stream, r.block_ids,
                                      layout=kvmem.PayloadLayout.BLOCK_LAYER_MAJOR)
        shapes_ok = bytes_ok = len(fetched) == len(r.blocks)
        hit_tokens = 0
        blocks = []
        for b, f in zip(r.blocks, fetched):
            frames_of_block = range(b.first_frame, b.last_frame + 1)
            want = np.concatenate([make_frame(args.seed, i, directions[schedule[i]])
                                   for i in frames_of_block], axis=3)
            shapes_ok &= f.kv.shape == (LAYERS, 2, KV_HEADS, b.token_count, HEAD_DIM)
            bytes_ok &= f.kv.shape == want.shape and bool(np.array_equal(f.kv, want))
            block_scenes = sorted({schedule[i] for i in frames_of_block})
            hit_tokens += TOKENS_PER_FRAME * sum(schedule[i] == scene for i in frames_of_block)
            blocks.append({"block_id": b.block_id, "first_frame": b.first_frame,
                           "last_frame": b.last_frame, "token_count": b.token_count,
                           "score": b.score, "gate_weight": b.gate_weight,
                           "tier": b.tier.name if isinstance(b.tier, kvmem.Tier) else b.tier,
                           "scenes": block_scenes})
        recalls.append({
            "scene": scene, "top_k": args.top_k, "max_tokens": args.max_tokens,
            "query": [float(x) for x in query],
            "blocks": blocks, "total_tokens": r.total_tokens,
            "budget_tokens": r.budget_tokens, "candidates": r.candidates,
            "precision": hit_tokens / r.total_tokens if r.total_tokens else 0.0,
            "scene_frames_outside_window": counts[scene],
            "engine_us": r.timing.total_us,
            "fetched": {"blocks": len(fetched), "bytes": sum(len(f.payload) for f in fetched),
                        "shape_ok": bool(shapes_ok), "bytes_match": bool(bytes_ok)}})
    return {
        "addr": args.addr, "stream": args.stream, "seed": args.seed,
        "frames": args.frames, "resumed_at": start, "scenes": args.scenes,
        "append": {"frames_written": appended.frames_written,
                   "bytes_written": appended.bytes_written,
                   "sealed_blocks": appended.sealed_blocks,
                   "last_durable_frame": appended.last_durable_frame,
                   "seconds": append_s,
                   "mib_per_s": appended.bytes_written / 2**20 / append_s if append_s else 0.0},
        "stats": {"frames": stats.frames, "tokens": stats.tokens,
                  "sealed_blocks": stats.sealed_blocks,
                  "open_block_frames": stats.open_block_frames,
                  "summary_dim": stats.summary_dim, "shot_cuts": stats.policy.shot_cuts,
                  "closed": stats.closed},
        "recalls": recalls,
    }


def print_human(out: dict) -> None:
    a, s = out["append"], out["stats"]
    print(f"stream {out['stream']} at {out['addr']}: {s['frames']} frames, {s['tokens']} tokens, "
          f"{s['sealed_blocks']} sealed blocks ({s['shot_cuts']} shot cuts), "
          f"{s['open_block_frames']} frames in the open block")
    if a["frames_written"]:
        print(f"  appended frames {out['resumed_at']}..{out['frames'] - 1}: "
              f"{a['frames_written']} frames, {a['bytes_written'] / 2**20:.1f} MiB in "
              f"{a['seconds']:.2f} s ({a['mib_per_s']:.0f} MiB/s)")
    else:
        print(f"  nothing to append: the stream already holds frames 0..{out['resumed_at'] - 1}")
    for r in out["recalls"]:
        f = r["fetched"]
        print(f"  query scene {r['scene']}: {len(r['blocks'])} blocks, {r['total_tokens']} of "
              f"{r['budget_tokens']} tokens, {r['candidates']} candidates, "
              f"{100 * r['precision']:.0f}% of recalled tokens from that scene, "
              f"{r['engine_us']} us; fetched {f['bytes'] / 1024:.0f} KiB, shapes "
              f"{'ok' if f['shape_ok'] else 'WRONG'}, bytes "
              f"{'match' if f['bytes_match'] else 'DIFFER'}")
        for b in r["blocks"]:
            print(f"    block {b['block_id']:4d} frames {b['first_frame']}-{b['last_frame']} "
                  f"{b['token_count']} tokens score {b['score']:.3f} gate {b['gate_weight']:.3f} "
                  f"scenes {b['scenes']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:50551", help="host:port or unix:/path")
    p.add_argument("--stream", default="frontend-0")
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--scenes", type=int, default=6)
    p.add_argument("--queries", type=int, default=3, help="scenes queried")
    p.add_argument("--top_k", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=256, help="recall budget, tokens")
    p.add_argument("--chunk_bytes", type=int, default=1 << 20)
    p.add_argument("--close", action="store_true", help="close the stream after appending")
    p.add_argument("--api_key", default="")
    p.add_argument("--tls_ca", default="")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        out = run(args)
    except kvmem.KvmemError as e:
        print(f"frontend.py: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_human(out)
    ok = all(r["fetched"]["shape_ok"] and r["fetched"]["bytes_match"] for r in out["recalls"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

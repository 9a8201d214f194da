"""kvmem.torch against a real kvmem-server: tensors appended and recalled
byte-exact, recalled blocks as views over the shared-memory mapping (address
check), window_lse and attend() (joint and gated) equal to direct computations
in double, and errors as the client's exceptions.

Exits with 77 (ctest: skipped) when torch cannot be imported."""
from __future__ import annotations

import math
import os
import sys
import unittest

import numpy as np

try:
    import torch
except ImportError as e:  # The one reason to skip: no PyTorch on this host.
    print(f"SKIP: torch cannot be imported ({e}); deploy/bootstrap.sh installs "
          "python3-torch")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))

import kvmem  # noqa: E402
import kvmem.torch as kt  # noqa: E402
from kvmem_test_util import Server  # noqa: E402

LAYERS, KV_HEADS, QUERY_HEADS, DIM = 2, 2, 4, 16
TOKENS, WINDOW, SINKS, FRAMES = 8, 32, 4, 40


def config(dtype=kvmem.DType.FP16) -> kvmem.StreamConfig:
    return kvmem.StreamConfig(
        geometry=kvmem.StreamGeometry(layers=LAYERS, kv_heads=KV_HEADS, head_dim=DIM,
                                      dtype=dtype, max_tokens_per_frame=TOKENS),
        hot_window_tokens=WINDOW,
        block_policy=kvmem.BlockPolicy(frames_per_block=2, mode=kvmem.SegmentMode.FIXED))


def frame(rng: np.random.Generator) -> torch.Tensor:
    """(layers, 2, kv_heads, tokens, head_dim) fp32; keys with a few strong
    directions so that attention is peaked."""
    kv = torch.from_numpy(rng.standard_normal((LAYERS, 2, KV_HEADS, TOKENS, DIM))
                          .astype(np.float32))
    kv[:, 0] *= 2.0
    return kv


def query(rng: np.random.Generator, tokens: int = 3) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal((LAYERS, QUERY_HEADS, tokens, DIM))
                            .astype(np.float32)) * 2.0


def direct_attention(q, k, v, group):
    """softmax(q k^T / sqrt(d)) v in float64; q (hq, t, d), k/v (hkv, n, d)."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for h in range(q.shape[0]):
        logits = q[h] @ k[h // group].T / math.sqrt(q.shape[2])
        w = torch.exp(logits - logits.max(dim=1, keepdim=True).values)
        out[h] = (w / w.sum(dim=1, keepdim=True)) @ v[h // group]
    return out


class TorchCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.client = kvmem.Client(cls.server.unix, timeout=30)
        cls.client.wait_ready(10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def fill(self, cache: kt.StreamCache, seed: int) -> torch.Tensor:
        """Appends FRAMES frames; returns every token's KV as appended (after
        the stream dtype's rounding): (layers, 2, kv_heads, all tokens, dim)."""
        rng = np.random.default_rng(seed)
        frames = []
        for _ in range(FRAMES):
            f = frame(rng)
            cache.append(f)
            frames.append(f.to(cache.dtype))
        return torch.cat(frames, dim=3)

    def test_append_recall_bytes_views_and_attention(self):
        cache = kt.StreamCache(self.client, "cam-torch", config(),
                               query_heads=QUERY_HEADS, sink_tokens=SINKS)
        self.addCleanup(cache.close)
        truth = self.fill(cache, 1)
        # The cache holds the sinks and the newest WINDOW tokens, as appended.
        k_h, v_h, p_h = cache.held(1)
        self.assertEqual(cache.margin_tokens, 0)
        held = WINDOW
        want = list(range(SINKS)) + list(range(FRAMES * TOKENS - held, FRAMES * TOKENS))
        self.assertEqual(p_h.tolist(), want)
        self.assertTrue(torch.equal(k_h, truth[1, 0][:, want]))
        self.assertTrue(torch.equal(v_h, truth[1, 1][:, want]))

        q = query(np.random.default_rng(2))
        # window_lse against a direct computation in double.
        lse = cache.window_lse(q).view(3, 2, LAYERS, KV_HEADS)  # token, member, l, h
        for layer in range(LAYERS):
            k, _, _ = cache.held(layer)
            for t in range(3):
                for qh in range(QUERY_HEADS):
                    h, m = qh // 2, qh % 2
                    logits = q[layer, qh, t].double() @ k[h].double().T / math.sqrt(DIM)
                    self.assertAlmostEqual(float(lse[t, m, layer, h]),
                                           float(torch.logsumexp(logits, 0)), places=4)
        # The query vectors' layout: [indexed_layer][kv_head][head_dim].
        vec = cache.query_vectors(q)
        self.assertEqual(tuple(vec.shape), (3 * 2, LAYERS * KV_HEADS * DIM))
        self.assertTrue(torch.equal(vec[2 * 1 + 1, (1 * KV_HEADS + 1) * DIM:][:DIM],
                                    q[1, 1 * 2 + 1, 1]))

        r = cache.recall(q, max_tokens=24)
        self.assertTrue(r.shared_memory)
        self.assertGreater(r.tokens, 0)
        self.assertLessEqual(r.tokens, 24)
        self.assertEqual(r.layers, [0, 1])
        # A share of the query's attention (the token stage renormalises it).
        self.assertGreater(r.response.recalled_mass, 0.0)
        self.assertLessEqual(r.response.recalled_mass, 1.0)
        # Byte-exact against the appended tokens, per block and joined.
        arena = r._delivery._arena
        base = np.frombuffer(arena.map, dtype=np.uint8).ctypes.data
        for blk in r.blocks:
            pos = blk.positions
            self.assertTrue(torch.equal(blk.kv[:, 0], truth[:, 0][:, :, pos]))
            self.assertTrue(torch.equal(blk.kv[:, 1], truth[:, 1][:, :, pos]))
            # A view of the mapping, not a copy.
            self.assertTrue(base <= blk.kv.data_ptr() < base + arena.size,
                            (hex(blk.kv.data_ptr()), hex(base), arena.size))
        for layer in range(LAYERS):
            pos = r.positions[layer]
            self.assertTrue(torch.equal(r.keys[layer], truth[layer, 0][:, pos]))
            self.assertTrue(torch.equal(r.values[layer], truth[layer, 1][:, pos]))
            held = set(p_h.tolist())
            self.assertFalse(any(p in held for p in pos.tolist()))
        in_arena = base <= r.keys[0].data_ptr() < base + arena.size
        self.assertEqual(in_arena, not r.copied)
        self.assertEqual(r.copied, len(r.blocks) > 1)

        # attend(): joint attention over sinks + window + recalled tokens.
        for layer in range(LAYERS):
            keys = torch.cat([k_h if layer == 1 else cache.held(layer)[0],
                              r.keys[layer]], dim=1)
            values = torch.cat([cache.held(layer)[1], r.values[layer]], dim=1)
            got = cache.attend(q[layer], layer)
            want_o = direct_attention(q[layer], keys, values, 2)
            self.assertLess(float((got.double() - want_o).abs().max()), 1e-4)
        # Gated: (1 - m) o_window + m sum_b gate_b o_b.
        layer = 0
        k0, v0, _ = cache.held(layer)
        o_w = direct_attention(q[layer], k0, v0, 2)
        o_r = torch.zeros_like(o_w)
        gates = 0.0
        for bi, blk in enumerate(r.blocks):
            sel = r.block_index[layer] == bi
            if not bool(sel.any()):
                continue
            o_r += blk.gate_weight * direct_attention(
                q[layer], r.keys[layer][:, sel], r.values[layer][:, sel], 2)
            gates += blk.gate_weight
        m = r.response.recalled_mass

        want_g = (1 - m) * o_w + m * o_r / gates
        got_g = cache.attend(q[layer], layer, mode="gated")
        self.assertLess(float((got_g.double() - want_g).abs().max()), 1e-4)
        # Causal within the frame: a query at position p sees no later key.
        qp = torch.tensor([FRAMES * TOKENS - 3, FRAMES * TOKENS - 2, FRAMES * TOKENS - 1])
        got_c = cache.attend(q[0], 0, q_positions=qp)
        keys = torch.cat([k0, r.keys[0]], dim=1)
        values = torch.cat([v0, r.values[0]], dim=1)
        kp = torch.cat([cache.held(0)[2], r.positions[0]])
        for t in range(3):
            seen = kp <= qp[t]
            want_t = direct_attention(q[0][:, t:t + 1], keys[:, seen], values[:, seen], 2)
            self.assertLess(float((got_c[:, t:t + 1].double() - want_t).abs().max()), 1e-4)

        # The frame's own K/V before it is appended (extra_kv), causal.
        xk, xv = torch.randn(KV_HEADS, 3, DIM), torch.randn(KV_HEADS, 3, DIM)
        xp = torch.tensor([FRAMES * TOKENS, FRAMES * TOKENS + 1, FRAMES * TOKENS + 2])
        got_x = cache.attend(q[0], 0, q_positions=xp, extra_kv=(xk, xv, xp))
        for t in range(3):
            keys = torch.cat([k0, xk[:, :t + 1], r.keys[0]], dim=1)
            values = torch.cat([v0, xv[:, :t + 1], r.values[0]], dim=1)
            want_t = direct_attention(q[0][:, t:t + 1], keys, values, 2)
            self.assertLess(float((got_x[:, t:t + 1].double() - want_t).abs().max()), 1e-4)

        # The next recall releases the last one's views (their lease goes
        # back with it); a one-block recall is a view, not a copy.
        r2 = cache.recall(q, max_tokens=2)
        self.assertEqual(r.blocks, [])
        self.assertLessEqual(r2.tokens, 2)
        if len(r2.blocks) == 1 and r2.dropped_tokens == 0:
            arena = r2._delivery._arena
            base = np.frombuffer(arena.map, dtype=np.uint8).ctypes.data
            self.assertFalse(r2.copied)
            self.assertTrue(base <= r2.keys[0].data_ptr() < base + arena.size)

    def test_per_layer_sets_and_inline_delivery(self):
        with kvmem.Client(self.server.tcp, timeout=30) as tcp:
            cache = kt.StreamCache(tcp, "cam-torch-inline", config(),
                                   query_heads=QUERY_HEADS, delivery="inline")
            truth = self.fill(cache, 3)
            q = query(np.random.default_rng(4), tokens=2)
            r = cache.recall(q, max_tokens=16, per_layer=True)
            self.assertFalse(r.shared_memory)
            self.assertTrue(r.copied)
            self.assertEqual(len(r.response.layer_sets), LAYERS)
            held = set(cache.held(0)[2].tolist())
            for s in r.response.layer_sets:
                li = r.layer_index(s.layer)
                # The set's tokens, but those the cache holds itself.
                want = sorted(p for p in (b.first_token_position + o for b in s.blocks
                                          for o in (b.token_offsets or range(b.token_count)))
                              if p not in held)
                self.assertEqual(sorted(r.positions[li].tolist()), want)
                self.assertLessEqual(len(want), 16)
                pos = r.positions[li]
                self.assertTrue(torch.equal(r.keys[li], truth[s.layer, 0][:, pos]))
            with self.assertRaises(ValueError):
                cache.attend(q[0], 0, mode="gated")
            cache.close()

    def test_bf16_and_fp32_streams_round_trip(self):
        for dtype, name in ((kvmem.DType.BF16, "bf16"), (kvmem.DType.FP32, "fp32")):
            cache = kt.StreamCache(self.client, f"cam-torch-{name}", config(dtype),
                                   query_heads=QUERY_HEADS)
            self.addCleanup(cache.close)
            truth = self.fill(cache, 5)
            self.assertEqual(truth.dtype, kt._TORCH[dtype])
            r = cache.recall(query(np.random.default_rng(6)), max_tokens=16)
            self.assertGreater(r.tokens, 0)
            for blk in r.blocks:
                self.assertEqual(blk.kv.dtype, truth.dtype)
                self.assertTrue(torch.equal(blk.kv[:, 0], truth[:, 0][:, :, blk.positions]))

    def test_bad_input_and_a_lost_server(self):
        with Server() as server:
            client = kvmem.Client(server.unix, timeout=10)
            cache = kt.StreamCache(client, "cam-lost", config(), query_heads=QUERY_HEADS)
            rng = np.random.default_rng(7)
            with self.assertRaisesRegex(ValueError, "frame_kv has shape"):
                cache.append(torch.zeros(LAYERS, 2, KV_HEADS + 1, 4, DIM))
            with self.assertRaisesRegex(ValueError, "q has shape"):
                cache.recall(torch.zeros(LAYERS, QUERY_HEADS + 1, 1, DIM))
            with self.assertRaisesRegex(ValueError, "not a multiple"):
                kt.StreamCache(client, "cam-bad", config(), query_heads=3)
            # A frame wider than the stream allows: the server's refusal, as
            # the client's exception (and the session is over).
            with self.assertRaises(kvmem.InvalidArgumentError):
                cache.append(torch.zeros(LAYERS, 2, KV_HEADS, TOKENS + 1, DIM))
            cache = kt.StreamCache(client, "cam-lost", config(), query_heads=QUERY_HEADS)
            cache.append(frame(rng))
            server.stop()
            with self.assertRaises(kvmem.UnavailableError):
                for _ in range(3):
                    cache.append(frame(rng))
            client.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)

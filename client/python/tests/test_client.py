"""The Python client against a real kvmem-server: numpy frames in, the same
bytes out in both fetch layouts, statistics, recall budgets and scores (checked
against summaries computed here), sessions, API keys, and error codes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import kvmem  # noqa: E402
from kvmem_test_util import Server  # noqa: E402

LAYERS, HEADS, DIM, MAX_TOKENS = 3, 2, 16, 8
HOT_WINDOW = 16
TOKENS = [8, 5, 8, 3, 1, 8, 7, 2, 6, 4]  # Per frame; FIXED blocks of 2 frames.


def config(dtype=kvmem.DType.FP16, hot_window=HOT_WINDOW,
           score=kvmem.ScoreMode.SUMMED) -> kvmem.StreamConfig:
    """Whole blocks (no token groups), so summary() is what is indexed; the
    summed score by default, which these tests rank by."""
    return kvmem.StreamConfig(
        geometry=kvmem.StreamGeometry(layers=LAYERS, kv_heads=HEADS, head_dim=DIM,
                                      dtype=dtype, max_tokens_per_frame=MAX_TOKENS),
        hot_window_tokens=hot_window,
        block_policy=kvmem.BlockPolicy(frames_per_block=2, mode=kvmem.SegmentMode.FIXED),
        index_policy=kvmem.IndexPolicy(groups_per_block=1),
        recall_policy=kvmem.RecallPolicy(score=score))


def frames(seed: int, tokens=TOKENS, dtype=np.float16) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((LAYERS, 2, HEADS, t, DIM)).astype(dtype) for t in tokens]


def summary(block_frames: list[np.ndarray]) -> np.ndarray:
    """The block summary the server indexes: per layer, the mean key over the
    block's tokens, [layer][kv_head][head_dim] fp32."""
    keys = np.concatenate([f[:, 0].astype(np.float32) for f in block_frames], axis=2)
    return keys.mean(axis=2).ravel()


class RealServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.client = kvmem.Client(cls.server.unix, timeout=30, chunk_bytes=100)
        cls.client.wait_ready(10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def _stream(self, name: str, seed: int = 1, cfg=None) -> list[np.ndarray]:
        fs = frames(seed)
        opened = self.client.open_stream(name, cfg or config())
        self.assertTrue(opened.created)
        self.assertEqual(opened.stats.last_durable_frame, -1)
        r = self.client.append_frames(name, fs)
        self.assertEqual(r.frames_written, len(fs))
        self.assertEqual(r.last_durable_frame, len(fs) - 1)
        return fs

    def test_append_stats_and_fetch(self):
        fs = frames(1)
        c = self.client
        opened = c.open_stream("rt", config())
        self.assertTrue(opened.created)
        self.assertFalse(c.open_stream("rt", config()).created)  # Same config: reopened.
        with self.assertRaises(kvmem.AlreadyExistsError):
            c.open_stream("rt", config(hot_window=32))

        frame_bytes = [f.nbytes for f in fs]
        # Chunks of 100 bytes (the client's): every frame is split unevenly.
        r = c.append_frames("rt", fs[:7])
        self.assertEqual((r.frames_written, r.bytes_written, r.last_durable_frame,
                          r.sealed_blocks), (7, sum(frame_bytes[:7]), 6, 3))
        # Frame indices and positions continue where the stream stopped.
        r = c.append_frames("rt", (kvmem.Frame(kv=f, timestamp_us=i) for i, f in
                                   enumerate(fs[7:])), chunk_bytes=1 << 20)
        self.assertEqual((r.frames_written, r.last_durable_frame, r.sealed_blocks), (3, 9, 2))

        s = c.stats("rt")
        self.assertEqual(s.stream_id, "rt")
        self.assertEqual(s.frames, 10)
        self.assertEqual(s.last_durable_frame, 9)
        self.assertEqual(s.tokens, sum(TOKENS))
        self.assertEqual(s.next_token_position, sum(TOKENS))
        self.assertEqual(s.payload_bytes, sum(frame_bytes))
        self.assertEqual(s.sealed_blocks, 5)
        self.assertEqual(s.open_block_frames, 0)
        self.assertEqual(s.summary_dim, LAYERS * HEADS * DIM)
        self.assertEqual(s.config.geometry, config().geometry)
        self.assertIn("rt", [x.stream_id for x in c.list_streams()])

        ids = list(range(5))
        fm = c.fetch_blocks("rt", ids, max_chunk_bytes=1024)
        self.assertEqual([b.info.block_id for b in fm], ids)
        for b in fm:
            i, j = 2 * b.info.block_id, 2 * b.info.block_id + 1
            with self.subTest(block=b.info.block_id, layout="frame-major"):
                self.assertEqual((b.info.first_frame, b.info.last_frame), (i, j))
                self.assertEqual(b.info.token_count, TOKENS[i] + TOKENS[j])
                self.assertEqual(b.payload, fs[i].tobytes() + fs[j].tobytes())
                self.assertEqual(b.frame_indices, [i, j])
                for got, want in zip(b.frames, fs[i:j + 1]):
                    np.testing.assert_array_equal(got, want)
                self.assertEqual(b.kv.shape, (LAYERS, 2, HEADS, b.info.token_count, DIM))
                np.testing.assert_array_equal(b.kv, np.concatenate(fs[i:j + 1], axis=3))

        lm = c.fetch_blocks("rt", [3, 0], layout=kvmem.PayloadLayout.BLOCK_LAYER_MAJOR)
        for b in lm:
            i = 2 * b.info.block_id
            want = np.concatenate(fs[i:i + 2], axis=3)
            with self.subTest(block=b.info.block_id, layout="block-layer-major"):
                self.assertEqual(b.kv.shape, (LAYERS, 2, HEADS, TOKENS[i] + TOKENS[i + 1], DIM))
                self.assertEqual(b.layers, [0, 1, 2])
                np.testing.assert_array_equal(b.kv, want)
                self.assertEqual(b.payload, np.ascontiguousarray(want).tobytes())
        (b,) = c.fetch_blocks("rt", [1], layout=kvmem.PayloadLayout.BLOCK_LAYER_MAJOR,
                              layers=[2, 0], max_chunk_bytes=1024)
        self.assertEqual(b.kv.shape, (2, 2, HEADS, TOKENS[2] + TOKENS[3], DIM))
        np.testing.assert_array_equal(b.kv, np.concatenate(fs[2:4], axis=3)[[2, 0]])

    def test_mass_recall_with_query_vectors_and_window(self):
        # Score MASS (the default) on an exact index: the per-head softmax
        # estimate computed here with numpy, for two query vectors and the
        # front end's window log-sum-exps.
        cfg = config(score=kvmem.ScoreMode.MASS)
        cfg.index_policy.index_factory = "Flat"
        fs = self._stream("mass", seed=4, cfg=cfg)
        rng = np.random.default_rng(5)
        queries = 3 * rng.standard_normal((2, LAYERS * HEADS * DIM)).astype(np.float32)
        window = rng.normal(3.0, 1.0, (2, LAYERS * HEADS)).astype(np.float32)
        starts = np.concatenate([[0], np.cumsum(TOKENS)])
        end = int(starts[-1])
        eligible = [b for b in range(5) if starts[2 * b + 2] <= end - HOT_WINDOW]
        tokens = {b: TOKENS[2 * b] + TOKENS[2 * b + 1] for b in eligible}
        mean = {b: summary(fs[2 * b:2 * b + 2]).reshape(LAYERS * HEADS, DIM)
                for b in eligible}
        density = {b: 0.0 for b in eligible}
        for q, w in zip(queries.reshape(2, LAYERS * HEADS, DIM), window):
            z = {b: (mean[b] * q).sum(axis=1) / np.sqrt(DIM) for b in eligible}
            norm = np.exp(w.astype(np.float64)) + sum(tokens[b] * np.exp(z[b])
                                                      for b in eligible)
            for b in eligible:
                density[b] += float(np.mean(np.exp(z[b]) / norm)) / 2
        ranked = sorted(eligible, key=lambda b: -density[b])

        r = self.client.recall("mass", queries, max_tokens=1000, window_lse=window)
        self.assertEqual(r.query_vectors, 2)
        self.assertFalse(r.window_estimated)
        self.assertEqual(r.block_ids, ranked)
        for blk in r.blocks:
            want = density[blk.block_id] * tokens[blk.block_id]
            self.assertAlmostEqual(blk.mass, want, delta=1e-4 * want)
            self.assertAlmostEqual(blk.gate_weight, blk.mass / r.recalled_mass,
                                   places=5)
        with self.assertRaises(kvmem.InvalidArgumentError):
            self.client.recall("mass", queries, window_lse=window[0])
        # The response's new figures, and the budget's new fields.
        self.assertEqual(r.scored_query_vectors, 2)
        self.assertGreater(r.cold_share, 0.0)
        self.assertLessEqual(r.cold_share, 1.0)
        many = 3 * rng.standard_normal((40, LAYERS * HEADS * DIM)).astype(np.float32)
        r = self.client.recall("mass", many, max_tokens=1000, identity_share=0.0,
                               mass_target=0.5)
        self.assertEqual((r.query_vectors, r.scored_query_vectors), (40, 16))
        self.assertEqual(r.channels.query_tokens + r.channels.track_tokens, 0)
        with self.assertRaises(kvmem.InvalidArgumentError):
            self.client.recall("mass", queries, mass_target=2.0)
        with self.assertRaises(kvmem.InvalidArgumentError):
            self.client.recall("mass", queries, identity_share=1.5)

    def test_recall_budgets_and_scores(self):
        fs = self._stream("rc", seed=2)
        rng = np.random.default_rng(3)
        query = rng.standard_normal(LAYERS * HEADS * DIM).astype(np.float32)
        # Positions: the newest HOT_WINDOW tokens are [end - 16, end); blocks
        # touching them are never recalled.
        starts = np.concatenate([[0], np.cumsum(TOKENS)])
        end = int(starts[-1])
        eligible = [b for b in range(5) if starts[2 * b + 2] <= end - HOT_WINDOW]
        self.assertEqual(eligible, [0, 1, 2])
        scores = {b: float(summary(fs[2 * b:2 * b + 2]) @ query) for b in eligible}
        ranked = sorted(eligible, key=lambda b: -scores[b])

        r = self.client.recall("rc", query, top_k=64, max_tokens=1000)
        self.assertEqual(r.candidates, len(eligible))
        self.assertEqual(r.block_ids, ranked)
        for blk in r.blocks:
            self.assertAlmostEqual(blk.score, scores[blk.block_id], delta=1e-3 * abs(
                scores[blk.block_id]) + 1e-3)
            self.assertEqual(blk.token_count, TOKENS[2 * blk.block_id] +
                             TOKENS[2 * blk.block_id + 1])
            self.assertEqual(blk.tier, kvmem.Tier.WARM)
        self.assertAlmostEqual(sum(b.gate_weight for b in r.blocks), 1.0, places=4)
        self.assertEqual(r.total_tokens, sum(b.token_count for b in r.blocks))

        sizes = {b: TOKENS[2 * b] + TOKENS[2 * b + 1] for b in eligible}
        for budget in (1, 8, 11, 13, 20, 24, 33):
            for top_k in (1, 2, 8):
                with self.subTest(max_tokens=budget, top_k=top_k):
                    r = self.client.recall("rc", query, top_k=top_k, max_tokens=budget)
                    self.assertEqual(r.budget_tokens, budget)
                    self.assertEqual(r.top_k, top_k)
                    self.assertLessEqual(r.total_tokens, budget)
                    self.assertLessEqual(len(r.blocks), top_k)
                    self.assertEqual(r.total_tokens, sum(b.token_count for b in r.blocks))
                    # Whole blocks: the best top_k, in score order, each taken
                    # when it still fits the budget.
                    want, used = [], 0
                    for b in ranked[:top_k]:
                        if used + sizes[b] <= budget:
                            want.append(b)
                            used += sizes[b]
                    self.assertEqual(set(r.block_ids), set(want))
                    self.assertEqual(r.block_ids, [b for b in ranked if b in want])
        # Budget as a fraction of the hot window.
        r = self.client.recall("rc", query, top_k=8, window_fraction=0.75)
        self.assertEqual(r.budget_tokens, 12)
        self.assertLessEqual(r.total_tokens, 12)

    def test_session(self):
        fs = frames(4, tokens=[4, 4, 4, 4, 4, 4, 4, 4])
        with self.client.session("ss", config(hot_window=8)) as s:
            self.assertTrue(s.opened.created)
            acks = [s.append(f) for f in fs]
            self.assertEqual([a.frame_index for a in acks], list(range(8)))
            self.assertEqual([a.last_durable_frame for a in acks], list(range(8)))
            self.assertEqual([a.sealed_block for a in acks], [False, True] * 4)
            q = np.random.default_rng(5).standard_normal(LAYERS * HEADS * DIM)
            via_session = s.recall(q, top_k=8, max_tokens=64)
            self.assertGreater(len(via_session.blocks), 0)
            with self.assertRaises(kvmem.InvalidArgumentError):
                s.recall(q[:5])
            # A rejected query leaves the session usable.
            extra = frames(6, tokens=[3])[0]
            self.assertEqual(s.append(extra).frame_index, 8)
        direct = self.client.recall("ss", q, top_k=8, max_tokens=64)
        self.assertEqual(direct.block_ids, via_session.block_ids)
        self.assertEqual(self.client.stats("ss").frames, 9)
        (b,) = self.client.fetch_blocks("ss", [2])
        self.assertEqual(b.payload, fs[4].tobytes() + fs[5].tobytes())

        # A replayed frame ends the session with its status.
        with self.client.session("ss") as s:
            self.assertFalse(s.opened.created)
            with self.assertRaises(kvmem.KvmemError) as cm:
                s.append(kvmem.Frame(kv=fs[0], frame_index=0))
            self.assertIn(cm.exception.code, (grpc.StatusCode.ALREADY_EXISTS,
                                              grpc.StatusCode.FAILED_PRECONDITION))
            with self.assertRaises(kvmem.FailedPreconditionError):
                s.append(extra)

    def test_shared_memory_and_recall_delivery(self):
        """fetch_shared gives numpy views into the read-only arena, equal to
        fetch_blocks' bytes in both layouts; recall_delivered delivers the set
        (shm and inline, unary and over a session) and leaves out held
        blocks."""
        fs = self._stream("shm")
        c = self.client
        ids = [3, 0, 1]
        for layout in (kvmem.PayloadLayout.BLOCK_LAYER_MAJOR,
                       kvmem.PayloadLayout.FRAME_MAJOR):
            want = c.fetch_blocks("shm", ids, layout=layout)
            with c.fetch_shared("shm", ids, layout=layout) as d:
                self.assertEqual([b.block_id for b in d.blocks], ids)
                self.assertGreater(d.lease_id, 0)
                for got, w in zip(d.blocks, want):
                    self.assertEqual(bytes(got.data), w.payload)
                    self.assertEqual(got.info.block_id, w.info.block_id)
                    if layout == kvmem.PayloadLayout.BLOCK_LAYER_MAJOR:
                        np.testing.assert_array_equal(got.kv, w.kv)
                        self.assertFalse(got.kv.flags.writeable)
                        with self.assertRaises(ValueError):
                            got.kv[0, 0, 0, 0, 0] = 1
        self.assertGreater(c.shm_arena_id, 0)
        # Asking for more than the arena holds attaches a larger one.
        first = c.shm_arena_id
        c.attach_shared_memory(c.shm_arena_bytes)  # Enough: nothing happens.
        self.assertEqual(c.shm_arena_id, first)
        c.attach_shared_memory(2 * c.shm_arena_bytes)
        self.assertNotEqual(c.shm_arena_id, first)
        with c.fetch_shared("shm", [0]) as d:
            self.assertEqual(bytes(d.blocks[0].data), c.fetch_blocks(
                "shm", [0], layout=kvmem.PayloadLayout.BLOCK_LAYER_MAJOR)[0].payload)
        q = np.random.default_rng(9).standard_normal(LAYERS * HEADS * DIM)
        plain = c.recall("shm", q, max_tokens=24)
        self.assertGreaterEqual(len(plain.blocks), 2)
        for mode in ("shm", "inline"):
            with self.subTest(mode=mode):
                r, d = c.recall_delivered("shm", q, mode=mode, max_tokens=24)
                self.assertEqual(r.block_ids, plain.block_ids)
                self.assertEqual([b.block_id for b in d.blocks], r.block_ids)
                for b in d.blocks:
                    i = 2 * b.block_id
                    np.testing.assert_array_equal(b.kv, np.concatenate(fs[i:i + 2], axis=3))
                self.assertEqual(d.nbytes, sum(len(b.data) for b in d.blocks))
                d.release()
                # The next frame holds the first block: only the rest moves.
                first = r.block_ids[0]
                r2, d2 = c.recall_delivered("shm", q, mode=mode, max_tokens=24,
                                            held=[first])
                self.assertEqual(r2.held_blocks, 1)
                self.assertEqual([b.block_id for b in d2.blocks], r.block_ids[1:])
                d2.release()
        # A lease released later rides on the next delivery.
        d = c.fetch_shared("shm", [0])
        lease, arena = d.lease_id, c.shm_arena_id
        d.release_later()
        c.fetch_shared("shm", [1]).release()
        from kvmem.v1 import service_pb2
        with self.assertRaises(grpc.RpcError) as cm:  # Released already.
            c.stub.ReleaseLeases(service_pb2.ReleaseLeasesRequest(
                arena_id=arena, lease_ids=[lease]), metadata=c.metadata())
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # A delivery refused still releases the leases it carried (the
        # server lets them go before it runs one), and the client sends them
        # again with the next in case the refused call never reached it.
        for refused, error in (
                (lambda: c.fetch_shared("shm", [99]), kvmem.NotFoundError),
                (lambda: c.recall_delivered("shm", q[:5], mode="shm"),
                 kvmem.InvalidArgumentError)):
            d = c.fetch_shared("shm", [0])
            lease = d.lease_id
            d.release_later()
            with self.assertRaises(error):
                refused()
            self.assertIn((c.shm_arena_id, lease), c._deferred)
            with self.assertRaises(grpc.RpcError) as cm:  # Released already.
                c.stub.ReleaseLeases(service_pb2.ReleaseLeasesRequest(
                    arena_id=c.shm_arena_id, lease_ids=[lease]), metadata=c.metadata())
            self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            c.fetch_shared("shm", [1]).release()
            self.assertNotIn((c.shm_arena_id, lease), c._deferred)
        with c.session("shm") as s:
            r, d = s.recall_delivered(q, max_tokens=24, held=plain.block_ids[:1])
            self.assertEqual([b.block_id for b in d.blocks], plain.block_ids[1:])
            d.release()

    def test_close_frees_the_arena_and_keeps_delivered_views(self):
        """Client.close() closes its arena's hand-off connection (the server
        frees the arena: a lease on it is then NOT_FOUND) while arrays
        delivered into it stay readable until they are dropped."""
        self._stream("shm-close")
        layout = kvmem.PayloadLayout.BLOCK_LAYER_MAJOR
        want = self.client.fetch_blocks("shm-close", [0], layout=layout)[0].kv
        c = kvmem.Client(self.server.unix, timeout=30)
        d = c.fetch_shared("shm-close", [0], layout=layout)
        kv, arena = d.blocks[0].kv, c.shm_arena_id
        d.release_later()
        c.close()
        self.assertEqual(c.shm_arena_id, 0)
        np.testing.assert_array_equal(kv, want)
        from kvmem.v1 import service_pb2
        release = service_pb2.ReleaseLeasesRequest(arena_id=arena,
                                                   lease_ids=[d.lease_id])
        deadline = time.monotonic() + 10
        while True:  # The server notices the closed connection on its own.
            try:
                self.client.stub.ReleaseLeases(release, metadata=self.client.metadata())
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                    self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND, e.details())
                    break
            self.assertLess(time.monotonic(), deadline, "the arena outlived its client")
            time.sleep(0.05)

    def test_token_delivery(self):
        """TOKEN_LAYER_MAJOR: recall_delivered delivers only the recalled
        tokens (kv equals the appended frames at token_offsets), held_tokens
        leaves tokens out; fetch_blocks and fetch_shared send the tokens named."""
        cfg = config(score=kvmem.ScoreMode.MASS)
        cfg.index_policy = kvmem.IndexPolicy(groups_per_block=4)
        fs = self._stream("tok", seed=3, cfg=cfg)
        c = self.client
        tok = kvmem.PayloadLayout.TOKEN_LAYER_MAJOR

        def block_kv(block_id):  # (layers, 2, heads, tokens, dim) as appended.
            return np.concatenate(fs[2 * block_id:2 * block_id + 2], axis=3)

        q = np.random.default_rng(4).standard_normal(LAYERS * HEADS * DIM)
        for mode in ("shm", "inline"):
            with self.subTest(mode=mode):
                r, d = c.recall_delivered("tok", q, mode=mode, max_tokens=12, layout=tok)
                self.assertEqual([b.block_id for b in d.blocks], r.block_ids)
                for rb, b in zip(r.blocks, d.blocks):
                    want = rb.token_offsets or list(range(rb.token_count))
                    self.assertEqual(b.token_offsets, want)
                    np.testing.assert_array_equal(b.kv, block_kv(b.block_id)[:, :, :, want])
                tokens = sum(len(b.token_offsets) for b in d.blocks)
                self.assertEqual(tokens, r.total_tokens)
                self.assertEqual(d.nbytes, tokens * LAYERS * 2 * HEADS * DIM * 2)
                first = d.blocks[0]
                d.release()
                r2, d2 = c.recall_delivered(
                    "tok", q, mode=mode, max_tokens=12, layout=tok,
                    held_tokens={first.block_id: first.token_offsets[:-1]})
                self.assertEqual(d2.blocks[0].token_offsets, first.token_offsets[-1:])
                d2.release()
        (b,) = c.fetch_blocks("tok", [2], layout=tok, layers=[1],
                              tokens={2: np.array([0, 3])})  # numpy offsets too
        self.assertEqual(b.token_offsets, [0, 3])
        np.testing.assert_array_equal(b.kv, block_kv(2)[1:2, :, :, [0, 3]])
        with c.fetch_shared("tok", [2, 1], layout=tok, tokens={2: [4]}) as d:
            self.assertEqual(d.blocks[0].token_offsets, [4])
            np.testing.assert_array_equal(d.blocks[0].kv, block_kv(2)[:, :, :, [4]])
            self.assertEqual(d.blocks[1].token_offsets, list(range(TOKENS[2] + TOKENS[3])))
            np.testing.assert_array_equal(d.blocks[1].kv, block_kv(1))
        with self.assertRaises(kvmem.KvmemError) as cm:
            c.fetch_blocks("tok", [2], layout=tok, tokens={2: [3, 1]})
        self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_fp32_and_bf16_streams(self):
        for dtype, np_in in ((kvmem.DType.FP32, np.float32), (kvmem.DType.BF16, np.float32)):
            with self.subTest(dtype=dtype.name):
                name = "dt-" + dtype.name.lower()
                fs = frames(7, tokens=[3, 6], dtype=np_in)
                self.client.open_stream(name, config(dtype=dtype))
                r = self.client.append_frames(name, fs)
                self.assertEqual(r.bytes_written,
                                 sum(config(dtype=dtype).geometry.payload_bytes(t)
                                     for t in (3, 6)))
                self.client.close_stream(name)  # Seals the last block.
                (b,) = self.client.fetch_blocks(name, [0])
                want = np.concatenate(fs, axis=3)
                if dtype is kvmem.DType.BF16:
                    self.assertEqual(b.kv.dtype, np.uint16)
                    want = kvmem.float32_to_bf16(want)
                else:
                    self.assertEqual(b.kv.dtype, np.float32)
                np.testing.assert_array_equal(b.kv, want)

    def test_errors(self):
        c = self.client
        fs = self._stream("er", seed=8)
        q = np.zeros(LAYERS * HEADS * DIM, np.float32)

        def code(fn):
            with self.assertRaises(kvmem.KvmemError) as cm:
                fn()
            return cm.exception

        e = code(lambda: c.recall("no-such-stream", q))
        self.assertIsInstance(e, kvmem.NotFoundError)
        self.assertEqual(e.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(code(lambda: c.stats("no-such-stream")).code,
                         grpc.StatusCode.NOT_FOUND)
        self.assertEqual(code(lambda: c.fetch_blocks("er", [999])).code,
                         grpc.StatusCode.NOT_FOUND)
        e = code(lambda: c.recall("er", q[:-1]))
        self.assertIsInstance(e, kvmem.InvalidArgumentError)
        self.assertEqual(e.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(code(lambda: c.open_stream("bad id!", config())).code,
                         grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(code(lambda: c.fetch_blocks("er", [0], layers=[1])).code,
                         grpc.StatusCode.INVALID_ARGUMENT)  # layers needs BLOCK_LAYER_MAJOR.

        # A replayed frame: ALREADY_EXISTS naming the last durable frame.
        e = code(lambda: c.append_frames("er", [kvmem.Frame(kv=fs[0], frame_index=0)]))
        self.assertEqual(e.code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertEqual(e.last_durable_frame, len(fs) - 1)
        # A gap: FAILED_PRECONDITION.
        e = code(lambda: c.append_frames("er", [kvmem.Frame(kv=fs[0], frame_index=len(fs) + 3)]))
        self.assertEqual(e.code, grpc.StatusCode.FAILED_PRECONDITION)
        # A frame of the wrong shape never reaches the server.
        with self.assertRaisesRegex(ValueError, "shape"):
            c.append_frames("er", [np.zeros((LAYERS, 2, HEADS + 1, 2, DIM), np.float16)])
        # Nothing was stored by the failed calls; the client resumes in place.
        self.assertEqual(c.stats("er").last_durable_frame, len(fs) - 1)
        r = c.append_frames("er", frames(9, tokens=[2]))
        self.assertEqual(r.last_durable_frame, len(fs))

        c.close_stream("er")
        e = code(lambda: c.append_frames("er", frames(9, tokens=[2])))
        self.assertEqual(e.code, grpc.StatusCode.FAILED_PRECONDITION)
        c.delete_stream("er")
        self.assertEqual(code(lambda: c.stats("er")).code, grpc.StatusCode.NOT_FOUND)
        self.assertNotIn("er", [s.stream_id for s in c.list_streams()])


class ApiKeyTest(unittest.TestCase):
    def test_keys_required_and_sent(self):
        key = "py-client-key-0123456789"
        with Server(env={"KVMEM_API_KEYS": f"tenant-a:{key}\n"}) as server:
            with kvmem.Client(server.tcp, timeout=30) as anon:
                with self.assertRaises(kvmem.UnauthenticatedError):
                    anon.list_streams()
            with kvmem.Client(server.tcp, api_key="wrong-key-0123456789", timeout=30) as bad:
                with self.assertRaises(kvmem.UnauthenticatedError):
                    bad.list_streams()
            with kvmem.Client(server.tcp, api_key=key, timeout=30) as good:
                good.open_stream("k1", config())
                self.assertEqual([s.stream_id for s in good.list_streams()], ["k1"])


class SharedMemoryRoomTest(unittest.TestCase):
    def test_default_arena_past_the_largest_takes_what_fits(self):
        """The default arena (256 MiB) past the server's largest (64 MiB
        here): attach_shared_memory() takes the largest that fits; asked for
        by size, an arena past it is refused."""
        with Server("--shm_max_total_bytes=67108864",
                    "--shm_max_arena_bytes=67108864") as server:
            with kvmem.Client(server.unix, timeout=30) as c:
                c.attach_shared_memory()
                self.assertGreater(c.shm_arena_id, 0)
                with self.assertRaises(kvmem.InvalidArgumentError):
                    c.attach_shared_memory(128 << 20)


class _WrongServer:
    """A gRPC server that answers every KvMemory call as a kvmem-server that
    does not own the stream does (kvmem-server --etcd): UNAVAILABLE with the
    owner's address in the trailing metadata kvmem-owner. The owner is a
    real kvmem-server; the real redirect is tested with two servers, etcd
    and Ceph in tests/distributed/takeover_test.cc."""

    def __init__(self, owner: str) -> None:
        from concurrent import futures

        def refuse(request, context):
            context.set_trailing_metadata(((kvmem.errors.OWNER_HEADER, owner),))
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"stream is owned by the kvmem-server at {owner}")

        kinds = {"OpenStream": grpc.unary_unary_rpc_method_handler,
                 "GetStreamStats": grpc.unary_unary_rpc_method_handler,
                 "Recall": grpc.unary_unary_rpc_method_handler,
                 "DeleteStream": grpc.unary_unary_rpc_method_handler,
                 "AppendFrames": grpc.stream_unary_rpc_method_handler,
                 "FetchBlocks": grpc.unary_stream_rpc_method_handler,
                 "Session": grpc.stream_stream_rpc_method_handler}
        self.calls = 0

        def counted(fn):
            def run(request, context):
                self.calls += 1
                return fn(request, context)
            return run

        handlers = {m: make(counted(refuse)) for m, make in kinds.items()}
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("kvmem.v1.KvMemory", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)


class _RefusingFetches:
    """A gRPC server whose FetchBlocks answers as a kvmem-server short of
    room in the caller's share does, by script: `plan[k]` for the k-th call
    is how many of the asked blocks it sends before refusing ("FetchBlocks
    sent N of M blocks"), None to send them all. Each block is one chunk of
    bytes([block id]) * 8. The real refusal's timing cannot be arranged
    mid-call; the real server's is tested in SecurityTest."""

    def __init__(self, plan, header: bool = False) -> None:
        """header: the count in trailing metadata kvmem-blocks-sent and not
        in the message (the client must use the header)."""
        from concurrent import futures
        from kvmem.v1 import service_pb2, types_pb2
        self.asked = []

        def fetch(request, context):
            ids = list(request.block_ids)
            self.asked.append(ids)
            step = plan[len(self.asked) - 1] if len(self.asked) <= len(plan) else None
            for i, b in enumerate(ids):
                if step is not None and i == step:
                    if header:
                        context.set_trailing_metadata((("kvmem-blocks-sent", str(i)),))
                        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                      "no room in the tenant's share")
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"FetchBlocks sent {i} of {len(ids)} blocks: the "
                                  "tenant's share of --max_queued_response_bytes is held")
                yield service_pb2.FetchBlocksResponse(
                    block_id=b, offset=0, data=bytes([b]) * 8, last_chunk_of_block=True,
                    block=types_pb2.RecalledBlock())

        handlers = {"FetchBlocks": grpc.unary_stream_rpc_method_handler(
            fetch,
            request_deserializer=service_pb2.FetchBlocksRequest.FromString,
            response_serializer=service_pb2.FetchBlocksResponse.SerializeToString)}
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("kvmem.v1.KvMemory", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def fetch(self, ids):
        from kvmem.v1 import service_pb2
        with kvmem.Client(f"127.0.0.1:{self.port}", timeout=30) as c:
            return c._fetch_resuming(
                service_pb2.FetchBlocksRequest(stream_id="cam", block_ids=ids),
                "cam", None)

    def stop(self) -> None:
        self.server.stop(None)


class FetchResumeTest(unittest.TestCase):
    def test_a_fetch_refused_for_room_resumes_with_the_blocks_not_received(self):
        """Block 0 sent then a refusal, then one with nothing sent, then the
        rest: every block once, in order, each asked again only while it
        had not arrived."""
        for header in (False, True):  # The count in the message, the header.
            fake = _RefusingFetches([1, 0, None], header=header)
            try:
                blocks = fake.fetch([5, 6, 7])
                self.assertEqual([b["id"] for b in blocks], [5, 6, 7])
                self.assertEqual([b"".join(b["parts"]) for b in blocks],
                                 [bytes([i]) * 8 for i in (5, 6, 7)])
                self.assertEqual(fake.asked, [[5, 6, 7], [6, 7], [6, 7]])
            finally:
                fake.stop()

    def test_a_refusal_without_progress_is_raised_after_about_half_a_second(self):
        fake = _RefusingFetches([0] * 10)
        try:
            t0 = time.monotonic()
            with self.assertRaises(kvmem.ResourceExhaustedError) as refused:
                fake.fetch([1, 2])
            waited = time.monotonic() - t0
            self.assertIn("FetchBlocks sent 0 of 2", str(refused.exception))
            self.assertEqual(len(fake.asked), 6)  # The call and 5 more.
            self.assertGreaterEqual(waited, 0.6)
        finally:
            fake.stop()


class RedirectTest(unittest.TestCase):
    def test_a_client_at_the_wrong_server_follows_to_the_owner(self):
        with Server() as server:
            wrong = _WrongServer(server.tcp)
            try:
                target = f"127.0.0.1:{wrong.port}"
                with kvmem.Client(target, timeout=30, max_redirects=0) as stay:
                    with self.assertRaises(kvmem.UnavailableError) as refused:
                        stay.stats("cam")
                    self.assertEqual(refused.exception.owner, server.tcp)
                with kvmem.Client(target, timeout=30) as c:
                    c.open_stream("cam", config())
                    self.assertEqual(c.route("cam"), server.tcp)
                    fs = frames(4)
                    self.assertEqual(c.append_frames("cam", fs).last_durable_frame,
                                     len(fs) - 1)
                    blocks = c.fetch_blocks("cam", [0])
                    np.testing.assert_array_equal(blocks[0].frames[0], fs[0])
                    q = np.ones(LAYERS * HEADS * DIM, np.float32)
                    self.assertTrue(c.recall("cam", q, max_tokens=64).blocks)
                    with c.session("cam") as s:
                        self.assertEqual(s.opened.stats.last_durable_frame, len(fs) - 1)
                # A fresh client's first call on another stream also follows.
                with kvmem.Client(target, timeout=30) as c2:
                    self.assertEqual(c2.stats("cam").last_durable_frame, len(fs) - 1)
                    self.assertEqual(c2.route("cam"), server.tcp)
                self.assertGreaterEqual(wrong.calls, 3)
            finally:
                wrong.stop()

    def test_a_negative_redirect_limit_is_refused(self):
        with self.assertRaises(ValueError) as bad:
            kvmem.Client("127.0.0.1:1", max_redirects=-1)
        self.assertIn("max_redirects is -1", str(bad.exception))


@unittest.skipIf(shutil.which("openssl") is None, "openssl (deploy/bootstrap.sh) not installed")
class TlsTest(unittest.TestCase):
    def test_tls_with_root_certificate(self):
        tmp = tempfile.mkdtemp(prefix="kvmem-pytls-")
        try:
            cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                            "-out", cert, "-days", "1", "-subj", "/CN=kvmem-test",
                            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                           check=True, capture_output=True)
            with Server(f"--tls_cert_file={cert}", f"--tls_key_file={key}") as server:
                with kvmem.Client(server.tcp, root_certificates=cert, timeout=30) as c:
                    c.open_stream("tls-1", config())
                    self.assertEqual([s.stream_id for s in c.list_streams()], ["tls-1"])
                # The name checked is the target's host unless overridden.
                with open(cert, "rb") as f:
                    pem = f.read()
                target = f"localhost:{server.port}"
                with kvmem.Client(target, root_certificates=pem, server_name="localhost",
                                  timeout=30) as c:
                    self.assertEqual(len(c.list_streams()), 1)
                with kvmem.Client(server.tcp, timeout=5) as plain:
                    with self.assertRaises(kvmem.UnavailableError):
                        plain.list_streams()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)

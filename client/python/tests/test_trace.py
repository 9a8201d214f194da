"""kvmem.trace and `kvmem eval --trace`: a trace written by hand reads back as
the format says (trace.proto), probes find their targets from the track ids;
the reference model (examples/streaming_model.py) records the same trace
twice, and `kvmem eval --trace --via=grpc` (a real kvmem-server) replays it to
the same figures twice.

Exits with 77 (ctest: skipped) when torch cannot be imported (the reference
model needs it; kvmem.trace itself does not)."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import kvmem  # noqa: E402
import kvmem.trace as kt  # noqa: E402
from kvmem import _pb  # noqa: E402
from kvmem_test_util import cli_binary  # noqa: E402

try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: torch cannot be imported ({e}); deploy/bootstrap.sh installs "
          "python3-torch")
    sys.exit(77)

_EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "streaming_model.py")


def read_frames(directory: str) -> list:
    out = []
    with open(os.path.join(directory, "frames.bin"), "rb") as fh:
        while True:
            n = fh.read(8)
            if not n:
                return out
            (length,) = struct.unpack("<Q", n)
            f = _pb.trace_pb2.TraceFrame()
            f.ParseFromString(fh.read(length))
            out.append(f)


class TraceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvmem-trace-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_writer_layout_labels_and_probes(self):
        d = os.path.join(self.dir, "hand")
        rng = np.random.default_rng(1)
        frames = []
        with kt.TraceWriter(d, layers=2, kv_heads=2, head_dim=8, max_tokens_per_frame=4,
                            query_heads_per_kv=2, query_tokens=0, sink_tokens=1,
                            has_labels=True, labels={"who": "test"}) as w:
            # Object 5 in frames 0-1 and 4 (a new visit after a gap).
            for f, ids in enumerate([[-2, -1, 5, 5], [-1, -1, 5, 5], [-1, -1, -1, -1],
                                     [-1, -1, -1, 7], [-1, 5, 5, -1]]):
                kv = rng.standard_normal((2, 2, 2, 4, 8)).astype(np.float32)
                frames.append(kv)
                w.frame(kv, track_ids=ids)
                q = rng.standard_normal((2, 2 * 2 * 8)).astype(np.float32)
                if f == 4:
                    w.query(q, kind="probe", object=5)
                else:
                    w.query(q)
            with self.assertRaisesRegex(ValueError, "kv has shape"):
                w.frame(np.zeros((2, 2, 3, 4, 8)), track_ids=[0] * 4)
            with self.assertRaisesRegex(ValueError, "query has shape"):
                w.query(np.zeros((3, 32)))
        with open(os.path.join(d, "trace.json")) as fh:
            h = json.load(fh)
        self.assertEqual((h["format"], h["version"], int(h["frames"])), ("kvmem-trace", 1, 5))
        self.assertEqual(h["geometry"]["layers"], 2)
        self.assertEqual(h["labels"], {"who": "test"})
        got = read_frames(d)
        self.assertEqual(len(got), 5)
        for f, (rec, kv) in enumerate(zip(got, frames)):
            self.assertEqual(rec.header.frame_index, f)
            self.assertEqual(rec.header.first_token_position, 4 * f)
            payload = np.frombuffer(rec.payload, dtype="<f2").reshape(kv.shape)
            self.assertTrue(np.array_equal(payload, kv.astype(np.float16)))
            self.assertEqual(len(rec.queries), 1)
            self.assertEqual(rec.queries[0].position, 4 * f + 4)
        probe = got[4].queries[0]
        self.assertEqual(probe.kind, _pb.trace_pb2.TraceQuery.KIND_PROBE)
        self.assertEqual(probe.object, 5)
        # Frames 0-1 (positions 2-3 and 6-7), not the current visit.
        self.assertEqual(list(probe.earlier), [2, 4, 6, 8])

    def record(self, name: str) -> str:
        d = os.path.join(self.dir, name)
        subprocess.run([sys.executable, _EXAMPLE, "--no_kvmem", "--frames=80",
                        "--report_every=80", f"--trace={d}"], check=True,
                       capture_output=True, timeout=300)
        return d

    def replay(self, d: str) -> dict:
        out = subprocess.run([cli_binary(), "eval", f"--trace={d}", "--via=grpc",
                              "--recall_fractions=0.3", "--hot_window_tokens=256",
                              "--json"], check=True, capture_output=True, text=True,
                             timeout=300)
        return json.loads(out.stdout)

    def test_reference_model_trace_replays_the_same_twice(self):
        a, b = self.record("a"), self.record("b")
        for name in ("trace.json", "frames.bin"):
            with open(os.path.join(a, name), "rb") as x, open(os.path.join(b, name), "rb") as y:
                self.assertEqual(x.read(), y.read(), name)
        r1, r2 = self.replay(a), self.replay(b)
        self.assertEqual(r1["workload"]["frames"], 80)
        self.assertEqual(r1["workload"]["tokens"], 80 * 16)
        self.assertTrue(r1["kvmem_path"].startswith("unix:"))
        for policy in ("kvmem", "oracle_tokens", "exact_keys_per_head", "mean_key_topk"):
            p1, p2 = r1["policies"][policy], r2["policies"][policy]
            for key in ("cold_mass_recalled", "output_rel_error", "reid_success",
                        "injected_tokens_mean"):
                self.assertEqual(p1[key], p2[key], (policy, key))
        k, o = r1["policies"]["kvmem"], r1["policies"]["oracle_tokens"]
        self.assertGreater(k["cold_mass_recalled"], 0.0)
        self.assertLessEqual(k["cold_mass_recalled"], o["cold_mass_recalled"] + 1e-6)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""The example front end (examples/frontend.py) against a real kvmem-server,
then the C++ CLI (`kvmem recall --query=...`) on the same stream with the same
queries and budgets: both clients must get the same recall sets (block ids,
frames and token counts in order; scores and gate weights to float precision).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import kvmem  # noqa: E402
from kvmem_test_util import Server, cli_binary  # noqa: E402

FRONTEND = os.path.join(os.path.dirname(__file__), "..", "examples", "frontend.py")
STREAM = "cam-frontend"


def format_query(query: list[float]) -> str:
    """--query text that parses back to exactly the fp32 values sent."""
    text = [f"{np.float32(x):.9g}" for x in query]
    for t, x in zip(text, query):
        if np.float32(float(t)) != np.float32(x):
            raise AssertionError(f"{t} does not round-trip {x!r}")
    return ",".join(text)


class FrontendVsCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def frontend(self, *args: str) -> dict:
        p = subprocess.run([sys.executable, FRONTEND, f"--addr={self.server.unix}",
                            f"--stream={STREAM}", "--seed=11", "--json", *args],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, f"frontend.py failed:\n{p.stdout}\n{p.stderr}")
        return json.loads(p.stdout)

    def cli_recall(self, query: list[float], top_k: int, max_tokens: int) -> dict:
        # The CLI over TCP, the front end over the unix socket: one server.
        p = subprocess.run([cli_binary(), "recall", f"--addr={self.server.tcp}",
                            f"--stream={STREAM}", "--json", f"--top_k={top_k}",
                            f"--max_tokens={max_tokens}", "--query=" + format_query(query)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, f"kvmem recall failed:\n{p.stdout}\n{p.stderr}")
        return json.loads(p.stdout)

    def check_run(self, out: dict, frames: int) -> None:
        self.assertEqual(out["stats"]["frames"], frames)
        self.assertEqual(out["append"]["last_durable_frame"], frames - 1)
        self.assertEqual(len(out["recalls"]), 3)
        self.assertTrue(any(len(r["blocks"]) >= 2 for r in out["recalls"]))
        for r in out["recalls"]:
            with self.subTest(frames=frames, scene=r["scene"]):
                self.assertGreater(len(r["blocks"]), 0)
                self.assertLessEqual(r["total_tokens"], r["max_tokens"])
                self.assertTrue(r["fetched"]["shape_ok"] and r["fetched"]["bytes_match"])
                # The workload has structure: recall finds the queried scene.
                self.assertGreaterEqual(r["precision"], 0.75)

                cpp = self.cli_recall(r["query"], r["top_k"], r["max_tokens"])
                cpp_blocks = cpp.get("blocks", [])
                self.assertEqual(
                    [(int(b["block_id"]), int(b["first_frame"]), int(b["last_frame"]),
                      int(b["token_count"])) for b in cpp_blocks],
                    [(b["block_id"], b["first_frame"], b["last_frame"], b["token_count"])
                     for b in r["blocks"]])
                self.assertEqual(cpp["total_tokens"], r["total_tokens"])
                self.assertEqual(cpp["budget_tokens"], r["budget_tokens"])
                self.assertEqual(cpp["candidates"], r["candidates"])
                for c, p in zip(cpp_blocks, r["blocks"]):
                    self.assertAlmostEqual(c["score"], p["score"],
                                           delta=1e-5 * max(1.0, abs(p["score"])))
                    self.assertAlmostEqual(c["gate_weight"], p["gate_weight"], delta=1e-5)

                # And the Python client again after the CLI: the same set.
                with kvmem.Client(self.server.tcp, timeout=30) as c:
                    again = c.recall(STREAM, np.asarray(r["query"], np.float32),
                                     top_k=r["top_k"], max_tokens=r["max_tokens"])
                self.assertEqual(again.block_ids, [b["block_id"] for b in r["blocks"]])

    def test_frontend_and_cpp_cli_agree(self):
        first = self.frontend("--frames=96")
        self.assertEqual(first["resumed_at"], 0)
        self.assertEqual(first["append"]["frames_written"], 96)
        self.check_run(first, 96)
        # A second run resumes the stream at its last durable frame + 1 with
        # the same deterministic frames (its byte checks cover both runs).
        second = self.frontend("--frames=112", "--max_tokens=320", "--top_k=6")
        self.assertEqual(second["resumed_at"], 96)
        self.assertEqual(second["append"]["frames_written"], 16)
        self.check_run(second, 112)


if __name__ == "__main__":
    unittest.main(verbosity=2)

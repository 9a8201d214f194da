"""Python client checks that need no kvmem-server: the typed mirrors match the
generated messages, numpy payload encoding, error mapping, and the metadata
every call sends (seen by a stand-in gRPC server)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import unittest
from concurrent import futures

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import kvmem  # noqa: E402
from kvmem import messages  # noqa: E402
from kvmem.v1 import service_pb2, service_pb2_grpc, types_pb2  # noqa: E402


def _proto_class(name: str):
    return getattr(types_pb2, name, None) or getattr(service_pb2, name)


class MirrorTest(unittest.TestCase):
    def test_every_proto_field_is_mirrored(self):
        for cls, name in messages.MIRRORS.items():
            with self.subTest(message=name):
                proto = _proto_class(name).DESCRIPTOR
                self.assertEqual(sorted(f.name for f in dataclasses.fields(cls)),
                                 sorted(proto.fields_by_name),
                                 f"{cls.__name__} fields differ from kvmem.v1.{name}")

    def test_enums_match(self):
        for cls, name in messages.PROTO_ENUMS.items():
            with self.subTest(enum=name):
                proto = types_pb2.DESCRIPTOR.enum_types_by_name.get(name) or \
                    service_pb2.DESCRIPTOR.enum_types_by_name[name]
                prefix = {"DType": "DTYPE_", "PayloadLayout": "PAYLOAD_LAYOUT_",
                          "SegmentMode": "SEGMENT_MODE_", "Tier": "TIER_",
                          "ReplacementPolicy": "REPLACEMENT_POLICY_",
                          "ColdPrecision": "COLD_PRECISION_",
                          "ScoreMode": "SCORE_MODE_"}[name]
                self.assertEqual({prefix + m.name: int(m) for m in cls},
                                 {v.name: v.number for v in proto.values})

    def test_config_round_trip(self):
        cfg = kvmem.StreamConfig(
            geometry=kvmem.StreamGeometry(layers=4, kv_heads=2, head_dim=64,
                                          dtype=kvmem.DType.BF16, max_tokens_per_frame=32),
            hot_window_tokens=512,
            block_policy=kvmem.BlockPolicy(frames_per_block=6, mode=kvmem.SegmentMode.SHOT,
                                           shot_similarity_threshold=0.5),
            index_policy=kvmem.IndexPolicy(indexed_layers=[3, 1], index_factory="HNSW32",
                                           groups_per_block=4),
            recall_defaults=kvmem.RecallDefaults(top_k=5, max_tokens=100,
                                                 gate_temperature=0.25),
            labels={"site": "lab", "camera": "7"},
            tier_policy=kvmem.TierPolicy(warm_budget_bytes=1 << 20,
                                         replacement=kvmem.ReplacementPolicy.LRU,
                                         prefetch_blocks=2,
                                         cold_precision=kvmem.ColdPrecision.INT8),
            recall_policy=kvmem.RecallPolicy(model_weight=1.0, scene_weight=0.5))
        msg = messages.to_proto(cfg, types_pb2.StreamConfig())
        self.assertEqual(msg.geometry.dtype, types_pb2.DTYPE_BF16)
        self.assertEqual(list(msg.index_policy.indexed_layers), [3, 1])
        self.assertEqual(msg.tier_policy.replacement, types_pb2.REPLACEMENT_POLICY_LRU)
        self.assertEqual(msg.tier_policy.cold_precision, types_pb2.COLD_PRECISION_INT8)
        self.assertEqual(dict(msg.labels), {"site": "lab", "camera": "7"})
        back = messages.from_proto(kvmem.StreamConfig, msg)
        self.assertEqual(back, cfg)
        # An optional field keeps unset apart from 0 both ways.
        self.assertFalse(msg.recall_policy.HasField("identity_share"))
        self.assertIsNone(back.recall_policy.identity_share)
        cfg.recall_policy.identity_share = 0.0
        msg = messages.to_proto(cfg, types_pb2.StreamConfig())
        self.assertTrue(msg.recall_policy.HasField("identity_share"))
        self.assertEqual(messages.from_proto(kvmem.StreamConfig, msg)
                         .recall_policy.identity_share, 0.0)
        self.assertIsInstance(back.block_policy.mode, kvmem.SegmentMode)


class PayloadTest(unittest.TestCase):
    g = kvmem.StreamGeometry(layers=2, kv_heads=3, head_dim=4, dtype=kvmem.DType.FP16,
                             max_tokens_per_frame=8)

    def test_fp16_layout_is_layer_major(self):
        kv = np.arange(2 * 2 * 3 * 5 * 4, dtype=np.float32).reshape(2, 2, 3, 5, 4)
        tokens, payload = kvmem.encode_frame(self.g, kv)
        self.assertEqual(tokens, 5)
        self.assertEqual(len(payload), self.g.payload_bytes(5))
        flat = np.frombuffer(payload, dtype="<f2")
        # Layer 1, V, head 2, token 3, dim 1: layer-major, K before V.
        idx = (((1 * 2 + 1) * 3 + 2) * 5 + 3) * 4 + 1
        self.assertEqual(flat[idx], kv[1, 1, 2, 3, 1])
        back = kvmem.decode_kv(self.g, payload, layers=2)
        np.testing.assert_array_equal(back, kv.astype(np.float16))

    def test_shape_checked(self):
        with self.assertRaisesRegex(ValueError, "kv_heads=3"):
            kvmem.encode_frame(self.g, np.zeros((2, 2, 2, 5, 4), np.float16))
        with self.assertRaisesRegex(ValueError, "floating"):
            kvmem.encode_frame(self.g, np.zeros((2, 2, 3, 5, 4), np.int32))

    def test_stack_kv(self):
        k = np.ones((2, 3, 5, 4), np.float16)
        v = np.zeros((2, 3, 5, 4), np.float16)
        kv = kvmem.stack_kv(k, v)
        self.assertEqual(kv.shape, (2, 2, 3, 5, 4))
        self.assertTrue((kv[:, 0] == 1).all() and (kv[:, 1] == 0).all())

    def test_bf16(self):
        x = np.array([1.0, -2.5, 3.140625, 1.00390625, 65504.0, 1e-3], dtype=np.float32)
        bits = kvmem.float32_to_bf16(x)
        self.assertEqual(bits.dtype, np.uint16)
        self.assertEqual(int(bits[0]), 0x3F80)
        self.assertEqual(int(bits[1]), 0xC020)
        # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
        self.assertEqual(int(bits[3]), 0x3F80)
        back = kvmem.bf16_to_float32(bits)
        np.testing.assert_allclose(back, x, rtol=2 ** -8)
        self.assertEqual(back[2], np.float32(3.140625))
        g = dataclasses.replace(self.g, dtype=kvmem.DType.BF16)
        kv = np.linspace(-3, 3, 2 * 2 * 3 * 2 * 4, dtype=np.float32).reshape(2, 2, 3, 2, 4)
        _, payload = kvmem.encode_frame(g, kv)
        np.testing.assert_array_equal(kvmem.decode_kv(g, payload, 2),
                                      kvmem.float32_to_bf16(kv))


class ErrorTest(unittest.TestCase):
    def test_mapping(self):
        e = kvmem.errors.error_for(grpc.StatusCode.ALREADY_EXISTS,
                                   'frame 3 of stream "a" is already stored; last durable '
                                   'frame is 7')
        self.assertIsInstance(e, kvmem.AlreadyExistsError)
        self.assertIsInstance(e, kvmem.KvmemError)
        self.assertEqual(e.code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertEqual(e.last_durable_frame, 7)
        e = kvmem.errors.error_from_code_value(5, "no stream")
        self.assertIsInstance(e, kvmem.NotFoundError)
        self.assertIsNone(e.last_durable_frame)
        e = kvmem.errors.error_from_code_value(13, "boom")
        self.assertEqual(type(e), kvmem.KvmemError)
        self.assertEqual(e.code, grpc.StatusCode.INTERNAL)


class _Recorder(service_pb2_grpc.KvMemoryServicer):
    """Records each call's metadata, then fails it (GetStreamStats answers,
    so that calls needing the geometry get as far as their own RPC)."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def _record(self, name, context):
        self.calls.append((name, dict(context.invocation_metadata())))

    def _fail(self, name, context):
        self._record(name, context)
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"recorder: {name}")

    def GetStreamStats(self, request, context):
        self._record("GetStreamStats", context)
        s = types_pb2.StreamStats(stream_id=request.stream_id, last_durable_frame=-1)
        s.config.geometry.layers = 1
        s.config.geometry.kv_heads = 1
        s.config.geometry.head_dim = 2
        s.config.geometry.dtype = types_pb2.DTYPE_FP32
        return s

    def OpenStream(self, request, context):
        self._fail("OpenStream", context)

    def CloseStream(self, request, context):
        self._fail("CloseStream", context)

    def DeleteStream(self, request, context):
        self._fail("DeleteStream", context)

    def ListStreams(self, request, context):
        self._fail("ListStreams", context)

    def AppendFrames(self, request_iterator, context):
        for _ in request_iterator:
            pass
        self._fail("AppendFrames", context)

    def Recall(self, request, context):
        self._fail("Recall", context)

    def FetchBlocks(self, request, context):
        self._fail("FetchBlocks", context)

    def Session(self, request_iterator, context):
        next(request_iterator, None)
        self._fail("Session", context)


class MetadataTest(unittest.TestCase):
    def test_every_stream_call_names_its_stream(self):
        tmp = tempfile.mkdtemp(prefix="kvmem-pymd-")
        recorder = _Recorder()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_pb2_grpc.add_KvMemoryServicer_to_server(recorder, server)
        addr = "unix:" + os.path.join(tmp, "s.sock")
        server.add_insecure_port(addr)
        server.start()
        try:
            c = kvmem.Client(addr, api_key="k" * 20, timeout=10)
            cfg = kvmem.StreamConfig(geometry=kvmem.StreamGeometry(1, 1, 2, kvmem.DType.FP32, 4))
            calls = [
                lambda: c.open_stream("cam-7", cfg),
                lambda: c.append_frames("cam-7", [np.zeros((1, 2, 1, 3, 2), np.float32)]),
                lambda: c.recall("cam-7", [0.5, 0.5]),
                lambda: c.fetch_blocks("cam-7", [1]),
                lambda: c.close_stream("cam-7"),
                lambda: c.delete_stream("cam-7"),
                lambda: c.session("cam-7"),
                lambda: c.list_streams(),
            ]
            for call in calls:
                with self.assertRaises(kvmem.KvmemError) as cm:
                    call()
                self.assertEqual(cm.exception.code, grpc.StatusCode.UNIMPLEMENTED)
            c.stats("cam-7")
            c.close()
        finally:
            server.stop(None)
            shutil.rmtree(tmp, ignore_errors=True)
        seen = {name for name, _ in recorder.calls}
        self.assertEqual(seen, {"OpenStream", "AppendFrames", "Recall", "FetchBlocks",
                                "CloseStream", "DeleteStream", "Session", "ListStreams",
                                "GetStreamStats"})
        for name, md in recorder.calls:
            with self.subTest(call=name):
                self.assertEqual(md.get("authorization"), "Bearer " + "k" * 20)
                if name == "ListStreams":
                    self.assertNotIn(kvmem.STREAM_ID_HEADER, md)
                else:
                    self.assertEqual(md.get(kvmem.STREAM_ID_HEADER), "cam-7")


if __name__ == "__main__":
    unittest.main(verbosity=2)

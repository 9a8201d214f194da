// Wire-level helpers for tests that drive a real kvmem-server: a stream
// config for a test geometry, and a StreamModel frame as the client uploads
// it.
#ifndef KVMEM_TESTS_WIRE_FIXTURE_H_
#define KVMEM_TESTS_WIRE_FIXTURE_H_

#include <cstdint>
#include <vector>

#include "client/cpp/kvmem_client.h"
#include "tests/stream_model.h"

namespace kvmem::testing {

// Geometry g with frames of up to 16 tokens; the given hot window, frames
// per block and indexed layers.
inline v1::StreamConfig WireConfig(const TestGeometry& g, uint32_t window,
                                   uint32_t frames_per_block,
                                   const std::vector<uint32_t>& indexed) {
  v1::StreamConfig c;
  c.mutable_geometry()->set_layers(g.layers);
  c.mutable_geometry()->set_kv_heads(g.kv_heads);
  c.mutable_geometry()->set_head_dim(g.head_dim);
  c.mutable_geometry()->set_dtype(static_cast<v1::DType>(g.dtype));
  c.mutable_geometry()->set_max_tokens_per_frame(16);
  c.set_hot_window_tokens(window);
  c.mutable_block_policy()->set_frames_per_block(frames_per_block);
  for (uint32_t l : indexed) c.mutable_index_policy()->add_indexed_layers(l);
  // Whole blocks on an exact index, so StreamModel's oracles apply; the
  // score is the default (per-head mass: StreamModel::MassRecall).
  c.mutable_index_policy()->set_groups_per_block(1);
  c.mutable_index_policy()->set_index_factory("Flat");
  return c;
}

// Frame i of a model, as an upload.
inline OutgoingFrame ToOutgoing(const ModelFrame& m, uint64_t i) {
  OutgoingFrame f;
  f.header.set_frame_index(i);
  f.header.set_first_token_position(m.first_pos);
  f.header.set_token_count(m.kv.tokens);
  f.payload = m.bytes;
  return f;
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_WIRE_FIXTURE_H_

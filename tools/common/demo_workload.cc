#include "tools/common/demo_workload.h"

#include <cmath>

#include "engine/codec/dtype.h"

namespace kvmem {
namespace {

std::vector<float> UnitVector(std::mt19937_64& rng, size_t dim, float scale) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(dim);
  double norm = 0;
  for (auto& x : v) {
    x = n(rng);
    norm += x * x;
  }
  const float k = scale / static_cast<float>(std::sqrt(norm / (dim / 64.0)));
  for (auto& x : v) x *= k;
  return v;
}

}  // namespace

v1::StreamConfig DemoStreamConfig(const DemoGeometry& g) {
  v1::StreamConfig c;
  c.mutable_geometry()->set_layers(g.layers);
  c.mutable_geometry()->set_kv_heads(g.kv_heads);
  c.mutable_geometry()->set_head_dim(g.head_dim);
  c.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
  c.mutable_geometry()->set_max_tokens_per_frame(g.tokens_per_frame);
  c.set_hot_window_tokens(g.hot_window_tokens);
  c.mutable_block_policy()->set_mode(v1::SEGMENT_MODE_SHOT);
  c.mutable_block_policy()->set_frames_per_block(g.frames_per_block);
  c.mutable_recall_defaults()->set_max_tokens(g.recall_max_tokens);
  v1::TierPolicy* t = c.mutable_tier_policy();
  t->set_replacement(v1::REPLACEMENT_POLICY_HEAT);
  t->set_warm_budget_bytes(g.warm_budget_bytes);
  t->set_cold_budget_bytes(g.cold_budget_bytes);
  t->set_prefetch_blocks(g.prefetch_blocks);
  t->set_stage_budget_bytes(g.stage_budget_bytes);
  t->set_rebuild_every_blocks(64);
  c.mutable_recall_policy()->set_scene_weight(0.5f);
  c.mutable_recall_policy()->set_track_weight(0.5f);
  return c;
}

CameraWorkload::CameraWorkload(uint64_t seed, const DemoGeometry& g, int places,
                               int frames)
    : g_(g), rng_(seed) {
  const size_t dim = static_cast<size_t>(g.layers) * g.kv_heads * g.head_dim;
  // Places share a common component (one building, one camera), so telling
  // them apart takes the smaller place-specific part.
  const std::vector<float> common = UnitVector(rng_, dim, 1.0f);
  for (int p = 0; p < places; ++p) {
    std::vector<float> v = UnitVector(rng_, dim, 0.35f);
    for (size_t i = 0; i < dim; ++i) v[i] += common[i];
    places_.push_back(std::move(v));
    scenes_.push_back(UnitVector(rng_, kDemoSceneDim, 1.0f));
  }
  // Shots of 6..20 frames; the next place is random, so places recur.
  std::uniform_int_distribution<int> len(6, 20), pick(0, places - 1);
  int shot = 0;
  while (static_cast<int>(place_of_frame_.size()) < frames) {
    const int place = pick(rng_);
    for (int i = len(rng_);
         i > 0 && static_cast<int>(place_of_frame_.size()) < frames; --i) {
      place_of_frame_.push_back(place);
      shot_of_frame_.push_back(shot);
    }
    ++shot;
  }
}

OutgoingFrame CameraWorkload::MakeFrame(int index) {
  const size_t dim = g_.head_dim;
  if (shot_of_frame_[index] != offset_shot_) {
    offset_shot_ = shot_of_frame_[index];
    shot_offset_ = UnitVector(rng_, places_[0].size(), 0.35f);
  }
  const std::vector<float>& place = places_[place_of_frame_[index]];
  std::normal_distribution<float> noise(0.0f, 0.8f);
  const uint32_t t = g_.tokens_per_frame;
  std::vector<float> slice(static_cast<size_t>(g_.kv_heads) * t * dim);
  OutgoingFrame f;
  f.header.set_frame_index(index);
  f.header.set_timestamp_us(static_cast<int64_t>(index) * 333333);
  f.header.set_first_token_position(static_cast<uint64_t>(index) * t);
  f.header.set_token_count(t);
  const int place_id = place_of_frame_[index];
  v1::FrameSignals* sig = f.header.mutable_signals();
  std::normal_distribution<float> scene_noise(0.0f, 0.05f);
  for (float x : scenes_[place_id])
    sig->add_scene_embedding(x + scene_noise(rng_));
  v1::Detection* d = sig->add_detections();
  d->set_track_id(static_cast<uint64_t>(place_id));
  d->set_x_min(0.2f);
  d->set_y_min(0.2f);
  d->set_x_max(0.6f);
  d->set_y_max(0.7f);
  d->set_score(0.9f);
  f.payload.resize(static_cast<size_t>(g_.layers) * 2 * slice.size() * 2);
  auto* out = reinterpret_cast<uint8_t*>(f.payload.data());
  for (uint32_t l = 0; l < g_.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g_.kv_heads; ++h) {
        const size_t base = (static_cast<size_t>(l) * g_.kv_heads + h) * dim;
        for (uint32_t tok = 0; tok < t; ++tok) {
          float* dst = slice.data() + (static_cast<size_t>(h) * t + tok) * dim;
          for (size_t d = 0; d < dim; ++d) {
            dst[d] =
                kv == 0 ? place[base + d] + shot_offset_[base + d] + noise(rng_)
                        : noise(rng_);
          }
        }
      }
      EncodeFromFloat(slice.data(), slice.size(), DType::kFp16, out);
      out += slice.size() * 2;
    }
  }
  return f;
}

std::vector<float> CameraWorkload::MakeQuery(int index) {
  std::normal_distribution<float> noise(0.0f, 0.15f);
  std::vector<float> q = places_[place_of_frame_[index]];
  for (auto& x : q) x += noise(rng_);
  return q;
}

}  // namespace kvmem

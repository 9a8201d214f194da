// A small synthetic multi-camera workload for `kvmem demo`: each camera cuts
// between a few places (backgrounds), revisiting them, so old shots become
// relevant again after they left the hot window. Keys are a place's latent
// vector plus shot and token noise; a query is the current place's latent
// plus noise. Each frame also carries the signals a front end would send: a
// scene embedding (the place's, plus noise) and a detection of the place's
// landmark (track id = place). Deterministic for a seed. (The full video-like
// workload of the evaluation harness is a separate, richer generator.)
//
// Thread safety: a CameraWorkload is used by one thread.
#ifndef KVMEM_TOOLS_COMMON_DEMO_WORKLOAD_H_
#define KVMEM_TOOLS_COMMON_DEMO_WORKLOAD_H_

#include <cstdint>
#include <random>
#include <vector>

#include "client/cpp/kvmem_client.h"

namespace kvmem {

struct DemoGeometry {
  uint32_t layers = 4;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 64;
  uint32_t tokens_per_frame = 32;
  uint32_t hot_window_tokens = 512;
  uint32_t frames_per_block = 4;     // Most frames a shot block may hold.
  uint32_t recall_max_tokens = 160;  // ~30 % of the window, as V-Rex suggests.
  // Per camera: with the defaults (240 frames of 64 KiB) about 4 blocks stay
  // warm, 16 cold, and the rest degraded.
  uint64_t warm_budget_bytes = 1 << 20;
  uint64_t cold_budget_bytes = 4 << 20;
  uint32_t prefetch_blocks = 2;
  uint64_t stage_budget_bytes = 512 << 10;
};

// Dimension of the scene embedding the demo's "front end" sends.
inline constexpr size_t kDemoSceneDim = 32;

v1::StreamConfig DemoStreamConfig(const DemoGeometry& g);

class CameraWorkload {
 public:
  CameraWorkload(uint64_t seed, const DemoGeometry& g, int places, int frames);

  OutgoingFrame MakeFrame(int index);
  // Query for frame `index`, one vector per layer and KV head.
  std::vector<float> MakeQuery(int index);
  int PlaceOf(int frame) const { return place_of_frame_[frame]; }
  int frames() const { return static_cast<int>(place_of_frame_.size()); }

 private:
  DemoGeometry g_;
  std::mt19937_64 rng_;
  std::vector<std::vector<float>> places_;  // [place][layer*heads*dim]
  std::vector<int> place_of_frame_;
  std::vector<int> shot_of_frame_;
  std::vector<std::vector<float>> scenes_;  // [place][kDemoSceneDim]
  std::vector<float> shot_offset_;          // Current shot's offset vector.
  int offset_shot_ = -1;
};

}  // namespace kvmem

#endif  // KVMEM_TOOLS_COMMON_DEMO_WORKLOAD_H_

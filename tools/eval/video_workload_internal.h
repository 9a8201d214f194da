// The video workload's internals, shared by its frames (video_workload.cc)
// and its queries (video_queries.cc): seeded helpers, the schedule's
// records and VideoWorkload::Impl. Not part of any interface.
#ifndef KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_INTERNAL_H_
#define KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "base/split_mix.h"
#include "tools/eval/video_workload.h"

namespace kvmem {
namespace video_internal {

// A seed for each (purpose, a, b, c) (base/split_mix.h) so any frame can be
// built in any order with the same result.
inline uint64_t Seed(uint64_t seed, uint64_t what, uint64_t a, uint64_t b = 0,
                     uint64_t c = 0) {
  return SplitMix64(SplitMix64(SplitMix64(SplitMix64(seed ^ what) ^ a) ^ b) ^
                    c);
}

enum Purpose : uint64_t {
  kBasis = 1,
  kProject,
  kShots,
  kVisits,
  kVisitVec,
  kShotVec,
  kNoise,
  kOcclude,
  kQuery,
  kScene,
  kBox,
  kPatch,
  kTexture,
  kAppearance,
};

inline std::vector<float> Gaussian(uint64_t seed, size_t n, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

inline void Normalize(std::vector<float>* v) {
  double n = 0;
  for (float x : *v) n += static_cast<double>(x) * x;
  if (n <= 0) return;
  const float k = static_cast<float>(1.0 / std::sqrt(n));
  for (auto& x : *v) x *= k;
}

inline void AddScaled(std::vector<float>* acc, const std::vector<float>& v,
                      float k) {
  for (size_t i = 0; i < acc->size(); ++i) (*acc)[i] += k * v[i];
}

inline double LogUniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
  return std::exp(u(rng));
}

struct Visit {
  uint32_t camera = 0;
  uint64_t begin = 0, end = 0;  // Frames [begin, end).
  uint32_t serial = 0;          // The object's visit number.
};

struct Shot {
  uint64_t begin = 0;
  uint32_t place = 0;
};

// The objects in view on a camera at a frame (occlusions removed), at most
// max_objects_per_frame, earliest arrival first; with each one's visit.
std::vector<std::pair<int, const Visit*>> InView(
    const VideoWorkloadOptions& o,
    const std::vector<std::vector<Visit>>& visits, uint32_t camera, uint64_t f);

// Rotates each dimension pair i of y (d floats) by position * theta[i].
void Rope(float* y, size_t d, double position,
          const std::vector<double>& theta);

}  // namespace video_internal

struct VideoWorkload::Impl {
  // Latent basis: the sink, the places and the objects are orthonormal
  // directions (distinct entities do not match by accident); patches, parts,
  // shots, visits and noise are small random perturbations on top.
  std::vector<std::vector<float>> place, object, patch, part, texture;
  std::vector<float> sink;
  // Projections per (layer, head): A (keys and queries) and B (values),
  // head_dim x latent_dim, row-major.
  std::vector<std::vector<float>> a, b;
  // Logit scale of each query head, [layer][kv_head][query head of group].
  std::vector<float> qscale;
  std::vector<float> scene_proj;  // scene_dim x latent_dim
  std::vector<double> theta;      // RoPE frequency per dimension pair.
  std::vector<std::vector<video_internal::Shot>> shots;  // Per camera.
  std::vector<std::vector<video_internal::Visit>>
      visits;                                 // Per object, in time order.
  std::vector<std::vector<uint32_t>> places;  // Per camera: its places.
  uint64_t walks = 0;

  // Construction steps (video_workload.cc), each from its own seeds;
  // latent: VideoWorkload::latent_dim().
  void BuildEntities(const VideoWorkloadOptions& o, size_t latent);
  void BuildProjections(const VideoWorkloadOptions& o, size_t latent);
  void BuildQueryHeads(const VideoWorkloadOptions& o, size_t latent);
  void BuildShots(const VideoWorkloadOptions& o);
  void BuildVisits(const VideoWorkloadOptions& o);
  // A frame's KV from its token latents x: layer-major, K then V,
  // [kv_heads][tokens][head_dim], fp16, keys RoPE'd from position pos0.
  void EncodeKV(const VideoWorkloadOptions& o, size_t latent,
                const std::vector<std::vector<float>>& x, uint64_t pos0,
                std::string* payload) const;
  // Queries (video_queries.cc): the query heads reading latents xs at
  // `position` into q; the latent of token s of a frame; the probes of
  // objects entering camera at frame f again, appended to *out.
  void QueryHeads(const VideoWorkloadOptions& o, size_t latent,
                  size_t summary_dim, uint64_t position,
                  std::vector<std::vector<float>> xs, WorkloadQuery* q) const;
  std::vector<float> TokenLatent(const VideoWorkloadOptions& o,
                                 const WorkloadFrame& frame, size_t s) const;
  void Probes(const VideoWorkloadOptions& o, size_t latent, size_t summary_dim,
              uint32_t camera, uint64_t f, const WorkloadFrame& frame,
              std::vector<WorkloadQuery>* out) const;
  // Whole-frame queries (frame_query_tokens > 0): the frame's query, a
  // probe when an object re-enters this camera at f.
  void FrameQuery(const VideoWorkloadOptions& o, size_t latent,
                  size_t summary_dim, uint32_t camera, uint64_t f,
                  const WorkloadFrame& frame,
                  std::vector<WorkloadQuery>* out) const;
  // The positions of object ob's tokens on its visits to `camera` before
  // visit i (re-identification targets), oldest first.
  std::vector<std::pair<uint64_t, uint64_t>> Earlier(
      const VideoWorkloadOptions& o, uint32_t camera, uint32_t ob,
      size_t i) const;
  // The change of object ob's part j on its visit `serial` (appearance
  // change; unit length).
  std::vector<float> Appearance(const VideoWorkloadOptions& o, size_t latent,
                                int ob, uint32_t serial, uint32_t j) const;
  // The scene embedding of a shot at a place.
  std::vector<float> Scene(const VideoWorkloadOptions& o, size_t latent,
                           uint32_t shot_place,
                           const std::vector<float>& shot_vec) const;

  const video_internal::Shot& ShotAt(uint32_t camera, uint64_t f,
                                     uint64_t* serial) const {
    const auto& s = shots[camera];
    auto it =
        std::upper_bound(s.begin(), s.end(), f,
                         [](uint64_t frame, const video_internal::Shot& sh) {
                           return frame < sh.begin;
                         });
    *serial = static_cast<uint64_t>(it - s.begin()) - 1;
    return *(it - 1);
  }
};

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_INTERNAL_H_

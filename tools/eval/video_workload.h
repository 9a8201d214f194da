// The evaluation workload: a deterministic, seeded synthetic video-KV stream
// whose structure is video-like rather than text-like.
//
// Latent world: places (backgrounds) that cameras cut between and revisit;
// objects with persistent identity embeddings that enter and leave cameras,
// are occluded, and come back after gaps from seconds to minutes, sometimes
// on another camera (one global schedule, so a person walks from camera to
// camera); a few attention-sink tokens at the start of every stream; heavy
// frame-to-frame redundancy (a token's latent changes by a little noise from
// one frame to the next).
//
// Each token's latent vector x (unit length, latent_dim) gives its key and
// value for every layer l and KV head h by fixed random projections:
//   k = RoPE(position) * (A_lh x),  v = B_lh x,  q = RoPE(position) * s A_lh
//   x_q
// RoPE at absolute positions (base rope_base) rotates each dimension pair i
// by position * base^(-2i/head_dim). The rows of A_lh carry more energy in
// the low-frequency pairs (low_freq_bias), as trained RoPE models put their
// semantic channels there (Barbero et al., "Round and Round We Go! What
// makes Rotary Positional Encodings useful?", 2024); so what matches stays
// findable far back, while the high-frequency pairs turn a block's mean key
// into a blur: mean-key summaries are realistically imperfect.
//
// Queries, after each query_every-th frame, at the next token position:
// "frame" queries come from a random token of the current frame with its
// detections and scene embedding as signals; "probe" queries ask where an
// object that has just re-entered this camera was before: its identity as
// the latent, its detection as the signal. Keys and values are rounded to
// fp16 (what is stored) before the oracle sees them.
//
// Thread safety: a VideoWorkload is immutable after construction; Camera
// objects are used by one thread each.
#ifndef KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_H_
#define KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tools/eval/workload_source.h"

namespace kvmem {

class VideoWorkload final : public WorkloadSource {
 public:
  explicit VideoWorkload(const VideoWorkloadOptions& options);
  ~VideoWorkload() override;

  const VideoWorkloadOptions& options() const override { return o_; }
  uint32_t cameras() const { return o_.cameras; }
  uint32_t frames() const { return o_.frames; }
  uint32_t summary_dim() const { return o_.layers * o_.kv_heads * o_.head_dim; }
  uint32_t latent_dim() const;

  WorkloadFrame Frame(uint32_t camera, uint64_t f) const override;
  std::vector<WorkloadQuery> Queries(uint32_t camera, uint64_t f,
                                     const WorkloadFrame& frame) const override;
  uint64_t shots(uint32_t camera) const override;
  // Visits that continue an object on another camera.
  uint64_t walks() const override;

 private:
  struct Impl;
  VideoWorkloadOptions o_;
  std::unique_ptr<Impl> impl_;
};

// Validation of the knobs: empty when fine, else what is wrong.
std::string CheckVideoWorkloadOptions(const VideoWorkloadOptions& o);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_H_

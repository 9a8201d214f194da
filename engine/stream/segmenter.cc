#include "engine/stream/segmenter.h"

#include <cmath>

#include "engine/signals/semantics.h"

namespace kvmem {

Segmenter::Segmenter(const StreamConfig& config)
    : shot_(config.segment_mode == SegmentMode::kShot),
      max_frames_(config.frames_per_block),
      max_tokens_(config.max_tokens_per_block),
      threshold_(config.shot_similarity_threshold) {}

Segmenter::Cut Segmenter::CutBefore(const std::vector<float>& signature,
                                    uint32_t tokens, uint32_t open_frames,
                                    uint32_t open_tokens) const {
  if (!shot_ || open_frames == 0) return Cut::kNone;
  if (open_frames + 1 > max_frames_) return Cut::kSize;
  if (max_tokens_ > 0 && open_tokens + tokens > max_tokens_) return Cut::kSize;
  // A signature of another size (embedding switched on or off) is a cut too.
  if (running_.size() != signature.size() ||
      Cosine(running_, signature) < threshold_) {
    return Cut::kShot;
  }
  return Cut::kNone;
}

bool Segmenter::FullAfter(uint32_t open_frames) const {
  return !shot_ && open_frames >= max_frames_;
}

void Segmenter::Add(const std::vector<float>& signature) {
  if (!shot_) return;
  if (running_.size() != signature.size()) running_.assign(signature.size(), 0);
  double norm = 0;
  for (float x : signature) norm += static_cast<double>(x) * x;
  if (norm == 0) return;
  const float inv = static_cast<float>(1.0 / std::sqrt(norm));
  for (size_t i = 0; i < signature.size(); ++i)
    running_[i] += signature[i] * inv;
}

void Segmenter::Reset() { running_.clear(); }

}  // namespace kvmem

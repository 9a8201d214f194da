// Segmenter: decides where blocks end. FIXED cuts every frames_per_block
// frames. SHOT starts a new block when a frame's signature (its scene
// embedding, or its mean key over the indexed layers when it has none) has
// cosine similarity below the threshold with the running block's mean
// signature, or when the block would grow past its frame or token cap.
//
// Thread safety: none; owned by one Stream's append path.
#ifndef KVMEM_ENGINE_STREAM_SEGMENTER_H_
#define KVMEM_ENGINE_STREAM_SEGMENTER_H_

#include <vector>

#include "engine/types.h"

namespace kvmem {

class Segmenter {
 public:
  enum class Cut { kNone, kShot, kSize };

  // REQUIRES: config has defaults filled.
  explicit Segmenter(const StreamConfig& config);

  // Before adding a frame of `tokens` tokens with `signature` to a block of
  // open_frames frames and open_tokens tokens: must the block end first?
  Cut CutBefore(const std::vector<float>& signature, uint32_t tokens,
                uint32_t open_frames, uint32_t open_tokens) const;
  // After adding a frame: is the block full (FIXED mode)?
  bool FullAfter(uint32_t open_frames) const;

  void Add(const std::vector<float>& signature);
  void Reset();
  bool shot_mode() const { return shot_; }

 private:
  bool shot_;
  uint32_t max_frames_;
  uint32_t max_tokens_;
  float threshold_;
  std::vector<float> running_;  // Sum of unit-normalised signatures.
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_SEGMENTER_H_

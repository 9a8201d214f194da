// OpenBlock: the frames of a stream's block being built, until it seals:
// their payloads (moved in, never copied), token counts, running mean key
// (the block's summary), semantics (tracks, boxes, scene), and the
// Segmenter that decides where blocks end (a fixed size, or shots).
//
// Thread safety: none; the stream guards it with its append lock.
#ifndef KVMEM_ENGINE_STREAM_OPEN_BLOCK_H_
#define KVMEM_ENGINE_STREAM_OPEN_BLOCK_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/codec/block_layout.h"
#include "engine/codec/record_codec.h"
#include "engine/signals/semantics.h"
#include "engine/stream/ingest_cpu.h"
#include "engine/stream/segmenter.h"
#include "engine/stream/summary_builder.h"
#include "engine/types.h"

namespace kvmem {

class OpenBlock {
 public:
  // REQUIRES: config outlives the open block.
  explicit OpenBlock(const StreamConfig& config);

  // A frame's shot signature: its scene embedding, or its mean key when it
  // sends none.
  std::vector<float> Signature(const Frame& frame) const;
  bool shot_mode() const { return segmenter_.shot_mode(); }
  // Whether a block ends before a frame of `tokens` tokens with this
  // signature, the open block holding `frames` frames and `block_tokens`.
  Segmenter::Cut CutBefore(const std::vector<float>& signature, uint32_t tokens,
                           uint32_t frames, uint32_t block_tokens) {
    return segmenter_.CutBefore(signature, tokens, frames, block_tokens);
  }
  bool FullAfter(uint32_t frames) const { return segmenter_.FullAfter(frames); }
  // Adds a frame; its payload is moved in.
  void Add(Frame* frame, const std::vector<float>& signature);
  // The sealed block's contents into *rec (frame tokens, summary, token
  // groups, tracks, scene) and its warm, layer-major copy; `clock` (may be
  // null) charged the token groups, the rest and the warm copy.
  std::unique_ptr<WarmBlock> Seal(BlockRecord* rec,
                                  StageClock* clock = nullptr) const;
  void Reset();

  uint64_t tokens() const { return summary_.tokens(); }
  // RAM its frames' signals hold (BlockSemanticsBuilder::RamBytes), from
  // any thread.
  uint64_t signal_bytes() const {
    return signal_bytes_.load(std::memory_order_relaxed);
  }
  std::vector<float> Mean() const { return summary_.Mean(); }
  const std::string& last_payload() const { return payloads_.back(); }
  // Frame i's payload bytes; null when absent.
  const char* payload_data(size_t i) const {
    return i < payloads_.size() ? payloads_[i].data() : nullptr;
  }

 private:
  const StreamConfig& config_;
  SummaryBuilder summary_;
  Segmenter segmenter_;
  BlockSemanticsBuilder semantics_;
  std::vector<std::string> payloads_;
  std::vector<uint32_t> tokens_;
  std::atomic<uint64_t> signal_bytes_{0};
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_OPEN_BLOCK_H_

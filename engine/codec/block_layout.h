// WarmBlock: a block's KV in RAM in its block (layer-major) form, the layout a
// DMA engine wants: for each layer, K then V, each [kv_heads][tokens][head_dim]
// in the stream's dtype; each slice padded to a 64-byte line and each layer
// starting on a 4 KiB boundary of one aligned allocation, so one layer of a
// block moves as a few aligned bursts without touching the rest.
//
// Thread safety: immutable after construction; share freely.
#ifndef KVMEM_ENGINE_CODEC_BLOCK_LAYOUT_H_
#define KVMEM_ENGINE_CODEC_BLOCK_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

inline constexpr size_t kSliceAlign = 64;
inline constexpr size_t kLayerAlign = 4096;

class WarmBlock {
 public:
  // From the block's frames as appended (frame-major payloads).
  // REQUIRES: frames[i] holds FramePayloadBytes(g, tokens[i]) bytes.
  static std::unique_ptr<WarmBlock> FromFrames(
      const Geometry& g, const std::vector<absl::string_view>& frames,
      const std::vector<uint32_t>& tokens);

  // From per-layer records (K then V, unpadded), as LayerRecord returns.
  // REQUIRES: layers.size() == g.layers, each 2 * slice bytes.
  static std::unique_ptr<WarmBlock> FromLayers(
      const Geometry& g, uint32_t tokens,
      const std::vector<std::string>& layers);

  // RAM a WarmBlock of `tokens` tokens allocates.
  static size_t AllocatedBytes(const Geometry& g, uint32_t tokens);

  ~WarmBlock();
  WarmBlock(const WarmBlock&) = delete;
  WarmBlock& operator=(const WarmBlock&) = delete;

  // K or V slice of a layer, unpadded: [kv_heads][tokens][head_dim].
  absl::string_view K(uint32_t layer) const;
  absl::string_view V(uint32_t layer) const;
  // Offset of a layer within the allocation (a multiple of kLayerAlign).
  size_t LayerOffset(uint32_t layer) const { return layer * layer_stride_; }
  const uint8_t* data() const { return data_; }

  // K then V of a layer, unpadded: the on-disk and wire form of one layer.
  std::string LayerRecord(uint32_t layer) const;
  // LayerRecord written to dst (2 * slice bytes), one copy.
  void CopyLayerRecord(uint32_t layer, uint8_t* dst) const;
  // The block as its frames, each exactly as appended.
  std::vector<std::string> ToFrames(
      const std::vector<uint32_t>& frame_tokens) const;
  // ToFrames' frames back to back, written to dst (FramePayloadBytes of
  // every frame), one copy.
  void CopyFrames(const std::vector<uint32_t>& frame_tokens,
                  uint8_t* dst) const;

  size_t allocated_bytes() const { return layer_stride_ * geometry_.layers; }
  uint32_t tokens() const { return tokens_; }

 private:
  // Slices uninitialised (the makers write them whole), padding zeroed.
  WarmBlock(const Geometry& g, uint32_t tokens);
  // The allocation's size: a layer's alignment when the block holds none.
  size_t buffer_bytes() const {
    return allocated_bytes() == 0 ? kLayerAlign : allocated_bytes();
  }
  // Frame of t tokens starting at token_offset into dst; returns its end.
  uint8_t* CopyFrame(size_t token_offset, uint32_t t, uint8_t* dst) const;
  uint8_t* MutableSlice(uint32_t layer, int kv) {
    return data_ + LayerOffset(layer) + kv * padded_slice_;
  }

  Geometry geometry_;
  uint32_t tokens_;
  size_t slice_bytes_;   // One K (or V) slice, unpadded.
  size_t padded_slice_;  // Rounded up to kSliceAlign.
  size_t layer_stride_;  // 2 padded slices rounded up to kLayerAlign.
  uint8_t* data_ = nullptr;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_BLOCK_LAYOUT_H_

#include "engine/codec/frame_parts.h"

#include <algorithm>
#include <cstring>

#include "engine/codec/dtype.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Copies between a frame and its parts: each (layer, K/V, head) row run of
// a part is contiguous on both sides.
void MoveRows(const Geometry& g, uint32_t t, uint32_t part_tokens, size_t row,
              const char* src, char* dst, bool split) {
  const size_t rows = size_t{2} * g.layers * g.kv_heads;
  for (uint32_t a = 0; a < t; a += part_tokens) {
    const uint32_t n = std::min(part_tokens, t - a);
    const size_t part_base = size_t{a} * rows * row;
    for (size_t r = 0; r < rows; ++r) {
      const size_t in_frame = (r * t + a) * row;
      const size_t in_part = part_base + r * n * row;
      if (split) {
        std::memcpy(dst + in_part, src + in_frame, n * row);
      } else {
        std::memcpy(dst + in_frame, src + in_part, n * row);
      }
    }
  }
}

}  // namespace

uint32_t FramePartTokens(const Geometry& g) {
  const uint64_t token = FramePayloadBytes(g, 1);
  if (token == 0) return 1;
  return static_cast<uint32_t>(
      std::max<uint64_t>(1, (kFramePartTargetBytes + token - 1) / token));
}

uint64_t FramePartBytes(const Geometry& g, uint32_t part_tokens) {
  return FramePayloadBytes(g, part_tokens);
}

size_t FrameRowBytes(const Geometry& g) {
  return size_t{g.head_dim} * DTypeBytes(g.dtype);
}

void SplitFrame(const Geometry& g, uint32_t t, uint32_t part_tokens,
                absl::string_view frame, std::string* out) {
  SplitFrameRows(g, t, part_tokens, FrameRowBytes(g), frame, out);
}

void SplitFrameRows(const Geometry& g, uint32_t t, uint32_t part_tokens,
                    size_t row_bytes, absl::string_view frame,
                    std::string* out) {
  out->resize(frame.size());
  MoveRows(g, t, part_tokens, row_bytes, frame.data(), out->data(),
           /*split=*/true);
}

std::string JoinFrame(const Geometry& g, uint32_t t, uint32_t part_tokens,
                      absl::string_view parts) {
  std::string frame(parts.size(), '\0');
  MoveRows(g, t, part_tokens, FrameRowBytes(g), parts.data(), frame.data(),
           /*split=*/false);
  return frame;
}

}  // namespace kvmem

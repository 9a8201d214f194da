// Frames kept in parts of consecutive tokens (ColdStore frame parts, the
// stream state's frame_part_tokens): part i of a frame of t tokens holds
// tokens [i * P, min(t, (i + 1) * P)) laid out as a frame of just those
// tokens would be ([layer][K, V][kv_head][token][head_dim]), and a frame's
// parts are stored back to back. A part of one token is that token's KV for
// every layer and head, contiguous: a read of a few tokens of a cold block
// reads their parts alone instead of whole frames.
#ifndef KVMEM_ENGINE_CODEC_FRAME_PARTS_H_
#define KVMEM_ENGINE_CODEC_FRAME_PARTS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

// Parts hold at least this many bytes (a 7B token's KV is 128 KiB: a part
// per token; 2 KiB tokens go 32 to a part).
inline constexpr uint64_t kFramePartTargetBytes = 64 << 10;

// Tokens per part for a stream of this geometry (at least 1).
uint32_t FramePartTokens(const Geometry& g);
// Bytes of a full part of part_tokens tokens (the store's part size).
uint64_t FramePartBytes(const Geometry& g, uint32_t part_tokens);
// Bytes of a frame's row as appended (a row: one layer, K or V and kv_head's
// head_dim values of a token).
size_t FrameRowBytes(const Geometry& g);

// The frame (t tokens, as appended) as its parts back to back, into *out
// (resized; its capacity is reused). REQUIRES: part_tokens > 0 and
// frame.size() == FramePayloadBytes(g, t).
void SplitFrame(const Geometry& g, uint32_t t, uint32_t part_tokens,
                absl::string_view frame, std::string* out);
// SplitFrame for rows of row_bytes bytes each (FrameRowBytes as appended),
// e.g. a frame's rows encoded one by one in frame order (frame_codec.h):
// the same moves, of smaller rows.
void SplitFrameRows(const Geometry& g, uint32_t t, uint32_t part_tokens,
                    size_t row_bytes, absl::string_view frame,
                    std::string* out);
// SplitFrame's inverse: the frame as appended. REQUIRES: parts.size() ==
// FramePayloadBytes(g, t).
std::string JoinFrame(const Geometry& g, uint32_t t, uint32_t part_tokens,
                      absl::string_view parts);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_FRAME_PARTS_H_

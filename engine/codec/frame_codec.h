// Frames compressed when they are written (TierConfig::ingest_precision):
// every row of a frame, i.e. one token's head_dim values of one layer, K or V
// and kv_head, is quantised on its own, so a frame's parts (frame_parts.h)
// and a part's tokens encode and decode independently, and the store's part
// addressing is unchanged (a part is EncodedFrameBytes of its tokens).
//
//   int8: [scale fp32][head_dim int8]; scale = max|x| / 127 (1 when the row
//         is zero), q = round(x / scale), half away from zero. A value comes
//         back within scale / 2 = max|x| / 254 of its row's largest.
//   int4: [min fp32][step fp32][ceil(head_dim / 2) bytes, low nibble
//         first]; step = (max - min) / 15 (1 when the row is constant),
//         q = round((x - min) / step) in [0, 15]: within step / 2.
// Per token for keys as well as values: a part may hold a single token, so
// KIVI's per-channel keys (quantize.h, the demotion's form) cannot apply;
// KIVI's Table 1 finds 4-bit per-token keys and values near fp16 quality
// (Liu et al., ICML 2024). Dequantised values are re-encoded to the stream's
// dtype (at most half an ulp more). Pure functions.
#ifndef KVMEM_ENGINE_CODEC_FRAME_CODEC_H_
#define KVMEM_ENGINE_CODEC_FRAME_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

// Whether frames of this precision are stored encoded (int8, int4).
bool FramesEncoded(ColdPrecision p);

// Bytes of one encoded row (a full row's dtype bytes when not encoded).
uint64_t EncodedRowBytes(const Geometry& g, ColdPrecision p);

// Bytes of `tokens` tokens of frame KV as stored: layers x 2 x kv_heads x
// tokens rows.
uint64_t EncodedFrameBytes(const Geometry& g, ColdPrecision p, uint32_t tokens);

// Encodes `rows` (whole rows in the stream's dtype, any frame or part
// layout) into *out (resized; its capacity is reused). REQUIRES:
// FramesEncoded(p), rows.size() a multiple of a row's bytes, values finite
// (FindOutOfRange finds none).
void EncodeFrameRows(const Geometry& g, ColdPrecision p, absl::string_view rows,
                     std::string* out);

// The inverse, into *out (resized). DATA_LOSS when the size is not a whole
// number of encoded rows. REQUIRES: FramesEncoded(p).
absl::Status DecodeFrameRows(const Geometry& g, ColdPrecision p,
                             absl::string_view encoded, std::string* out);

// A frame (or part) read from the store, decoded in place when the stream
// encodes its frames; untouched otherwise. DATA_LOSS as DecodeFrameRows.
absl::Status DecodeStoredFrame(const Geometry& g, ColdPrecision p,
                               std::string* bytes);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_FRAME_CODEC_H_

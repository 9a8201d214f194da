// Int8 per-channel quantisation of K/V slices, the degraded tier's format,
// and an int4 form for streams kept at int4 on disk.
// A slice [kv_heads][tokens][head_dim] is quantised per channel (head, dim)
// across tokens: scale = max|x| / 127, q = round(x / scale). Dequantised
// values are within scale / 2 = max|x| / 254 of the originals (before the
// re-encode to the stream's dtype, which adds at most half an ulp of it).
// Pure functions.
#ifndef KVMEM_ENGINE_CODEC_QUANTIZE_H_
#define KVMEM_ENGINE_CODEC_QUANTIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

// Quantises one layer record (K then V, unpadded, dtype elements of a block
// of `tokens` tokens) into: per slice, kv_heads*head_dim fp32 scales followed
// by kv_heads*tokens*head_dim int8 values.
std::string QuantizeLayer(const Geometry& g, uint32_t tokens,
                          absl::string_view layer);

// The inverse: a full-size layer record in the stream's dtype. DATA_LOSS when
// the record has the wrong size.
absl::StatusOr<std::string> DequantizeLayer(const Geometry& g, uint32_t tokens,
                                            absl::string_view quantized);

// Bytes of a quantised layer record.
uint64_t QuantizedLayerBytes(const Geometry& g, uint32_t tokens);

// Int4, KIVI-style (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit
// Quantization for KV Cache", ICML 2024): keys per channel (one minimum and
// step per (kv_head, dim) over the block's tokens, as outliers sit in
// channels), values per token (one per (kv_head, token) over head_dim);
// q = round((x - min) / step) in [0, 15] with step = (max - min) / 15, so a
// dequantised value is within step / 2 of the original (before the
// re-encode to the stream's dtype, which adds at most half an ulp of it).
// Record: K's minimums and steps (fp32, kv_heads*head_dim each), K's codes
// (two per byte, low nibble first, in [kv_head][token][head_dim] order),
// then V's minimums and steps (kv_heads*tokens each) and codes.
std::string QuantizeLayerInt4(const Geometry& g, uint32_t tokens,
                              absl::string_view layer);
absl::StatusOr<std::string> DequantizeLayerInt4(const Geometry& g,
                                                uint32_t tokens,
                                                absl::string_view quantized);
uint64_t Int4LayerBytes(const Geometry& g, uint32_t tokens);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_QUANTIZE_H_

// Int8 per-channel quantisation of K/V slices, the degraded tier's format.
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

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_QUANTIZE_H_

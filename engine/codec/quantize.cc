#include "engine/codec/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/stream_config.h"

namespace kvmem {

uint64_t QuantizedLayerBytes(const Geometry& g, uint32_t tokens) {
  const uint64_t channels = static_cast<uint64_t>(g.kv_heads) * g.head_dim;
  return 2 * (channels * sizeof(float) + LayerSliceElements(g, tokens));
}

std::string QuantizeLayer(const Geometry& g, uint32_t tokens,
                          absl::string_view layer) {
  const size_t n = LayerSliceElements(g, tokens);
  const size_t width = DTypeBytes(g.dtype);
  std::string out;
  out.reserve(QuantizedLayerBytes(g, tokens));
  std::vector<float> x(n), scale(static_cast<size_t>(g.kv_heads) * g.head_dim);
  std::vector<int8_t> q(n);
  for (int kv = 0; kv < 2; ++kv) {
    DecodeToFloat(
        reinterpret_cast<const uint8_t*>(layer.data()) + kv * n * width, n,
        g.dtype, x.data());
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      for (uint32_t d = 0; d < g.head_dim; ++d) {
        float m = 0;
        for (uint32_t t = 0; t < tokens; ++t) {
          m = std::max(
              m,
              std::fabs(
                  x[(static_cast<size_t>(h) * tokens + t) * g.head_dim + d]));
        }
        const float s = m > 0 ? m / 127.0f : 1.0f;
        scale[static_cast<size_t>(h) * g.head_dim + d] = s;
        for (uint32_t t = 0; t < tokens; ++t) {
          const size_t i =
              (static_cast<size_t>(h) * tokens + t) * g.head_dim + d;
          q[i] = static_cast<int8_t>(
              std::clamp(std::lround(x[i] / s), -127L, 127L));
        }
      }
    }
    out.append(reinterpret_cast<const char*>(scale.data()),
               scale.size() * sizeof(float));
    out.append(reinterpret_cast<const char*>(q.data()), q.size());
  }
  return out;
}

absl::StatusOr<std::string> DequantizeLayer(const Geometry& g, uint32_t tokens,
                                            absl::string_view quantized) {
  if (quantized.size() != QuantizedLayerBytes(g, tokens)) {
    return absl::DataLossError(
        absl::StrCat("degraded layer record has ", quantized.size(),
                     " bytes; expected ", QuantizedLayerBytes(g, tokens)));
  }
  const size_t n = LayerSliceElements(g, tokens);
  const size_t channels = static_cast<size_t>(g.kv_heads) * g.head_dim;
  const size_t width = DTypeBytes(g.dtype);
  std::string out(2 * n * width, '\0');
  std::vector<float> scale(channels), x(n);
  const char* p = quantized.data();
  for (int kv = 0; kv < 2; ++kv) {
    std::memcpy(scale.data(), p, channels * sizeof(float));
    p += channels * sizeof(float);
    const auto* q = reinterpret_cast<const int8_t*>(p);
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      for (uint32_t t = 0; t < tokens; ++t) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          const size_t i =
              (static_cast<size_t>(h) * tokens + t) * g.head_dim + d;
          x[i] = q[i] * scale[static_cast<size_t>(h) * g.head_dim + d];
        }
      }
    }
    p += n;
    EncodeFromFloat(x.data(), n, g.dtype,
                    reinterpret_cast<uint8_t*>(out.data()) + kv * n * width);
  }
  return out;
}

}  // namespace kvmem

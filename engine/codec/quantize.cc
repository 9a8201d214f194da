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
  const size_t width = DTypeBytes(g.dtype), D = g.head_dim;
  const size_t rows = static_cast<size_t>(g.kv_heads) * tokens;
  std::string out;
  out.reserve(QuantizedLayerBytes(g, tokens));
  std::vector<float> x(n), scale(static_cast<size_t>(g.kv_heads) * D);
  std::vector<int8_t> q(n);
  for (int kv = 0; kv < 2; ++kv) {
    DecodeToFloat(
        reinterpret_cast<const uint8_t*>(layer.data()) + kv * n * width, n,
        g.dtype, x.data());
    // Row by row (a token of a head), so the loops run along memory.
    std::fill(scale.begin(), scale.end(), 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      float* m = scale.data() + r / tokens * D;
      const float* row = x.data() + r * D;
      for (size_t d = 0; d < D; ++d) m[d] = std::max(m[d], std::fabs(row[d]));
    }
    for (float& s : scale) s = s > 0 ? s / 127.0f : 1.0f;
    for (size_t r = 0; r < rows; ++r) {
      const float* s = scale.data() + r / tokens * D;
      const float* row = x.data() + r * D;
      int8_t* out_row = q.data() + r * D;
      for (size_t d = 0; d < D; ++d) {
        // Rounded half away from zero (as lround), within [-127, 127].
        const float v = std::clamp(row[d] / s[d], -127.0f, 127.0f);
        out_row[d] = static_cast<int8_t>(
            static_cast<int32_t>(v + std::copysign(0.5f, v)));
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

namespace {

// Two codes per byte, low nibble first.
void PackNibbles(const std::vector<uint8_t>& codes, std::string* out) {
  const size_t n = codes.size(), at = out->size();
  out->resize(at + (n + 1) / 2, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out->data() + at);
  for (size_t j = 0; j < n / 2; ++j) {
    p[j] = static_cast<uint8_t>(codes[2 * j] | codes[2 * j + 1] << 4);
  }
  if (n % 2 == 1) p[n / 2] = codes[n - 1];
}

void AppendFloats(const std::vector<float>& v, std::string* out) {
  out->append(reinterpret_cast<const char*>(v.data()),
              v.size() * sizeof(float));
}

float Step(float lo, float hi) { return hi > lo ? (hi - lo) / 15.0f : 1.0f; }

// round((x - lo) / step) in [0, 15]; x >= lo, so +0.5 and truncation round.
uint8_t Code(float x, float lo, float step) {
  return static_cast<uint8_t>(std::min((x - lo) / step + 0.5f, 15.0f));
}

}  // namespace

uint64_t Int4LayerBytes(const Geometry& g, uint32_t tokens) {
  const uint64_t n = LayerSliceElements(g, tokens);
  const uint64_t key_groups = static_cast<uint64_t>(g.kv_heads) * g.head_dim;
  const uint64_t value_groups = static_cast<uint64_t>(g.kv_heads) * tokens;
  return 2 * sizeof(float) * (key_groups + value_groups) + 2 * ((n + 1) / 2);
}

std::string QuantizeLayerInt4(const Geometry& g, uint32_t tokens,
                              absl::string_view layer) {
  const size_t n = LayerSliceElements(g, tokens);
  const size_t width = DTypeBytes(g.dtype), D = g.head_dim;
  const size_t channels = static_cast<size_t>(g.kv_heads) * D;
  const size_t rows = static_cast<size_t>(g.kv_heads) * tokens;
  std::string out;
  out.reserve(Int4LayerBytes(g, tokens));
  std::vector<float> x(n);
  std::vector<uint8_t> codes(n);
  const auto* src = reinterpret_cast<const uint8_t*>(layer.data());
  // Keys: per channel over the tokens (rows of a head share its channels).
  DecodeToFloat(src, n, g.dtype, x.data());
  std::vector<float> lo(channels, INFINITY), hi(channels, -INFINITY);
  for (size_t r = 0; r < rows; ++r) {
    float* l = lo.data() + r / tokens * D;
    float* h = hi.data() + r / tokens * D;
    const float* row = x.data() + r * D;
    for (size_t d = 0; d < D; ++d) {
      l[d] = std::min(l[d], row[d]);
      h[d] = std::max(h[d], row[d]);
    }
  }
  std::vector<float> step(channels);
  for (size_t c = 0; c < channels; ++c) step[c] = Step(lo[c], hi[c]);
  for (size_t r = 0; r < rows; ++r) {
    const float* l = lo.data() + r / tokens * D;
    const float* s = step.data() + r / tokens * D;
    const float* row = x.data() + r * D;
    uint8_t* c = codes.data() + r * D;
    for (size_t d = 0; d < D; ++d) c[d] = Code(row[d], l[d], s[d]);
  }
  AppendFloats(lo, &out);
  AppendFloats(step, &out);
  PackNibbles(codes, &out);
  // Values: per token over head_dim.
  DecodeToFloat(src + n * width, n, g.dtype, x.data());
  lo.resize(rows);
  step.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * D;
    float l = INFINITY, h = -INFINITY;
    for (size_t d = 0; d < D; ++d) {
      l = std::min(l, row[d]);
      h = std::max(h, row[d]);
    }
    lo[r] = l;
    step[r] = Step(l, h);
    uint8_t* c = codes.data() + r * D;
    for (size_t d = 0; d < D; ++d) c[d] = Code(row[d], l, step[r]);
  }
  AppendFloats(lo, &out);
  AppendFloats(step, &out);
  PackNibbles(codes, &out);
  return out;
}

absl::StatusOr<std::string> DequantizeLayerInt4(const Geometry& g,
                                                uint32_t tokens,
                                                absl::string_view quantized) {
  if (quantized.size() != Int4LayerBytes(g, tokens)) {
    return absl::DataLossError(
        absl::StrCat("int4 layer record has ", quantized.size(),
                     " bytes; expected ", Int4LayerBytes(g, tokens)));
  }
  const size_t n = LayerSliceElements(g, tokens);
  const size_t width = DTypeBytes(g.dtype), D = g.head_dim;
  const size_t rows = static_cast<size_t>(g.kv_heads) * tokens;
  const size_t groups[2] = {static_cast<size_t>(g.kv_heads) * D, rows};
  std::string out(2 * n * width, '\0');
  std::vector<float> lo, step, x(n);
  std::vector<uint8_t> codes(n);
  const char* p = quantized.data();
  for (int kv = 0; kv < 2; ++kv) {
    lo.resize(groups[kv]);
    step.resize(groups[kv]);
    std::memcpy(lo.data(), p, groups[kv] * sizeof(float));
    p += groups[kv] * sizeof(float);
    std::memcpy(step.data(), p, groups[kv] * sizeof(float));
    p += groups[kv] * sizeof(float);
    const auto* packed = reinterpret_cast<const uint8_t*>(p);
    for (size_t j = 0; j < n / 2; ++j) {
      codes[2 * j] = packed[j] & 15;
      codes[2 * j + 1] = packed[j] >> 4;
    }
    if (n % 2 == 1) codes[n - 1] = packed[n / 2] & 15;
    p += (n + 1) / 2;
    for (size_t r = 0; r < rows; ++r) {
      const uint8_t* c = codes.data() + r * D;
      float* row = x.data() + r * D;
      if (kv == 0) {  // Keys: per channel.
        const float* l = lo.data() + r / tokens * D;
        const float* s = step.data() + r / tokens * D;
        for (size_t d = 0; d < D; ++d) row[d] = l[d] + c[d] * s[d];
      } else {  // Values: per token.
        for (size_t d = 0; d < D; ++d) row[d] = lo[r] + c[d] * step[r];
      }
    }
    EncodeFromFloat(x.data(), n, g.dtype,
                    reinterpret_cast<uint8_t*>(out.data()) + kv * n * width);
  }
  return out;
}

}  // namespace kvmem

// Int8 per-channel quantisation (engine/codec/quantize.h), the degraded tier's
// format, and the int4 form of streams kept at int4: the stated error bounds
// per channel (and per token), sizes, and damaged records.
#include "engine/codec/quantize.h"

#include <cmath>
#include <random>

#include "engine/codec/block_layout.h"
#include "engine/codec/dtype.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

Geometry G(const testing::TestGeometry& tg, uint32_t max_tokens) {
  return {tg.layers, tg.kv_heads, tg.head_dim, tg.dtype, max_tokens};
}

// x as a layer record in dtype, and its values as stored (*orig).
std::string Encoded(const std::vector<float>& x, DType dtype,
                    std::vector<float>* orig) {
  std::string layer(x.size() * DTypeBytes(dtype), '\0');
  EncodeFromFloat(x.data(), x.size(), dtype,
                  reinterpret_cast<uint8_t*>(layer.data()));
  orig->resize(x.size());
  DecodeToFloat(reinterpret_cast<const uint8_t*>(layer.data()), x.size(), dtype,
                orig->data());
  return layer;
}

TEST(QuantizeTest, Int8PerChannelWithinBound) {
  testing::TestGeometry tg;
  for (DType dtype : {DType::kFp32, DType::kFp16}) {
    tg.dtype = dtype;
    const Geometry g = G(tg, 64);
    std::mt19937_64 rng(2);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const uint32_t tokens = 40;
    std::vector<float> x(2 * LayerSliceElements(g, tokens));
    for (size_t i = 0; i < x.size(); ++i) {
      // Channels of very different ranges: per-channel scales matter.
      x[i] = n(rng) * (1 + (i % g.head_dim) * 10.0f);
    }
    std::vector<float> orig;
    const std::string layer = Encoded(x, dtype, &orig);
    const std::string q = QuantizeLayer(g, tokens, layer);
    EXPECT_EQ(q.size(), QuantizedLayerBytes(g, tokens));
    EXPECT_LT(q.size(), layer.size());
    auto back = DequantizeLayer(g, tokens, q);
    ASSERT_TRUE(back.ok());
    std::vector<float> y(x.size());
    DecodeToFloat(reinterpret_cast<const uint8_t*>(back->data()), y.size(),
                  dtype, y.data());
    const size_t slice = LayerSliceElements(g, tokens);
    for (size_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          float max_abs = 0;
          for (uint32_t t = 0; t < tokens; ++t) {
            max_abs = std::max(
                max_abs,
                std::fabs(
                    orig[kv * slice + (h * tokens + t) * g.head_dim + d]));
          }
          // The stated bound, plus half an fp16 ulp of the value for fp16.
          for (uint32_t t = 0; t < tokens; ++t) {
            const size_t i = kv * slice + (h * tokens + t) * g.head_dim + d;
            const float ulp = dtype == DType::kFp16
                                  ? std::fabs(orig[i]) / 1024.0f + 1e-7f
                                  : 1e-6f * max_abs;
            ASSERT_LE(std::fabs(y[i] - orig[i]), max_abs / 254.0f + ulp)
                << "kv " << kv << " head " << h << " dim " << d;
          }
        }
      }
    }
    EXPECT_EQ(DequantizeLayer(g, tokens, q.substr(1)).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

// Int4, KIVI-style: keys within half a step of their channel's range over
// the block's tokens, values within half a step of their token's range over
// head_dim; a quarter-ish of fp16's bytes; constant groups exact; damaged
// records are DATA_LOSS.
TEST(QuantizeTest, Int4KeysPerChannelValuesPerTokenWithinBound) {
  testing::TestGeometry tg;
  for (DType dtype : {DType::kFp32, DType::kFp16}) {
    tg.dtype = dtype;
    const Geometry g = G(tg, 64);
    std::mt19937_64 rng(3);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const uint32_t tokens = 40;
    const size_t slice = LayerSliceElements(g, tokens);
    std::vector<float> x(2 * slice);
    for (size_t i = 0; i < x.size(); ++i) {
      // Key channels and value tokens of very different ranges.
      const size_t range = i < slice ? i % g.head_dim : (i / g.head_dim) % 7;
      x[i] = n(rng) * (1 + range * 10.0f);
    }
    // One constant key channel (head 0, dim 1) and value token (head 0,
    // token 2): exact.
    for (uint32_t t = 0; t < tokens; ++t) x[t * g.head_dim + 1] = 0.75f;
    for (uint32_t d = 0; d < g.head_dim; ++d)
      x[slice + 2 * g.head_dim + d] = -3.5f;
    std::vector<float> orig;
    const std::string layer = Encoded(x, dtype, &orig);
    const std::string q = QuantizeLayerInt4(g, tokens, layer);
    EXPECT_EQ(q.size(), Int4LayerBytes(g, tokens));
    // A 7B block (8 KV heads x 128, 512 tokens, fp16): 0.27 of its bytes
    // (int8: 0.51).
    const Geometry b7{32, 8, 128, DType::kFp16, 128};
    const double fp16 = 2.0 * LayerSliceElements(b7, 512) * 2;
    EXPECT_LT(Int4LayerBytes(b7, 512) / fp16, 0.28);
    EXPECT_LT(QuantizedLayerBytes(b7, 512) / fp16, 0.51);
    auto back = DequantizeLayerInt4(g, tokens, q);
    ASSERT_TRUE(back.ok()) << back.status();
    std::vector<float> y(x.size());
    DecodeToFloat(reinterpret_cast<const uint8_t*>(back->data()), y.size(),
                  dtype, y.data());
    // Each value's group: its (head, dim) over tokens for keys, its (head,
    // token) over dims for values.
    auto group_range = [&](size_t i) {
      float lo = INFINITY, hi = -INFINITY;
      const size_t h = i % slice / (tokens * g.head_dim);
      for (uint32_t j = 0; j < (i < slice ? tokens : g.head_dim); ++j) {
        const size_t k =
            i < slice ? (h * tokens + j) * g.head_dim + i % g.head_dim
                      : slice + (i - slice) / g.head_dim * g.head_dim + j;
        lo = std::min(lo, orig[k]);
        hi = std::max(hi, orig[k]);
      }
      return hi - lo;
    };
    for (size_t i = 0; i < x.size(); ++i) {
      const float ulp = dtype == DType::kFp16
                            ? std::fabs(orig[i]) / 1024.0f + 1e-6f
                            : 1e-5f * (1 + std::fabs(orig[i]));
      ASSERT_LE(std::fabs(y[i] - orig[i]), group_range(i) / 30.0f + ulp)
          << (i < slice ? "key " : "value ") << i % slice;
    }
    for (uint32_t t = 0; t < tokens; ++t)
      EXPECT_EQ(y[t * g.head_dim + 1], 0.75f);
    for (uint32_t d = 0; d < g.head_dim; ++d)
      EXPECT_EQ(y[slice + 2 * g.head_dim + d], -3.5f);
    EXPECT_EQ(DequantizeLayerInt4(g, tokens, q.substr(1)).status().code(),
              absl::StatusCode::kDataLoss);
    EXPECT_EQ(DequantizeLayerInt4(g, tokens, q + "x").status().code(),
              absl::StatusCode::kDataLoss);
  }
}

// A channel of zeros (scale 0) comes back as zeros, not NaN; a channel's
// outlier widens only that channel's error, not its neighbours'.
TEST(QuantizeTest, ZeroChannelsAndOutliersStayInTheirChannel) {
  testing::TestGeometry tg;
  tg.dtype = DType::kFp32;
  const Geometry g = G(tg, 8);
  const uint32_t tokens = 8;
  const size_t slice = LayerSliceElements(g, tokens);
  std::vector<float> x(2 * slice, 0.0f);
  for (uint32_t t = 0; t < tokens; ++t) {
    // Head 0: dim 0 all zero; dim 1 small values with one outlier; dim 2
    // small values only.
    x[(0 * tokens + t) * g.head_dim + 1] = t == 3 ? 1000.0f : 0.01f * t;
    x[(0 * tokens + t) * g.head_dim + 2] = 0.01f * t;
  }
  std::string layer(x.size() * sizeof(float), '\0');
  EncodeFromFloat(x.data(), x.size(), g.dtype,
                  reinterpret_cast<uint8_t*>(layer.data()));
  const std::string q = QuantizeLayer(g, tokens, layer);
  ASSERT_EQ(q.size(), QuantizedLayerBytes(g, tokens));
  auto back = DequantizeLayer(g, tokens, q);
  ASSERT_TRUE(back.ok()) << back.status();
  std::vector<float> y(x.size());
  DecodeToFloat(reinterpret_cast<const uint8_t*>(back->data()), y.size(),
                g.dtype, y.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
  for (uint32_t t = 0; t < tokens; ++t) {
    EXPECT_EQ(y[(0 * tokens + t) * g.head_dim + 0], 0.0f) << t;
    // Dim 2's own scale is 0.07 / 127: its error stays below 0.07 / 254.
    const size_t d2 = (0 * tokens + t) * g.head_dim + 2;
    EXPECT_LE(std::fabs(y[d2] - x[d2]), 0.07f / 254 + 1e-6f) << t;
    // Dim 1 shares its scale with the outlier: within 1000 / 254.
    const size_t d1 = (0 * tokens + t) * g.head_dim + 1;
    EXPECT_LE(std::fabs(y[d1] - x[d1]), 1000.0f / 254) << t;
  }
  EXPECT_EQ(DequantizeLayer(g, tokens, q + "x").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DequantizeLayer(g, tokens, "").status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kvmem

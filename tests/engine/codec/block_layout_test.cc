#include "engine/codec/block_layout.h"

#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

Geometry G(const testing::TestGeometry& tg, uint32_t max_tokens = 16) {
  return {tg.layers, tg.kv_heads, tg.head_dim, tg.dtype, max_tokens};
}

TEST(BlockLayoutTest, LayerMajorAlignedAndRoundTrips) {
  testing::TestGeometry tg;
  tg.head_dim = 12;  // 24-byte rows: slices need padding to 64 bytes.
  const Geometry g = G(tg);
  std::mt19937_64 rng(1);
  std::vector<testing::FloatFrame> frames;
  std::vector<std::string> bytes;
  std::vector<uint32_t> tokens = {3, 7, 1};
  for (uint32_t t : tokens) {
    frames.push_back(testing::RandomFrame(rng, tg, t));
    bytes.push_back(testing::Encode(frames.back(), tg.dtype));
  }
  std::vector<absl::string_view> views(bytes.begin(), bytes.end());
  auto block = WarmBlock::FromFrames(g, views, tokens);
  ASSERT_EQ(block->tokens(), 11u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block->data()) % kLayerAlign, 0u);
  for (uint32_t l = 0; l < g.layers; ++l) {
    EXPECT_EQ(block->LayerOffset(l) % kLayerAlign, 0u);
    const auto* k = reinterpret_cast<const uint8_t*>(block->K(l).data());
    const auto* v = reinterpret_cast<const uint8_t*>(block->V(l).data());
    EXPECT_EQ((v - block->data()) % kSliceAlign, 0u);
    EXPECT_EQ(k - block->data(), static_cast<ptrdiff_t>(block->LayerOffset(l)));
    // K of layer l, head h, block token t is frame f's token t - offset(f).
    std::vector<float> got(block->K(l).size() / 2);
    DecodeToFloat(k, got.size(), tg.dtype, got.data());
    size_t base = 0;
    for (size_t f = 0; f < frames.size(); ++f) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t t = 0; t < tokens[f]; ++t) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            ASSERT_EQ(got[(h * 11 + base + t) * g.head_dim + d],
                      frames[f].Key(tg, l, h, t, d));
          }
        }
      }
      base += tokens[f];
    }
  }
  EXPECT_EQ(block->allocated_bytes(), WarmBlock::AllocatedBytes(g, 11));
  // Back to frames, and through per-layer records, byte for byte.
  EXPECT_EQ(block->ToFrames(tokens), bytes);
  std::vector<std::string> layers;
  for (uint32_t l = 0; l < g.layers; ++l)
    layers.push_back(block->LayerRecord(l));
  EXPECT_EQ(WarmBlock::FromLayers(g, 11, layers)->ToFrames(tokens), bytes);
}

}  // namespace
}  // namespace kvmem

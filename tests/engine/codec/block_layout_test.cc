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

// A warm copy's memory is reused once a block leaves RAM (the warm buffer
// pool): a block made in the memory of one whose bytes were all 0xff still
// has zero padding and exactly its own slices.
TEST(BlockLayoutTest, AReusedWarmCopyHasZeroPaddingAndItsOwnBytes) {
  testing::TestGeometry tg;
  tg.head_dim = 12;  // Padded slices, as above.
  const Geometry g = G(tg);
  const uint32_t tokens = 5;
  const size_t frame_bytes = FramePayloadBytes(g, tokens);
  const std::string ones(frame_bytes, '\xff');
  std::mt19937_64 rng(2);
  const std::string frame =
      testing::Encode(testing::RandomFrame(rng, tg, tokens), tg.dtype);
  for (int round = 0; round < 3; ++round) {
    WarmBlock::FromFrames(g, {ones}, {tokens}).reset();
    auto block = WarmBlock::FromFrames(g, {frame}, {tokens});
    const uint8_t* base = block->data();
    size_t checked = 0;
    for (uint32_t l = 0; l < g.layers; ++l) {
      const size_t k = block->LayerOffset(l);
      const size_t v =
          reinterpret_cast<const uint8_t*>(block->V(l).data()) - base;
      const size_t end = l + 1 < g.layers ? block->LayerOffset(l + 1)
                                          : block->allocated_bytes();
      for (size_t i = k + block->K(l).size(); i < v; ++i, ++checked) {
        ASSERT_EQ(base[i], 0) << "layer " << l << " K padding at " << i;
      }
      for (size_t i = v + block->V(l).size(); i < end; ++i, ++checked) {
        ASSERT_EQ(base[i], 0) << "layer " << l << " V padding at " << i;
      }
    }
    EXPECT_GT(checked, 0u);
    std::vector<std::string> back = block->ToFrames({tokens});
    ASSERT_EQ(back.size(), 1u);
    EXPECT_EQ(back[0], frame) << "round " << round;
  }
}

}  // namespace
}  // namespace kvmem

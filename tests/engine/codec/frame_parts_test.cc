#include "engine/codec/frame_parts.h"

#include <random>
#include <string>

#include "engine/stream_config.h"
#include "gtest/gtest.h"

namespace kvmem {
namespace {

Geometry Fp16(uint32_t layers, uint32_t kv_heads, uint32_t head_dim) {
  Geometry g;
  g.layers = layers;
  g.kv_heads = kv_heads;
  g.head_dim = head_dim;
  g.dtype = DType::kFp16;
  return g;
}

// Part i is the frame of tokens [i * P, ...) as a frame of those tokens
// alone would be laid out, and Join undoes Split, for every P (shorter last
// parts, a part larger than the frame).
TEST(FramePartsTest, PartsAreFramesOfTheirTokensAndJoinUndoesSplit) {
  const Geometry g = Fp16(3, 2, 4);
  const size_t row = g.head_dim * 2;
  std::mt19937 rng(3);
  for (uint32_t t : {1u, 5u, 8u}) {
    std::string frame(FramePayloadBytes(g, t), '\0');
    for (char& c : frame) c = static_cast<char>(rng());
    for (uint32_t p : {1u, 2u, 3u, 8u, 9u}) {
      std::string parts;
      SplitFrame(g, t, p, frame, &parts);
      ASSERT_EQ(parts.size(), frame.size());
      size_t at = 0;
      for (uint32_t a = 0; a < t; a += p) {
        const uint32_t n = std::min(p, t - a);
        // Row r (layer, K/V, head) of token a + j sits at (r * n + j).
        for (size_t r = 0; r < 2 * g.layers * g.kv_heads; ++r) {
          for (uint32_t j = 0; j < n; ++j) {
            EXPECT_EQ(parts.substr(at + (r * n + j) * row, row),
                      frame.substr((r * t + a + j) * row, row))
                << "t " << t << " p " << p << " row " << r << " token "
                << a + j;
          }
        }
        at += FramePayloadBytes(g, n);
      }
      EXPECT_EQ(JoinFrame(g, t, p, parts), frame) << "t " << t << " p " << p;
    }
  }
}

TEST(FramePartsTest, PartsHoldAtLeastTheTargetBytes) {
  const Geometry g7b = Fp16(32, 8, 128);
  EXPECT_EQ(FramePartTokens(g7b), 1u);  // 128 KiB a token.
  EXPECT_EQ(FramePartBytes(g7b, 1), 128u << 10);
  const Geometry eval = Fp16(2, 4, 64);
  EXPECT_EQ(FramePartTokens(eval), 32u);  // 2 KiB a token.
  EXPECT_EQ(FramePartBytes(eval, 32), 64u << 10);
}

}  // namespace
}  // namespace kvmem

#include "engine/stream/summary_builder.h"

#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(SummaryBuilderTest, MeanKeyOfIndexedLayersMatchesOracle) {
  testing::TestGeometry tg;
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    StreamConfig c;
    c.geometry = {tg.layers, tg.kv_heads, tg.head_dim, dtype, 16};
    c.hot_window_tokens = 64;
    c.indexed_layers = {2, 0};  // Order given is the summary's layout.
    c = WithDefaults(c);
    std::mt19937_64 rng(1);
    SummaryBuilder b(c);
    std::vector<testing::FloatFrame> frames;
    for (uint32_t tokens : {3u, 16u, 1u}) {
      frames.push_back(testing::RandomFrame(rng, tg, tokens));
    }
    std::vector<const testing::FloatFrame*> ptrs;
    for (const auto& f : frames) {
      b.AddFrame(testing::Encode(f, dtype), f.tokens);
      ptrs.push_back(&f);
    }
    EXPECT_EQ(b.tokens(), 20u);
    const std::vector<double> want = testing::MeanKey(tg, ptrs, {2, 0});
    const std::vector<float> got = b.Mean();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6) << i;
    }
    b.Reset();
    EXPECT_EQ(b.tokens(), 0u);
    EXPECT_EQ(b.Mean(), std::vector<float>(got.size(), 0.0f));
  }
}

}  // namespace
}  // namespace kvmem

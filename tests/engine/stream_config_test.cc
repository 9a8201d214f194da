#include "engine/stream_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;

StreamConfig Valid() {
  StreamConfig c;
  c.geometry = {4, 2, 64, DType::kFp16, 32};
  c.hot_window_tokens = 256;
  return WithDefaults(c);
}

TEST(StreamConfigTest, DefaultsAndSizes) {
  const StreamConfig c = Valid();
  EXPECT_TRUE(ValidateStreamConfig(c).ok());
  EXPECT_EQ(c.frames_per_block, kDefaultFramesPerBlock);
  EXPECT_EQ(c.indexed_layers, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(c.default_max_tokens, 256u / 5);
  EXPECT_EQ(c.index_factory, "Progressive");
  // About one token group per 8 tokens of a full block: 4 x 32 / 8.
  EXPECT_EQ(c.groups_per_block, 16u);
  EXPECT_EQ(c.weights.score, ScoreMode::kMass);
  EXPECT_EQ(c.default_top_k, 0u);  // No cap: the token budget is the limit.
  EXPECT_EQ(SummaryDim(c), 4u * 2 * 64);
  // 4 layers x (K+V) x 2 heads x 10 tokens x 64 dims x 2 bytes.
  EXPECT_EQ(FramePayloadBytes(c.geometry, 10), 4u * 2 * 2 * 10 * 64 * 2);
}

TEST(StreamConfigTest, ErrorsNameFieldAndValue) {
  struct Case {
    std::function<void(StreamConfig&)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](StreamConfig& c) { c.geometry.head_dim = 0; },
       "config.geometry.head_dim is 0"},
      {[](StreamConfig& c) { c.geometry.layers = 5000; },
       "config.geometry.layers is 5000"},
      {[](StreamConfig& c) { c.geometry.dtype = static_cast<DType>(42); },
       "config.geometry.dtype is 42"},
      {[](StreamConfig& c) { c.hot_window_tokens = 0; },
       "config.hot_window_tokens is 0"},
      {[](StreamConfig& c) {
         c.indexed_layers = {1, 9};
       },
       "indexed_layers has layer 9"},
      {[](StreamConfig& c) {
         c.indexed_layers = {1, 1};
       },
       "lists layer 1 twice"},
      {[](StreamConfig& c) { c.index_factory = "NotAnIndex7"; },
       "index_factory \"NotAnIndex7\""},
      {[](StreamConfig& c) { c.gate_temperature = -1; },
       "gate_temperature is -1"},
      {[](StreamConfig& c) {
         c.tiers.cold_precision = static_cast<ColdPrecision>(4);
       },
       "config.tier_policy.cold_precision is 4"},
  };
  for (const Case& k : cases) {
    StreamConfig c = Valid();
    k.mutate(c);
    const absl::Status s = ValidateStreamConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.expect;
    EXPECT_THAT(std::string(s.message()), HasSubstr(k.expect));
  }
}

TEST(StreamConfigTest, StreamIds) {
  EXPECT_TRUE(ValidateStreamId("cam-01:site.A_b").ok());
  EXPECT_THAT(std::string(ValidateStreamId("").message()),
              HasSubstr("stream_id is empty"));
  EXPECT_THAT(std::string(ValidateStreamId(std::string(129, 'a')).message()),
              HasSubstr("129 bytes"));
  EXPECT_THAT(std::string(ValidateStreamId("a/b").message()),
              HasSubstr("\"a/b\""));
  EXPECT_EQ(ValidateStreamId(std::string("a\0b", 3)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvmem

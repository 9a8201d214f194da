#include "engine/codec/record_codec.h"

#include "engine/stream_config.h"
#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(RecordCodecTest, RoundTrips) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kBf16, 16};
  c.hot_window_tokens = 64;
  c.indexed_layers = {1};
  c.labels = {{"camera", "lobby"}, {"site", "A"}};
  c.gate_temperature = 0.5f;
  auto c2 = DecodeConfig(EncodeConfig(c));
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_TRUE(*c2 == c);

  StreamState s;
  s.closed = true;
  s.last_frame = 41;
  s.next_token_position = 9999;
  s.open_block_frames = 3;
  s.open_block_tokens = 77;
  auto s2 = DecodeState(EncodeState(s));
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->last_frame, 41);
  EXPECT_TRUE(s2->closed);
  EXPECT_EQ(s2->next_token_position, 9999u);
  EXPECT_EQ(s2->open_block_tokens, 77u);

  BlockRecord b;
  b.info.id = 5;
  b.info.first_frame = 20;
  b.info.last_frame = 23;
  b.info.token_count = 128;
  b.summary = {1.5f, -2.0f, 0.25f};
  auto b2 = DecodeBlock(EncodeBlock(b));
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(b2->info.last_frame, 23u);
  EXPECT_EQ(b2->summary, b.summary);
}

// A config record of version 1 (before tiers, recall policy and shots)
// still decodes, and with defaults applied it is a valid config.
TEST(RecordCodecTest, ReadsVersionOneConfigs) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  std::string v1 = EncodeConfig(c);
  // Version 2 appended 3 x 4 bytes (shots), 4 x 8 + 5 x 4 (tiers) and
  // 4 x 4 (weights) after the version 1 fields; version 3, 4 (groups);
  // version 4, 4 (score mode); version 5, 4 (an empty scorer name);
  // version 6, 5 (the identity share); version 7, 4 (the cold precision);
  // version 8, 4 (the ingest precision).
  v1.resize(v1.size() - (12 + 32 + 20 + 16 + 4 + 4 + 4 + 5 + 4 + 4));
  v1[0] = 1;
  auto decoded = DecodeConfig(v1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->segment_mode, SegmentMode::kUnspecified);
  const StreamConfig filled = WithDefaults(*decoded);
  EXPECT_TRUE(ValidateStreamConfig(filled).ok())
      << ValidateStreamConfig(filled);
  EXPECT_EQ(filled.segment_mode, SegmentMode::kFixed);
  EXPECT_EQ(filled.tiers.warm_budget_bytes, 0u);
}

TEST(RecordCodecTest, ReadsVersionTwoConfigsAndBlocksWithoutGroups) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.groups_per_block = 9;
  std::string v2 = EncodeConfig(c);
  // Version 3 appended groups_per_block, version 4 the score mode, version
  // 5 the scorer's name (empty: 4 bytes), version 6 the identity share,
  // version 7 the cold precision.
  v2.resize(v2.size() - 25);  // Version 8's ingest precision too.
  v2[0] = 2;
  auto config = DecodeConfig(v2);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->groups_per_block, 1u);  // Its blocks have no groups.
  EXPECT_EQ(config->weights.score, ScoreMode::kSummed);  // What it had.
  EXPECT_EQ(WithDefaults(*config).weights.score, ScoreMode::kSummed);
  EXPECT_EQ(config->hot_window_tokens, 64u);

  BlockRecord b;
  b.info.id = 4;
  b.summary = {1, 2, 3};
  b.last_hit_frame = 11;
  std::string block = EncodeBlock(b);
  // Three empty length-prefixed fields: group summaries, token groups,
  // token codes; and version 5's groups_pending byte.
  block.resize(block.size() - 13);
  block[0] = 2;
  auto back = DecodeBlock(block);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->info.id, 4u);
  EXPECT_EQ(back->last_hit_frame, 11u);
  EXPECT_TRUE(back->group_summaries.empty());
  EXPECT_TRUE(back->token_group.empty());
  EXPECT_TRUE(back->token_codes.empty());
}

// Block records of version 3 (token groups, no token codes) decode with no
// codes; version 4 keeps them byte for byte.
TEST(RecordCodecTest, TokenCodesRoundTripAndVersionThreeHasNone) {
  BlockRecord b;
  b.info.id = 6;
  b.summary = {1, 2};
  b.group_summaries = {3, 4};
  b.token_group = {0, 0, 1};
  b.token_codes = std::string("\x01\x00\xff codes", 9);
  auto back = DecodeBlock(EncodeBlock(b));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->token_codes, b.token_codes);
  EXPECT_EQ(back->token_group, b.token_group);

  b.token_codes.clear();
  std::string v3 = EncodeBlock(b);
  v3.resize(v3.size() - 5);  // The empty codes field, groups_pending.
  v3[0] = 3;
  back = DecodeBlock(v3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->group_summaries, b.group_summaries);
  EXPECT_TRUE(back->token_codes.empty());
}

// A seal's stand-in keeps everything but the token groups and says they
// are pending; the full record (version 5) says they are not, and a version
// 4 record reads as complete.
TEST(RecordCodecTest, AStandInLeavesOutTheGroupsAndSaysSo) {
  BlockRecord b;
  b.info.id = 7;
  b.info.first_frame = 3;
  b.summary = {1, 2};
  b.frame_tokens = {4, 4};
  b.tracks.push_back({9, 2, 3, 4, {0.1f, 0.2f, 0.3f, 0.4f}});
  b.group_summaries = {3, 4};
  b.token_group = {0, 1, 1, 0, 0, 1, 1, 0};
  b.token_codes = "codes";
  auto stand_in = DecodeBlock(EncodeBlockStandIn(b));
  ASSERT_TRUE(stand_in.ok()) << stand_in.status();
  EXPECT_TRUE(stand_in->groups_pending);
  EXPECT_TRUE(stand_in->group_summaries.empty());
  EXPECT_TRUE(stand_in->token_group.empty());
  EXPECT_TRUE(stand_in->token_codes.empty());
  EXPECT_EQ(stand_in->info.first_frame, 3u);
  EXPECT_EQ(stand_in->summary, b.summary);
  EXPECT_EQ(stand_in->frame_tokens, b.frame_tokens);
  ASSERT_EQ(stand_in->tracks.size(), 1u);
  EXPECT_EQ(stand_in->tracks[0].track_id, 9u);
  EXPECT_LT(EncodeBlockStandIn(b).size(), EncodeBlock(b).size());

  std::string full = EncodeBlock(b);
  auto back = DecodeBlock(full);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->groups_pending);
  EXPECT_EQ(back->token_codes, "codes");
  full.resize(full.size() - 1);  // Version 4: no groups_pending byte.
  full[0] = 4;
  back = DecodeBlock(full);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->groups_pending);
  EXPECT_EQ(back->token_group, b.token_group);
}

// Version 3 had token groups but one score: its streams keep SUMMED, while
// a version 4 record that left the score unset gets the default (MASS).
TEST(RecordCodecTest, ReadsVersionThreeConfigsAsSummed) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.groups_per_block = 9;
  std::string v3 = EncodeConfig(c);
  auto v4 = DecodeConfig(v3);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(WithDefaults(*v4).weights.score, ScoreMode::kMass);
  // Version 4 appended the score mode, version 5 the (empty) scorer name,
  // version 6 the identity share, version 7 the cold precision.
  v3.resize(v3.size() - 21);  // Version 8's ingest precision too.
  v3[0] = 3;
  auto config = DecodeConfig(v3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->groups_per_block, 9u);
  const StreamConfig filled = WithDefaults(*config);
  EXPECT_EQ(filled.weights.score, ScoreMode::kSummed);
  EXPECT_TRUE(ValidateStreamConfig(filled).ok())
      << ValidateStreamConfig(filled);
}

// Version 5 keeps the scorer's name; a version 4 record has none, and its
// score mode names the scorer once defaults are filled in.
TEST(RecordCodecTest, KeepsTheScorerNameAndReadsVersionFourWithout) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.weights.score = ScoreMode::kSummed;
  c.weights.scorer = "summed";
  std::string v5 = EncodeConfig(c);
  auto back = DecodeConfig(v5);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->weights.scorer, "summed");
  EXPECT_TRUE(*back == c);
  // The name, length-prefixed; the share; the cold precision.
  v5.resize(v5.size() - (4 + 6 + 5 + 4 + 4));
  v5[0] = 4;
  auto v4 = DecodeConfig(v5);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->weights.scorer, "");
  EXPECT_EQ(WithDefaults(*v4).weights.scorer, "summed");
}

// Version 6 keeps the identity share, set or unset; a version 5 record
// has none: the default.
TEST(RecordCodecTest, KeepsTheIdentityShareAndReadsVersionFiveWithout) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  EXPECT_FALSE(DecodeConfig(EncodeConfig(c))->weights.identity_share);
  c.weights.identity_share = 0.0f;  // Off: kept apart from unset.
  std::string v6 = EncodeConfig(c);
  auto back = DecodeConfig(v6);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->weights.identity_share, 0.0f);
  EXPECT_TRUE(*back == c);
  v6.resize(v6.size() - (5 + 4 + 4));  // Whether set, its value; the
  // precisions.
  v6[0] = 5;
  auto v5 = DecodeConfig(v6);
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_FALSE(v5->weights.identity_share);
}

// Version 7 keeps the cold precision; a version 6 record has none: its
// blocks were always kept at full precision.
TEST(RecordCodecTest, KeepsTheColdPrecisionAndReadsVersionSixAsFull) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.tiers.cold_precision = ColdPrecision::kInt8;
  std::string v7 = EncodeConfig(c);
  auto back = DecodeConfig(v7);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tiers.cold_precision, ColdPrecision::kInt8);
  EXPECT_TRUE(*back == c);
  v7.resize(v7.size() - 8);
  v7[0] = 6;
  auto v6 = DecodeConfig(v7);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->tiers.cold_precision, ColdPrecision::kFull);
}

// Version 8 keeps the ingest precision; version 7 reads as FULL (frames
// as appended).
TEST(RecordCodecTest, KeepsTheIngestPrecisionAndReadsVersionSevenAsFull) {
  StreamConfig c;
  c.geometry = {2, 1, 8, DType::kFp16, 16};
  c.tiers.ingest_precision = ColdPrecision::kInt4;
  std::string v8 = EncodeConfig(c);
  auto back = DecodeConfig(v8);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tiers.ingest_precision, ColdPrecision::kInt4);
  EXPECT_TRUE(*back == c);
  v8.resize(v8.size() - 4);
  v8[0] = 7;
  auto v7 = DecodeConfig(v8);
  ASSERT_TRUE(v7.ok()) << v7.status();
  EXPECT_EQ(v7->tiers.ingest_precision, ColdPrecision::kFull);
}

TEST(RecordCodecTest, TruncatedOrTrailingBytesAreDataLoss) {
  BlockRecord b;
  b.summary = {1, 2, 3};
  const std::string bytes = EncodeBlock(b);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeBlock(bytes.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << n;
  }
  EXPECT_EQ(DecodeBlock(bytes + "x").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeState("").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeConfig("\x02").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kvmem

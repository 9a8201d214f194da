// A stream whose frames are compressed when written (tier_policy.
// ingest_precision INT8 or INT4, engine/codec/frame_codec.h), on RocksDB:
// the store holds the encoded bytes (stats count them), every read returns
// the values the stream saw when it sealed the block, whether the block is
// warm, cold, read whole or by tokens, before or after a restart (which
// replays the open block from its encoded frames); reads are within the
// form's bound of what was appended; a value quantisation cannot take is
// refused.
#include <cmath>
#include <random>

#include "engine/codec/block_layout.h"
#include "engine/codec/dtype.h"
#include "engine/codec/frame_codec.h"
#include "engine/stream_config.h"
#include "gmock/gmock.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using testing::ExpectWithin;
using testing::OpenTestEngine;
using testing::StreamModel;
using testing::TestConfig;
using testing::TestGeometry;
using testing::ToFrame;

// (form, frame_part_tokens: 0 the default, whole 4-token frames here; 3
// splits them 3 + 1).
class IngestPrecisionTest
    : public ::testing::TestWithParam<std::tuple<ColdPrecision, uint32_t>> {
 protected:
  ColdPrecision form() const { return std::get<0>(GetParam()); }
  EngineOptions Options() const {
    EngineOptions o;
    o.frame_part_tokens = std::get<1>(GetParam());
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(
    Forms, IngestPrecisionTest,
    ::testing::Combine(::testing::Values(ColdPrecision::kInt8,
                                         ColdPrecision::kInt4),
                       ::testing::Values(0u, 3u)),
    [](const auto& p) {
      return std::string(std::get<0>(p.param) == ColdPrecision::kInt8
                             ? "Int8"
                             : "Int4") +
             (std::get<1>(p.param) == 0 ? "Whole" : "Parts");
    });

// The block's frame-major bytes (empty after a failed read, reported).
std::string FrameMajor(const StreamHandle& stream, uint64_t block) {
  absl::StatusOr<std::string> got = testing::FrameMajor(stream, block);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *std::move(got) : std::string();
}

std::string Tokens(const StreamHandle& stream, uint64_t block,
                   const std::vector<uint32_t>& tokens) {
  auto pieces = stream.ReadBlockTokens(block, tokens, {});
  EXPECT_TRUE(pieces.ok()) << pieces.status();
  std::string got;
  if (pieces.ok()) {
    for (const auto& p : *pieces) got += p.ToString();
  }
  return got;
}

TEST_P(IngestPrecisionTest, TheStoreKeepsTheEncodedFramesAndReadsReturnThem) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = testing::TwoWarmBlocksConfig(g);
  const Geometry geo = WithDefaults(c).geometry;
  StreamConfig small_config = c;
  small_config.tiers.ingest_precision = form();
  // Values in [-2, 2]: int8 within 2 / 254 of them, int4 within 4 / 30,
  // plus fp16's rounding.
  const float bound =
      (form() == ColdPrecision::kInt4 ? 4.0f / 30 : 2.0f / 254) + 2.0f / 1024;
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(41);
  std::string warm19, warm19_tokens;
  const std::vector<uint32_t> picked = {1, 3, 4, 6};
  std::vector<RecallResult> before;
  std::vector<RecallQuery> queries;
  uint64_t next_frame = 40;
  {
    auto e = OpenTestEngine(dir.path(), Options());
    ASSERT_TRUE(e->OpenStream("full", c).ok());
    ASSERT_TRUE(e->OpenStream("small", small_config).ok());
    for (uint64_t f = 0; f < 40; ++f) {
      Frame frame = ToFrame(m.AddFrame(rng, 4), f);
      ASSERT_TRUE(e->Append("full", frame).ok());
      ASSERT_TRUE(e->Append("small", std::move(frame)).ok());
    }
    e->WaitForBackground();
    auto stream = *e->Find("small");
    // Block 19 is warm: what the stream saw.
    ASSERT_EQ(stream.GetBlock(19)->tier, Tier::kWarm);
    warm19 = FrameMajor(stream, 19);
    warm19_tokens = Tokens(stream, 19, picked);
    ExpectWithin(m.BlockBytes(19), warm19, g.dtype, bound, 19);
    const StreamStats full = *e->GetStats("full");
    const StreamStats small = *e->GetStats("small");
    EXPECT_EQ(small.config.tiers.ingest_precision, form());
    EXPECT_EQ(full.config.tiers.ingest_precision, ColdPrecision::kFull);
    // 20 blocks, 2 warm: 18 cold, their frames as written (not degraded,
    // not rewritten per layer).
    EXPECT_EQ(small.cold.blocks, 18u);
    EXPECT_EQ(small.degraded.blocks, 0u);
    EXPECT_EQ(small.cold.bytes, 18 * EncodedFrameBytes(geo, form(), 8));
    EXPECT_EQ(full.cold.bytes, 18 * FramePayloadBytes(geo, 8));
    EXPECT_LT(small.cold.bytes, full.cold.bytes);
    // Block 0's first frame as the store holds it.
    for (uint64_t b = 0; b < 18; ++b) {
      ExpectWithin(m.BlockBytes(b), FrameMajor(stream, b), g.dtype, bound, b);
    }
    // Frames until block 19 leaves RAM (and one in the open block): its
    // reads are what RAM held.
    while (next_frame < 60 && stream.GetBlock(19)->tier == Tier::kWarm) {
      Frame frame = ToFrame(m.AddFrame(rng, 4), next_frame++);
      ASSERT_TRUE(e->Append("small", std::move(frame)).ok());
      e->WaitForBackground();
    }
    if (next_frame % 2 == 0) {
      Frame frame = ToFrame(m.AddFrame(rng, 4), next_frame++);
      ASSERT_TRUE(e->Append("small", std::move(frame)).ok());
      e->WaitForBackground();
    }
    ASSERT_EQ(stream.GetBlock(19)->tier, Tier::kCold);
    EXPECT_EQ(FrameMajor(stream, 19), warm19);
    EXPECT_EQ(Tokens(stream, 19, picked), warm19_tokens);
    for (int i = 0; i < 6; ++i) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, m.summary_dim());
      q.max_tokens = 12;
      auto r = e->Recall("small", q);
      ASSERT_TRUE(r.ok()) << r.status();
      queries.push_back(q);
      before.push_back(*std::move(r));
    }
  }
  // A restart: the open block (one frame) comes back from its encoded
  // frame.
  auto e = OpenTestEngine(dir.path(), Options());
  auto stream = *e->Find("small");
  EXPECT_EQ(e->GetStats("small")->config.tiers.ingest_precision, form());
  EXPECT_EQ(FrameMajor(stream, 19), warm19);
  EXPECT_EQ(Tokens(stream, 19, picked), warm19_tokens);
  for (size_t i = 0; i < queries.size(); ++i) {
    auto r = e->Recall("small", queries[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->blocks.size(), before[i].blocks.size()) << "query " << i;
    for (size_t j = 0; j < r->blocks.size(); ++j) {
      EXPECT_EQ(r->blocks[j].block.id, before[i].blocks[j].block.id);
      EXPECT_EQ(r->blocks[j].token_offsets, before[i].blocks[j].token_offsets);
    }
  }
  // The next frame seals a block with the replayed one.
  Frame frame = ToFrame(m.AddFrame(rng, 4), next_frame);
  ASSERT_TRUE(e->Append("small", std::move(frame)).ok());
  e->WaitForBackground();
  const uint64_t last = next_frame / 2;
  ExpectWithin(m.BlockBytes(last), FrameMajor(stream, last), g.dtype, bound,
               last);
}

// A stream that quantises its frames refuses a value it cannot quantise,
// in any layer (a full-precision stream stores values keys do not feed as
// sent); a reopen with another ingest precision is refused.
TEST(IngestPrecisionConfigTest, NonFiniteValuesAndAnotherPrecision) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  c.indexed_layers = {0};
  StreamConfig small_config = c;
  small_config.tiers.ingest_precision = ColdPrecision::kInt4;
  auto e = OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("full", c).ok());
  ASSERT_TRUE(e->OpenStream("small", small_config).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(5);
  Frame frame = ToFrame(m.AddFrame(rng, 4), 0);
  // A value (V) of the last layer: fp16 NaN.
  frame.payload[frame.payload.size() - 1] = '\x7e';
  EXPECT_TRUE(e->Append("full", frame).ok());
  const absl::Status refused = e->Append("small", frame).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("ingest_precision INT4"));
  StreamConfig other = small_config;
  other.tiers.ingest_precision = ColdPrecision::kInt8;
  EXPECT_EQ(e->OpenStream("small", other).status().code(),
            absl::StatusCode::kAlreadyExists);
  StreamConfig bad = c;
  bad.tiers.ingest_precision = static_cast<ColdPrecision>(9);
  const absl::Status invalid = e->OpenStream("bad", bad).status();
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invalid.message()),
              ::testing::HasSubstr("config.tier_policy.ingest_precision is 9"));
}

}  // namespace
}  // namespace kvmem

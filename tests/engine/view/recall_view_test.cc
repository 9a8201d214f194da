// RecallView (a stream's read model), RebuildSchedule and RecallFeedback,
// each on its own: what recall reads stays consistent as blocks are
// installed, evicted and re-indexed; feedback is deduplicated and schedules
// maintenance once; rebuilds come due by count and run one at a time.
#include "engine/view/recall_view.h"

#include <random>
#include <thread>

#include "engine/recall/recall_feedback.h"
#include "engine/stream_config.h"
#include "engine/view/rebuild_schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::ElementsAre;

// A block of `tokens` tokens at [pos, pos + tokens) with a random summary,
// token groups of `groups` (round robin) and track `track` (0: none).
BlockEntry Block(const StreamConfig& c, uint64_t id, uint64_t pos,
                 uint32_t tokens, uint32_t groups, uint64_t track,
                 std::mt19937_64& rng) {
  std::normal_distribution<float> n;
  BlockEntry e;
  BlockRecord& r = e.rec;
  r.info.id = id;
  r.info.first_frame = id;
  r.info.last_frame = id;
  r.info.first_token_position = pos;
  r.info.end_token_position = pos + tokens;
  r.info.token_count = tokens;
  r.info.payload_bytes = FramePayloadBytes(c.geometry, tokens);
  r.frame_tokens = {tokens};
  const uint32_t dim = SummaryDim(c);
  for (uint32_t i = 0; i < dim; ++i) r.summary.push_back(n(rng));
  if (groups > 1) {
    for (uint32_t g = 0; g < groups; ++g)
      for (uint32_t i = 0; i < dim; ++i) r.group_summaries.push_back(n(rng));
    for (uint32_t t = 0; t < tokens; ++t) r.token_group.push_back(t % groups);
  }
  if (track != 0) r.tracks.push_back({track, 1, id, id, {0, 0, 1, 1}});
  return e;
}

TEST(RecallViewTest, InstallsEvictsAndRebuildsConsistently) {
  const testing::TestGeometry g;
  StreamConfig c = testing::TestConfig(g, /*window=*/20, 1);
  c.groups_per_block = 4;
  c = WithDefaults(c);
  ASSERT_TRUE(ValidateStreamConfig(c).ok());
  RecallView view("cam", c, StreamState());
  std::mt19937_64 rng(3);
  kvmem::MutexLock lock(&view.mu());
  for (uint64_t b = 0; b < 6; ++b) {
    view.Install(Block(c, b, b * 10, 10, 4, b % 2 == 0 ? 7 : 0, rng));
  }
  EXPECT_TRUE(view.grouped());
  EXPECT_EQ(view.units_per_block(), 4u);
  EXPECT_EQ(view.blocks().size(), 6u);
  EXPECT_EQ(view.indexes().all().size(), 6u);
  EXPECT_EQ(view.indexes().groups()->size(), 24u);
  // Round robin over 10 tokens: groups of 3, 3, 2, 2.
  EXPECT_EQ(view.UnitTokens(5, 0), 3u);
  EXPECT_EQ(view.UnitTokens(5, 3), 2u);
  EXPECT_EQ(view.UnitSummary((uint64_t{2} << kGroupShift) | 1),
            view.blocks()[2].rec.group_summaries.data() + SummaryDim(c));
  // A window of 20 ending at 60: blocks ending by 40 are recallable.
  EXPECT_EQ(view.EligibleBlocks(60), 4u);
  EXPECT_EQ(view.EligibleBlocks(15), 0u);
  ASSERT_NE(view.TrackBlocks(7), nullptr);
  EXPECT_THAT(*view.TrackBlocks(7), ElementsAre(0, 2, 4));
  EXPECT_EQ(view.TrackBlocks(8), nullptr);
  EXPECT_EQ(view.tracks().at(7).blocks, 3u);

  // Evicting blocks 0 and 1 drops their run from RAM, with their units and
  // track entries; ids and unit slots of the kept blocks stay right.
  for (uint64_t b : {0, 1}) {
    BlockEntry& e = view.entry(b);
    view.Unindex(b, 4, e.rec.info.payload_bytes);
    e.rec.disk = DiskForm::kNone;
  }
  view.DropEvictedRun();
  EXPECT_EQ(view.blocks().first(), 2u);
  EXPECT_EQ(view.indexes().all().size(), 4u);
  EXPECT_EQ(view.UnitTokens(5, 0), 3u);
  EXPECT_THAT(*view.TrackBlocks(7), ElementsAre(2, 4));
  EXPECT_EQ(view.evicted_payload_bytes(),
            2 * FramePayloadBytes(c.geometry, 10));
  EXPECT_TRUE(view.MissingBlockError(1).message().find("evicted") !=
              std::string::npos);
  EXPECT_EQ(view.EligibleBlocks(60), 4u);  // The dropped run counts.
}

// A rebuild indexes every live summary again: a block the live index lost
// (taken out, still stored) is back, an evicted one stays out, and searches
// answer as before.
TEST(RecallViewTest, RebuildKeepsTheLiveSummaries) {
  const testing::TestGeometry g;
  StreamConfig c = WithDefaults(testing::TestConfig(g, 20, 1));
  RecallView view("cam", c, StreamState());
  std::mt19937_64 rng(4);
  std::vector<float> q(SummaryDim(c), 0.5f);
  std::vector<ScoredId> before;
  {
    kvmem::MutexLock lock(&view.mu());
    for (uint64_t b = 0; b < 8; ++b)
      view.Install(Block(c, b, b * 4, 4, 1, 0, rng));
    view.Unindex(3, 0, 0);
    view.entry(3).rec.disk = DiskForm::kNone;  // Evicted.
    before = view.indexes().all().Search(q.data(), 8);
    view.Unindex(5, 0, 0);  // Lost by the live index, still stored.
    EXPECT_EQ(view.indexes().all().size(), 6u);
  }
  EXPECT_EQ(view.RebuildIndexes(), 7u);
  StreamStats s;
  view.FillStats(&s);
  EXPECT_EQ(s.policy.rebuilds, 1u);
  EXPECT_EQ(s.sealed_blocks, 8u);
  kvmem::ReaderMutexLock lock(&view.mu());
  const std::vector<ScoredId> after = view.indexes().all().Search(q.data(), 8);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].id, before[i].id);
    EXPECT_FLOAT_EQ(after[i].score, before[i].score);
  }
}

TEST(RebuildScheduleTest, DueByCountAndOneAtATime) {
  TierConfig t;
  t.rebuild_every_blocks = 5;
  RebuildSchedule s(t, 8);
  EXPECT_FALSE(s.DueAfterSealing(0, 0));
  EXPECT_FALSE(s.DueAfterSealing(3, 0));
  EXPECT_TRUE(s.DueAfterSealing(2, 0));  // 5 sealed: due, the count restarts.
  EXPECT_FALSE(s.DueAfterSealing(4, 0));
  EXPECT_TRUE(s.Claim());
  EXPECT_FALSE(s.Claim());  // One queued at a time.
  s.Done();
  EXPECT_TRUE(s.Claim());
  TierConfig off;
  RebuildSchedule never(off, 8);
  EXPECT_FALSE(never.DueAfterSealing(1000, 0));
}

TEST(RebuildScheduleTest, NoSoonerThanAnEighthOfTheKeptBlocks) {
  // rebuild_every_blocks = 1 on a stream keeping 81 blocks: a rebuild
  // copies all 81, so one is due only every 11 seals (11 x 8 >= 81); the
  // seconds trigger waits for the same; a floor of 0 is the triggers alone.
  TierConfig t;
  t.rebuild_every_blocks = 1;
  RebuildSchedule s(t, 8);
  EXPECT_TRUE(s.DueAfterSealing(1, 8));  // A small stream: every seal.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(s.DueAfterSealing(1, 81)) << i;
  EXPECT_TRUE(s.DueAfterSealing(1, 81));
  EXPECT_FALSE(s.DueAfterSealing(1, 81));
  RebuildSchedule unfloored(t, 0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(unfloored.DueAfterSealing(1, 81));
  TierConfig secs;
  secs.rebuild_every_seconds = 1;
  RebuildSchedule timed(secs, 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE(timed.DueAfterSealing(1, 81));
  EXPECT_TRUE(timed.DueAfterSealing(10, 81));
}

RecalledBlock Recalled(uint64_t id, uint32_t tokens) {
  RecalledBlock b;
  b.block.id = id;
  b.block.token_count = tokens;
  return b;
}

TEST(RecallFeedbackTest, OneHitPerBlockAndMaintenanceScheduledOnce) {
  RecallFeedback f;
  RecallResult per_layer;
  per_layer.layer_sets.resize(2);
  per_layer.layer_sets[0].blocks = {Recalled(4, 3), Recalled(2, 5)};
  per_layer.layer_sets[0].total_tokens = 8;
  per_layer.layer_sets[1].blocks = {Recalled(4, 3)};
  per_layer.layer_sets[1].total_tokens = 3;
  EXPECT_TRUE(f.Queue(per_layer, 10, /*can_schedule=*/true));
  RecallResult one;
  one.blocks = {Recalled(9, 1)};
  one.total_tokens = 1;
  EXPECT_FALSE(f.Queue(one, 11, true));  // Already scheduled.
  const std::vector<RecallHit> hits = f.Drain();
  ASSERT_EQ(hits.size(), 3u);  // Block 4 once for the per-layer recall.
  EXPECT_EQ(hits[0].block, 2u);
  EXPECT_EQ(hits[1].block, 4u);
  EXPECT_EQ(hits[2].block, 9u);
  EXPECT_EQ(hits[2].frame, 11u);
  EXPECT_TRUE(f.Drain().empty());
  EXPECT_FALSE(f.Queue(one, 12, /*can_schedule=*/false));  // Nowhere to run.
  EXPECT_TRUE(f.Queue(one, 13, true));
  EXPECT_FALSE(f.Queue(RecallResult(), 14, true));  // No hits.

  StreamStats s;
  for (uint32_t us = 1; us <= 100; ++us) f.RecordLatency(us);
  f.FillStats(&s);
  EXPECT_EQ(s.recalled_blocks, 3u + 1 + 1 + 1);  // Every set's, counted.
  EXPECT_EQ(s.recalled_tokens, 11u + 3);
  EXPECT_EQ(s.policy.recall_us_p50, 51u);   // Rank floor(0.5 * 100).
  EXPECT_EQ(s.policy.recall_us_p99, 100u);  // Rank 99, not 98.
  EXPECT_EQ(s.policy.recall_us_max, 100u);
}

}  // namespace
}  // namespace kvmem

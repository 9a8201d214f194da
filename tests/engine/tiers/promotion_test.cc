// Promotion admission (TierManager::ApplyHits): a recalled block out of RAM
// goes back to warm only if it earns it: recalled again within the heat
// half-life, hotter than the warm block it would push out by the policy's
// margin, and at most one such displacing promotion per maintenance pass.
// Hits are applied as the stream's maintenance applies a recall's.
#include <chrono>
#include <future>
#include <random>
#include <vector>

#include "engine/codec/block_layout.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using testing::OpenTestEngine;
using testing::StreamModel;
using testing::TestConfig;
using testing::TestGeometry;
using testing::ToFrame;

class PromotionTest : public ::testing::Test {
 protected:
  // 10 one-frame blocks, warm budget 2: blocks 8 and 9 warm, 0-7 cold.
  void Open(Replacement policy) {
    if (engine_ == nullptr) engine_ = OpenTestEngine(dir_.path());
    const uint32_t tokens = 4;
    StreamConfig c = TestConfig(g_, tokens, 1);
    c.tiers.replacement = policy;
    c.tiers.heat_half_life_frames = 100;
    c.tiers.warm_budget_bytes =
        2 * WarmBlock::AllocatedBytes(WithDefaults(c).geometry, tokens);
    ASSERT_TRUE(engine_->OpenStream("s", c).ok());
    StreamModel m(g_, 1, tokens, {2, 0});
    std::mt19937_64 rng(5);
    for (uint64_t f = 0; f < 10; ++f) {
      ASSERT_TRUE(
          engine_->Append("s", ToFrame(m.AddFrame(rng, tokens), f)).ok());
    }
    ASSERT_EQ(Warm(), (std::vector<uint64_t>{8, 9}));
  }
  std::vector<uint64_t> Warm() {
    auto stream = *engine_->Find("s");
    std::vector<uint64_t> warm;
    for (uint64_t b = 0; b < 10; ++b) {
      if (stream.GetBlock(b)->tier == Tier::kWarm) warm.push_back(b);
    }
    return warm;
  }
  // Each hit at frame 9 (no decay between them).
  void Hit(std::vector<uint64_t> blocks) {
    std::vector<RecallHit> hits;
    for (uint64_t b : blocks) hits.push_back({b, 9});
    ASSERT_TRUE(StreamTestPeer::ApplyHits(*engine_->Find("s"), hits).ok());
  }
  PolicyCounters Moves() { return engine_->GetStats("s")->policy; }

  testing::TempDir dir_;
  TestGeometry g_;
  std::unique_ptr<MemoryEngine> engine_;
};

TEST_F(PromotionTest, AFirstHitIsReadFromTheStoreNotPromoted) {
  for (Replacement policy : {Replacement::kHeat, Replacement::kLru}) {
    Open(policy);
    Hit({3});
    EXPECT_EQ(Warm(), (std::vector<uint64_t>{8, 9}));
    EXPECT_EQ(Moves().promotions, 0u);
    EXPECT_EQ(Moves().promotions_declined, 1u);
    ASSERT_TRUE(engine_->DeleteStream("s").ok());
  }
}

TEST_F(PromotionTest, LruPromotesARepeatHitInPlaceOfAnOlderBlock) {
  Open(Replacement::kLru);
  Hit({3, 3});  // Just used: more recent than block 8 (sealed at frame 8).
  EXPECT_EQ(Warm(), (std::vector<uint64_t>{3, 9}));
  // Block 9 was sealed at the frame of the hit: as recent, so it stays.
  Hit({5, 5});
  EXPECT_EQ(Warm(), (std::vector<uint64_t>{3, 9}));
  EXPECT_EQ(Moves().promotions, 1u);
}

TEST_F(PromotionTest, RepeatHitsPromoteOneDisplacingBlockPerPass) {
  Open(Replacement::kHeat);
  // Blocks 3 and 5 recalled three times each in one pass: both earn a
  // place (heat 0.75 against the new blocks' 0.01), but only one warm
  // block is pushed out per pass.
  Hit({3, 3, 3, 5, 5, 5});
  std::vector<uint64_t> warm = Warm();
  ASSERT_EQ(warm.size(), 2u);
  EXPECT_EQ(warm[0], 3u);
  EXPECT_EQ(Moves().promotions, 1u);
  EXPECT_EQ(Moves().demotions, 9u);  // 8 as the blocks sealed, 1 for 3.
  EXPECT_GE(Moves().promotions_declined, 1u);
  // The next pass promotes 5 in place of the remaining new block.
  Hit({5});
  EXPECT_EQ(Warm(), (std::vector<uint64_t>{3, 5}));
  EXPECT_EQ(Moves().promotions, 2u);
  EXPECT_LE(engine_->GetStats("s")->warm.bytes,
            engine_->GetStats("s")->config.tiers.warm_budget_bytes);
}

TEST_F(PromotionTest, AHotterWarmBlockIsNotPushedOut) {
  Open(Replacement::kHeat);
  Hit({3, 3, 3});
  Hit({5, 5, 5});
  ASSERT_EQ(Warm(), (std::vector<uint64_t>{3, 5}));
  const uint64_t promotions = Moves().promotions;
  // Block 1 as hot as 3 and 5: no swap.
  Hit({1, 1, 1});
  EXPECT_EQ(Warm(), (std::vector<uint64_t>{3, 5}));
  EXPECT_EQ(Moves().promotions, promotions);
}

TEST_F(PromotionTest, AHitBeyondTheHalfLifeIsAFirstHitAgain) {
  Open(Replacement::kHeat);
  auto stream = *engine_->Find("s");
  ASSERT_TRUE(StreamTestPeer::ApplyHits(stream, {{3, 9}}).ok());
  ASSERT_TRUE(StreamTestPeer::ApplyHits(stream, {{3, 9 + 101}}).ok());
  EXPECT_EQ(Warm(), (std::vector<uint64_t>{8, 9}));
  EXPECT_EQ(Moves().promotions_declined, 2u);
}

// An append that seals no block changes nothing the budgets count, so it
// does not wait for a tier move (a promotion holds the moves' lock while it
// reads a block); an append that seals one still enforces the budgets.
TEST(TierMovesTest, AnAppendThatSealsNothingDoesNotWaitForAMove) {
  testing::TempDir dir;
  TestGeometry g;
  auto engine = OpenTestEngine(dir.path());
  const uint32_t tokens = 4;
  StreamConfig c = TestConfig(g, tokens, 4);  // 4-frame blocks.
  const uint64_t block =
      WarmBlock::AllocatedBytes(WithDefaults(c).geometry, 4 * tokens);
  c.tiers.warm_budget_bytes = block;  // One warm block.
  ASSERT_TRUE(engine->OpenStream("s", c).ok());
  StreamModel m(g, 4, tokens, {2, 0});
  std::mt19937_64 rng(9);
  for (uint64_t f = 0; f < 5; ++f) {  // Block 0 sealed, frame 4 open.
    ASSERT_TRUE(engine->Append("s", ToFrame(m.AddFrame(rng, tokens), f)).ok());
  }
  const StreamHandle stream = *engine->Find("s");
  // The future outlives the held lock: a failure here must not wait for
  // the append it failed on while holding what that append waits for.
  std::future<absl::StatusOr<AppendResult>> appended;
  bool waited = false;
  StreamTestPeer::HoldMoves(stream, [&] {
    appended = std::async(std::launch::async, [&] {
      return engine->Append("s", ToFrame(m.AddFrame(rng, tokens), 5));
    });
    waited = appended.wait_for(std::chrono::seconds(20)) !=
             std::future_status::ready;
  });
  EXPECT_FALSE(waited)
      << "a frame that seals nothing waited for the tier manager's moves";
  EXPECT_TRUE(appended.get().ok());
  // Frames 6 and 7: block 1 sealed, block 0 demoted to stay in budget.
  for (uint64_t f = 6; f < 8; ++f) {
    ASSERT_TRUE(engine->Append("s", ToFrame(m.AddFrame(rng, tokens), f)).ok());
  }
  EXPECT_EQ(stream.GetBlock(0)->tier, Tier::kCold);
  EXPECT_EQ(stream.GetBlock(1)->tier, Tier::kWarm);
  EXPECT_LE(engine->GetStats("s")->warm.bytes, block);
}

}  // namespace
}  // namespace kvmem

// Replacement policies (engine/tiers/replacement.h): each term of the heat
// score on its own, its bounds, LRU, and the decay of recall hits. (The
// policies at work in a stream: TiersTest and ReplacementTest in
// tiers_test.cc.)
#include "engine/tiers/replacement.h"

#include <map>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

BlockRecord Block(uint64_t last_access, std::vector<uint64_t> tracks = {}) {
  BlockRecord b;
  b.last_access_frame = last_access;
  for (uint64_t t : tracks) {
    TrackPresence p;
    p.track_id = t;
    b.tracks.push_back(p);
  }
  return b;
}

TEST(ReplacementPolicyTest, LruIsRecencyAndPicksTheName) {
  auto lru = NewReplacementPolicy(Replacement::kLru);
  EXPECT_STREQ(lru->name(), "lru");
  ReplacementContext ctx;
  ctx.now_frame = 200;
  EXPECT_DOUBLE_EQ(lru->KeepScore(Block(50), ctx), 0.25);
  EXPECT_DOUBLE_EQ(lru->KeepScore(Block(200), ctx), 1.0);
  ctx.now_frame = 0;  // Nothing appended yet: 0, not a division by 0.
  EXPECT_EQ(lru->KeepScore(Block(0), ctx), 0.0);
  EXPECT_STREQ(NewReplacementPolicy(Replacement::kHeat)->name(), "heat");
  // A block just recalled is the most recent: LRU promotes it in place of
  // any other; heat asks for half a component more than the block it
  // would push out.
  EXPECT_EQ(lru->promotion_margin(), 0.0);
  EXPECT_EQ(NewHeatPolicy()->promotion_margin(), 0.5);
}

TEST(ReplacementPolicyTest, HeatTermsOneAtATime) {
  auto heat = NewHeatPolicy();
  ReplacementContext ctx;
  ctx.now_frame = 1000;
  ctx.half_life_frames = 100;
  // Nothing but recency: 0.01 x 500/1000.
  EXPECT_DOUBLE_EQ(heat->KeepScore(Block(500), ctx), 0.005);
  // Persistence: its track lived 50 frames of a 100-frame half-life; and
  // frequency: the track is in 2 blocks of 8.
  std::map<uint64_t, TrackHistory> tracks;
  tracks[7] = {100, 150, 2};
  ctx.tracks = &tracks;
  EXPECT_DOUBLE_EQ(heat->KeepScore(Block(0, {7}), ctx), 0.5 + 0.25);
  // Both cap at 1 (a track seen for 10 half-lives, in 40 blocks), and the
  // block's best track counts.
  tracks[9] = {0, 1000, 40};
  EXPECT_DOUBLE_EQ(heat->KeepScore(Block(0, {7, 9}), ctx), 2.0);
  // Similarity: it shows 1 of the newest frame's 2 tracks.
  FrameSignals latest;
  latest.detections.push_back({7, 0, 0, 0, 1, 1, 1});
  latest.detections.push_back({8, 0, 0, 0, 1, 1, 1});
  ctx.latest = &latest;
  ctx.tracks = nullptr;
  EXPECT_DOUBLE_EQ(heat->KeepScore(Block(0, {7}), ctx), 0.5);
  // History: 2 hits, one half-life ago -> 1 decayed hit -> 1/4.
  ctx.latest = nullptr;
  BlockRecord hit = Block(0);
  hit.hits = 2;
  hit.last_hit_frame = 900;
  EXPECT_DOUBLE_EQ(heat->KeepScore(hit, ctx), 0.25);
  // Every term at its cap: 4 + recency.
  tracks[9] = {0, 1000, 40};
  ctx.tracks = &tracks;
  latest.detections.resize(1);
  latest.detections[0].track_id = 9;
  ctx.latest = &latest;
  BlockRecord all = Block(1000, {9});
  all.hits = 100;
  all.last_hit_frame = 1000;
  EXPECT_DOUBLE_EQ(heat->KeepScore(all, ctx), 4.01);
}

TEST(ReplacementPolicyTest, DecayedHitsHalveEveryHalfLife) {
  BlockRecord b;
  EXPECT_EQ(DecayedHits(b, 1000, 100), 0.0);  // Never hit.
  b.hits = 8;
  b.last_hit_frame = 500;
  EXPECT_DOUBLE_EQ(DecayedHits(b, 500, 100), 8.0);
  EXPECT_DOUBLE_EQ(DecayedHits(b, 700, 100), 2.0);
  EXPECT_DOUBLE_EQ(DecayedHits(b, 400, 100), 8.0);  // "Now" before the hit.
  EXPECT_DOUBLE_EQ(DecayedHits(b, 501, 0), 4.0);    // Half-life 0 acts as 1.
}

}  // namespace
}  // namespace kvmem

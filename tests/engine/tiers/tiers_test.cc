// The dynamic memory: shot segmentation, tiers and replacement, dual-signal
// and per-layer recall, staged prefetch, index rebuilds. Real RocksDB.
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "engine/codec/block_layout.h"
#include "engine/codec/quantize.h"
#include "engine/signals/semantics.h"
#include "engine/stream_config.h"
#include "engine/view/recall_view.h"
#include "gmock/gmock.h"
#include "storage/forwarding_store.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using testing::ExpectWithin;
using testing::FrameMajor;
using testing::OpenTestEngine;
using testing::StreamModel;
using testing::TestConfig;
using testing::TestGeometry;
using testing::ToFrame;

std::vector<float> Unit(std::mt19937_64& rng, size_t dim) {
  std::vector<float> v = testing::RandomQuery(rng, dim);
  double n = 0;
  for (float x : v) n += x * x;
  for (float& x : v) x /= std::sqrt(n);
  return v;
}

FrameSignals Track(uint64_t id, float x = 0.1f) {
  FrameSignals s;
  s.detections.push_back({id, 1, x, 0.1f, x + 0.2f, 0.5f, 0.9f});
  return s;
}

// Shots of planted lengths, told apart by the scene embedding or, without
// one, by the keys themselves; a long shot is cut at the frame cap.
TEST(SegmenterTest, CutsAtPlantedShotBoundaries) {
  for (bool embedding : {true, false}) {
    testing::TempDir dir;
    TestGeometry g;
    auto e = OpenTestEngine(dir.path());
    StreamConfig c = TestConfig(g, 16, 0);
    c.segment_mode = SegmentMode::kShot;
    c.frames_per_block = 10;  // Cap.
    ASSERT_TRUE(e->OpenStream("s", c).ok());
    StreamModel m(g, 1, 16, {2, 0});
    std::mt19937_64 rng(embedding ? 1 : 2);
    std::normal_distribution<float> noise(0.0f, 0.05f);
    const std::vector<int> shots = {5, 9, 3, 14};  // 14 > cap: cut at 10.
    uint64_t f = 0;
    for (int len : shots) {
      const std::vector<float> scene = Unit(rng, 24);
      const std::vector<float> key = Unit(rng, g.head_dim);
      for (int i = 0; i < len; ++i, ++f) {
        testing::ModelFrame frame = m.AddFrame(rng, 4);
        FrameSignals sig;
        if (embedding) {
          for (float x : scene) sig.scene_embedding.push_back(x + noise(rng));
        } else {
          // Every key of the frame is the shot's direction plus noise.
          const size_t slice = g.kv_heads * 4 * g.head_dim;
          for (uint32_t l = 0; l < g.layers; ++l) {
            for (size_t j = 0; j < slice; ++j) {
              frame.kv.values[2 * slice * l + j] =
                  std::round((key[j % g.head_dim] + noise(rng)) * 64) / 64;
            }
          }
          frame.bytes = testing::Encode(frame.kv, g.dtype);
        }
        ASSERT_TRUE(e->Append("s", ToFrame(frame, f, sig)).ok());
      }
    }
    ASSERT_TRUE(e->CloseStream("s").ok());
    auto stream = *e->Find("s");
    const std::vector<std::pair<uint64_t, uint64_t>> want = {
        {0, 4}, {5, 13}, {14, 16}, {17, 26}, {27, 30}};
    ASSERT_EQ(stream.Stats().sealed_blocks, want.size()) << embedding;
    for (size_t b = 0; b < want.size(); ++b) {
      auto info = stream.GetBlock(b);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->first_frame, want[b].first) << b << " " << embedding;
      EXPECT_EQ(info->last_frame, want[b].second) << b << " " << embedding;
      EXPECT_EQ(info->first_token_position, want[b].first * 4);
    }
    EXPECT_EQ(stream.Stats().policy.shot_cuts, 3u);  // The cap is not a shot.
  }
}

// An object that keeps coming back (track 7, every 10th frame) among
// transient ones: once it has shown that it recurs, heat-aware replacement
// keeps its blocks warm however old they get; LRU keeps only the newest. (Its
// very first block goes cold under both: when the budget first bites, at
// frame 6, nothing yet says track 7 will return.)
TEST(ReplacementTest, HeatKeepsRecurringObjectLruDoesNot) {
  TestGeometry g;
  const uint32_t tokens = 4;
  for (Replacement policy : {Replacement::kHeat, Replacement::kLru}) {
    testing::TempDir dir;
    auto e = OpenTestEngine(dir.path());
    StreamConfig c = TestConfig(g, tokens, 1);
    c.tiers.replacement = policy;
    c.tiers.heat_half_life_frames = 20;
    c.tiers.warm_budget_bytes =
        6 * WarmBlock::AllocatedBytes(WithDefaults(c).geometry, tokens);
    ASSERT_TRUE(e->OpenStream("s", c).ok());
    StreamModel m(g, 1, tokens, {2, 0});
    std::mt19937_64 rng(3);
    for (uint64_t f = 0; f < 60; ++f) {
      const FrameSignals sig = f % 10 == 0 ? Track(7) : Track(1000 + f);
      ASSERT_TRUE(
          e->Append("s", ToFrame(m.AddFrame(rng, tokens), f, sig)).ok());
    }
    auto stream = *e->Find("s");
    std::vector<uint64_t> warm;
    for (uint64_t b = 0; b < 60; ++b) {
      if (stream.GetBlock(b)->tier == Tier::kWarm) warm.push_back(b);
    }
    const StreamStats st = stream.Stats();
    EXPECT_LE(st.warm.bytes, c.tiers.warm_budget_bytes);
    EXPECT_GT(st.policy.demotions, 0u);
    if (policy == Replacement::kHeat) {
      EXPECT_THAT(warm, ::testing::IsSupersetOf({10, 20, 30, 40, 50}));
      EXPECT_EQ(warm.size(), 6u);
    } else {
      EXPECT_EQ(warm, (std::vector<uint64_t>{54, 55, 56, 57, 58, 59}));
    }
  }
}

// Budgets push blocks down every tier; recall skips evicted blocks, flags
// degraded ones; fetches return exact cold bytes and bounded degraded ones;
// a restart keeps the tiers.
// Param: whether a demoted block keeps its frames as its durable copy
// (EngineOptions::demote_keeps_frames) or is rewritten per layer; the
// tiers, their bytes and every answer are the same either way.
class ColdFormTiersTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(ColdForms, ColdFormTiersTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Frames" : "Layers";
                         });

TEST_P(ColdFormTiersTest, DemoteDegradeEvictFetchAndRecover) {
  testing::TempDir dir;
  EngineOptions options;
  options.demote_keeps_frames = GetParam();
  TestGeometry g;
  const uint32_t tokens = 4;
  StreamConfig c = TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  const uint64_t block_bytes = FramePayloadBytes(geo, 2 * tokens);
  c.tiers.warm_budget_bytes = 2 * WarmBlock::AllocatedBytes(geo, 2 * tokens);
  c.tiers.cold_budget_bytes = 4 * block_bytes;
  c.tiers.storage_cap_bytes =
      4 * block_bytes + 10 * g.layers * QuantizedLayerBytes(geo, 2 * tokens);
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(4);
  std::vector<RecallResult> before;
  std::vector<std::vector<float>> queries;
  StreamStats st;
  std::map<uint64_t, Tier> tiers_before;
  {
    auto e = OpenTestEngine(dir.path(), options);
    ASSERT_TRUE(e->OpenStream("s", c).ok());
    for (uint64_t f = 0; f < 60; ++f) {
      ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, tokens), f)).ok());
      st = *e->GetStats("s");
      ASSERT_LE(st.warm.bytes, c.tiers.warm_budget_bytes);
      ASSERT_LE(st.cold.bytes, c.tiers.cold_budget_bytes);
      ASSERT_LE(st.cold.bytes + st.degraded.bytes, c.tiers.storage_cap_bytes);
    }
    // 30 blocks: 2 warm, 4 cold; the storage cap also counts the warm
    // blocks' frames on disk (2 x 3072 bytes), which leaves room for 7
    // degraded blocks (2304 bytes each) of the 10 it was sized for.
    EXPECT_EQ(st.warm.blocks, 2u);
    EXPECT_EQ(st.cold.blocks, 4u);
    EXPECT_EQ(st.degraded.blocks, 7u);
    EXPECT_EQ(st.evicted.blocks, 17u);
    EXPECT_EQ(st.policy.evictions, 17u);
    EXPECT_EQ(st.policy.degradations, 24u);
    int degraded_seen = 0;
    for (int i = 0; i < 20; ++i) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, m.summary_dim());
      q.top_k = 6;
      q.max_tokens = 1000;
      auto r = e->Recall("s", q);
      ASSERT_TRUE(r.ok());
      // Candidates: 30 blocks less the 17 evicted, less the newest (tokens
      // 232..240), which is inside the 8-token hot window.
      EXPECT_EQ(r->candidates, 12u);
      for (const auto& b : r->blocks) {
        EXPECT_NE(b.block.tier, Tier::kEvicted);
        // A promoted degraded block is warm but still an approximation.
        if (b.block.tier == Tier::kDegraded) {
          EXPECT_TRUE(b.block.degraded);
        }
        if (b.block.tier == Tier::kCold) {
          EXPECT_FALSE(b.block.degraded);
        }
        degraded_seen += b.block.degraded;
      }
      queries.push_back(q.query);
      before.push_back(*r);
    }
    EXPECT_GT(degraded_seen, 0);
    e->WaitForBackground();  // Recalls promote blocks; budgets then apply.
    st = *e->GetStats("s");
    EXPECT_GT(st.policy.promotions, 0u);
    EXPECT_LE(st.warm.bytes, c.tiers.warm_budget_bytes);

    auto stream = *e->Find("s");
    for (uint64_t b = 0; b < 30; ++b) {
      auto info = stream.GetBlock(b);
      tiers_before[b] = info.ok() ? info->tier : Tier::kEvicted;
      if (!info.ok()) {
        EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
        EXPECT_THAT(std::string(info.status().message()),
                    ::testing::HasSubstr("evicted"));
        // Whether its card is still kept or its run was dropped from RAM.
        auto read = stream.ReadBlockPayload(b, PayloadLayout::kFrameMajor, {});
        EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
        EXPECT_THAT(std::string(read.status().message()),
                    ::testing::HasSubstr("evicted"));
        continue;
      }
      absl::StatusOr<std::string> got = FrameMajor(stream, b);
      ASSERT_TRUE(got.ok()) << got.status();
      const std::string want = m.BlockBytes(b);
      if (!info->degraded) {
        EXPECT_EQ(*got, want) << "block " << b;
        continue;
      }
      // Degraded: every value within max|x|/254 of its channel (+ fp16 ulp).
      ExpectWithin(want, *got, g.dtype, 2.0f / 254 + 2.0f / 1024, b);
    }
  }
  // Restart: tiers and answers survive (promoted blocks come back warm).
  auto e = OpenTestEngine(dir.path(), options);
  const StreamStats again = *e->GetStats("s");
  EXPECT_EQ(again.evicted.blocks, st.evicted.blocks);
  EXPECT_EQ(again.degraded.blocks, st.degraded.blocks);
  EXPECT_EQ(again.cold.blocks + again.warm.blocks,
            st.cold.blocks + st.warm.blocks);
  {
    // Each block where it was (a demotion that kept the frames did not
    // rewrite the record, so recovery chose the same warm blocks).
    const StreamHandle stream = *e->Find("s");
    for (const auto& [b, tier] : tiers_before) {
      auto info = stream.GetBlock(b);
      EXPECT_EQ(info.ok() ? info->tier : Tier::kEvicted, tier) << "block " << b;
    }
  }
  for (size_t i = 0; i < queries.size(); ++i) {
    RecallQuery q;
    q.query = queries[i];
    q.top_k = 6;
    q.max_tokens = 1000;
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->blocks.size(), before[i].blocks.size());
    for (size_t j = 0; j < r->blocks.size(); ++j) {
      EXPECT_EQ(r->blocks[j].block.id, before[i].blocks[j].block.id);
    }
  }
}

// The semantic signal brings back a block the model signal alone would not
// rank first; budgets hold and gates sum to 1.
TEST(RecallPlannerTest, SemanticSignalReranksWithinBudget) {
  testing::TempDir dir;
  TestGeometry g;
  auto e = OpenTestEngine(dir.path());
  StreamConfig c = TestConfig(g, 8, 1);
  c.weights.track = 50;
  c.weights.iou = 10;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel m(g, 1, 8, {2, 0});
  std::mt19937_64 rng(5);
  for (uint64_t f = 0; f < 40; ++f) {
    const FrameSignals sig = f == 3 ? Track(42, 0.3f) : Track(500 + f);
    ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, 4), f, sig)).ok());
  }
  int semantic_first = 0;
  for (int i = 0; i < 20; ++i) {
    RecallQuery q;
    q.query = testing::RandomQuery(rng, m.summary_dim());
    q.top_k = 3;
    q.max_tokens = 8;  // Two blocks of 4 tokens.
    q.signals = Track(42, 0.32f);
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok());
    ASSERT_FALSE(r->blocks.empty());
    uint32_t tokens = 0;
    double gates = 0;
    for (const auto& b : r->blocks) {
      tokens += b.block.token_count;
      gates += b.gate_weight;
    }
    EXPECT_LE(tokens, 8u);
    EXPECT_NEAR(gates, 1.0, 1e-5);
    semantic_first += r->blocks[0].block.id == 3;
    EXPECT_GT(r->blocks[0].semantic_score, 0.0f);
    // Without the signal, the same query ranks by the model alone.
    RecallQuery plain = q;
    plain.signals = FrameSignals();
    auto p = e->Recall("s", plain);
    ASSERT_TRUE(p.ok());
    const auto want = m.Recall(q.query, 3, 8);
    ASSERT_EQ(p->blocks.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(p->blocks[j].block.id, want[j].block_id);
    }
  }
  EXPECT_EQ(semantic_first, 20);
}

TEST(RecallPlannerTest, PerLayerSetsMatchPerLayerOracle) {
  testing::TempDir dir;
  TestGeometry g;
  auto e = OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", TestConfig(g, 16, 2)).ok());
  StreamModel m(g, 2, 16, {2, 0});
  std::mt19937_64 rng(6);
  for (uint64_t f = 0; f < 40; ++f) {
    ASSERT_TRUE(
        e->Append("s", ToFrame(m.AddFrame(rng, 1 + rng() % 8), f)).ok());
  }
  const size_t layer_dim = g.kv_heads * g.head_dim;
  int differing = 0;
  for (int i = 0; i < 20; ++i) {
    RecallQuery q;
    q.query = testing::RandomQuery(rng, m.summary_dim());
    q.top_k = 4;
    q.max_tokens = 20;
    q.per_layer = true;
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->layer_sets.size(), 2u);
    EXPECT_TRUE(r->blocks.empty());
    const std::vector<uint32_t> layers = {2, 0};
    for (size_t li = 0; li < 2; ++li) {
      EXPECT_EQ(r->layer_sets[li].layer, layers[li]);
      const std::vector<float> slice(q.query.begin() + li * layer_dim,
                                     q.query.begin() + (li + 1) * layer_dim);
      const std::vector<uint32_t> one = {layers[li]};
      const auto want = m.Recall(slice, 4, 20, 0, &one);
      ASSERT_EQ(r->layer_sets[li].blocks.size(), want.size());
      uint32_t tokens = 0;
      for (size_t j = 0; j < want.size(); ++j) {
        EXPECT_EQ(r->layer_sets[li].blocks[j].block.id, want[j].block_id);
        EXPECT_NEAR(r->layer_sets[li].blocks[j].score, want[j].score, 1e-3);
        tokens += r->layer_sets[li].blocks[j].block.token_count;
      }
      EXPECT_LE(tokens, 20u);
    }
    differing += r->layer_sets[0].blocks[0].block.id !=
                 r->layer_sets[1].blocks[0].block.id;
  }
  EXPECT_GT(differing, 0);  // Layers do pick different blocks.
}

// Prefetch stages blocks in RAM but recall answers exactly as a twin stream
// without prefetch; a recall that picks a staged block confirms it.
TEST(PrefetchTest, StagedBlocksAreOnlyReturnedWhenAQueryPicksThem) {
  testing::TempDir dir;
  TestGeometry g;
  auto e = OpenTestEngine(dir.path());
  StreamConfig c = TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  c.tiers.warm_budget_bytes = WarmBlock::AllocatedBytes(geo, 8);
  StreamConfig staged = c;
  staged.tiers.prefetch_blocks = 2;
  staged.tiers.stage_budget_bytes = 3 * WarmBlock::AllocatedBytes(geo, 8);
  ASSERT_TRUE(e->OpenStream("plain", c).ok());
  ASSERT_TRUE(e->OpenStream("staged", staged).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(7);
  int hits_seen = 0;
  for (uint64_t f = 0; f < 80; ++f) {
    const auto& frame = m.AddFrame(rng, 4);
    ASSERT_TRUE(e->Append("plain", ToFrame(frame, f)).ok());
    ASSERT_TRUE(e->Append("staged", ToFrame(frame, f)).ok());
    const StreamStats s = *e->GetStats("staged");
    ASSERT_LE(s.policy.stage_bytes, staged.tiers.stage_budget_bytes);
    if (f % 2 == 1) continue;
    // The frame just appended opened a block: query with its mean key, as
    // the prefetcher predicted from it.
    RecallQuery q;
    const std::vector<const testing::FloatFrame*> last = {&frame.kv};
    for (double x : testing::MeanKey(g, last, {2, 0})) q.query.push_back(x);
    q.top_k = 2;
    q.max_tokens = 8;
    auto a = e->Recall("plain", q);
    auto b = e->Recall("staged", q);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->blocks.size(), b->blocks.size());
    for (size_t j = 0; j < a->blocks.size(); ++j) {
      EXPECT_EQ(a->blocks[j].block.id, b->blocks[j].block.id);
      EXPECT_EQ(a->blocks[j].score, b->blocks[j].score);
      EXPECT_FALSE(a->blocks[j].was_staged);
      hits_seen += b->blocks[j].was_staged;
    }
    e->WaitForBackground();
  }
  const StreamStats s = *e->GetStats("staged");
  EXPECT_GT(s.policy.staged, 0u);
  EXPECT_GT(hits_seen, 0);
  EXPECT_EQ(s.policy.stage_hits, static_cast<uint64_t>(hits_seen));
  EXPECT_GT(s.policy.stage_misses, 0u);
  EXPECT_EQ(e->GetStats("plain")->policy.staged, 0u);
}

// Staged copies live only in room the engine's warm cap leaves: a stream
// whose stage budget is 2^64 (an audit's stream staged 260 MB beside a cap
// of 8 MiB, its staged bytes counted nowhere) stages up to that room, and
// its oldest copies go at its next frame once warm blocks took the room.
TEST(PrefetchTest, StagedCopiesStayWithinTheGlobalWarmCap) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  const uint64_t block = WarmBlock::AllocatedBytes(WithDefaults(c).geometry, 8);
  EngineOptions options;
  options.global_warm_budget_bytes = 6 * block;
  auto e = OpenTestEngine(dir.path(), options);
  c.tiers.warm_budget_bytes = 2 * block;
  c.tiers.prefetch_blocks = 8;
  c.tiers.stage_budget_bytes = ~uint64_t{0};
  ASSERT_TRUE(e->OpenStream("staged", c).ok());
  StreamConfig other = TestConfig(g, 8, 2);  // No budget of its own.
  ASSERT_TRUE(e->OpenStream("other", other).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(21);
  uint64_t most_staged = 0;
  for (uint64_t f = 0; f < 60; ++f) {
    const auto& frame = m.AddFrame(rng, 4);
    // The other stream starts late and fills the cap with warm blocks.
    if (f >= 30) ASSERT_TRUE(e->Append("other", ToFrame(frame, f - 30)).ok());
    ASSERT_TRUE(e->Append("staged", ToFrame(frame, f)).ok());
    e->WaitForBackground();
    const uint64_t staged = e->global_stage_bytes();
    ASSERT_EQ(staged, e->GetStats("staged")->policy.stage_bytes);
    ASSERT_LE(e->global_warm_bytes() + staged, options.global_warm_budget_bytes)
        << "frame " << f;
    most_staged = std::max(most_staged, staged);
  }
  // Staging ran (up to the room the warm blocks left), and gave way.
  EXPECT_GE(most_staged, 2 * block);
  EXPECT_GT(e->GetStats("staged")->policy.staged, 0u);
  EXPECT_LT(e->global_stage_bytes(), most_staged);
}

// Rebuilds run in the background while appends and recalls go on; the
// swapped index holds every block exactly once.
TEST(RebuildTest, SwapsWithoutLosingOrDuplicatingBlocks) {
  testing::TempDir dir;
  TestGeometry g;
  auto e = OpenTestEngine(dir.path());
  StreamConfig c = TestConfig(g, 16, 2);
  c.tiers.rebuild_every_blocks = 3;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel m(g, 2, 16, {2, 0});
  std::mt19937_64 rng(8);
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    std::mt19937_64 r2(9);
    while (!done) {
      RecallQuery q;
      q.query = testing::RandomQuery(r2, m.summary_dim());
      q.top_k = 50;
      q.max_tokens = 100000;
      auto r = e->Recall("s", q);
      if (!r.ok()) ++bad;
      std::set<uint64_t> ids;
      for (const auto& b : r->blocks) {
        if (!ids.insert(b.block.id).second) ++bad;  // Duplicate.
      }
    }
  });
  for (uint64_t f = 0; f < 200; ++f) {
    ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, 4), f)).ok());
  }
  done = true;
  reader.join();
  e->WaitForBackground();
  EXPECT_EQ(bad.load(), 0);
  auto stream = *e->Find("s");
  // Triggers every 3 blocks at first (then no sooner than an eighth of the
  // kept blocks); one already queued absorbs the next ones.
  EXPECT_GT(stream.Stats().policy.rebuilds, 0u);
  EXPECT_EQ(*e->RebuildIndex("s"), 100u);
  for (int i = 0; i < 10; ++i) {
    RecallQuery q;
    q.query = testing::RandomQuery(rng, m.summary_dim());
    q.top_k = 100;
    q.max_tokens = 100000;
    auto r = e->Recall("s", q);
    const auto want = m.Recall(q.query, 100, 100000);
    ASSERT_EQ(r->blocks.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(r->blocks[j].block.id, want[j].block_id);
    }
  }
}

// Index rebuilds run on the background executor while appends go on, under
// a storage cap that evicts every block but the newest as it seals (so the
// run of evicted blocks leaves RAM after every seal): the index ends with
// exactly the blocks that have a disk form, each readable. (A rebuild whose
// build outlasts two seals reconciles ids the table has dropped; that
// interleaving is too narrow to hit here, and RebuildIndex starts its
// reconciliation at the table's first id for it.)
TEST(TiersTest, RebuildsRacingEvictionsOfTheirBlocks) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  c.tiers.warm_budget_bytes = 1;  // Every block demoted as it seals...
  c.tiers.storage_cap_bytes = FramePayloadBytes(geo, 2 * 4);  // ...evicted.
  c.tiers.rebuild_every_blocks = 1;  // A rebuild after every seal.
  EngineOptions options;
  options.background_threads = 1;
  auto e = OpenTestEngine(dir.path(), options);
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(21);
  for (uint64_t f = 0; f < 2000; ++f) {
    ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, 4), f)).ok());
  }
  e->WaitForBackground();
  const StreamStats st = *e->GetStats("s");
  EXPECT_EQ(st.sealed_blocks, 1000u);
  EXPECT_GT(st.evicted.blocks, 990u);
  EXPECT_GT(st.policy.rebuilds, 0u);
  // Recalls see only the blocks left, and each is readable.
  RecallQuery q;
  q.query = testing::RandomQuery(rng, m.summary_dim());
  q.max_tokens = 1000;
  auto r = e->Recall("s", q);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->candidates + st.evicted.blocks + 1, st.sealed_blocks)
      << "every block not evicted, less the one in the hot window";
  auto stream = *e->Find("s");
  for (const auto& b : r->blocks) {
    EXPECT_TRUE(
        stream.ReadBlockPayload(b.block.id, PayloadLayout::kFrameMajor, {})
            .ok());
  }
}

// A client's rebuild_every_blocks = 1 rebuilds after every seal only while
// the stream is small: a rebuild re-adds every kept block, so one runs no
// sooner than an eighth of them have sealed since the last
// (EngineOptions::rebuild_kept_per_sealed; 0: every seal, as before).
TEST(TiersTest, RebuildsAreAmortisedOverTheKeptBlocks) {
  TestGeometry g;
  for (uint32_t floor : {8u, 0u}) {
    SCOPED_TRACE(::testing::Message() << "rebuild_kept_per_sealed " << floor);
    testing::TempDir dir;
    StreamConfig c = TestConfig(g, 8, 2);
    c.tiers.rebuild_every_blocks = 1;
    EngineOptions options;
    options.rebuild_kept_per_sealed = floor;
    auto e = OpenTestEngine(dir.path(), options);
    ASSERT_TRUE(e->OpenStream("s", c).ok());
    StreamModel m(g, 2, 8, {2, 0});
    std::mt19937_64 rng(22);
    for (uint64_t f = 0; f < 800; ++f) {
      ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, 4), f)).ok());
      e->WaitForBackground();  // Each due rebuild runs before the next seal.
    }
    const StreamStats st = *e->GetStats("s");
    ASSERT_EQ(st.sealed_blocks, 400u);
    if (floor == 0) {
      EXPECT_EQ(st.policy.rebuilds, 400u);
    } else {
      // 8 x ln(400 / 8) + 8 = 39: the first 8 seals, then one each time
      // the kept blocks grow by an eighth.
      EXPECT_GE(st.policy.rebuilds, 30u);
      EXPECT_LE(st.policy.rebuilds, 50u);
    }
  }
}

// A track's history leaves RAM with the last kept block that shows it: a
// tracker that names new ids in every frame (an audit's front end sent
// 1,024 a frame) no longer grows the stream's track map without bound.
TEST(TiersTest, TrackHistoriesLeaveWithTheirBlocks) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  c.tiers.warm_budget_bytes = 1;  // Every block demoted as it seals...
  c.tiers.storage_cap_bytes = FramePayloadBytes(geo, 2 * 4);  // ...evicted.
  auto e = OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(22);
  constexpr uint64_t kPerFrame = 4;
  constexpr size_t kScene = 48;  // Scene floats a frame.
  BlockRecord one_track;
  one_track.tracks.resize(1);
  const uint64_t per_presence = SignalRamBytes(one_track);
  BlockSemanticsBuilder open;
  FrameSignals one;
  one.detections.resize(1);
  one.scene_embedding.assign(kScene, 0.5f);
  open.AddFrame(0, one);
  const uint64_t open_scene = kScene * sizeof(double);
  const uint64_t per_open_track = open.RamBytes() - open_scene;
  uint64_t most = 0;
  for (uint64_t f = 0; f < 400; ++f) {
    FrameSignals sig;
    for (uint64_t k = 0; k < kPerFrame; ++k) {
      sig.detections.push_back(
          {f * kPerFrame + k + 1, 0, 0.1f, 0.1f, 0.4f, 0.4f, 0.9f});
    }
    sig.scene_embedding.assign(kScene, 0.25f + 0.001f * f);
    ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, 4), f, sig)).ok());
    const StreamStats st = *e->GetStats("s");
    most = std::max(most, st.track_histories);
    // The kept blocks' tracks (a block is 2 frames; the few blocks not yet
    // dropped), never every track seen.
    ASSERT_LE(st.track_histories,
              (st.sealed_blocks - st.evicted.blocks) * 2 * kPerFrame)
        << "frame " << f;
    // Each track shows in one block: the signals' RAM counted is exactly
    // the kept presences', the scene means of the blocks not evicted (an
    // evicted block keeps its tracks, not its scene) and the open block's
    // tracks and scene sum.
    const uint64_t scenes =
        st.warm.blocks + st.cold.blocks + st.degraded.blocks;
    const uint64_t in_open =
        st.open_block_frames == 0
            ? 0
            : open_scene + st.open_block_frames * kPerFrame * per_open_track;
    ASSERT_EQ(st.signal_bytes, st.track_histories * per_presence +
                                   scenes * kScene * sizeof(float) + in_open)
        << "frame " << f;
  }
  std::cout << "track histories held: at most " << most << " of "
            << 400 * kPerFrame << " tracks seen\n";
  EXPECT_GT(most, 0u);
  EXPECT_LT(most, 100u);
  // The newest tracks still have their histories (and blocks).
  const StreamStats st = *e->GetStats("s");
  EXPECT_GT(st.track_histories, 0u);
}

// An evicted block keeps only its card in RAM until the run of evicted
// blocks before it leaves: none of its token codes' memory. (Its record
// was move-assigned a fresh one, and a std::string assigned from a short
// one keeps its own buffer: 9 KiB a block in the soak, whose RSS grew ~200
// KiB/s while blocks older than a hot one were evicted.)
TEST(TiersTest, AnEvictedBlockKeepsNoTokenCodes) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  c.weights.score = ScoreMode::kMass;
  c.groups_per_block = 4;         // Token groups, and so token codes.
  c.tiers.warm_budget_bytes = 1;  // Blocks demoted as they seal.
  auto e = OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(23);
  for (uint64_t f = 0; f < 12; ++f) {
    ASSERT_TRUE(e->Append("s", ToFrame(m.AddFrame(rng, 4), f)).ok());
  }
  e->WaitForBackground();
  auto stream = *e->Find("s");
  const std::optional<size_t> before = StreamTestPeer::CodeCapacity(stream, 1);
  ASSERT_TRUE(before.has_value());
  ASSERT_GT(*before, 0u) << "block 1 has token codes";
  // Block 1, behind block 0 that stays: its entry stays in RAM's table.
  ASSERT_TRUE(StreamTestPeer::Evict(stream, 1).ok());
  const std::optional<size_t> after = StreamTestPeer::CodeCapacity(stream, 1);
  ASSERT_TRUE(after.has_value()) << "block 0 keeps block 1's card in RAM";
  EXPECT_EQ(*after, std::string().capacity()) << "no buffer of its own";
  EXPECT_EQ(e->GetStats("s")->evicted.blocks, 1u);
  // Evicting block 0 drops the run of both.
  ASSERT_TRUE(StreamTestPeer::Evict(stream, 0).ok());
  EXPECT_FALSE(StreamTestPeer::CodeCapacity(stream, 1).has_value());
}

// A stream kept compressed on disk (tier_policy.cold_precision INT8 or
// INT4): each block that leaves RAM is written once, compressed, in place
// of its frames; the same frames in a full-precision stream take 2x (int8)
// or ~4x (int4) the bytes; recall picks the same blocks and tokens; reads
// stay within the form's bound (values here are in [-2, 2]: int8 within
// max|x| / 254, int4 within a range of at most 4 / 30); a restart
// keeps the precision and the tiers.
class ColdPrecisionTest : public ::testing::TestWithParam<ColdPrecision> {};

// Streams "full" and "small" recall the same blocks and tokens for q; the
// small stream's blocks out of RAM are flagged degraded.
void ExpectSameSets(MemoryEngine* e, const RecallQuery& q) {
  auto a = e->Recall("full", q);
  auto b = e->Recall("small", q);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->blocks.size(), b->blocks.size());
  for (size_t j = 0; j < a->blocks.size(); ++j) {
    EXPECT_EQ(a->blocks[j].block.id, b->blocks[j].block.id);
    EXPECT_EQ(a->blocks[j].token_offsets, b->blocks[j].token_offsets);
    if (b->blocks[j].block.tier != Tier::kWarm) {
      EXPECT_TRUE(b->blocks[j].block.degraded);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, ColdPrecisionTest,
                         ::testing::Values(ColdPrecision::kInt8,
                                           ColdPrecision::kInt4),
                         [](const ::testing::TestParamInfo<ColdPrecision>& p) {
                           return p.param == ColdPrecision::kInt8 ? "Int8"
                                                                  : "Int4";
                         });

TEST_P(ColdPrecisionTest, BlocksLeavingRamAreWrittenCompressed) {
  const bool int4 = GetParam() == ColdPrecision::kInt4;
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = testing::TwoWarmBlocksConfig(g);
  const Geometry geo = WithDefaults(c).geometry;
  StreamConfig small_config = c;
  small_config.tiers.cold_precision = GetParam();
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(31);
  std::vector<std::vector<float>> queries;
  {
    auto e = OpenTestEngine(dir.path());
    ASSERT_TRUE(e->OpenStream("full", c).ok());
    ASSERT_TRUE(e->OpenStream("small", small_config).ok());
    for (uint64_t f = 0; f < 40; ++f) {
      Frame frame = ToFrame(m.AddFrame(rng, 4), f);
      ASSERT_TRUE(e->Append("full", frame).ok());
      ASSERT_TRUE(e->Append("small", std::move(frame)).ok());
    }
    const StreamStats full = *e->GetStats("full");
    const StreamStats small = *e->GetStats("small");
    EXPECT_EQ(small.config.tiers.cold_precision, GetParam());
    EXPECT_EQ(full.config.tiers.cold_precision, ColdPrecision::kFull);
    // 20 blocks, 2 warm: the other 18 cold, or degraded (compressed) at
    // once.
    EXPECT_EQ(full.cold.blocks, 18u);
    EXPECT_EQ(small.cold.blocks, 0u);
    EXPECT_EQ(small.degraded.blocks, 18u);
    EXPECT_EQ(small.policy.demotions, 18u);
    EXPECT_EQ(small.policy.degradations, 0u);
    EXPECT_EQ(small.degraded.bytes,
              18 * g.layers *
                  (int4 ? Int4LayerBytes(geo, 2 * 4)
                        : QuantizedLayerBytes(geo, 2 * 4)));
    EXPECT_LT(small.degraded.bytes, full.cold.bytes);  // Scales weigh on
    // blocks of 8 tokens; QuantizeTest has the ratio at a 7B block's size.
    for (int i = 0; i < 12; ++i) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, m.summary_dim());
      q.max_tokens = 12;
      ExpectSameSets(e.get(), q);
      queries.push_back(q.query);
    }
    auto stream = *e->Find("small");
    for (uint64_t b = 0; b < 18; ++b) {
      auto info = stream.GetBlock(b);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_TRUE(info->degraded) << "block " << b;
      absl::StatusOr<std::string> got = FrameMajor(stream, b);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectWithin(m.BlockBytes(b), *got, g.dtype,
                   (int4 ? 4.0f / 30 : 2.0f / 254) + 2.0f / 1024, b);
    }
  }
  auto e = OpenTestEngine(dir.path());
  const StreamStats again = *e->GetStats("small");
  EXPECT_EQ(again.config.tiers.cold_precision, GetParam());
  EXPECT_EQ(again.cold.blocks, 0u);
  EXPECT_GE(again.degraded.blocks, 16u);  // Recalls promoted some to warm.
  for (const auto& query : queries) {
    RecallQuery q;
    q.query = query;
    q.max_tokens = 12;
    ExpectSameSets(e.get(), q);
  }
}

// The engine-wide warm cap holds across streams that have no budget of
// their own.
TEST(TiersTest, GlobalWarmBudgetHoldsAcrossStreams) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  const uint64_t block = WarmBlock::AllocatedBytes(WithDefaults(c).geometry, 8);
  EngineOptions options;
  options.global_warm_budget_bytes = 5 * block;
  auto e = OpenTestEngine(dir.path(), options);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(e->OpenStream(id, c).ok());
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(12);
  for (uint64_t f = 0; f < 40; ++f) {
    const auto& frame = m.AddFrame(rng, 4);
    for (const char* id : {"a", "b", "c"}) {
      ASSERT_TRUE(e->Append(id, ToFrame(frame, f)).ok());
      uint64_t warm = 0;
      for (const auto& s : e->ListStreams()) warm += s.warm.bytes;
      ASSERT_LE(warm, options.global_warm_budget_bytes) << "frame " << f;
      ASSERT_EQ(warm, e->global_warm_bytes());
    }
  }
  uint64_t cold = 0;
  for (const auto& s : e->ListStreams()) cold += s.cold.blocks;
  EXPECT_EQ(cold, 3u * 20 - 5);
}

// Counts the block records each commit writes, per block.
class RecordCountingStore final : public ForwardingColdStore {
 public:
  using ForwardingColdStore::ForwardingColdStore;
  absl::Status Commit(const StreamWrite& w) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [id, record] : w.blocks) writes[id] += 1;
    }
    return ForwardingColdStore::Commit(w);
  }
  std::map<uint64_t, int> Writes() {
    std::lock_guard<std::mutex> lock(mu);
    return writes;
  }
  std::mutex mu;
  std::map<uint64_t, int> writes;
};

// A demotion that keeps the block's frames changes no durable form, so it
// does not rewrite the block's record (13 MB at 7B): each block's record is
// written once, at its seal. The recorded tier then says warm for blocks
// that left RAM; a restart brings back warm the newest blocks the warm
// budgets hold (the stream's, then what the engine-wide cap leaves) and
// keeps the others cold, every byte as appended.
TEST(TiersTest, ADemotionThatKeepsFramesLeavesTheRecordAlone) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  const uint64_t block = WarmBlock::AllocatedBytes(geo, 8);
  c.tiers.warm_budget_bytes = 3 * block;
  auto counting = std::make_shared<RecordCountingStore>(
      std::shared_ptr<ColdStore>(testing::OpenTestStore(dir.path())));
  EngineOptions options;
  options.demote_keeps_frames = true;
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(21);
  {
    auto e = MemoryEngine::Open(std::make_unique<ForwardingColdStore>(counting),
                                options);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->OpenStream("s", c).ok());
    for (uint64_t f = 0; f < 20; ++f) {
      ASSERT_TRUE((*e)->Append("s", ToFrame(m.AddFrame(rng, 4), f)).ok());
    }
    (*e)->WaitForBackground();
    const StreamStats st = *(*e)->GetStats("s");
    EXPECT_EQ(st.warm.blocks, 3u);
    EXPECT_EQ(st.cold.blocks, 7u);
    EXPECT_GE(st.policy.demotions, 7u);
  }
  const std::map<uint64_t, int> writes = counting->Writes();
  ASSERT_EQ(writes.size(), 10u);
  for (const auto& [id, n] : writes) EXPECT_EQ(n, 1) << "block " << id;
  // Restarts: the stream's budget (3 blocks), then an engine-wide cap of 2.
  for (const uint64_t warm : {3, 2}) {
    EngineOptions again = options;
    if (warm == 2) again.global_warm_budget_bytes = 2 * block;
    auto e = MemoryEngine::Open(std::make_unique<ForwardingColdStore>(counting),
                                again);
    ASSERT_TRUE(e.ok()) << e.status();
    const StreamStats st = *(*e)->GetStats("s");
    EXPECT_EQ(st.warm.blocks, warm);
    EXPECT_EQ(st.cold.blocks, 10 - warm);
    const StreamHandle stream = *(*e)->Find("s");
    for (uint64_t b = 0; b < 10; ++b) {
      EXPECT_EQ(stream.GetBlock(b)->tier,
                b >= 10 - warm ? Tier::kWarm : Tier::kCold)
          << "block " << b;
      absl::StatusOr<std::string> got = FrameMajor(stream, b);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, m.BlockBytes(b)) << "block " << b;
    }
  }
}

// Fetches racing tier moves: every read is exact for full-precision blocks,
// within the bound for degraded ones, and never fails but for eviction.
TEST(TiersTest, ReadsRacingTierMovesStayConsistent) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  const uint64_t block_bytes = FramePayloadBytes(geo, 8);
  c.tiers.warm_budget_bytes = 2 * WarmBlock::AllocatedBytes(geo, 8);
  c.tiers.cold_budget_bytes = 3 * block_bytes;
  c.tiers.storage_cap_bytes = 20 * block_bytes;
  auto e = OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  auto stream = *e->Find("s");
  StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(13);
  for (uint64_t f = 0; f < 400; ++f) m.AddFrame(rng, 4);
  std::atomic<uint64_t> sealed{0};
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, failures{0};
  std::thread reader([&] {
    std::mt19937_64 r2(14);
    while (!done) {
      const uint64_t n = sealed.load();
      if (n == 0) continue;
      const uint64_t b = r2() % n;
      BlockInfo info;
      auto pieces =
          stream.ReadBlockPayload(b, PayloadLayout::kFrameMajor, {}, &info);
      if (!pieces.ok()) {
        if (!absl::IsNotFound(pieces.status())) ++failures;
        continue;
      }
      std::string got;
      for (const auto& p : *pieces) got += p.ToString();
      const std::string want = m.BlockBytes(b);
      if (got.size() != want.size()) {
        ++failures;
      } else if (!info.degraded && got != want) {
        ++failures;
      }
      ++reads;
    }
  });
  for (uint64_t f = 0; f < 400; ++f) {
    ASSERT_TRUE(e->Append("s", ToFrame(m.frames()[f], f)).ok());
    sealed = (f + 1) / 2;
    // Every 4th frame, the reader catches up (a read per 4 frames) before
    // the next tier moves: appends to a fast store (the memory store) would
    // otherwise all be done before it read much.
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (f % 4 == 3 && reads.load() < static_cast<int>(f / 4) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(reads.load(), 90);
  const StreamStats st = stream.Stats();
  EXPECT_GT(st.policy.degradations, 0u);
  EXPECT_GT(st.policy.evictions, 0u);
}

}  // namespace
}  // namespace kvmem

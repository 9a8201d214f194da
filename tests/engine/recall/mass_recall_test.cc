// Recall by estimated attention mass (score MASS) through a real engine over
// RocksDB, against StreamModel::MassRecall, the formula computed directly:
// the same blocks in the same order with the same masses, with the front
// end's window log-sum-exp and with kvmem's own estimate, one or several
// query vectors, per-layer sets; on the exact (Flat) and the int8-bounded
// (Progressive) index. Budgets, windows, gates and token groups.
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "engine/memory_engine.h"
#include "engine/stream_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using testing::StreamModel;

constexpr uint32_t kFpb = 3, kWindow = 40;

StreamConfig MassConfig(const testing::TestGeometry& g,
                        const std::string& index) {
  StreamConfig c = testing::TestConfig(g, kWindow, kFpb);
  c.weights.score = ScoreMode::kMass;
  c.index_factory = index;
  return c;
}

std::vector<float> Scaled(std::vector<float> v, float k) {
  for (float& x : v) x *= k;
  return v;
}

// A stream on the parameter's index with `frames` frames of 4 random
// tokens, and its model.
class MassRecallTest : public ::testing::TestWithParam<std::string> {
 protected:
  void Fill(uint64_t seed, uint64_t frames) {
    engine_ = testing::OpenTestEngine(dir_.path());
    ASSERT_TRUE(engine_->OpenStream("s", MassConfig(g_, GetParam())).ok());
    rng_.seed(seed);
    for (uint64_t f = 0; f < frames; ++f) {
      ASSERT_TRUE(
          engine_->Append("s", testing::ToFrame(model_.AddFrame(rng_, 4), f))
              .ok());
    }
  }
  // Progressive computes each head's normaliser from its int8 scores
  // (within their proven bound), so its masses are close, not equal.
  double tol() const { return GetParam() == "Flat" ? 1e-4 : 2e-2; }

  testing::TempDir dir_;
  const testing::TestGeometry g_{};
  std::unique_ptr<MemoryEngine> engine_;
  StreamModel model_{g_, kFpb, kWindow, {2, 0}};
  std::mt19937_64 rng_;
};

TEST_P(MassRecallTest, MatchesTheFormulaComputedDirectly) {
  // 61 frames of 4 tokens: 20 sealed blocks of 12 tokens and an open one.
  Fill(21, 61);
  MemoryEngine* e = engine_.get();
  const StreamModel& model = model_;
  std::mt19937_64& rng = rng_;
  const size_t dim = model.summary_dim(), heads = model.heads();
  const double tol = this->tol();
  std::normal_distribution<float> lse(4.0f, 2.0f);
  size_t compared = 0;
  for (int i = 0; i < 40; ++i) {
    const uint32_t vectors = 1 + i % 3;
    RecallQuery q;
    for (uint32_t j = 0; j < vectors; ++j) {
      const auto v = Scaled(testing::RandomQuery(rng, dim), 4.0f);
      q.query.insert(q.query.end(), v.begin(), v.end());
    }
    if (i % 2 == 0) {  // The front end's window; else kvmem's estimate.
      for (size_t k = 0; k < vectors * heads; ++k)
        q.window_lse.push_back(lse(rng));
    }
    q.top_k = i % 4 == 1 ? 2 : 0;
    q.max_tokens = 10 + 9 * i;
    auto got = e->Recall("s", q);
    ASSERT_TRUE(got.ok()) << got.status();
    std::map<uint64_t, double> density;
    const auto want = model.MassRecall(q.query, q.window_lse, q.top_k,
                                       q.max_tokens, 0, 0, &density);
    EXPECT_EQ(got->query_vectors, vectors);
    EXPECT_EQ(got->window_estimated, q.window_lse.empty());
    uint32_t tokens = 0;
    double mass = 0, gates = 0, true_mass = 0, want_mass = 0;
    for (const RecalledBlock& b : got->blocks) {
      ASSERT_TRUE(density.count(b.block.id))
          << "not recallable: " << b.block.id;
      true_mass += density[b.block.id] * b.block.token_count;
      EXPECT_NEAR(b.mass, density[b.block.id] * b.block.token_count,
                  tol * b.mass + 1e-12);
      EXPECT_TRUE(b.token_offsets.empty());
      tokens += b.block.token_count;
      mass += b.mass;
      gates += b.gate_weight;
    }
    for (const auto& h : want) want_mass += h.mass;
    if (GetParam() == "Flat") {  // Exact: the formula's very blocks.
      ASSERT_EQ(got->blocks.size(), want.size()) << "query " << i;
      for (size_t j = 0; j < want.size(); ++j) {
        EXPECT_EQ(got->blocks[j].block.id, want[j].block_id)
            << "query " << i << " rank " << j;
      }
    } else {  // Close blocks may swap; the set holds as much mass.
      EXPECT_GE(true_mass, 0.99 * want_mass) << "query " << i;
    }
    // Gates at temperature 1: each block's share of the set's mass.
    for (const RecalledBlock& b : got->blocks) {
      EXPECT_NEAR(b.gate_weight, b.mass / mass, 1e-5);
    }
    if (!want.empty()) {
      EXPECT_NEAR(gates, 1.0, 1e-5);
    }
    EXPECT_NEAR(got->recalled_mass, mass, 1e-5 * mass + 1e-12);
    EXPECT_LE(tokens, q.max_tokens);
    EXPECT_EQ(tokens, got->total_tokens);
    if (q.top_k > 0) {
      EXPECT_LE(got->blocks.size(), q.top_k);
    }
    compared += got->blocks.size();
  }
  EXPECT_GT(compared, 50u);
}

TEST_P(MassRecallTest, PerLayerSetsScoreEachLayersHeads) {
  Fill(22, 40);
  MemoryEngine* e = engine_.get();
  const StreamModel& model = model_;
  std::mt19937_64& rng = rng_;
  const size_t dim = model.summary_dim(), kv = g_.kv_heads;
  const double tol = this->tol();
  for (int i = 0; i < 10; ++i) {
    RecallQuery q;
    q.query = Scaled(testing::RandomQuery(rng, dim), 4.0f);
    q.window_lse.assign(model.heads(), 3.0f);
    q.max_tokens = 30;
    q.per_layer = true;
    auto got = e->Recall("s", q);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->layer_sets.size(), 2u);
    for (size_t li = 0; li < 2; ++li) {
      EXPECT_EQ(got->layer_sets[li].layer, li == 0 ? 2u : 0u);
      const auto want = model.MassRecall(q.query, q.window_lse, 0, 30, li * kv,
                                         (li + 1) * kv);
      const auto& set = got->layer_sets[li].blocks;
      double got_mass = 0, want_mass = 0;
      for (const auto& b : set) got_mass += b.mass;
      for (const auto& h : want) want_mass += h.mass;
      EXPECT_NEAR(got_mass, want_mass, tol * want_mass + 1e-12);
      if (GetParam() == "Flat") {
        ASSERT_EQ(set.size(), want.size()) << "query " << i << " layer " << li;
        for (size_t j = 0; j < want.size(); ++j) {
          EXPECT_EQ(set[j].block.id, want[j].block_id);
          EXPECT_NEAR(set[j].mass, want[j].mass, tol * want[j].mass + 1e-12);
        }
      }
    }
    EXPECT_TRUE(got->blocks.empty());
  }
}

TEST_P(MassRecallTest, PerHeadSetsScoreOneHeadEach) {
  Fill(25, 40);
  MemoryEngine* e = engine_.get();
  const StreamModel& model = model_;
  const testing::TestGeometry& g = g_;
  std::mt19937_64& rng = rng_;
  const double tol = this->tol();
  RecallQuery q;
  q.query = Scaled(testing::RandomQuery(rng, model.summary_dim()), 4.0f);
  q.window_lse.assign(model.heads(), 3.0f);
  q.max_tokens = 30;
  q.per_head = true;
  auto got = e->Recall("s", q);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->layer_sets.size(), model.heads());  // 2 layers x 2 heads.
  for (size_t h = 0; h < model.heads(); ++h) {
    const LayerRecallSet& set = got->layer_sets[h];
    EXPECT_EQ(set.layer, h < g.kv_heads ? 2u : 0u);
    EXPECT_EQ(set.kv_head, h % g.kv_heads);
    const auto want = model.MassRecall(q.query, q.window_lse, 0, 30, h, h + 1);
    double got_mass = 0, want_mass = 0;
    for (const auto& b : set.blocks) got_mass += b.mass;
    for (const auto& w : want) want_mass += w.mass;
    EXPECT_NEAR(got_mass, want_mass, tol * want_mass + 1e-12) << "head " << h;
    EXPECT_LE(set.total_tokens, 30u);
    if (GetParam() == "Flat") {
      ASSERT_EQ(set.blocks.size(), want.size()) << "head " << h;
      for (size_t j = 0; j < want.size(); ++j) {
        EXPECT_EQ(set.blocks[j].block.id, want[j].block_id);
      }
    }
  }
  q.per_layer = true;
  EXPECT_EQ(e->Recall("s", q).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// HNSW16 cannot scan every summary: its candidates come from a pool of its
// best by the mean query (here the pool holds every block).
INSTANTIATE_TEST_SUITE_P(Indexes, MassRecallTest,
                         ::testing::Values("Flat", "Progressive", "HNSW16"));

TEST(MassRecallGroupsTest, FillsTheBudgetOutsideTheWindow) {
  // Token groups of unequal sizes: the set never exceeds the budget, never
  // holds window tokens, and stops only when no unrecalled group fits what
  // is left.
  testing::TempDir dir;
  const testing::TestGeometry g;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = MassConfig(g, "Progressive");
  c.groups_per_block = 0;  // The default: about one per 8 tokens.
  c.hot_window_tokens = 48;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  ASSERT_EQ((*e->GetStats("s")).config.groups_per_block, 6u);  // 3 x 16 / 8.
  StreamModel model(g, kFpb, 48, {2, 0});
  std::mt19937_64 rng(23);
  std::uniform_int_distribution<uint32_t> tokens(1, 16);
  for (uint64_t f = 0; f < 90; ++f) {
    ASSERT_TRUE(
        e->Append("s", testing::ToFrame(model.AddFrame(rng, tokens(rng)), f))
            .ok());
  }
  const uint64_t window_start = model.next_pos() - 48;
  for (int i = 0; i < 30; ++i) {
    RecallQuery q;
    q.query = Scaled(testing::RandomQuery(rng, model.summary_dim()), 3.0f);
    q.max_tokens = 5 + 17 * i;
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok()) << r.status();
    uint32_t used = 0;
    std::set<std::pair<uint64_t, uint32_t>> taken;
    for (const RecalledBlock& b : r->blocks) {
      // Whole blocks lie before the window; the block straddling its start
      // brings only its tokens before it.
      if (b.token_offsets.empty()) {
        EXPECT_LE(b.block.end_token_position, window_start);
      }
      used += RecalledTokens(b);
      for (uint32_t t : b.token_offsets) {
        EXPECT_LT(t, b.block.token_count);
        EXPECT_LT(b.block.first_token_position + t, window_start);
        taken.emplace(b.block.id, t);
      }
    }
    EXPECT_EQ(used, r->total_tokens);
    ASSERT_LE(used, q.max_tokens) << "query " << i;
    // What is left is smaller than every token group not taken.
    const auto stats = *e->GetStats("s");
    uint64_t eligible_tokens = 0;
    for (uint64_t id = 0; id < stats.sealed_blocks; ++id) {
      const BlockInfo info = *e->Find("s")->GetBlock(id);
      if (info.first_token_position < window_start) {
        eligible_tokens += std::min<uint64_t>(
            info.token_count, window_start - info.first_token_position);
      }
    }
    if (eligible_tokens >= q.max_tokens + 16) {
      EXPECT_GT(used + 16, q.max_tokens) << "query " << i;
    }
  }
}

TEST(MassRecallValidationTest, QueryVectorsAndWindowSumsAreChecked) {
  testing::TempDir dir;
  const testing::TestGeometry g;
  auto e = testing::OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", MassConfig(g, "Progressive")).ok());
  const size_t dim = 2 * g.kv_heads * g.head_dim;
  std::mt19937_64 rng(24);
  RecallQuery q;
  q.query = testing::RandomQuery(rng, dim + 3);
  auto r = e->Recall("s", q);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("query has 67 floats"));
  q.query.assign(dim * 1025, 0.5f);
  r = e->Recall("s", q);
  EXPECT_THAT(r.status().message(), HasSubstr("n in [1, 1024]"));
  q.query = testing::RandomQuery(rng, 2 * dim);
  q.window_lse.assign(3, 1.0f);
  r = e->Recall("s", q);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("window_lse has 3 floats"));
  EXPECT_THAT(r.status().message(), HasSubstr("expects 8"));
  q.window_lse.assign(8, 1.0f);
  q.window_lse[5] = NAN;
  r = e->Recall("s", q);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("window_lse"));
  q.window_lse[5] = 1.0f;
  r = e->Recall("s", q);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->query_vectors, 2u);
  // Per-head sets need the mass score.
  StreamConfig summed = MassConfig(g, "Progressive");
  summed.weights.score = ScoreMode::kSummed;
  ASSERT_TRUE(e->OpenStream("summed", summed).ok());
  q.per_head = true;
  r = e->Recall("summed", q);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("per_head needs score MASS"));
}

// A recall holds a float per query vector, head and unit: past
// kMaxScoresPerRecall it is refused with the figures, not run. 4 layers x
// 1,024 KV heads of 1 dim: 4,096 heads, so 16 vectors (the most scored: a
// larger query is reduced to 16) score 2^16 per unit and 9 blocks of 64
// token groups (576 units) pass the limit.
TEST(MassRecallValidationTest, ScoresPerRecallAreBounded) {
  testing::TempDir dir;
  const testing::TestGeometry g{4, 1024, 1, DType::kFp16};
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(g, 16, 4);
  c.indexed_layers = {};  // All 4.
  c.weights.score = ScoreMode::kMass;
  c.groups_per_block = 64;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  std::mt19937_64 rng(25);
  for (uint64_t f = 0; f < 37; ++f) {
    ASSERT_TRUE(
        e->Append("s", testing::FrameOf(testing::RandomFrame(rng, g, 16), f,
                                        g.dtype))
            .ok());
  }
  ASSERT_EQ((*e->GetStats("s")).sealed_blocks, 9u);
  const size_t dim = 4 * 1024;
  RecallQuery q;
  for (uint32_t sent : {16u, 100u}) {
    q.query = testing::RandomQuery(rng, sent * dim);
    auto r = e->Recall("s", q);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(r.status().message(),
                HasSubstr("recall would score 16 query vectors x 4096 heads x "
                          "576 units"));
    EXPECT_THAT(r.status().message(), HasSubstr("send fewer query vectors"));
  }
  q.query.resize(14 * dim);  // 14 x 4096 x 576 < 2^25.
  auto r = e->Recall("s", q);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->query_vectors, 14u);
  EXPECT_GT(r->total_tokens, 0u);
}

// Semantic weights far above the model weight (exp(semantic / model)
// leaves float's range), and a window log-sum-exp so large that every
// candidate's estimated mass is 0: the ranking's 0 x inf case
// (MassRankValue, tested on its own in recall_planner_test). The set is
// still filled, anchored on the query's track, with equal gates and no NaN.
TEST(MassRecallSemanticsTest, HugeSemanticWeightsStayOrdered) {
  testing::TempDir dir;
  const testing::TestGeometry g;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = MassConfig(g, "Progressive");
  c.weights.model = 1e-3f;
  c.weights.track = 1e6f;
  c.weights.scene = 1e6f;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel model(g, kFpb, kWindow, {2, 0});
  std::mt19937_64 rng(26);
  for (uint64_t f = 0; f < 60; ++f) {
    FrameSignals s;
    s.detections.push_back(
        {f < 9 ? 7u : 100u + f, 0u, 0.1f, 0.1f, 0.5f, 0.5f, 0.9f});
    s.scene_embedding = {1.0f, float(f % 5), 0.5f};
    ASSERT_TRUE(
        e->Append("s", testing::ToFrame(model.AddFrame(rng, 4), f, s)).ok());
  }
  for (int i = 0; i < 5; ++i) {
    RecallQuery q;
    // Large logits: most units' estimated mass underflows to 0.
    q.query = Scaled(testing::RandomQuery(rng, model.summary_dim()), 40.0f);
    q.max_tokens = 40;
    if (i % 2 == 1) q.window_lse.assign(g.kv_heads * 2, 1e4f);
    q.signals.detections.push_back({7u, 0u, 0.1f, 0.1f, 0.5f, 0.5f, 0.9f});
    q.signals.scene_embedding = {1.0f, float(i), 0.5f};
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->blocks.empty());
    double gates = 0;
    for (const RecalledBlock& b : r->blocks) {
      EXPECT_FALSE(std::isnan(b.priority)) << "block " << b.block.id;
      EXPECT_FALSE(std::isnan(b.mass));
      EXPECT_TRUE(std::isfinite(b.gate_weight));
      gates += b.gate_weight;
    }
    EXPECT_NEAR(gates, 1.0, 1e-5);
    if (!q.window_lse.empty()) {
      EXPECT_EQ(r->recalled_mass, 0.0f);
      EXPECT_FLOAT_EQ(r->blocks[0].gate_weight, 1.0f / r->blocks.size());
    }
    // Track 7 was seen in the first 9 frames (blocks 0-2): anchored first.
    EXPECT_LT(r->blocks[0].block.id, 3u);
  }
}

// The other end of float's range: keys at fp16's largest and a query at
// the largest value a recall takes (+-65,536), whose logits (~3e10) put
// cold tokens e^(1e10) above any window log-sum-exp. exp saturates below
// the point where a block's or a recall's float sums could overflow
// (fast_exp_poly.h's kHigh): every mass stays finite and a share of at most
// 1. (At exp(88) a sum of three tokens was inf: an audit's answer carried
// mass inf, gate weights flattened and shares beyond 1.)
// Blocks whole (one group) and in token groups (the token stage).
TEST(MassRecallSemanticsTest, SaturatedLogitsGiveFiniteShares) {
  for (uint32_t groups : {1u, 4u}) {
    SCOPED_TRACE(groups);
    testing::TempDir dir;
    const testing::TestGeometry g;
    auto e = testing::OpenTestEngine(dir.path());
    StreamConfig c = MassConfig(g, "Progressive");
    c.groups_per_block = groups;
    ASSERT_TRUE(e->OpenStream("s", c).ok());
    std::mt19937_64 rng(31);
    for (uint64_t f = 0; f < 40; ++f) {
      testing::FloatFrame frame = testing::RandomFrame(rng, g, 4);
      for (float& x : frame.values) x = x < 0 ? -65504.0f : 65504.0f;
      ASSERT_TRUE(e->Append("s", testing::FrameOf(frame, f, g.dtype)).ok());
    }
    const size_t dim = e->GetStats("s")->summary_dim;
    for (int i = 0; i < 4; ++i) {
      RecallQuery q;
      for (float x : testing::RandomQuery(rng, dim)) {
        q.query.push_back(x < 0 ? -65536.0f : 65536.0f);
      }
      q.max_tokens = 24;
      if (i % 2 == 1) q.window_lse.assign(g.kv_heads * 2, 0.0f);
      auto r = e->Recall("s", q);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_FALSE(r->blocks.empty());
      double gates = 0;
      for (const RecalledBlock& b : r->blocks) {
        EXPECT_TRUE(std::isfinite(b.mass)) << "block " << b.block.id;
        EXPECT_GE(b.mass, 0.0f);
        EXPECT_LE(b.mass, 1.0f + 1e-4f);
        EXPECT_TRUE(std::isfinite(b.priority));
        EXPECT_TRUE(std::isfinite(b.gate_weight));
        gates += b.gate_weight;
      }
      EXPECT_NEAR(gates, 1.0, 1e-4);
      EXPECT_TRUE(std::isfinite(r->recalled_mass)) << "query " << i;
      EXPECT_LE(r->recalled_mass, 1.0f + 1e-4f) << "query " << i;
      if (groups > 1) EXPECT_GT(r->tokens_scored, 0u);
    }
  }
}

// A scene term can lift any block, not only the query's tracks: the one
// block whose scene matches the query's is found even where its attention
// mass alone would not let it survive the bounds (with a budget of one
// block, the scan keeps only the few best by mass).
TEST(MassRecallSemanticsTest, SceneMatchOutsideTheMassTopIsRecalled) {
  testing::TempDir dir;
  const testing::TestGeometry g;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = MassConfig(g, "Progressive");
  c.weights.scene = 30;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel model(g, kFpb, kWindow, {2, 0});
  std::mt19937_64 rng(27);
  for (uint64_t f = 0; f < 60; ++f) {
    FrameSignals s;
    s.scene_embedding =
        f / kFpb == 2 ? std::vector<float>{0, 1} : std::vector<float>{1, 0};
    ASSERT_TRUE(
        e->Append("s", testing::ToFrame(model.AddFrame(rng, 4), f, s)).ok());
  }
  int top_by_mass = 0;
  for (int i = 0; i < 10; ++i) {
    RecallQuery q;
    q.query = Scaled(testing::RandomQuery(rng, model.summary_dim()), 3.0f);
    q.max_tokens = kFpb * 4;  // One block.
    auto plain = e->Recall("s", q);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_EQ(plain->blocks.size(), 1u);
    top_by_mass += plain->blocks[0].block.id == 2;
    q.signals.scene_embedding = {0, 1};
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->blocks.size(), 1u) << "query " << i;
    EXPECT_EQ(r->blocks[0].block.id, 2u) << "query " << i;
    EXPECT_FLOAT_EQ(r->blocks[0].semantic_score, 30.0f);
  }
  EXPECT_LE(top_by_mass, 2);  // Mass alone rarely picks block 2.
}

// With a scene weight, a MASS recall scores every eligible block's scene up
// front. Once a storage cap has evicted the oldest blocks and their run has
// left RAM (BlockTable::first() > 0), that pass must start at the first
// kept block: block ids below it have no entry to read.
TEST(MassRecallSemanticsTest, SceneScoringSkipsTheDroppedEvictedRun) {
  testing::TempDir dir;
  const testing::TestGeometry g;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = MassConfig(g, "Progressive");
  c.weights.scene = 30;
  const Geometry geo = WithDefaults(c).geometry;
  c.tiers.warm_budget_bytes = 1;
  c.tiers.storage_cap_bytes = FramePayloadBytes(geo, 8 * kFpb * 4);
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  StreamModel model(g, kFpb, kWindow, {2, 0});
  std::mt19937_64 rng(29);
  for (uint64_t f = 0; f < 200; ++f) {
    FrameSignals s;
    s.scene_embedding = {1, float(f % 3)};
    ASSERT_TRUE(
        e->Append("s", testing::ToFrame(model.AddFrame(rng, 4), f, s)).ok());
  }
  e->WaitForBackground();
  const StreamStats st = *e->GetStats("s");
  ASSERT_GT(st.evicted.blocks, 20u);  // The oldest run is gone from RAM.
  RecallQuery q;
  q.query = testing::RandomQuery(rng, model.summary_dim());
  q.signals.scene_embedding = {1, 2};
  q.max_tokens = kFpb * 4 * 3;
  auto r = e->Recall("s", q);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->blocks.empty());
  for (const RecalledBlock& b : r->blocks) {
    EXPECT_GE(b.block.id, st.evicted.blocks) << "an evicted block recalled";
  }
}

}  // namespace
}  // namespace kvmem

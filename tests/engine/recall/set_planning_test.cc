// Mass targets and sets sized by need (engine/recall/set_planning.h): a set
// stops at the smallest rank prefix reaching its target, never past its
// budget; several sets share one total, taken best first across them; and
// through the engine the budget and the total are never exceeded.
#include "engine/recall/set_planning.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

PlanPolicy Mass(uint32_t max_tokens) {
  PlanPolicy p;
  p.mode = ScoreMode::kMass;
  p.max_tokens = max_tokens;
  return p;
}

// A set of `n` single tokens of block `block`, densities d0 * decay^i, its
// cold mass their sum plus `rest` (mass the set could not score).
ScoredSet Geometric(uint64_t block, uint32_t n, float d0, float decay,
                    double rest = 0) {
  ScoredSet s;
  float d = d0;
  for (uint32_t i = 0; i < n; ++i, d *= decay) {
    s.ranked.push_back({block, 0, 1, d, 0, i});
    s.cold_mass += d;
  }
  s.cold_mass += rest;
  return s;
}

double MassOf(const RecallPlan& p) {
  double m = 0;
  for (const PlannedBlock& b : p.blocks) m += b.mass;
  return m;
}

TEST(SetPlanningTest, ATargetStopsAtTheSmallestPrefixThatReachesIt) {
  for (float target : {0.1f, 0.5f, 0.8f, 0.95f}) {
    std::vector<ScoredSet> sets = {Geometric(1, 100, 0.05f, 0.95f)};
    const double goal = target * sets[0].cold_mass;
    const auto plans = PlanSets(Mass(60), &sets, target);
    const RecallPlan& p = plans[0];
    ASSERT_LE(p.total_tokens, 60u);
    const double mass = MassOf(p);
    if (p.total_tokens < 60) {
      EXPECT_GE(mass, goal * (1 - 1e-6)) << target;
      // Without its last (smallest) token it would fall short.
      const double last = sets[0].ranked[p.total_tokens - 1].score;
      EXPECT_LT(mass - last, goal) << target;
    } else {
      EXPECT_LT(mass, goal) << target;  // The budget capped it.
    }
  }
  // No target: the whole budget.
  std::vector<ScoredSet> sets = {Geometric(1, 100, 0.05f, 0.95f)};
  EXPECT_EQ(PlanSets(Mass(60), &sets, 0)[0].total_tokens, 60u);
}

TEST(SetPlanningTest, SetsShareOneTotalSizedByNeed) {
  // A peaked head (most mass in few tokens), a spread one, a middling one.
  std::vector<ScoredSet> sets = {Geometric(1, 200, 0.2f, 0.7f),
                                 Geometric(2, 200, 0.01f, 0.995f),
                                 Geometric(3, 200, 0.05f, 0.95f)};
  const uint32_t budget = 40, total = budget * 3;
  const float target = 0.9f;
  std::vector<double> goal;
  for (const ScoredSet& s : sets) goal.push_back(target * s.cold_mass);
  const auto plans = PlanSets(Mass(budget), &sets, target);
  uint32_t used = 0;
  for (const RecallPlan& p : plans) used += p.total_tokens;
  EXPECT_LE(used, total);
  // The peaked set reaches its target with far fewer tokens than the
  // budget; the spread one gets more than the budget.
  EXPECT_LT(plans[0].total_tokens, budget / 2);
  EXPECT_GE(MassOf(plans[0]), goal[0] * (1 - 1e-6));
  EXPECT_GT(plans[1].total_tokens, budget);
  // The total is spent (the spread set could take it all), and what was
  // taken is the best across the sets still short of their target: no
  // token left out of a short set beats the worst token taken of any set.
  EXPECT_EQ(used, total);
  float worst_taken = 1, best_left = 0;
  for (size_t s = 0; s < 3; ++s) {
    const uint32_t n = plans[s].total_tokens;
    if (n > 0) worst_taken = std::min(worst_taken, sets[s].ranked[n - 1].score);
    if (MassOf(plans[s]) < goal[s] && n < sets[s].ranked.size()) {
      best_left = std::max(best_left, sets[s].ranked[n].score);
    }
  }
  EXPECT_LE(best_left, worst_taken);
}

TEST(SetPlanningTest, TheIdentityShareComesBeforeTheTarget) {
  std::vector<ScoredSet> sets = {Geometric(1, 100, 0.05f, 0.95f)};
  // Tokens of another block, each of little mass.
  for (uint32_t i = 0; i < 10; ++i) {
    PlanUnit u{9, 0, 1, 1e-6f, 0, i};
    u.channel = RecallChannel::kQuery;
    sets[0].query_units.push_back(u);
  }
  sets[0].identity_budget = 10;
  const auto plans = PlanSets(Mass(60), &sets, 0.5f);
  EXPECT_EQ(plans[0].channels.query, 10u);
  EXPECT_GT(plans[0].channels.attention, 0u);
  EXPECT_GE(MassOf(plans[0]), 0.5 * sets[0].cold_mass * (1 - 1e-6));
}

// Through the engine, per head and for one set: budgets and totals hold,
// a higher target never takes fewer tokens, the share is reported.
TEST(SetPlanningEngineTest, TargetsHoldThroughTheEngine) {
  testing::TempDir dir;
  const testing::TestGeometry g;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(g, 64, 2);
  c.weights.score = ScoreMode::kMass;
  c.weights.scorer = "mass";
  c.groups_per_block = 0;
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  std::mt19937_64 rng(41);
  for (uint64_t f = 0; f < 60; ++f) {
    ASSERT_TRUE(e->Append("s", testing::FrameOf(testing::RandomFrame(rng, g, 8),
                                                f, g.dtype))
                    .ok());
  }
  RecallQuery q;
  q.query = testing::RandomQuery(rng, 2 * 2 * 16);
  q.max_tokens = 40;
  uint32_t last = 0;
  for (float target : {0.0f, 0.2f, 0.5f, 0.9f, 1.0f}) {
    q.mass_target = target;
    auto r = e->Recall("s", q);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(r->total_tokens, 40u);
    EXPECT_GE(r->cold_share, 0.0f);
    EXPECT_LE(r->cold_share, 1.0f);
    if (target > 0 && r->total_tokens < 40) {
      EXPECT_GE(r->cold_share, target * (1 - 1e-4)) << target;
    }
    if (target > 0) {
      EXPECT_GE(r->total_tokens, last) << target;
    }
    last = target > 0 ? r->total_tokens : 0;
  }
  q.per_head = true;
  q.mass_target = 0.6f;
  auto r = e->Recall("s", q);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->layer_sets.size(), 4u);
  uint32_t used = 0;
  for (const LayerRecallSet& s : r->layer_sets) {
    used += s.total_tokens;
    EXPECT_LE(s.total_tokens, 4u * 40u);
    uint32_t counted = 0;
    for (const RecalledBlock& b : s.blocks) counted += RecalledTokens(b);
    EXPECT_EQ(counted, s.total_tokens);
  }
  EXPECT_LE(used, 4u * 40u);
  // Refused: outside [0, 1], and with score SUMMED.
  q.per_head = false;
  q.mass_target = 1.5f;
  EXPECT_EQ(e->Recall("s", q).status().code(),
            absl::StatusCode::kInvalidArgument);
  StreamConfig summed = testing::TestConfig(g, 64, 2);
  ASSERT_TRUE(e->OpenStream("summed", summed).ok());
  q.mass_target = 0.5f;
  auto s = e->Recall("summed", q);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("budget.mass_target needs score MASS"),
            absl::string_view::npos)
      << s.status();
}

}  // namespace
}  // namespace kvmem

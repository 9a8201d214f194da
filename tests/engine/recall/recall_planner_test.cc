#include "engine/recall/recall_planner.h"

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <tuple>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

PlanUnit Unit(uint64_t block, uint32_t tokens, float score, uint32_t group = 0,
              float semantic = 0) {
  return {block, group, tokens, score, semantic};
}

PlanPolicy Summed(uint32_t max_tokens, uint32_t top_k = 0) {
  PlanPolicy p;
  p.mode = ScoreMode::kSummed;
  p.max_tokens = max_tokens;
  p.top_k = top_k;
  return p;
}

std::vector<uint64_t> Ids(const RecallPlan& plan) {
  std::vector<uint64_t> ids;
  for (const PlannedBlock& b : plan.blocks) ids.push_back(b.block);
  return ids;
}

std::vector<uint32_t> Tokens(const PlanTokens& t) {
  return std::vector<uint32_t>(t.begin(), t.end());
}

PlannedBlock Planned(float priority, float mass = 0) {
  PlannedBlock b;
  b.priority = priority;
  b.mass = mass;
  return b;
}

TEST(RecallPlannerTest, FillsBudgetInScoreOrderSkippingWhatDoesNotFit) {
  // Given in no particular order: the planner ranks them.
  const std::vector<PlanUnit> units = {Unit(5, 30, 7.0f), Unit(7, 60, 9.0f),
                                       Unit(1, 10, 6.0f), Unit(3, 50, 8.0f)};
  const RecallPlan plan = RecallPlanner::PlanBlocks(Summed(100), units);
  // 60 fits, 50 would make 110 and is skipped, 30 fits (90), 10 fits (100).
  EXPECT_EQ(Ids(plan), (std::vector<uint64_t>{7, 5, 1}));
  EXPECT_EQ(plan.total_tokens, 100u);
  EXPECT_FLOAT_EQ(plan.blocks[0].priority, 9.0f);  // model_scale 1.
}

TEST(RecallPlannerTest, NeverExceedsBudgetNorTopK) {
  std::vector<PlanUnit> units;
  for (int i = 0; i < 200; ++i) {
    units.push_back(Unit(i, 1 + (i * 37) % 97, 100.0f - i, i % 3));
  }
  for (uint32_t budget : {0u, 1u, 17u, 96u, 500u, 100000u}) {
    for (uint32_t top_k : {0u, 1u, 5u}) {
      for (const RecallPlan& plan :
           {RecallPlanner::PlanBlocks(Summed(budget, top_k), units),
            RecallPlanner::Plan(Summed(budget, top_k), units)}) {
        uint64_t total = 0;
        for (const PlannedBlock& b : plan.blocks) total += b.tokens;
        EXPECT_LE(total, budget);
        EXPECT_EQ(total, plan.total_tokens);
        if (top_k > 0) {
          EXPECT_LE(plan.blocks.size(), top_k);
        }
      }
    }
  }
}

// Admits says what Take would still take: any block until top_k blocks
// are taken, then only those; always with top_k 0. The fill drops what it
// does not admit before ranking it (set_planning.cc).
TEST(RecallPlannerTest, AdmitsWhatTakeStillTakes) {
  RecallPlanner capped(Summed(100, 2));
  EXPECT_TRUE(capped.Admits(9));
  capped.Take({Unit(1, 10, 5.0f), Unit(2, 10, 4.0f)});
  EXPECT_TRUE(capped.Admits(1));
  EXPECT_TRUE(capped.Admits(2));
  EXPECT_FALSE(capped.Admits(3));
  // Take agrees: block 3's unit is passed over, block 1's taken.
  capped.Take({Unit(3, 10, 9.0f), Unit(1, 10, 1.0f, 1)});
  const RecallPlan plan = capped.Finish();
  EXPECT_EQ(plan.total_tokens, 30u);
  EXPECT_EQ(plan.blocks.size(), 2u);
  RecallPlanner open(Summed(100, 0));
  open.Take({Unit(1, 10, 5.0f), Unit(2, 10, 4.0f), Unit(4, 10, 3.0f)});
  EXPECT_TRUE(open.Admits(77));
}

TEST(RecallPlannerTest, SummedBlocksCapBeforeTheFillGroupsCapDistinctBlocks) {
  // Ranked 9, 8, 7: block 8 is too large for the budget.
  const std::vector<PlanUnit> units = {Unit(1, 6, 9.0f), Unit(2, 20, 8.0f),
                                       Unit(3, 4, 7.0f)};
  // Whole blocks (SUMMED): the top_k = 2 best are 1 and 2, then the fill
  // takes 1 only (2 does not fit, 3 was cut by top_k).
  EXPECT_EQ(Ids(RecallPlanner::PlanBlocks(Summed(10, 2), units)),
            (std::vector<uint64_t>{1}));
  // The general fill caps distinct blocks taken instead: 1, then 3.
  EXPECT_EQ(Ids(RecallPlanner::Plan(Summed(10, 2), units)),
            (std::vector<uint64_t>{1, 3}));
}

TEST(RecallPlannerTest, GroupsOfOneBlockMergeAndTheBestUnitScoresIt) {
  PlanPolicy p = Summed(100);
  p.model_scale = 0.5f;
  // Block 4's groups 2 and 0, block 9's group 1; semantic bonus on block 9.
  const std::vector<PlanUnit> units = {
      Unit(4, 3, 10.0f, 2), Unit(9, 5, 2.0f, 1, 4.0f), Unit(4, 7, 1.0f, 0)};
  const RecallPlan plan = RecallPlanner::Plan(p, units);
  // Priorities: 5, 5 (= 0.5 * 2 + 4), 0.5; the tie goes to the newer block.
  ASSERT_EQ(Ids(plan), (std::vector<uint64_t>{9, 4}));
  EXPECT_EQ(plan.blocks[0].group_mask, 0b10u);
  EXPECT_EQ(plan.blocks[1].group_mask, 0b101u);
  EXPECT_EQ(plan.blocks[1].first_group, 2u);
  EXPECT_FLOAT_EQ(plan.blocks[1].score, 10.0f);
  EXPECT_FLOAT_EQ(plan.blocks[1].priority, 5.0f);
  EXPECT_EQ(plan.blocks[1].tokens, 10u);
  EXPECT_FLOAT_EQ(plan.blocks[0].semantic, 4.0f);
  EXPECT_NEAR(plan.blocks[0].gate_weight + plan.blocks[1].gate_weight, 1.0,
              1e-6);
}

TEST(RecallPlannerTest, MassPlansByDensityAndSumsMassPerBlock) {
  PlanPolicy p;
  p.mode = ScoreMode::kMass;
  p.max_tokens = 10;
  p.model_weight = 1.0f;
  RecallPlanner planner(p);
  // Densities (mass per token): block 2 group 1 is densest.
  std::vector<PlanUnit> units = {Unit(1, 4, 0.01f, 0), Unit(2, 4, 0.2f, 1),
                                 Unit(2, 4, 0.05f, 0), Unit(3, 1, 0.0f, 0)};
  planner.Rank(&units);
  EXPECT_EQ(units[0].block, 2u);
  EXPECT_EQ(units[0].group, 1u);
  planner.Take(units);  // 4 + 4 of block 2, then block 3's 1 token fits (9)
                        // before block 1's 4 would not.
  EXPECT_EQ(planner.tokens_left(), 1u);
  EXPECT_FALSE(planner.full());
  // A second pass continues the fill.
  planner.Take({Unit(7, 1, 0.001f)});
  EXPECT_TRUE(planner.full());
  const RecallPlan plan = planner.Finish();
  ASSERT_EQ(Ids(plan), (std::vector<uint64_t>{2, 3, 7}));
  EXPECT_FLOAT_EQ(plan.blocks[0].mass, 0.2f * 4 + 0.05f * 4);
  EXPECT_FLOAT_EQ(plan.blocks[0].priority, std::log(0.2f));
  // Density 0 has no mass and a finite priority.
  EXPECT_EQ(plan.blocks[1].mass, 0.0f);
  EXPECT_TRUE(std::isfinite(plan.blocks[1].priority));
  EXPECT_EQ(plan.blocks[1].gate_weight, 0.0f);
  EXPECT_EQ(plan.total_tokens, 10u);
}

TEST(RecallPlannerTest, UnitsOfNoTokensAreNeverTaken) {
  const RecallPlan plan =
      RecallPlanner::Plan(Summed(10), {Unit(1, 0, 9.0f), Unit(2, 3, 1.0f)});
  EXPECT_EQ(Ids(plan), (std::vector<uint64_t>{2}));
}

TEST(RecallPlannerTest, TokenOffsetsOfChosenGroups) {
  const std::vector<uint8_t> token_group = {0, 1, 1, 2, 0};
  EXPECT_EQ(TokenOffsets(token_group, 0b010, {}, 5),
            (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(TokenOffsets(token_group, 0b101, {}, 5),
            (std::vector<uint32_t>{0, 3, 4}));
  EXPECT_TRUE(TokenOffsets(token_group, 0b111, {}, 5).empty());  // Whole.
  // Single tokens join the groups' tokens, ascending.
  EXPECT_EQ(TokenOffsets(token_group, 0b100, {4, 1}, 5),
            (std::vector<uint32_t>{1, 3, 4}));
  EXPECT_TRUE(TokenOffsets(token_group, 0b011, {3}, 5).empty());
}

PlanUnit Token(uint64_t block, uint32_t group, uint32_t token, float density) {
  PlanUnit u{block, group, 1, density, 0};
  u.token = token;
  return u;
}

PlanPolicy Mass(uint32_t max_tokens) {
  PlanPolicy p;
  p.mode = ScoreMode::kMass;
  p.max_tokens = max_tokens;
  return p;
}

TEST(RecallPlannerTest, TokenUnitsFillTheBudgetOneTokenEach) {
  RecallPlanner planner(Mass(3));
  std::vector<PlanUnit> units = {Token(4, 0, 7, 0.1f), Token(2, 1, 3, 0.4f),
                                 Token(4, 1, 2, 0.3f), Token(2, 0, 0, 0.2f)};
  planner.Rank(&units);
  planner.Take(units);
  const RecallPlan plan = planner.Finish();
  EXPECT_EQ(plan.total_tokens, 3u);
  ASSERT_EQ(Ids(plan), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(plan.blocks[0].single_tokens, (PlanTokens{3, 0}));
  EXPECT_EQ(plan.blocks[1].single_tokens, (PlanTokens{2}));
  EXPECT_EQ(plan.blocks[0].group_mask, 0u);
  EXPECT_FLOAT_EQ(plan.blocks[0].mass, 0.6f);
}

TEST(RecallPlannerTest, AWholeGroupAbsorbsItsTokensAndIsChargedOnce) {
  RecallPlanner planner(Mass(6));
  // Tokens 1 and 2 of group 3 first, then group 3 whole (4 tokens): it adds
  // 2, and a later token of the group is not taken again.
  planner.Take({Token(9, 3, 1, 0.5f), Token(9, 0, 8, 0.5f),
                Token(9, 3, 2, 0.5f), Unit(9, 4, 0.25f, 3), Token(9, 3, 5, 1.f),
                Token(9, 1, 6, 0.1f)});
  const RecallPlan plan = planner.Finish();
  ASSERT_EQ(plan.blocks.size(), 1u);
  const PlannedBlock& b = plan.blocks[0];
  EXPECT_EQ(plan.total_tokens, 6u);
  EXPECT_EQ(b.tokens, 6u);
  EXPECT_EQ(b.group_mask, uint64_t{1} << 3);
  EXPECT_EQ(b.single_tokens, (PlanTokens{8, 6}));
  EXPECT_EQ(b.single_groups, (PlanTokens{0, 1}));
}

TEST(RecallPlannerTest, GateWeightsAreTemperedSoftmax) {
  std::vector<PlannedBlock> blocks = {Planned(2.0f), Planned(0.0f)};
  AssignGateWeights(&blocks, 2.0f, ScoreMode::kSummed);
  const double e = std::exp(1.0);  // exp(2/2) vs exp(0/2)
  EXPECT_NEAR(blocks[0].gate_weight, e / (e + 1), 1e-6);
  EXPECT_NEAR(blocks[1].gate_weight, 1 / (e + 1), 1e-6);
  // Large scores do not overflow.
  std::vector<PlannedBlock> big = {Planned(1e6f), Planned(1e6f - 1)};
  AssignGateWeights(&big, 1.0f, ScoreMode::kSummed);
  EXPECT_NEAR(big[0].gate_weight + big[1].gate_weight, 1.0, 1e-6);
  EXPECT_GT(big[0].gate_weight, big[1].gate_weight);
}

TEST(RecallPlannerTest, MassGatesAreSharesOfTheSetsMass) {
  // gate_b = mass_b^(1/T) / sum over the set of mass^(1/T).
  std::vector<PlannedBlock> blocks = {Planned(0, 0.3f), Planned(0, 0.1f),
                                      Planned(0, 0.0f)};  // Underflowed.
  AssignGateWeights(&blocks, 1.0f, ScoreMode::kMass);
  EXPECT_NEAR(blocks[0].gate_weight, 0.75, 1e-6);
  EXPECT_NEAR(blocks[1].gate_weight, 0.25, 1e-6);
  EXPECT_EQ(blocks[2].gate_weight, 0.0f);
  AssignGateWeights(&blocks, 2.0f, ScoreMode::kMass);  // Flatter.
  const double a = std::sqrt(0.3), b = std::sqrt(0.1);
  EXPECT_NEAR(blocks[0].gate_weight, a / (a + b), 1e-6);
  EXPECT_NEAR(blocks[0].gate_weight + blocks[1].gate_weight, 1.0, 1e-6);
  // No mass anywhere: equal weights, still summing to 1.
  for (auto& x : blocks) x.mass = 0;
  AssignGateWeights(&blocks, 1.0f, ScoreMode::kMass);
  for (const auto& x : blocks) EXPECT_NEAR(x.gate_weight, 1.0 / 3, 1e-6);
}

// MASS ranks by density * exp(semantic / model_weight): the order of
// model_weight * ln(density) + semantic while it is in float's range, never
// NaN (a NaN key breaks std::sort's ordering), 0 for density 0.
TEST(RecallPlannerTest, MassRankValueOrdersLikePriorityAndNeverNaN) {
  const float kMax = std::numeric_limits<float>::max();
  // In range: the same order as the priority.
  const float d[] = {1e-6f, 1e-3f, 0.02f, 0.5f};
  const float sem[] = {0.0f, 0.3f, 2.0f, 7.5f};
  const float model[] = {0.25f, 1.0f, 3.0f};
  for (float m : model) {
    for (float d1 : d) {
      for (float s1 : sem) {
        for (float d2 : d) {
          for (float s2 : sem) {
            const double p1 = m * std::log(d1) + s1, p2 = m * std::log(d2) + s2;
            if (std::abs(p1 - p2) < 1e-4) continue;
            EXPECT_EQ(MassRankValue(d1, s1, m) > MassRankValue(d2, s2, m),
                      p1 > p2)
                << d1 << " " << s1 << " vs " << d2 << " " << s2 << " m " << m;
          }
        }
      }
    }
  }
  // exp(1e9) overflows: saturates, finite, above every value in range.
  EXPECT_EQ(MassRankValue(1e-3f, 1e6f, 1e-3f), kMax);
  EXPECT_GT(MassRankValue(1e-3f, 1e6f, 1e-3f), MassRankValue(0.9f, 50, 1));
  // Density 0 stays 0 (ln 0 = -inf), not 0 x inf = NaN.
  EXPECT_EQ(MassRankValue(0.0f, 1e6f, 1e-3f), 0.0f);
  EXPECT_EQ(MassRankValue(0.0f, 3.0f, 1.0f), 0.0f);
  // Not recallable (-1) stays below every recallable unit.
  EXPECT_EQ(MassRankValue(-1.0f, 1e6f, 1e-3f), -1.0f);
  EXPECT_EQ(MassRankValue(0.25f, 0.0f, 1.0f), 0.25f);
}

// RankAndTake ranks a chunk at a time; its plans are Rank then Take's, for
// mixes of whole groups and single tokens (the fill's further units), with
// ties on value, budgets that end the fill early or late, top_k and mass
// goals.
TEST(RecallPlannerTest, RankAndTakeEqualsRankThenTake) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<PlanUnit> units;
    std::set<std::tuple<uint64_t, uint32_t, uint32_t>> seen;
    const int n = 1 + static_cast<int>(rng() % 3000);
    for (int i = 0; i < n; ++i) {
      PlanUnit u;
      u.block = rng() % 200;
      u.group = static_cast<uint32_t>(rng() % 8);
      u.score = static_cast<float>(rng() % 50) / 7.0f;  // Many ties.
      const bool whole = rng() % 4 == 0;
      u.tokens = whole ? 1 + static_cast<uint32_t>(rng() % 16) : 1;
      if (!whole) u.token = static_cast<uint32_t>(rng() % 128);
      u.semantic = rng() % 5 == 0 ? 0.5f : 0.0f;
      // Distinct units, as a recall offers them (one per group or token):
      // equal keys would leave their order to the sort.
      if (seen.insert({u.block, u.group, u.token}).second) units.push_back(u);
    }
    PlanPolicy p;
    p.mode = ScoreMode::kMass;
    p.max_tokens = static_cast<uint32_t>(rng() % 1200);
    p.top_k = static_cast<uint32_t>(rng() % 3 == 0 ? 0 : 1 + rng() % 40);
    if (rng() % 4 == 0) p.mass_goal = double(rng() % 400) / 10.0;
    RecallPlanner full(p), chunked(p);
    std::vector<PlanUnit> ranked = units;
    full.Rank(&ranked);
    full.Take(ranked);
    chunked.RankAndTake(units);
    const RecallPlan a = full.Finish(), b = chunked.Finish();
    ASSERT_EQ(a.total_tokens, b.total_tokens) << "round " << round;
    ASSERT_EQ(Ids(a), Ids(b)) << "round " << round;
    for (size_t i = 0; i < a.blocks.size(); ++i) {
      EXPECT_EQ(a.blocks[i].tokens, b.blocks[i].tokens);
      EXPECT_EQ(a.blocks[i].group_mask, b.blocks[i].group_mask);
      EXPECT_DOUBLE_EQ(a.blocks[i].mass, b.blocks[i].mass);
      EXPECT_EQ(Tokens(a.blocks[i].single_tokens),
                Tokens(b.blocks[i].single_tokens));
    }
  }
}

}  // namespace
}  // namespace kvmem

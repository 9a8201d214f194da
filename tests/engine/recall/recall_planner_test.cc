#include "engine/recall/recall_planner.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

RecalledBlock Block(uint64_t id, uint32_t tokens, float score) {
  RecalledBlock b;
  b.block.id = id;
  b.block.token_count = tokens;
  b.score = score;
  b.priority = score;
  return b;
}

TEST(RecallPlannerTest, FillsBudgetInScoreOrderSkippingWhatDoesNotFit) {
  const std::vector<RecalledBlock> ranked = {
      Block(7, 60, 9.0f), Block(3, 50, 8.0f), Block(5, 30, 7.0f),
      Block(1, 10, 6.0f)};
  const auto chosen = PlanBudgetedRecall(ranked, 100, 1.0f);
  // 60 fits, 50 would make 110 and is skipped, 30 fits (90), 10 fits (100).
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(chosen[0].block.id, 7u);
  EXPECT_EQ(chosen[1].block.id, 5u);
  EXPECT_EQ(chosen[2].block.id, 1u);
}

TEST(RecallPlannerTest, NeverExceedsBudget) {
  std::vector<RecalledBlock> ranked;
  for (int i = 0; i < 200; ++i) {
    ranked.push_back(Block(i, 1 + (i * 37) % 97, 100.0f - i));
  }
  for (uint32_t budget : {0u, 1u, 17u, 96u, 500u, 100000u}) {
    uint64_t total = 0;
    for (const auto& b : PlanBudgetedRecall(ranked, budget, 1.0f)) {
      total += b.block.token_count;
    }
    EXPECT_LE(total, budget);
  }
}

TEST(RecallPlannerTest, GateWeightsAreTemperedSoftmax) {
  std::vector<RecalledBlock> blocks = {Block(0, 1, 2.0f), Block(1, 1, 0.0f)};
  AssignGateWeights(&blocks, 2.0f, ScoreMode::kSummed);
  const double e = std::exp(1.0);  // exp(2/2) vs exp(0/2)
  EXPECT_NEAR(blocks[0].gate_weight, e / (e + 1), 1e-6);
  EXPECT_NEAR(blocks[1].gate_weight, 1 / (e + 1), 1e-6);
  // Large scores do not overflow.
  std::vector<RecalledBlock> big = {Block(0, 1, 1e6f), Block(1, 1, 1e6f - 1)};
  AssignGateWeights(&big, 1.0f, ScoreMode::kSummed);
  EXPECT_NEAR(big[0].gate_weight + big[1].gate_weight, 1.0, 1e-6);
  EXPECT_GT(big[0].gate_weight, big[1].gate_weight);
}

TEST(RecallPlannerTest, MassGatesAreSharesOfTheSetsMass) {
  // gate_b = mass_b^(1/T) / sum over the set of mass^(1/T).
  std::vector<RecalledBlock> blocks = {Block(0, 1, 0), Block(1, 1, 0),
                                       Block(2, 1, 0)};
  blocks[0].mass = 0.3f;
  blocks[1].mass = 0.1f;
  blocks[2].mass = 0.0f;  // Underflowed: no share.
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

TEST(RecallPlannerTest, FillBudgetSkipsWhatDoesNotFitAndCapsBlocks) {
  // Units of blocks 1, 1, 2, 3, 4 with 5, 4, 3, 2, 1 tokens.
  const std::vector<FillUnit> ranked = {{1, 5}, {1, 4}, {2, 3}, {3, 2}, {4, 1}};
  FillState all;
  std::vector<size_t> taken;
  EXPECT_EQ(FillBudget(ranked, 11, 0, &all, &taken), 11u);
  // 5 + 4 = 9; 3 would make 12 (skipped); 2 fits (11); then full.
  EXPECT_EQ(taken, (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(all.blocks, (std::vector<uint64_t>{1, 3}));
  FillState capped;
  taken.clear();
  // At most 2 blocks: block 1's units and block 2's; 3 and 4 are new blocks.
  EXPECT_EQ(FillBudget(ranked, 100, 2, &capped, &taken), 12u);
  EXPECT_EQ(taken, (std::vector<size_t>{0, 1, 2}));
  // A fill continues over further units with its state.
  const std::vector<FillUnit> more = {{2, 1}, {5, 1}};
  taken.clear();
  EXPECT_EQ(FillBudget(more, 100, 2, &capped, &taken), 13u);
  EXPECT_EQ(taken, (std::vector<size_t>{0}));
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

}  // namespace
}  // namespace kvmem

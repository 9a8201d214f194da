#include "engine/recall_planner.h"

#include <cmath>

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

}  // namespace
}  // namespace kvmem

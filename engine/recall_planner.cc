#include "engine/recall_planner.h"

#include <algorithm>
#include <cmath>

namespace kvmem {

std::vector<RecalledBlock> PlanBudgetedRecall(
    const std::vector<RecalledBlock>& ranked, uint32_t max_tokens,
    float gate_scale) {
  std::vector<RecalledBlock> chosen;
  uint64_t used = 0;
  for (const RecalledBlock& b : ranked) {
    const uint32_t tokens = RecalledTokens(b);
    if (used + tokens > max_tokens) continue;
    used += tokens;
    chosen.push_back(b);
    if (used == max_tokens) break;
  }
  AssignGateWeights(&chosen, gate_scale);
  return chosen;
}

void AssignGateWeights(std::vector<RecalledBlock>* blocks, float gate_scale) {
  if (blocks->empty()) return;
  double top = -INFINITY;
  for (const auto& b : *blocks)
    top = std::max<double>(top, b.priority / gate_scale);
  double sum = 0;
  for (auto& b : *blocks) {
    const double e = std::exp(b.priority / gate_scale - top);
    b.gate_weight = static_cast<float>(e);
    sum += e;
  }
  for (auto& b : *blocks)
    b.gate_weight = static_cast<float>(b.gate_weight / sum);
}

}  // namespace kvmem

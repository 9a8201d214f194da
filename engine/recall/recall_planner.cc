#include "engine/recall/recall_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

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
  AssignGateWeights(&chosen, gate_scale, ScoreMode::kSummed);
  return chosen;
}

float MassRankValue(float density, float semantic, float model_weight) {
  if (semantic == 0 || !(density > 0)) return density;
  const double v =
      double(density) * std::exp(double(semantic) / double(model_weight));
  return static_cast<float>(
      std::min(v, double(std::numeric_limits<float>::max())));
}

uint64_t FillBudget(const std::vector<FillUnit>& ranked, uint32_t max_tokens,
                    uint32_t top_k, FillState* state,
                    std::vector<size_t>* taken) {
  for (size_t i = 0; i < ranked.size() && state->used < max_tokens; ++i) {
    const FillUnit& u = ranked[i];
    if (u.tokens == 0 || state->used + u.tokens > max_tokens) continue;
    if (state->known.count(u.block) == 0) {
      if (top_k > 0 && state->blocks.size() >= top_k) continue;
      state->blocks.push_back(u.block);
      state->known.insert(u.block);
    }
    state->used += u.tokens;
    taken->push_back(i);
  }
  return state->used;
}

void AssignGateWeights(std::vector<RecalledBlock>* blocks, float temperature,
                       ScoreMode mode) {
  if (blocks->empty()) return;
  std::vector<double> x;
  x.reserve(blocks->size());
  for (const auto& b : *blocks) {
    const double v = mode == ScoreMode::kMass
                         ? (b.mass > 0 ? std::log(double(b.mass)) : -INFINITY)
                         : double(b.priority);
    x.push_back(v / temperature);
  }
  const double top = *std::max_element(x.begin(), x.end());
  if (!std::isfinite(top)) {  // Every block has zero mass.
    for (auto& b : *blocks) b.gate_weight = 1.0f / blocks->size();
    return;
  }
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - top));
  for (size_t i = 0; i < blocks->size(); ++i) {
    (*blocks)[i].gate_weight = static_cast<float>(x[i] / sum);
  }
}

}  // namespace kvmem

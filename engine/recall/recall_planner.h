// Budgeted recall planning: from ranked candidates (blocks, or token groups
// of blocks, all outside the hot window) choose what fits the token budget,
// and weight the chosen blocks. Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_RECALL_PLANNER_H_
#define KVMEM_ENGINE_RECALL_RECALL_PLANNER_H_

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "engine/types.h"

namespace kvmem {

// Walks `ranked` in order and keeps every block whose tokens still fit in
// max_tokens (a block too large for what is left is skipped and smaller,
// lower-ranked ones may still fill the rest). Never exceeds max_tokens.
// Gate weights as AssignGateWeights with ScoreMode::kSummed.
// REQUIRES: ranked is sorted by descending priority; gate_scale > 0.
std::vector<RecalledBlock> PlanBudgetedRecall(
    const std::vector<RecalledBlock>& ranked, uint32_t max_tokens,
    float gate_scale);

// One unit of a budget fill: a whole block, or one token group of it.
struct FillUnit {
  uint64_t block = 0;
  uint32_t tokens = 0;
};

// Budget fill over units in rank order: takes each unit whose tokens still
// fit in what is left of max_tokens, as long as it belongs to a block
// already taken or fewer than top_k blocks are taken (top_k 0: no cap).
// Appends the indexes of the units taken to *taken; returns the tokens they
// hold (never more than max_tokens). `state` carries the fill across calls
// so a fill can continue over further units (same max_tokens and top_k).
struct FillState {
  uint64_t used = 0;
  std::vector<uint64_t> blocks;        // Distinct blocks taken, in order.
  std::unordered_set<uint64_t> known;  // The same blocks, to look up.
};
// The value score MASS ranks units by: density * exp(semantic /
// model_weight), which orders them as model_weight * ln(density) + semantic
// does, with no log per unit. Density 0 stays 0 whatever the bonus (ln 0 =
// -inf; never 0 x inf = NaN, which would break a sort), negative density
// (not recallable) is returned as it is, and values beyond float's range
// saturate at its largest (semantics then outweigh attention by e^88 or
// more) instead of becoming inf. REQUIRES: model_weight > 0.
float MassRankValue(float density, float semantic, float model_weight);

uint64_t FillBudget(const std::vector<FillUnit>& ranked, uint32_t max_tokens,
                    uint32_t top_k, FillState* state,
                    std::vector<size_t>* taken);

// Gate weights, the one place their formula lives (documented on
// kvmem.v1.RecallDefaults.gate_temperature): softmax over the set of x_b /
// temperature, where x_b = ln(mass_b) with ScoreMode::kMass (so weights are
// mass^(1/T), normalised: at T = 1 each block's share of the set's
// estimated attention) and x_b = priority_b with ScoreMode::kSummed. They
// sum to 1 over a non-empty set; blocks of zero mass get 0 (all zero: equal
// weights).
// REQUIRES: temperature > 0.
void AssignGateWeights(std::vector<RecalledBlock>* blocks, float temperature,
                       ScoreMode mode);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALL_PLANNER_H_

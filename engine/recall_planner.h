// Budgeted recall planning: from the top-k blocks (already filtered to those
// outside the hot window, best score first) choose what fits the token budget
// and weight it. Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_PLANNER_H_
#define KVMEM_ENGINE_RECALL_PLANNER_H_

#include <cstdint>
#include <vector>

#include "engine/types.h"

namespace kvmem {

// Walks `ranked` in order and keeps every block whose tokens still fit in
// max_tokens (a block too large for what is left is skipped and smaller,
// lower-ranked ones may still fill the rest). Never exceeds max_tokens.
// Gate weights are softmax(priority / gate_scale) over the chosen blocks.
// REQUIRES: ranked is sorted by descending priority; gate_scale > 0.
std::vector<RecalledBlock> PlanBudgetedRecall(
    const std::vector<RecalledBlock>& ranked, uint32_t max_tokens,
    float gate_scale);

// Fills gate_weight of each block with softmax(priority / gate_scale).
void AssignGateWeights(std::vector<RecalledBlock>* blocks, float gate_scale);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_PLANNER_H_

// Bounds for score MASS's pruning: which scanned units can be among the
// first taken into a budget, from bounds on their rank value. Pure
// functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_MASS_BOUNDS_H_
#define KVMEM_ENGINE_RECALL_MASS_BOUNDS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/recall/semantic_cache.h"

namespace kvmem {

// Bounds of each unit's rank value (MassRankValue of its density and its
// block's known semantic score): density / slack and density * slack; -1
// for units that are not recallable (on[i] == 0). ids: the units (block <<
// shift | group).
void ValueBounds(const float* density, const float* slack, const float* on,
                 const std::vector<uint64_t>& ids, uint32_t shift,
                 const SemanticCache& sem, float model_weight,
                 std::vector<float>* lower, std::vector<float>* upper);

// theta: the largest value such that the units whose lower bound reaches it
// hold `budget` tokens; only units whose upper bound reaches theta can be
// among the first taken. *pending receives (row, upper) of the units whose
// upper bound reaches the floor theta was computed over (a superset of
// those reaching theta).
float BudgetThreshold(const std::vector<float>& lower,
                      const std::vector<float>& upper,
                      const std::vector<uint32_t>& tokens, uint32_t budget,
                      std::vector<std::pair<uint32_t, float>>* pending);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_MASS_BOUNDS_H_

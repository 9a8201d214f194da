// From a scorer's ranked sets to their plans (engine/recall/scorer.h,
// recall_planner.h): each set takes the identity channel's units within its
// share, then attention's ranked units, then the scorer's further units.
//
// Mass targets (RecallBudget.mass_target, score MASS): a set stops once its
// estimated mass reaches target x its estimated cold mass (the smallest set
// by rank whose share of the cold mass reaches the target), within its
// budget. With several sets (per layer, per head) and a target, the sets
// share one total, budget x sets tokens, and are sized by each one's need:
// after each set's identity units, attention's units of every set are
// taken by their rank value in one order (the best token of any head
// first: the one adding the most to the mean of the sets' masses), a set
// leaving the order once it reaches its target, until the total is spent.
// A set may then hold more than the budget (at most the total): heads
// whose attention is spread get more, heads that attend to a few tokens
// fewer (as V-Rex's ReSV and Twilight's top-p size theirs).
//
// Pure functions; call where the scorer's per-thread state is valid (right
// after scoring, on the scoring thread: ScoredSet::more).
#ifndef KVMEM_ENGINE_RECALL_SET_PLANNING_H_
#define KVMEM_ENGINE_RECALL_SET_PLANNING_H_

#include <vector>

#include "engine/recall/recall_planner.h"
#include "engine/recall/scorer.h"

namespace kvmem {

// The plans of `sets` (one each, in order) under `policy`, whose
// max_tokens is each set's budget; mass_target in [0, 1], 0: none.
std::vector<RecallPlan> PlanSets(const PlanPolicy& policy,
                                 std::vector<ScoredSet>* sets,
                                 float mass_target);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_SET_PLANNING_H_

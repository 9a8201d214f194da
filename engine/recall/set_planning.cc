#include "engine/recall/set_planning.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <utility>

namespace kvmem {
namespace {

// Drops the units the planner can no longer take because their block is
// past its top_k (Take would pass over them): the fill's further units are
// every token and group not ranked yet, and ranking them all is a sort of
// thousands where top_k has closed all but a few blocks.
void DropUnadmitted(const RecallPlanner& planner,
                    std::vector<PlanUnit>* units) {
  units->erase(std::remove_if(
                   units->begin(), units->end(),
                   [&](const PlanUnit& u) { return !planner.Admits(u.block); }),
               units->end());
}

// The identity channel first, within its share: the tracks, then the
// query as a whole (engine/recall/identity_channel.h).
void TakeIdentity(ScoredSet* set, RecallPlanner* planner) {
  planner->Take(set->track_units, set->track_budget);
  if (set->identity_budget > planner->used()) {
    planner->Take(set->query_units, set->identity_budget - planner->used());
  }
}

// One set alone: identity, attention's ranked units, then (when budget is
// left) the scorer's further units, ranked by the policy.
RecallPlan PlanOne(const PlanPolicy& policy, ScoredSet* set) {
  RecallPlanner planner(policy);
  TakeIdentity(set, &planner);
  planner.Take(set->ranked);
  if (!planner.full() && set->more) {
    std::vector<PlanUnit> more = set->more(planner.tokens_left());
    DropUnadmitted(planner, &more);
    planner.RankAndTake(std::move(more));
  }
  return planner.Finish();
}

// Several sets sharing `total` tokens, each up to its goal (see the header).
std::vector<RecallPlan> PlanJoint(const PlanPolicy& policy,
                                  std::vector<ScoredSet>* sets,
                                  float mass_target) {
  const size_t n = sets->size();
  const uint32_t total = static_cast<uint32_t>(std::min<uint64_t>(
      uint64_t{policy.max_tokens} * n, std::numeric_limits<uint32_t>::max()));
  std::vector<RecallPlanner> planners;
  planners.reserve(n);
  uint64_t used = 0;
  for (ScoredSet& set : *sets) {
    PlanPolicy p = policy;
    p.max_tokens = total;
    p.mass_goal = double(mass_target) * set.cold_mass;
    planners.emplace_back(p);
    TakeIdentity(&set, &planners.back());
    used += planners.back().used();
  }
  // Each set's attention units in rank order, its further units after them
  // (asked for once, when its ranked ones run out).
  std::vector<size_t> next(n, 0);
  std::vector<bool> asked(n, false);
  const RecallPlanner ranker(policy);
  auto unit_of = [&](size_t s) -> const PlanUnit* {
    ScoredSet& set = (*sets)[s];
    if (next[s] >= set.ranked.size() && !asked[s] && set.more) {
      asked[s] = true;
      std::vector<PlanUnit> more = set.more(planners[s].tokens_left());
      DropUnadmitted(planners[s], &more);
      ranker.Rank(&more);
      set.ranked.insert(set.ranked.end(), more.begin(), more.end());
    }
    return next[s] < set.ranked.size() ? &set.ranked[next[s]] : nullptr;
  };
  std::priority_queue<std::pair<float, size_t>> order;  // Value, set.
  for (size_t s = 0; s < n; ++s) {
    if (const PlanUnit* u = unit_of(s)) order.emplace(ranker.RankValue(*u), s);
  }
  while (!order.empty() && used < total) {
    const size_t s = order.top().second;
    order.pop();
    RecallPlanner& planner = planners[s];
    if (planner.full()) continue;  // Its goal is reached.
    const uint32_t before = planner.used();
    planner.Take({(*sets)[s].ranked[next[s]++]},
                 static_cast<uint32_t>(total - used));
    used += planner.used() - before;
    if (const PlanUnit* u = unit_of(s)) order.emplace(ranker.RankValue(*u), s);
  }
  std::vector<RecallPlan> plans;
  plans.reserve(n);
  for (RecallPlanner& planner : planners) plans.push_back(planner.Finish());
  return plans;
}

}  // namespace

std::vector<RecallPlan> PlanSets(const PlanPolicy& policy,
                                 std::vector<ScoredSet>* sets,
                                 float mass_target) {
  if (mass_target > 0 && policy.mode == ScoreMode::kMass && sets->size() > 1) {
    return PlanJoint(policy, sets, mass_target);
  }
  std::vector<RecallPlan> plans;
  plans.reserve(sets->size());
  for (ScoredSet& set : *sets) {
    PlanPolicy p = policy;
    if (mass_target > 0 && policy.mode == ScoreMode::kMass) {
      p.mass_goal = double(mass_target) * set.cold_mass;
    }
    plans.push_back(PlanOne(p, &set));
  }
  return plans;
}

}  // namespace kvmem

// RecallPlanner: from scored candidates (blocks, or token groups of blocks,
// all outside the hot window) to a budgeted recall set. A pure function of
// the candidates, the budget and the policy: it knows nothing of streams,
// indexes or storage (the stream gathers candidates, engine/stream/;
// the planner ranks them, fills the token budget and weights the set).
//
//   RecallPlanner planner(policy);
//   planner.Rank(&units);      // best first
//   planner.Take(units);       // fill the budget in that order
//   planner.Take(more);        // optionally continue with further units
//   RecallPlan plan = planner.Finish();
//
// Ranking: score SUMMED orders units by priority = model_scale * score +
// semantic; score MASS by MassRankValue(density, semantic, model_weight),
// which orders them as model_weight * ln(density) + semantic does. Ties go
// to the newer block (larger id), then the larger group.
//
// Thread safety: an instance is used by one thread; the free functions are
// safe from any.
#ifndef KVMEM_ENGINE_RECALL_RECALL_PLANNER_H_
#define KVMEM_ENGINE_RECALL_RECALL_PLANNER_H_

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "engine/types.h"

namespace kvmem {

// A PlanUnit that is a whole block or group, not one token.
inline constexpr uint32_t kWholeUnit = ~uint32_t{0};

// One candidate unit: a whole block (group 0), one token group of one, or
// one token (token-resolution recall: `token` identifies it within its
// block, engine/recall/token_stage.h; `group` is its group, `tokens` 1).
struct PlanUnit {
  uint64_t block = 0;
  uint32_t group = 0;
  uint32_t tokens = 0;
  // SUMMED: the query . summary inner product; MASS: the estimated
  // attention mass per token (density).
  float score = 0;
  // The weighted semantic score of the unit's block (0 when unknown).
  float semantic = 0;
  uint32_t token = kWholeUnit;
  // The channel that offers it (identity channels offer token units only,
  // their `score` still the attention density, so masses and gates stay
  // attention's).
  RecallChannel channel = RecallChannel::kAttention;
};

struct PlanPolicy {
  ScoreMode mode = ScoreMode::kMass;
  uint32_t max_tokens = 0;  // The token budget; the set never exceeds it.
  uint32_t top_k = 0;       // The most distinct blocks; 0: no cap.
  float model_weight = 1;   // MASS: the model signal's weight (> 0).
  float model_scale = 1;    // SUMMED: model weight / sqrt(head_dim).
  float gate_temperature = 1;
  // MASS: the fill stops once the set's mass reaches it (a mass target).
  double mass_goal = std::numeric_limits<double>::infinity();
};

// One block of a plan, in the order blocks were first taken.
// A block's list of tokens in a plan. A recall takes a few tokens from each
// of hundreds of blocks (about 4 at the default budget): eight fit in place,
// so most blocks' lists allocate nothing (they were most of a recall's
// mallocs, and malloc ~20 % of its time in the eval's fragmented heap).
using PlanTokens = absl::InlinedVector<uint32_t, 8>;

struct PlannedBlock {
  uint64_t block = 0;
  // Its best-ranked unit taken: that unit's group, score, and the block's
  // semantic score and priority (SUMMED: model_scale * score + semantic;
  // MASS: model_weight * ln(density) + semantic, density floored at the
  // smallest float so it stays finite).
  uint32_t first_group = 0;
  float score = 0;
  float semantic = 0;
  float priority = 0;
  float mass = 0;  // MASS: sum over its units of density * tokens.
  float gate_weight = 0;
  uint32_t tokens = 0;      // Tokens of its units taken.
  uint64_t group_mask = 0;  // Bit g: group g taken (whole).
  // Single tokens taken (token units: their `token`), in the order taken,
  // and each one's group; none of them in a group of group_mask (a whole group
  // taken after some of its tokens absorbs them: the budget counts each token
  // once).
  PlanTokens single_tokens;
  PlanTokens single_groups;
  // The single tokens the identity channels took (their `token`s).
  PlanTokens query_tokens;
  PlanTokens track_tokens;
};

struct RecallPlan {
  std::vector<PlannedBlock> blocks;
  uint32_t total_tokens = 0;
  ChannelTokens channels;  // identity_budget: left to the caller.
};

class RecallPlanner {
 public:
  explicit RecallPlanner(const PlanPolicy& policy);

  // The value units are ranked by (see above).
  float RankValue(const PlanUnit& u) const;
  // Sorts units best first.
  void Rank(std::vector<PlanUnit>* units) const;
  // Takes units in the given order: each whose tokens still fit in what is
  // left of the budget, as long as its block is already taken or fewer than
  // top_k blocks are. Units of 0 tokens are never taken, nor a token unit
  // whose group is already taken whole or that was taken before. May be
  // called again to continue the fill with further units; `limit` caps the
  // tokens this call adds.
  void Take(const std::vector<PlanUnit>& ranked, uint32_t limit = UINT32_MAX);
  // Rank then Take, ranking only as far as the fill gets: the best units a
  // chunk at a time (selected, then sorted), taken, until the plan is full
  // or none are left. The same units taken in the same order as
  // Rank(&units) then Take(units), at a selection's cost instead of a
  // sort's where the fill ends early (the further units of a token-
  // resolution recall are thousands; the fill takes tens of them).
  void RankAndTake(std::vector<PlanUnit> units);
  // Whether Take could still take a unit of `block`: the block is taken
  // already, or fewer than top_k blocks are (top_k 0: always). Once false
  // for a block it stays false (the taken blocks only grow).
  bool Admits(uint64_t block) const {
    return policy_.top_k == 0 || blocks_.size() < policy_.top_k ||
           slot_.count(block) > 0;
  }
  uint32_t tokens_left() const {
    return static_cast<uint32_t>(policy_.max_tokens - used_);
  }
  bool full() const {
    return used_ >= policy_.max_tokens || mass_ >= policy_.mass_goal;
  }
  uint32_t used() const { return static_cast<uint32_t>(used_); }
  double mass() const { return mass_; }
  // The plan, with gate weights (AssignGateWeights over the planned
  // blocks). The planner is spent.
  RecallPlan Finish();

  // Score SUMMED, whole blocks, as kvmem has always planned them: the
  // top_k best by priority (all with top_k 0), then the budget fill.
  static RecallPlan PlanBlocks(const PlanPolicy& policy,
                               std::vector<PlanUnit> units);
  // Rank, Take and Finish in one call (token groups; score MASS).
  static RecallPlan Plan(const PlanPolicy& policy, std::vector<PlanUnit> units);

 private:
  // Whether token `token` of blocks_[slot] was taken alone since dedupe_.
  bool Taken(size_t slot, uint32_t token) const;
  float Priority(const PlanUnit& u) const;

  const PlanPolicy policy_;
  uint64_t used_ = 0;
  double mass_ = 0;  // MASS: sum of the taken units' density x tokens.
  std::vector<PlannedBlock> blocks_;
  absl::flat_hash_map<uint64_t, size_t> slot_;  // Block -> index in blocks_.
  ChannelTokens channels_;
  // [slot] bits of the single tokens taken, once a channel other than
  // attention offered units (attention offers each token once).
  // Per block: a bit per token taken one by one (dedupe across channels);
  // room for 512 tokens (a 7B block's) in place.
  std::vector<absl::InlinedVector<uint64_t, 8>> taken_;
  bool dedupe_ = false;
};

// The value score MASS ranks units by: density * exp(semantic /
// model_weight), which orders them as model_weight * ln(density) + semantic
// does, with no log per unit. Density 0 stays 0 whatever the bonus (ln 0 =
// -inf; never 0 x inf = NaN, which would break a sort), negative density
// (not recallable) is returned as it is, and values beyond float's range
// saturate at its largest (semantics then outweigh attention by e^88 or
// more) instead of becoming inf. REQUIRES: model_weight > 0.
float MassRankValue(float density, float semantic, float model_weight);

// Gate weights, the one place their formula lives (documented on
// kvmem.v1.RecallDefaults.gate_temperature): softmax over the set of x_b /
// temperature, where x_b = ln(mass_b) with ScoreMode::kMass (so weights are
// mass^(1/T), normalised: at T = 1 each block's share of the set's
// estimated attention) and x_b = priority_b with ScoreMode::kSummed. They
// sum to 1 over a non-empty set; blocks of zero mass get 0 (all zero: equal
// weights).
// REQUIRES: temperature > 0.
void AssignGateWeights(std::vector<PlannedBlock>* blocks, float temperature,
                       ScoreMode mode);

// The token offsets a recalled block carries for the groups in group_mask
// (token_group[t]: token t's group) and the single tokens: ascending, and
// empty when that is every token (the whole block).
std::vector<uint32_t> TokenOffsets(const std::vector<uint8_t>& token_group,
                                   uint64_t group_mask,
                                   absl::Span<const uint32_t> single_tokens,
                                   uint32_t token_count);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALL_PLANNER_H_

// RecallScorer: how a stream's recall scores its candidates, behind one
// small interface (shaped like engine/accel/accelerator.h and FAISS's
// Index: one required method, optional capabilities with defaults, per-call
// knobs in a struct). Given the stream's read view, the query and the
// budget (resolved before scoring), a scorer gathers the eligible recall
// units (blocks, or token groups of blocks), scores them, and hands them to
// the planner ranked (engine/recall/recall_planner.h), one list per recall
// set. The planner fills each set's budget and weights it; Recall()
// (engine/recall/recaller.h) turns the plans into the answer.
//
// Scorers are chosen by name (StreamConfig.weights.scorer,
// kvmem.v1.RecallPolicy.scorer): "mass" (per-head attention mass at token
// resolution, the default), "mass_groups" (the same at token-group
// resolution) and "summed" (the summed logit of the mean query) are built in;
// a program registers more with RegisterRecallScorer. A new scorer is one
// file and one registration:
//
//   class OldestFirst : public RecallScorer { ... };
//   RegisterRecallScorer(std::make_unique<OldestFirst>());
//   config.weights.scorer = "oldest";   // then open the stream
//
// Thread safety: a registered scorer is shared by every stream that names
// it and called from many threads at once: Score must be safe to call
// concurrently (const, no shared mutable state; per-thread scratch is
// fine). The registry's functions are safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_SCORER_H_
#define KVMEM_ENGINE_RECALL_SCORER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/accel/accelerator.h"
#include "engine/recall/recall_helpers.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/recall_query.h"
#include "engine/types.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// One scoring call's inputs besides the view.
struct ScoreRequest {
  const RecallQuery* query = nullptr;  // Validated (ValidateRecallQuery).
  const std::vector<float>* mean_query = nullptr;  // Mean of its vectors.
  // The vectors' weights (MassInputs::weight), when the query was reduced
  // to weighted representatives (engine/recall/query_reduction.h); null:
  // equal.
  const std::vector<float>* vector_weights = nullptr;
  RecallBudget budget;  // Resolved before scoring (ResolveBudget).
  // Blocks [0, eligible) lie wholly before the hot window: only their
  // units may be recalled (evicted ones never are).
  size_t eligible = 0;
  // Block `eligible`, when it straddles the window's start: its first
  // straddle_tokens tokens lie before the window (0: none, or the block
  // cannot be recalled by token: TokensBeforeWindow). A scorer that
  // recalls single tokens may recall those, never the block's others; one
  // that takes whole units leaves the block out.
  uint32_t straddle_tokens = 0;
  // Searches and scans go through it (their cost into the call's *cost).
  Accelerator* accel = nullptr;
  // Threads the scan and the token stage may use besides the caller's.
  RecallHelpers helpers;
};

// One recall set's candidates, as the planner is to take them.
struct ScoredSet {
  // With per-layer or per-head sets: the set's indexed layer and KV head.
  uint32_t layer = 0;
  uint32_t kv_head = 0;
  // Taken in this order, each while it fits the budget and top_k.
  std::vector<PlanUnit> ranked;
  // Optional: more units for what `ranked` leaves of the budget, given the
  // tokens left (called only when some are); the planner ranks them by its
  // policy and takes them in that order. It may read the scorer's
  // per-thread scratch: call it on the scoring thread, before that thread
  // scores again (AnswerRecall plans every set right after scoring).
  std::function<std::vector<PlanUnit>(uint32_t tokens_left)> more;
  // Tokens the set scored one by one (token-resolution scorers), and the
  // time that took.
  uint64_t tokens_scored = 0;
  uint32_t token_us = 0;
  // Optional: the identity channel (engine/recall/identity_channel.h). The
  // planner takes track_units (at most track_budget tokens), then
  // query_units (up to identity_budget with what the tracks took), then
  // `ranked`; their units' channel says which took them.
  std::vector<PlanUnit> track_units, query_units;
  uint32_t track_budget = 0, identity_budget = 0;
  // Score MASS: the estimated attention mass of every recallable unit of
  // the set (its share of the attention outside the window), for mass
  // targets and RecallResult.cold_share; 0 when unknown.
  double cold_mass = 0;
  // What turns the set's masses into shares of the query's attention: the
  // estimate's normaliser makes window + candidates sum to 1 with group
  // means' logits; scored one by one, the pooled tokens hold more than
  // their groups' means said (Jensen), so the whole is 1 + that difference
  // and a set's share is its mass / (1 + difference). 1 without a token
  // stage.
  double mass_scale = 1.0;
};

struct ScoredRecall {
  // How the planner ranks and weights the units (mode: what their score
  // means), and the budget. Every set shares it.
  PlanPolicy policy;
  std::vector<ScoredSet> sets;
  // The sets answer RecallResult.layer_sets (per layer or per head); else
  // sets holds one set, the answer's blocks.
  bool layer_sets = false;
  // The units are token groups: answers carry each block's token offsets
  // (else the units are whole blocks).
  bool group_units = false;
  // RecalledBlock.score reports the mean query's inner product with the
  // summary of the block's best unit (else that unit's own score).
  bool score_is_mean_dot = false;
  bool window_estimated = false;  // RecallResult.window_estimated.
  uint32_t search_us = 0;         // Time in index searches and scans.
  // Released with the result, once the plans are made (MASS: frees a large
  // recall's per-thread scratch then); declared last, so it goes first.
  std::shared_ptr<const void> state;
};

class RecallScorer {
 public:
  virtual ~RecallScorer() = default;

  // The name streams choose it by: [a-z0-9_]{1,32}.
  virtual const std::string& name() const = 0;

  // Scores the eligible units of `view` for req into *out (sets, ranked
  // units, policy) and the accelerator's cost into *cost. Errors are the
  // recall's answer (e.g. RESOURCE_EXHAUSTED for a recall too large to
  // score).
  virtual absl::Status Score(const RecallView& view, const ScoreRequest& req,
                             ScoredRecall* out, CallCost* cost) const
      ABSL_SHARED_LOCKS_REQUIRED(view.mu()) = 0;

  // Optional capabilities; the defaults ask for nothing.
  // The view keeps the open block's mean key (RecallView::open_mean).
  virtual bool wants_open_mean() const { return false; }
  // Streams with several indexed layers keep one index per indexed layer
  // (StreamIndexes::layer).
  virtual bool wants_layer_indexes() const { return false; }
  // It answers RecallQuery.per_head (a set per indexed layer and KV head);
  // else such a query is INVALID_ARGUMENT.
  virtual bool answers_per_head() const { return false; }
};

// Makes `scorer` available by its name to streams opened from now on.
// ALREADY_EXISTS when the name is taken; INVALID_ARGUMENT for a name
// outside [a-z0-9_]{1,32}. Scorers stay registered for the program's life.
absl::Status RegisterRecallScorer(std::unique_ptr<RecallScorer> scorer);

// The scorer registered as `name`; null when none is.
const RecallScorer* FindRecallScorer(absl::string_view name);

// Every registered name, sorted.
std::vector<std::string> RecallScorerNames();

// The names of the built-in scorers: "mass" scores token groups, then the
// tokens of the best groups from their codes (engine/recall/token_stage.h);
// "mass_groups" stops at the groups (kvmem before token-resolution recall).
inline constexpr absl::string_view kMassScorer = "mass";
inline constexpr absl::string_view kMassGroupsScorer = "mass_groups";
inline constexpr absl::string_view kSummedScorer = "summed";

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_SCORER_H_

// Token-resolution recall, score MASS's second stage (scorer "mass"): the
// group bounds choose a pool of token groups several times the budget
// (kTokenPoolFactor), and every token of the pool is scored from its token
// codes (engine/index/token_codes.h) by the same per-head mass formula as a
// unit (engine/recall/mass_estimate.h, with the recall's normaliser):
//   density_t = mean over vectors j and heads h of exp(z_jth - L_jh)
// The planner then fills the budget with the best tokens, so a block brings
// back only its tokens the query attends to, however they are grouped.
// Attention that lives in a few tokens spread over many frames is what a
// group's mean key blurs: its tokens are found here.
//
// Blocks whose records have no codes (written before them) stay whole-group
// units at their group's density. Degraded blocks are scored from their
// codes (kept from the full-precision keys at seal) and recalled from their
// int8 form, flagged degraded; evicted blocks have neither and are never
// candidates.
//
// Pure functions of the view; call under its lock.
#ifndef KVMEM_ENGINE_RECALL_TOKEN_STAGE_H_
#define KVMEM_ENGINE_RECALL_TOKEN_STAGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/index/token_codes.h"
#include "engine/recall/mass_estimate.h"
#include "engine/recall/recall_helpers.h"
#include "engine/recall/recall_planner.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// The pool: groups holding up to this many times the budget's tokens. The
// recall issue's model of the selection found 8 reaches the token oracle's
// cold mass on two workloads (0.90 / 0.92) and 0.70 of 0.91 on one whose
// attention is peaked on few tokens per frame (0.85 at 64).
inline constexpr uint32_t kTokenPoolFactor = 8;
// ... and at most this many vector x head dots over the pool (the pool
// shrinks toward the budget for queries of many vectors over many heads):
// about 5 ms of one core at the AVX2 kernel's rate.
inline constexpr uint64_t kMaxTokenDots = uint64_t{1} << 22;

struct TokenStageInput {
  const TokenQuery* query = nullptr;  // The recall's vectors, prepared.
  const MassEstimate* est = nullptr;  // Its normaliser.
  uint32_t h0 = 0, h1 = 0;            // The set's head range.
  float logit_scale = 0;              // 1 / sqrt(head_dim).
  // Optional (the identity channel): the estimate of the vectors' weighted
  // mean, and the vectors' weights; each token then also gets its density
  // for that mean vector.
  const MassEstimate* mean_est = nullptr;
  const float* weight = nullptr;  // [vector]
  // Optional: the above's density terms, prepared (ScorePoolTokens prepares
  // them once for the pool; TokenDensities does for each call without).
  const DensityTerms* terms = nullptr;
};

// The scored tokens, flat (a pool holds several thousand: the set ranks
// them by value and makes units of the few it can take).
struct TokenStageOutput {
  std::vector<PlanUnit> runs;       // The pooled groups that had codes.
  std::vector<float> density;       // [token]
  std::vector<float> mean_density;  // [token], with in.mean_est.
  std::vector<uint32_t> run;        // [token]: its group in runs.
  std::vector<uint32_t> place;      // [token]: its place in group order.
  std::vector<PlanUnit> whole;      // Pooled groups without codes, whole.
  uint64_t tokens_scored = 0;
  // Token i as a unit (1 token, its density, its block's semantic score).
  PlanUnit Unit(size_t i) const {
    PlanUnit u = runs[run[i]];
    u.tokens = 1;
    u.score = density[i];
    u.token = place[i];
    return u;
  }
};

// The densities of m tokens from their m consecutive code records over
// heads [in.h0, in.h1), into out[k]: the formula above, from the int4 keys
// and the int8 query; with in.mean_est, also each token's density for the
// vectors' weighted mean into mean_out[k].
void TokenDensities(const TokenCodeShape& shape, const TokenStageInput& in,
                    const uint8_t* records, size_t m, float* out,
                    float* mean_out = nullptr);

// The record holds token codes for every token (else its groups are
// scored whole).
bool HasTokenCodes(const BlockRecord& rec, const TokenCodeShape& shape);

// How many tokens of block `block` lie before position window_start when
// the token stage can recall them alone: the block is kept with a disk form
// (not evicted), starts before window_start and ends after it, its frames'
// positions follow each other without gaps (a token's offset is then its
// position's), and its record has token codes; else 0. A front end that holds
// exactly its hot window holds none of them, and they are the most recent cold
// tokens.
uint32_t TokensBeforeWindow(const RecallView& view, uint64_t block,
                            uint64_t window_start)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// Every token of the pool's group units scored, into *out (its block's
// semantic score carried over); a token unit's `token` is its place in its
// block's group order (the codes' order: GroupOrder turns places into
// token offsets). A unit's first u.tokens places are
// scored: all of its group's, or fewer for a group of the block straddling
// the window (a group's places are in append order, so its tokens before
// the window are its first). Pools of kParallelPoolTokens tokens
// or more are scored in slices on `helpers` too (the same values: each
// token's are computed alone). REQUIRES: the pool's units are recallable
// group units of `view`.
void ScorePoolTokens(const RecallView& view, const TokenStageInput& in,
                     const std::vector<PlanUnit>& pool, TokenStageOutput* out,
                     const RecallHelpers& helpers = {})
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());
// ... and the slices are about this many tokens (a slice costs a task
// hand-off, a few microseconds; a token ~0.1-0.2 us at 8 vectors).
inline constexpr size_t kParallelPoolTokens = 256;

// A set's pool, in tokens: kTokenPoolFactor x its budget, fewer where each
// token costs more dots than kMaxTokenDots allows (`vectors` x `heads` per
// token), never below the budget.
uint32_t PoolBudget(uint32_t budget, uint32_t vectors, uint32_t heads);

// The candidates best by value (ties to the larger id), in that order,
// until their tokens reach `budget` (or all of them): PoolUntil's
// candidates, sorted (the others are never sorted).
std::vector<uint32_t> BestUntil(const std::vector<float>& value,
                                const std::vector<uint32_t>& tokens,
                                const std::vector<uint64_t>& id,
                                uint64_t budget);

// BestUntil's candidates in no particular order (a weighted selection, no
// sort): for a pool, whose order nothing reads.
std::vector<uint32_t> PoolUntil(const std::vector<float>& value,
                                const std::vector<uint32_t>& tokens,
                                const std::vector<uint64_t>& id,
                                uint64_t budget);

// The set's ranked units from the scored tokens: the budget's count and
// kRankSlack more as token units, in RecallPlanner::Rank's order (the
// pool's groups without codes ranked in among them), and *rest makes units
// of the other tokens if the fill asks for them.
// kRankSlack: the tokens the planner may pass over (those of the anchors'
// groups, taken whole).
inline constexpr size_t kRankSlack = 256;
void RankScoredTokens(std::shared_ptr<const TokenStageOutput> scored,
                      const PlanPolicy& policy, uint32_t budget,
                      std::vector<PlanUnit>* ranked,
                      std::function<std::vector<PlanUnit>()>* rest);

// A block's group order (token_group[t]: token t's group; group 0's tokens
// in append order first, then group 1's, ...), built once for the several
// place lists a recall answers per block.
class GroupOrder {
 public:
  // group_tokens[g]: the tokens of group g < groups (the view's count,
  // RecallView::UnitTokens, so the order needs one pass over the tokens).
  // Tokens of groups >= groups have no place (nor codes).
  void Reset(const std::vector<uint8_t>& token_group,
             const uint32_t* group_tokens, uint32_t groups);
  // The token offsets of places in that order, in the order given; places
  // beyond the block are dropped.
  std::vector<uint32_t> Tokens(absl::Span<const uint32_t> places) const;
  // The same into *out (its memory reused).
  void Tokens(absl::Span<const uint32_t> places,
              std::vector<uint32_t>* out) const;

 private:
  std::vector<uint32_t> token_at_;  // [place]: the token there.
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_TOKEN_STAGE_H_

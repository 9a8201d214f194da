// Per-head attention-mass estimation: the model signal of recall with
// kvmem.v1.ScoreMode MASS (see types.proto for the formula this computes).
//
// A query (one or more vectors) is scored against every candidate summary
// per head (BlockIndex::ScanSegments: one segment per indexed layer and KV
// head). For vector j, head h and candidate c with n_c tokens and logit
// z_jch = dot_jch / sqrt(head_dim), the head's softmax normaliser is
//   L_jh = ln( exp(W_jh) + sum over counted candidates of n_c exp(z_jch) )
// with W_jh the log-sum-exp of what attention reads besides the candidates
// (the front end's window and sinks; -inf for nothing), and the candidate's
// estimated attention mass per token is
//   density_c = sum over j of w_j x mean over h of exp(z_jch - L_jh),
// w_j the vector's weight (MassInputs::weight; 1/n each by default).
// A candidate's mass is n_c * density_c: the share of the query's
// attention, averaged over vectors and heads, its tokens would hold if each
// had the summary's logit. That is exp(mean logit) per token, below the mean
// of exp(logit) (Jensen), so tight summaries (token groups) estimate better.
//
// Scans from the int8 stage carry a bound per candidate (every head's dot
// within bound_jc): the true density (given the normaliser) then lies within
// [density / slack, density * slack], slack_c = exp(max_j bound_jc / sqrt(d)).
// The normaliser itself is computed from the scan's values.
//
// Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_MASS_ESTIMATE_H_
#define KVMEM_ENGINE_RECALL_MASS_ESTIMATE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/index/block_index.h"

namespace kvmem {

// What a scanned candidate is to the estimate.
enum class CandidateRole : uint8_t {
  kIgnore = 0,  // Neither recallable nor in the normaliser.
  kRecall = 1,  // Recallable; in the normaliser.
  kWindow = 2,  // Held by the front end: in the normaliser only.
};

struct MassInputs {
  uint32_t heads = 0;     // Segments of every scan.
  float logit_scale = 0;  // 1 / sqrt(head_dim).
  size_t n = 0;           // Candidates: the rows of every scan.
  // [n] the tokens each candidate adds to the normaliser: its tokens when
  // it is recallable or held by the front end (kRecall, kWindow), 0 when
  // it must not count (kIgnore).
  const float* counted = nullptr;
  std::vector<const SegmentScan*> scans;  // One per query vector.
  // [vector][head]: W_jh, what attention reads besides the candidates;
  // -inf for nothing. Counted candidates are added to it.
  const float* window_lse = nullptr;
  // Head ranges [begin, end) to report densities for: {0, heads} for one
  // recall set over all heads, one range per layer for per-layer sets.
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  // [vector]: w_j, summing to 1; empty: 1/n each.
  std::vector<float> weight;
};

struct MassEstimate {
  uint32_t heads = 0, vectors = 0;
  std::vector<float> weight;                // [vector]: w_j (empty: 1/n each).
  std::vector<float> log_norm;              // [vector][head]: L_jh
  std::vector<std::vector<float>> density;  // [range][candidate]
  std::vector<float> slack;                 // [candidate], >= 1
};

// REQUIRES: every scan has in.n rows of in.heads dots; window_lse holds
// scans.size() * heads values; ranges are within [0, heads) and non-empty.
MassEstimate EstimateMass(const MassInputs& in);
// The same into *out, reusing its buffers (a recall's per-thread rows).
void EstimateMass(const MassInputs& in, MassEstimate* out);

// The densities over heads [h0, h1) of m candidates from their exact dots,
// dots[(candidate * vectors + vector) * heads + head], with the normaliser
// of `est`, into out[candidate].
void CandidateDensities(const MassEstimate& est, const float* dots, size_t m,
                        uint32_t h0, uint32_t h1, float logit_scale,
                        float* out);

// A head range's terms of CandidateDensities' formula and, with a mean
// estimate, of the identity channel's: each candidate's density over heads
// [h0, h1) for the weighted mean of the query vectors (the query as a
// whole: its logit is the weighted mean of the vectors' logits, `weight`
// over the vectors), with the normaliser of `mean_est` (an estimate of that
// one mean vector). Prepared once for many candidates: TermDensities then
// gives both in one pass over the dots (fast_exp.h's density kernel).
struct DensityTerms {
  uint32_t heads = 0, vectors = 0, h0 = 0, w = 0;
  float logit_scale = 0;
  std::vector<float> neg, coef;         // [vector][head in range], [vector]
  std::vector<float> mean_k, mean_neg;  // [vector], [head]; empty: no mean
};
// mean_est and weight: both or neither.
void PrepareDensityTerms(const MassEstimate& est, uint32_t h0, uint32_t h1,
                         float logit_scale, const MassEstimate* mean_est,
                         const float* weight, DensityTerms* out);
// mean_out: the mean vector's densities when the terms have a mean (null:
// not computed).
void TermDensities(const DensityTerms& t, const float* dots, size_t m,
                   float* out, float* mean_out);

// The weights of `in` (w_j), uniform when it gives none.
std::vector<float> VectorWeights(const std::vector<float>& weight,
                                 size_t vectors);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_MASS_ESTIMATE_H_

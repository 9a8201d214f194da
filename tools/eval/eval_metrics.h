// Metrics of `kvmem eval` (eval.h): one query's oracle, the outputs and
// cold mass a selection gives, the best shared and per-head sets, and a
// policy's summary over its rows. Internal to the evaluation harness.
#ifndef KVMEM_TOOLS_EVAL_EVAL_METRICS_H_
#define KVMEM_TOOLS_EVAL_EVAL_METRICS_H_

#include <cstdint>
#include <vector>

#include "tools/eval/eval.h"
#include "tools/eval/eval_policies.h"

namespace kvmem {

// One query's oracle, shared by every configuration and policy.
struct QueryTruth {
  uint32_t query_heads = 0, group = 1, head_dim = 0;
  std::vector<std::vector<float>> probs;  // [query head][token]
  std::vector<std::vector<double>> outs;  // [query head][head_dim]
  std::vector<double> pbar, prefix;       // Mean over query heads.
  // Sinks + window of the current window size, per query head.
  std::vector<double> base_mass;
  std::vector<std::vector<double>> base_out;
  // The query's vectors (WorkloadQuery::q_heads), while it is scored.
  const std::vector<std::vector<float>>* q_heads = nullptr;
};

// prefix[e] - prefix[b] (0 when e <= b).
double Sum(const std::vector<double>& prefix, uint64_t b, uint64_t e);

// Fills row's mass, cosine and relative error of attending to the sinks,
// the window and the selection jointly (per query head, each reading its
// KV head's set when the selection has sets per head), and with gates: the
// window's and each recalled block's own attention mixed by the
// selection's estimated mass and gate weights. With `int8` or `int4`
// (cam's tokens as a stream with tier_policy.cold_precision INT8 or INT4
// returns them, same layout) and t.q_heads, also the relative errors when
// the recalled tokens come from that tier (int8_rel_error,
// int8_gated_rel_error, int4_...); without, those equal the exact ones.
void ScoreOutputs(const QueryTruth& t, const CameraTokens& cam,
                  const CameraTokens* int8, const CameraTokens* int4,
                  const Selection& sel, QueryRow* row);

// The cold mass the best shared set of R tokens holds (by mean attention
// over query heads) and the best set per query head (each head's own R),
// both averaged over query heads, added to *per_head and *shared; the cold
// mass in all to *pool.
void OracleSets(const QueryTruth& t, uint64_t n, const PolicyBudget& b,
                uint64_t sink_tokens, double* per_head, double* shared,
                double* pool);

// Summary of configuration ci's policy pi over the result's rows.
PolicySummary Summarize(const EvalResult& result, size_t ci, size_t pi,
                        double fps, uint32_t recall);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_EVAL_METRICS_H_

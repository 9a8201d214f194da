// A recall query against one stream: its validation and the budget in force.
// Pure functions of the query and the stream's config, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_RECALL_QUERY_H_
#define KVMEM_ENGINE_RECALL_RECALL_QUERY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/stream_config.h"
#include "engine/types.h"

namespace kvmem {

// The budget a recall is held to, resolved from the query and the stream's
// defaults before scoring.
struct RecallBudget {
  uint32_t tokens = 0;  // Each set's most tokens (> 0).
  uint32_t top_k = 0;   // Each set's most distinct blocks; 0: no cap.
  // The query's vectors as scored: at most kMaxScoredVectors (a larger
  // query is reduced first, engine/recall/query_reduction.h).
  uint32_t query_vectors = 0;
};

// INVALID_ARGUMENT naming the field and its value for a query the stream
// cannot answer: no or misshapen query vectors (n x summary_dim floats, n in
// [1, kMaxQueryVectors], at most kMaxQueryFloats), non-finite values, a
// window_lse of the wrong length, bad signals, per_head with per_layer, or
// per_head when the stream's scorer (named `scorer`) cannot answer it
// (!per_head_ok), a position past 2^63, a window fraction outside [0, 1],
// an identity share outside [0, 1], a mass target outside [0, 1] or with a
// score other than MASS.
absl::Status ValidateRecallQuery(const RecallQuery& q,
                                 const StreamConfig& config,
                                 uint32_t summary_dim,
                                 const std::string& stream_id,
                                 bool per_head_ok);

// The budget in force: the query's max_tokens, else its window fraction of
// the hot window (at least 1 token), else the stream's default; the
// query's top_k, else the stream's. INVALID_ARGUMENT when top_k exceeds
// kMaxTopK or the tokens 2^24; RESOURCE_EXHAUSTED when a per_head or
// per_layer recall's sets x tokens exceed kMaxSetTokensPerRecall.
absl::StatusOr<RecallBudget> ResolveBudget(const RecallQuery& q,
                                           const StreamConfig& config,
                                           uint32_t summary_dim);

// The mean of the query's n vectors of `dim` floats.
std::vector<float> MeanQuery(const std::vector<float>& query, uint32_t dim);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALL_QUERY_H_

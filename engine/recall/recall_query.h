// A recall query against one stream: its validation and the budget in force.
// Pure functions of the query and the stream's config, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_RECALL_QUERY_H_
#define KVMEM_ENGINE_RECALL_RECALL_QUERY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/stream_config.h"
#include "engine/types.h"

namespace kvmem {

// INVALID_ARGUMENT naming the field and its value for a query the stream
// cannot answer: no or misshapen query vectors (n x summary_dim floats, n in
// [1, kMaxQueryVectors]), non-finite values, a window_lse of the wrong
// length, bad signals, per_head without score MASS or with per_layer, a
// position past 2^63, a window fraction outside [0, 1].
absl::Status ValidateRecallQuery(const RecallQuery& q,
                                 const StreamConfig& config,
                                 uint32_t summary_dim,
                                 const std::string& stream_id);

// The budget in force, into r->budget_tokens and r->top_k (and
// r->query_vectors): the query's max_tokens, else its window fraction of
// the hot window (at least 1 token), else the stream's default; the
// query's top_k, else the stream's. INVALID_ARGUMENT when top_k exceeds
// kMaxTopK or the tokens 2^24.
absl::Status ResolveBudget(const RecallQuery& q, const StreamConfig& config,
                           uint32_t summary_dim, RecallResult* r);

// The mean of the query's n vectors of `dim` floats.
std::vector<float> MeanQuery(const std::vector<float>& query, uint32_t dim);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALL_QUERY_H_

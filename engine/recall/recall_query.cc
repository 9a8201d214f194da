#include "engine/recall/recall_query.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/index/dot.h"
#include "engine/signals/frame_signals.h"

namespace kvmem {
namespace {

absl::Status CheckShape(const RecallQuery& q, uint32_t summary_dim,
                        const std::string& id) {
  if (q.query.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query is empty; stream \"", id, "\" expects ", summary_dim,
        " floats ([indexed_layer][kv_head][head_dim])"));
  }
  if (q.query.size() % summary_dim != 0 ||
      q.query.size() / summary_dim > kMaxQueryVectors ||
      q.query.size() > kMaxQueryFloats) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query has ", q.query.size(), " floats; stream \"", id,
        "\" expects n x ", summary_dim,
        " (n query vectors of [indexed_layer][kv_head][head_dim], n in [1, ",
        std::min<uint64_t>(kMaxQueryVectors, kMaxQueryFloats / summary_dim),
        "]: at most ", kMaxQueryVectors, " vectors and ", kMaxQueryFloats,
        " floats)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRecallQuery(const RecallQuery& q,
                                 const StreamConfig& config,
                                 uint32_t summary_dim, const std::string& id,
                                 bool per_head_ok) {
  KVMEM_RETURN_IF_ERROR(CheckShape(q, summary_dim, id));
  const uint32_t vectors = static_cast<uint32_t>(q.query.size() / summary_dim);
  const uint32_t heads = summary_dim / config.geometry.head_dim;
  KVMEM_RETURN_IF_ERROR(CheckFinite("query", q.query));
  if (q.current_token_position > (uint64_t{1} << 63)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "current_token_position is ", q.current_token_position,
        "; must be at most 2^63 (frame positions are at most 2^62)"));
  }
  if (!q.window_lse.empty()) {
    if (q.window_lse.size() != static_cast<size_t>(vectors) * heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("window_lse has ", q.window_lse.size(), " floats; with ",
                       vectors, " query vector(s) stream \"", id, "\" expects ",
                       static_cast<size_t>(vectors) * heads,
                       " ([query vector][indexed_layer][kv_head]) or none"));
    }
    KVMEM_RETURN_IF_ERROR(CheckFinite("window_lse", q.window_lse));
  }
  KVMEM_RETURN_IF_ERROR(ValidateSignals("signals", q.signals));
  if (q.per_head && (q.per_layer || !per_head_ok)) {
    return absl::InvalidArgumentError(
        q.per_layer ? "per_head and per_layer are both set; ask for one"
                    : absl::StrCat("per_head needs score MASS (a scorer that "
                                   "answers per KV head); stream \"",
                                   id, "\" scores with \"",
                                   config.weights.scorer, "\""));
  }
  KVMEM_RETURN_IF_ERROR(CheckShare("budget.identity_share", q.identity_share));
  if (!(q.mass_target >= 0.0f && q.mass_target <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget.mass_target is ", q.mass_target, "; must be in [0, 1]"));
  }
  if (q.mass_target > 0 && config.weights.score != ScoreMode::kMass) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget.mass_target needs score MASS; stream \"", id,
                     "\" scores with \"", config.weights.scorer, "\""));
  }
  if (!(q.window_fraction >= 0.0f && q.window_fraction <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("budget.window_fraction is ",
                                                   q.window_fraction,
                                                   "; must be in [0, 1]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RecallBudget> ResolveBudget(const RecallQuery& q,
                                           const StreamConfig& config,
                                           uint32_t summary_dim) {
  RecallBudget b;
  b.top_k = q.top_k == 0 ? config.default_top_k : q.top_k;
  b.query_vectors = static_cast<uint32_t>(q.query.size() / summary_dim);
  if (q.max_tokens > 0) {
    b.tokens = q.max_tokens;
  } else if (q.window_fraction > 0) {
    b.tokens = std::max<uint32_t>(
        1, static_cast<uint32_t>(q.window_fraction * config.hot_window_tokens));
  } else {
    b.tokens = config.default_max_tokens;
  }
  if (b.top_k > kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat("budget.top_k is ", q.top_k,
                                                   "; must be at most ",
                                                   kMaxTopK, " (0: no cap)"));
  }
  if (b.tokens > kMaxRecallTokens) {
    // The value in force: the request's, or the stream's default.
    return absl::InvalidArgumentError(absl::StrCat(
        q.max_tokens != 0 ? "budget.max_tokens is "
                          : "the stream's recall_defaults.max_tokens is ",
        b.tokens, "; must be at most ", kMaxRecallTokens));
  }
  if (q.per_head || q.per_layer) {
    const uint32_t heads =
        summary_dim / std::max<uint32_t>(1, config.geometry.head_dim);
    const uint64_t sets =
        q.per_head ? heads
                   : heads / std::max<uint32_t>(1, config.geometry.kv_heads);
    if (sets * b.tokens > kMaxSetTokensPerRecall) {
      return absl::ResourceExhaustedError(absl::StrCat(
          q.per_head ? "per_head" : "per_layer", " recall would answer ", sets,
          " sets of up to ", b.tokens, " tokens each = ", sets * b.tokens,
          "; at most ", kMaxSetTokensPerRecall,
          " a recall: lower budget.max_tokens or index fewer layers"));
    }
  }
  return b;
}

std::vector<float> MeanQuery(const std::vector<float>& query, uint32_t dim) {
  const uint32_t vectors = static_cast<uint32_t>(query.size() / dim);
  std::vector<float> mean(query.begin(), query.begin() + dim);
  for (uint32_t j = 1; j < vectors; ++j) {
    Axpy(1.0f, query.data() + j * dim, mean.data(), dim);
  }
  if (vectors > 1) {
    for (float& x : mean) x /= static_cast<float>(vectors);
  }
  return mean;
}

}  // namespace kvmem

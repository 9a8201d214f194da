#include "engine/recall/summed_scorer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/timing.h"
#include "engine/recall/semantic_cache.h"
#include "engine/recall/track_candidates.h"
#include "engine/signals/semantics.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

float SummaryDot(const float* summary, const float* query, size_t dim) {
  double dot = 0;
  for (size_t i = 0; i < dim; ++i)
    dot += static_cast<double>(summary[i]) * query[i];
  return static_cast<float>(dot);
}

// The same over token groups (groups_per_block > 1), for the full summary.
std::vector<PlanUnit> GroupCandidates(const RecallView& view,
                                      const CandidateQuery& q,
                                      Accelerator& accel, CallCost* cost,
                                      uint32_t* search_us)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
  const auto t0 = SteadyClock::now();
  const StreamConfig& config = view.config();
  const RecallWeights& w = config.weights;
  const bool semantic = SemanticWeights(w);
  const BlockTable& blocks = view.blocks();
  const uint32_t dim = view.summary_dim();
  auto groups_of = [&](size_t b) {
    return blocks[b].rec.group_summaries.size() / dim;
  };
  std::unordered_map<uint64_t, float> scores;  // Group id -> inner product.
  if (q.eligible > 0 && q.top_k > 0) {
    // Groups of blocks in the window can outrank eligible ones: ask for
    // enough extra results that the pool of eligible groups survives.
    uint64_t window_groups = 0;
    for (size_t b = q.eligible; b < blocks.size(); ++b) {
      if (blocks[b].rec.disk != DiskForm::kNone) window_groups += groups_of(b);
    }
    const BlockIndex& index = *view.indexes().groups();
    const uint64_t eligible_groups = index.size() - window_groups;
    const uint64_t pool = static_cast<uint64_t>(q.top_k) *
                          config.groups_per_block * (semantic ? 2 : 1);
    const uint32_t k = static_cast<uint32_t>(
        std::min<uint64_t>(pool, eligible_groups) + window_groups);
    for (const ScoredId& h :
         accel.Search(index, q.vector, {k, q.priority}, cost)) {
      if (h.id / kGroupStride < q.eligible) scores.emplace(h.id, h.score);
    }
  }
  if (search_us != nullptr) *search_us = WholeMicrosSince(t0);
  for (size_t b : TrackCandidates(view, *q.signals, q.eligible)) {
    for (size_t g = 0; g < groups_of(b); ++g) {
      const uint64_t gid = b * kGroupStride + g;
      if (scores.count(gid)) continue;
      scores.emplace(gid,
                     SummaryDot(blocks[b].rec.group_summaries.data() + g * dim,
                                q.vector, dim));
    }
  }
  // Each group with its block's semantic match.
  SemanticCache sem(semantic, [&](uint64_t b) {
    return SemanticScore(MatchSignals(blocks[b].rec, *q.signals), w);
  });
  std::vector<PlanUnit> units;
  units.reserve(scores.size());
  for (const auto& [gid, score] : scores) {
    const uint64_t b = gid / kGroupStride;
    const uint32_t g = static_cast<uint32_t>(gid % kGroupStride);
    units.push_back(
        {b, g, view.UnitTokens(b, g), score, semantic ? sem.Get(b) : 0.0f});
  }
  return units;
}

class SummedScorer final : public RecallScorer {
 public:
  const std::string& name() const override { return name_; }
  bool wants_layer_indexes() const override { return true; }

  absl::Status Score(const RecallView& view, const ScoreRequest& req,
                     ScoredRecall* out, CallCost* cost) const override
      ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
    const StreamConfig& config = view.config();
    const RecallQuery& query = *req.query;
    out->policy = SummedPolicy(config);
    out->policy.max_tokens = req.budget.tokens;
    // Without a cap on blocks, SUMMED asks the index for the budget's worth
    // (every block holds a token at least).
    out->policy.top_k = req.budget.top_k > 0
                            ? req.budget.top_k
                            : std::min<uint32_t>(req.budget.tokens, kMaxTopK);
    // The best by priority, at most top_k of them (whole blocks).
    auto best_blocks = [&](std::vector<PlanUnit> units) {
      KeepBestBlocks(out->policy, out->policy.top_k, &units);
      return units;
    };
    CandidateQuery q;
    q.signals = &query.signals;
    q.eligible = req.eligible;
    q.top_k = out->policy.top_k;
    q.priority = query.priority;
    const float* mean = req.mean_query->data();
    if (query.per_layer) {
      out->layer_sets = true;
      for (size_t li = 0; li < config.indexed_layers.size(); ++li) {
        q.vector = mean + li * view.layer_dim();
        q.offset = li * view.layer_dim();
        q.dim = view.layer_dim();
        uint32_t us = 0;
        ScoredSet& set = out->sets.emplace_back();
        set.layer = config.indexed_layers[li];
        set.ranked = best_blocks(SummedBlockCandidates(
            view, view.indexes().layer(li), q, *req.accel, cost, &us));
        out->search_us += us;
      }
      return absl::OkStatus();
    }
    q.vector = mean;
    q.dim = view.summary_dim();
    ScoredSet& set = out->sets.emplace_back();
    if (view.indexes().groups() != nullptr) {
      out->group_units = true;
      set.ranked = GroupCandidates(view, q, *req.accel, cost, &out->search_us);
      RecallPlanner(out->policy).Rank(&set.ranked);
    } else {
      set.ranked = best_blocks(SummedBlockCandidates(
          view, view.indexes().all(), q, *req.accel, cost, &out->search_us));
    }
    return absl::OkStatus();
  }

 private:
  const std::string name_{kSummedScorer};
};

}  // namespace

std::unique_ptr<RecallScorer> NewSummedScorer() {
  return std::make_unique<SummedScorer>();
}

PlanPolicy SummedPolicy(const StreamConfig& config) {
  PlanPolicy policy;
  policy.mode = ScoreMode::kSummed;
  policy.model_scale = config.weights.model /
                       std::sqrt(static_cast<float>(config.geometry.head_dim));
  policy.gate_temperature = config.gate_temperature;
  return policy;
}

void KeepBestBlocks(const PlanPolicy& policy, uint32_t top_k,
                    std::vector<PlanUnit>* units) {
  RecallPlanner(policy).Rank(units);
  if (units->size() > top_k) units->resize(top_k);
}

std::vector<PlanUnit> SummedBlockCandidates(const RecallView& view,
                                            const BlockIndex& index,
                                            const CandidateQuery& q,
                                            Accelerator& accel, CallCost* cost,
                                            uint32_t* search_us) {
  const auto t0 = SteadyClock::now();
  const RecallWeights& w = view.config().weights;
  const bool semantic = SemanticWeights(w);
  const BlockTable& blocks = view.blocks();
  std::unordered_map<uint64_t, float> scores;  // id -> inner product
  if (q.eligible > 0 && q.top_k > 0) {
    // Blocks in the window can outrank eligible ones: ask for enough extra
    // results that top_k eligible ones survive the filter. With semantic
    // weights, a wider model pool lets them reorder it.
    const uint64_t pool = static_cast<uint64_t>(q.top_k) * (semantic ? 4 : 1);
    const uint32_t k = static_cast<uint32_t>(
        std::min<uint64_t>(pool, q.eligible) + (blocks.size() - q.eligible));
    for (const ScoredId& h :
         accel.Search(index, q.vector, {k, q.priority}, cost)) {
      if (h.id < q.eligible) scores.emplace(h.id, h.score);
    }
  }
  if (search_us != nullptr) *search_us = WholeMicrosSince(t0);
  for (size_t b : TrackCandidates(view, *q.signals, q.eligible)) {
    if (scores.count(b)) continue;
    scores.emplace(b, SummaryDot(blocks[b].rec.summary.data() + q.offset,
                                 q.vector, q.dim));
  }
  std::vector<PlanUnit> units;
  units.reserve(scores.size());
  for (const auto& [id, score] : scores) {
    const BlockRecord& rec = blocks[id].rec;
    units.push_back(
        {id, 0, rec.info.token_count, score,
         semantic ? SemanticScore(MatchSignals(rec, *q.signals), w) : 0.0f});
  }
  return units;
}

}  // namespace kvmem

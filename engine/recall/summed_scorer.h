// Score SUMMED ("summed"): kvmem before per-head scoring, kept for
// comparison. Candidates come from the index (the mean query's inner
// product with each summary: raw logits summed over layers and heads) and
// from the query's track ids (the semantic signal); each is ranked by
//   priority = model_weight * score / sqrt(head_dim) + semantic
// and the plan takes the best by priority (at most top_k blocks when set),
// then fills the token budget. With per_layer, one set per indexed layer
// from that layer's index; with token groups, units are groups.
#ifndef KVMEM_ENGINE_RECALL_SUMMED_SCORER_H_
#define KVMEM_ENGINE_RECALL_SUMMED_SCORER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/accel/accelerator.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/scorer.h"
#include "engine/view/recall_view.h"

namespace kvmem {

std::unique_ptr<RecallScorer> NewSummedScorer();

// One query vector's SUMMED candidates against one index.
struct CandidateQuery {
  const float* vector = nullptr;  // dim floats.
  // The dims of each block summary the index holds: [offset, offset + dim).
  size_t offset = 0;
  size_t dim = 0;
  const FrameSignals* signals = nullptr;
  size_t eligible = 0;    // Blocks [0, eligible) may be candidates.
  uint32_t top_k = 0;     // How many eligible ones the index is asked for.
  uint32_t priority = 0;  // The accelerator's queue priority.
};

// The index's best eligible blocks and the query's track candidates, each
// with its inner product and (when semantic weights are on) semantic
// score; whole blocks (group 0). The search's cost into *cost, its time
// into *search_us (optional).
std::vector<PlanUnit> SummedBlockCandidates(const RecallView& view,
                                            const BlockIndex& index,
                                            const CandidateQuery& q,
                                            Accelerator& accel, CallCost* cost,
                                            uint32_t* search_us)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// The planner policy SUMMED ranks by, for the stream's weights.
PlanPolicy SummedPolicy(const StreamConfig& config);

// SUMMED's whole-block choice: *units ranked by `policy`, the best `top_k`
// kept (what the recall and prefetch staging take).
void KeepBestBlocks(const PlanPolicy& policy, uint32_t top_k,
                    std::vector<PlanUnit>* units);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_SUMMED_SCORER_H_

// One recall of one stream, start to end: the query is validated and its
// budget resolved, then, under the view's shared lock, the eligible blocks
// (those wholly before the hot window) are found, the stream's scorer
// scores them (engine/recall/scorer.h), the planner fills each set's
// budget (engine/recall/recall_planner.h), and the plans become the answer's
// recalled blocks; after the lock, the accelerator's cost of staging the
// chosen KV is added. What the stream does with the result (feedback,
// totals, latency) is its own.
//
// Thread safety: safe from any thread; takes view.mu() shared.
#ifndef KVMEM_ENGINE_RECALL_RECALLER_H_
#define KVMEM_ENGINE_RECALL_RECALLER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/accel/accelerator.h"
#include "engine/recall/scorer.h"
#include "engine/types.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// The recall set for q (INVALID_ARGUMENT for a query the stream cannot
// answer, NOT_FOUND for a deleted stream, the scorer's errors), and in
// *now_frame the newest frame it saw; the scorer may use `helpers`.
absl::StatusOr<RecallResult> AnswerRecall(
    const RecallView& view, const RecallScorer& scorer, Accelerator& accel,
    const RecallQuery& q, uint64_t* now_frame,
    const RecallHelpers& helpers = {}) ABSL_LOCKS_EXCLUDED(view.mu());

// "" or why the index's sampled recall (samples searches, recall@k
// `recall`) breaks the accelerator's floor; a few samples first.
std::string RecallFloorWarning(const RecallView& view, const Accelerator& accel,
                               uint64_t samples, double recall);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALLER_H_

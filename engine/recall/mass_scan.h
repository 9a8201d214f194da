// Score MASS's scans: every unit's per-head dots with each query vector,
// from the index (ScanSegments: int8 with proven bounds on Progressive,
// exact on Flat) or, for indexes that cannot scan, exactly over a pool of
// candidates; and one unit's exact dots. Call under the view's lock.
#ifndef KVMEM_ENGINE_RECALL_MASS_SCAN_H_
#define KVMEM_ENGINE_RECALL_MASS_SCAN_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/index/block_index.h"
#include "engine/recall/scorer.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// Exact per-head dots of a unit's summary with each of the `vectors` query
// vectors: out[vector * heads + head].
void UnitDots(const RecallView& view, uint64_t unit, const float* query,
              uint32_t vectors, float* out)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// The index's scan of every unit per query vector (or, for indexes that
// cannot scan, the index's top results for the mean query plus the hot
// window's units, scored exactly from their summaries), into *scans; `mode`
// what the caller needs of the int8 scan (bounds to prove by, or ranks).
void ScanUnits(const RecallView& view, const ScoreRequest& req, ScanMode mode,
               CallCost* cost, std::vector<SegmentScan>* scans)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_MASS_SCAN_H_

// The semantic signal's candidates: the recent blocks that show a query's
// tracks, which a recall scores beside the index's best.
//
// Pure functions of the view; REQUIRES the view's lock held (shared).
#ifndef KVMEM_ENGINE_RECALL_TRACK_CANDIDATES_H_
#define KVMEM_ENGINE_RECALL_TRACK_CANDIDATES_H_

#include <cstddef>
#include <vector>

#include "engine/types.h"
#include "engine/view/recall_view.h"

namespace kvmem {

// How many recent blocks per query track become semantic candidates.
inline constexpr size_t kBlocksPerTrack = 64;

// Recent eligible (id < eligible), non-evicted blocks that show the query's
// tracks, at most kBlocksPerTrack per track, newest first per track, when
// the stream's track or IoU weight is on; else none.
std::vector<size_t> TrackCandidates(const RecallView& view,
                                    const FrameSignals& signals,
                                    size_t eligible)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// The recallable blocks (id < eligible, kept, not evicted) that show track
// track_id, newest first, at most `limit`.
std::vector<uint64_t> RecentTrackBlocks(const RecallView& view,
                                        uint64_t track_id, size_t eligible,
                                        size_t limit)
    ABSL_SHARED_LOCKS_REQUIRED(view.mu());

// Whether any semantic weight (track, IoU, scene) is on.
bool SemanticWeights(const RecallWeights& w);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_TRACK_CANDIDATES_H_

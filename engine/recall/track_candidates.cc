#include "engine/recall/track_candidates.h"

namespace kvmem {

bool SemanticWeights(const RecallWeights& w) {
  return w.track > 0 || w.iou > 0 || w.scene > 0;
}

std::vector<uint64_t> RecentTrackBlocks(const RecallView& view,
                                        uint64_t track_id, size_t eligible,
                                        size_t limit) {
  std::vector<uint64_t> out;
  const std::vector<uint64_t>* shown = view.TrackBlocks(track_id);
  if (shown == nullptr) return out;
  const BlockTable& blocks = view.blocks();
  for (auto b = shown->rbegin(); b != shown->rend() && out.size() < limit;
       ++b) {
    if (*b < eligible && blocks.Has(*b) &&
        blocks[*b].rec.disk != DiskForm::kNone) {
      out.push_back(*b);
    }
  }
  return out;
}

std::vector<size_t> TrackCandidates(const RecallView& view,
                                    const FrameSignals& signals,
                                    size_t eligible) {
  std::vector<size_t> out;
  const RecallWeights& w = view.config().weights;
  if ((w.track <= 0 && w.iou <= 0) || eligible == 0) return out;
  for (const Detection& d : signals.detections) {
    for (uint64_t b :
         RecentTrackBlocks(view, d.track_id, eligible, kBlocksPerTrack)) {
      out.push_back(b);
    }
  }
  return out;
}

}  // namespace kvmem

#include "engine/recall/track_candidates.h"

namespace kvmem {

bool SemanticWeights(const RecallWeights& w) {
  return w.track > 0 || w.iou > 0 || w.scene > 0;
}

std::vector<size_t> TrackCandidates(const RecallView& view,
                                    const FrameSignals& signals,
                                    size_t eligible) {
  std::vector<size_t> out;
  const RecallWeights& w = view.config().weights;
  if ((w.track <= 0 && w.iou <= 0) || eligible == 0) return out;
  const BlockTable& blocks = view.blocks();
  for (const Detection& d : signals.detections) {
    const std::vector<uint64_t>* shown = view.TrackBlocks(d.track_id);
    if (shown == nullptr) continue;
    size_t taken = 0;
    for (auto b = shown->rbegin();
         b != shown->rend() && taken < kBlocksPerTrack; ++b) {
      if (*b >= eligible || !blocks.Has(*b) ||
          blocks[*b].rec.disk == DiskForm::kNone) {
        continue;
      }
      ++taken;
      out.push_back(*b);
    }
  }
  return out;
}

}  // namespace kvmem

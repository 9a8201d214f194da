#include "engine/signals/semantics.h"

#include <algorithm>
#include <cmath>

namespace kvmem {

void BlockSemanticsBuilder::AddFrame(uint64_t frame_index,
                                     const FrameSignals& signals) {
  for (const Detection& d : signals.detections) {
    auto [it, inserted] = tracks_.try_emplace(d.track_id);
    TrackPresence& t = it->second;
    if (inserted) {
      t.track_id = d.track_id;
      t.first_frame = frame_index;
    }
    // Several detections of one track in a frame count once.
    if (inserted || t.last_frame != frame_index) t.frames += 1;
    t.last_frame = frame_index;
    t.box[0] = d.x_min;
    t.box[1] = d.y_min;
    t.box[2] = d.x_max;
    t.box[3] = d.y_max;
  }
  if (signals.scene_embedding.empty()) return;
  if (scene_sum_.empty() && scene_frames_ == 0) {
    scene_sum_.assign(signals.scene_embedding.size(), 0.0);
  }
  if (scene_sum_.size() != signals.scene_embedding.size()) {
    scene_mismatch_ = true;
    return;
  }
  for (size_t i = 0; i < scene_sum_.size(); ++i) {
    scene_sum_[i] += signals.scene_embedding[i];
  }
  ++scene_frames_;
}

std::vector<TrackPresence> BlockSemanticsBuilder::Tracks() const {
  std::vector<TrackPresence> out;
  out.reserve(tracks_.size());
  for (const auto& [id, t] : tracks_) out.push_back(t);
  return out;
}

std::vector<float> BlockSemanticsBuilder::SceneMean() const {
  if (scene_frames_ == 0 || scene_mismatch_) return {};
  std::vector<float> mean(scene_sum_.size());
  for (size_t i = 0; i < mean.size(); ++i) {
    mean[i] = static_cast<float>(scene_sum_[i] / scene_frames_);
  }
  return mean;
}

void BlockSemanticsBuilder::Reset() {
  tracks_.clear();
  scene_sum_.clear();
  scene_frames_ = 0;
  scene_mismatch_ = false;
}

float BoxIoU(const float a[4], const float b[4]) {
  const float ix = std::max(0.0f, std::min(a[2], b[2]) - std::max(a[0], b[0]));
  const float iy = std::max(0.0f, std::min(a[3], b[3]) - std::max(a[1], b[1]));
  const float inter = ix * iy;
  const float area_a = (a[2] - a[0]) * (a[3] - a[1]);
  const float area_b = (b[2] - b[0]) * (b[3] - b[1]);
  const float uni = area_a + area_b - inter;
  return uni > 0 ? inter / uni : 0.0f;
}

float Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.empty() || a.size() != b.size()) return 0.0f;
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  if (na == 0 || nb == 0) return 0.0f;
  return static_cast<float>(dot / std::sqrt(na * nb));
}

SemanticMatch MatchSignals(const BlockRecord& block,
                           const FrameSignals& query) {
  SemanticMatch m;
  if (!query.detections.empty() && !block.tracks.empty()) {
    size_t present = 0;
    for (const Detection& d : query.detections) {
      auto it = std::lower_bound(
          block.tracks.begin(), block.tracks.end(), d.track_id,
          [](const TrackPresence& t, uint64_t id) { return t.track_id < id; });
      if (it == block.tracks.end() || it->track_id != d.track_id) continue;
      ++present;
      const float box[4] = {d.x_min, d.y_min, d.x_max, d.y_max};
      m.iou = std::max(m.iou, BoxIoU(box, it->box));
    }
    m.tracks = static_cast<float>(present) / query.detections.size();
  }
  m.scene = std::max(0.0f, Cosine(block.scene, query.scene_embedding));
  return m;
}

float SemanticScore(const SemanticMatch& m, const RecallWeights& w) {
  return w.track * m.tracks + w.iou * m.iou + w.scene * m.scene;
}

}  // namespace kvmem

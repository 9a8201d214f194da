#include "engine/signals/frame_signals.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvmem {

absl::Status CheckFinite(absl::string_view field, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(std::fabs(v[i]) <= kMaxInputMagnitude)) {  // NaN fails too.
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is ", v[i],
                       "; must be finite and in [-65536, 65536]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSignals(absl::string_view field, const FrameSignals& s) {
  if (s.detections.size() > kMaxDetections) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".detections has ", s.detections.size(),
                     " entries; at most ", kMaxDetections));
  }
  for (size_t i = 0; i < s.detections.size(); ++i) {
    const Detection& d = s.detections[i];
    const float coords[] = {d.x_min, d.y_min, d.x_max, d.y_max};
    for (float c : coords) {
      if (!(c >= 0.0f && c <= 1.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".detections[", i,
                                                       "] box coordinate ", c,
                                                       " is outside [0, 1]"));
      }
    }
    if (d.x_min > d.x_max || d.y_min > d.y_max) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".detections[", i, "] box has min > max"));
    }
    if (!(std::fabs(d.score) <= kMaxInputMagnitude)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".detections[", i, "].score is ", d.score,
                       "; must be finite and in [-65536, 65536]"));
    }
  }
  if (s.scene_embedding.size() > kMaxSceneEmbeddingDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".scene_embedding has ", s.scene_embedding.size(),
                     " values; at most ", kMaxSceneEmbeddingDim));
  }
  return CheckFinite(absl::StrCat(field, ".scene_embedding"),
                     s.scene_embedding);
}

}  // namespace kvmem

// Validation of the semantic signals a front end sends with frames and
// queries. Pure functions.
#ifndef KVMEM_ENGINE_SIGNALS_H_
#define KVMEM_ENGINE_SIGNALS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

inline constexpr size_t kMaxDetections = 1024;
inline constexpr size_t kMaxSceneEmbeddingDim = 8192;

// INVALID_ARGUMENT naming `field` and the index when a value is NaN or Inf.
absl::Status CheckFinite(absl::string_view field, const std::vector<float>& v);

// Boxes within [0, 1] with min <= max, finite scores, bounded counts.
// `field` prefixes messages, e.g. "frame.signals".
absl::Status ValidateSignals(absl::string_view field, const FrameSignals& s);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_SIGNALS_H_

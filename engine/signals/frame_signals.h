// Validation of the semantic signals a front end sends with frames and
// queries. Pure functions.
#ifndef KVMEM_ENGINE_SIGNALS_FRAME_SIGNALS_H_
#define KVMEM_ENGINE_SIGNALS_FRAME_SIGNALS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

inline constexpr size_t kMaxDetections = 1024;
inline constexpr size_t kMaxSceneEmbeddingDim = 8192;

// The largest magnitude of any float a client sends (keys, queries,
// window_lse, scene embeddings, detection scores): 2^16, just above the
// largest finite FP16. Products of two such values summed over 65536
// dimensions stay below 2^48, so every score and gate is finite.
inline constexpr float kMaxInputMagnitude = 65536.0f;

// INVALID_ARGUMENT naming `field` and the index when a value is NaN, Inf or
// of magnitude above kMaxInputMagnitude.
absl::Status CheckFinite(absl::string_view field, const std::vector<float>& v);

// Boxes within [0, 1] with min <= max, finite scores, bounded counts.
// `field` prefixes messages, e.g. "frame.signals".
absl::Status ValidateSignals(absl::string_view field, const FrameSignals& s);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_SIGNALS_FRAME_SIGNALS_H_

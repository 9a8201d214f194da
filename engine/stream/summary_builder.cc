#include "engine/stream/summary_builder.h"

#include <algorithm>

#include "engine/stream_config.h"

namespace kvmem {

SummaryBuilder::SummaryBuilder(const StreamConfig& config)
    : geometry_(config.geometry),
      layers_(EffectiveIndexedLayers(config)),
      sums_(static_cast<size_t>(SummaryDim(config)), 0.0) {}

void SummaryBuilder::AddFrame(absl::string_view payload, uint32_t token_count) {
  const Geometry& g = geometry_;
  const size_t width = DTypeBytes(g.dtype);
  const uint64_t slice_bytes = LayerSliceElements(g, token_count) * width;
  const uint64_t row_bytes = static_cast<uint64_t>(g.head_dim) * width;
  const auto* base = reinterpret_cast<const uint8_t*>(payload.data());
  for (size_t li = 0; li < layers_.size(); ++li) {
    // Layer l's K slice starts after l full (K, V) pairs.
    const uint8_t* k = base + 2 * slice_bytes * layers_[li];
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      double* acc = sums_.data() +
                    (li * static_cast<size_t>(g.kv_heads) + h) * g.head_dim;
      const uint8_t* head =
          k + static_cast<uint64_t>(h) * token_count * row_bytes;
      for (uint32_t t = 0; t < token_count; ++t) {
        AccumulateAsFloat(head + t * row_bytes, g.head_dim, g.dtype, acc);
      }
    }
  }
  tokens_ += token_count;
}

std::vector<float> SummaryBuilder::Mean() const {
  std::vector<float> mean(sums_.size(), 0.0f);
  if (tokens_ == 0) return mean;
  const double inv = 1.0 / static_cast<double>(tokens_);
  for (size_t i = 0; i < sums_.size(); ++i) {
    mean[i] = static_cast<float>(sums_[i] * inv);
  }
  return mean;
}

void SummaryBuilder::Reset() {
  std::fill(sums_.begin(), sums_.end(), 0.0);
  tokens_ = 0;
}

}  // namespace kvmem

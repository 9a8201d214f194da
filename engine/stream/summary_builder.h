// SummaryBuilder: accumulates the keys of an unsealed block and produces its
// summary, the mean key over the block's tokens for each indexed layer,
// laid out [indexed_layer][kv_head][head_dim] in fp32. Sums are kept in double
// so the mean does not depend on how tokens were split into frames.
//
// Thread safety: none; a value type owned by one Stream's append path.
#ifndef KVMEM_ENGINE_STREAM_SUMMARY_BUILDER_H_
#define KVMEM_ENGINE_STREAM_SUMMARY_BUILDER_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

class SummaryBuilder {
 public:
  // REQUIRES: config passed ValidateStreamConfig.
  explicit SummaryBuilder(const StreamConfig& config);

  // Adds the keys of a frame. REQUIRES: payload is the frame's full payload
  // for token_count tokens.
  void AddFrame(absl::string_view payload, uint32_t token_count);

  // The mean key so far (zeros when no token was added).
  std::vector<float> Mean() const;

  uint64_t tokens() const { return tokens_; }
  void Reset();

 private:
  Geometry geometry_;
  std::vector<uint32_t> layers_;
  std::vector<double> sums_;  // [indexed_layer][kv_head][head_dim]
  uint64_t tokens_ = 0;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_SUMMARY_BUILDER_H_

// Encoding of the records the engine keeps in the ColdStore: stream configs,
// stream states and block records. A small versioned little-endian format;
// decoders reject truncated or trailing bytes with DATA_LOSS.
#ifndef KVMEM_ENGINE_RECORD_CODEC_H_
#define KVMEM_ENGINE_RECORD_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

// Durable progress of a stream, committed with every frame.
struct StreamState {
  bool closed = false;
  int64_t last_frame = -1;  // Last durable frame, -1 when none.
  uint64_t next_token_position =
      0;  // Earliest position the next frame may use.
  uint64_t frames = 0;
  uint64_t tokens = 0;
  uint64_t payload_bytes = 0;
  uint64_t next_block_id = 0;
  uint64_t open_block_first_frame = 0;  // First frame of the unsealed block.
  uint32_t open_block_frames = 0;
  uint64_t open_block_first_position = 0;
  uint32_t open_block_tokens = 0;
  uint64_t open_block_payload_bytes = 0;
};

struct BlockRecord {
  BlockInfo info;
  std::vector<float> summary;
};

std::string EncodeConfig(const StreamConfig& config);
absl::StatusOr<StreamConfig> DecodeConfig(absl::string_view bytes);

std::string EncodeState(const StreamState& state);
absl::StatusOr<StreamState> DecodeState(absl::string_view bytes);

std::string EncodeBlock(const BlockRecord& block);
absl::StatusOr<BlockRecord> DecodeBlock(absl::string_view bytes);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECORD_CODEC_H_

// Encoding of the records the engine keeps in the ColdStore: stream configs,
// stream states and block records. A small versioned little-endian format;
// decoders reject truncated or trailing bytes with DATA_LOSS.
#ifndef KVMEM_ENGINE_CODEC_RECORD_CODEC_H_
#define KVMEM_ENGINE_CODEC_RECORD_CODEC_H_

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
  // Length of the stream's scene embeddings (0: none yet). Written last;
  // records without it (older versions) read as 0.
  uint32_t scene_dim = 0;
  // Tokens per part of the stream's stored frames (engine/codec/
  // frame_parts.h), fixed when the stream is created; 0: frames stored
  // whole, as appended (streams from before parts). Written after
  // scene_dim; records without it read as 0.
  uint32_t frame_part_tokens = 0;
};

// Where a block's KV lives on disk.
enum class DiskForm : uint8_t {
  kFrames = 0,  // As its frames' records (not yet demoted, or demoted
                // with EngineOptions::demote_keeps_frames).
  kFull = 1,    // Per-layer records, full precision.
  kInt8 = 2,    // Per-layer records, int8 per-channel (degraded).
  kNone = 3,    // Evicted.
  kInt4 = 4,    // Per-layer records, int4 (ColdPrecision::kInt4, KIVI-style:
                // keys per channel, values per token); degraded.
};

// A track seen in a block: how many of its frames, when, and its last box.
struct TrackPresence {
  uint64_t track_id = 0;
  uint32_t frames = 0;
  uint64_t first_frame = 0;
  uint64_t last_frame = 0;
  float box[4] = {0, 0, 0, 0};  // x_min, y_min, x_max, y_max
};

struct BlockRecord {
  BlockInfo info;
  DiskForm disk = DiskForm::kFrames;
  std::vector<uint32_t> frame_tokens;  // Token count of each frame, in order.
  std::vector<float> summary;
  // Token groups (groups_per_block > 1): [group][summary_dim] mean keys and
  // each token's group; empty otherwise.
  std::vector<float> group_summaries;
  std::vector<uint8_t> token_group;
  // Token codes (with token groups): every token's int4 keys of the indexed
  // layers, engine/index/token_codes.h, in group order (TokenGroups::codes);
  // empty for records from before them and for evicted blocks.
  std::string token_codes;
  std::vector<TrackPresence> tracks;  // Sorted by track_id.
  std::vector<float> scene;           // Mean scene embedding (may be empty).
  uint64_t last_access_frame = 0;     // Sealed or last recalled.
  float hits = 0;                     // Recall hits, decayed to last_hit_frame.
  uint64_t last_hit_frame = 0;
  // The record a seal logged while its token groups (group_summaries,
  // token_group, token_codes: ~13 MB of a 7B block's 13.3) went to the
  // store outside its write-ahead log (StreamWrite::block_stand_ins): a crash
  // before the store flushed them leaves this stand-in, and recovery builds
  // the groups again from the block's frames (Stream::CompleteRecords).
  bool groups_pending = false;
};

std::string EncodeConfig(const StreamConfig& config);
absl::StatusOr<StreamConfig> DecodeConfig(absl::string_view bytes);

std::string EncodeState(const StreamState& state);
absl::StatusOr<StreamState> DecodeState(absl::string_view bytes);

// A frame's signals, stored beside its payload (replayed on recovery).
std::string EncodeSignals(const FrameSignals& signals);
absl::StatusOr<FrameSignals> DecodeSignals(absl::string_view bytes);

std::string EncodeBlock(const BlockRecord& block);
// The record without its token groups, marked groups_pending: the stand-in
// a seal logs for `block` (StreamWrite::block_stand_ins).
std::string EncodeBlockStandIn(const BlockRecord& block);
absl::StatusOr<BlockRecord> DecodeBlock(absl::string_view bytes);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_RECORD_CODEC_H_

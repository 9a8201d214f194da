// BlockReader: a stream's blocks as readers get them, from whatever tier
// holds them: metadata, payloads in either layout (pieces that point into
// the bytes where they are, or one copy into a caller's buffer), and the
// warm copy or layer records of a block loaded from the store (tier moves
// and recovery use these). A read is consistent with one generation of the
// block: a tier move that overlaps it makes it read again.
//
// Thread safety: all methods are safe to call concurrently with each other,
// with recalls and with tier moves; they take the view's lock shared and
// never hold it across storage reads.
#ifndef KVMEM_ENGINE_TIERS_BLOCK_READER_H_
#define KVMEM_ENGINE_TIERS_BLOCK_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/codec/block_layout.h"
#include "engine/codec/record_codec.h"
#include "engine/types.h"
#include "engine/view/recall_view.h"
#include "storage/cold_store.h"

namespace kvmem {

class BlockReader {
 public:
  // REQUIRES: view and store outlive the reader.
  BlockReader(const RecallView& view, ColdStore* store)
      : view_(view), store_(store) {}

  // What StreamHandle (engine/memory_engine.h) lends; documented there.
  absl::StatusOr<BlockInfo> GetBlock(uint64_t block_id) const
      ABSL_LOCKS_EXCLUDED(view_.mu());
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockPayload(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, BlockInfo* info) const
      ABSL_LOCKS_EXCLUDED(view_.mu());
  absl::StatusOr<uint64_t> ReadBlockPayloadInto(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info) const ABSL_LOCKS_EXCLUDED(view_.mu());
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockTokens(
      uint64_t block_id, const std::vector<uint32_t>& tokens,
      const std::vector<uint32_t>& layers, BlockInfo* info) const
      ABSL_LOCKS_EXCLUDED(view_.mu());
  absl::StatusOr<uint64_t> ReadBlockTokensInto(
      uint64_t block_id, const std::vector<uint32_t>& tokens,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info) const ABSL_LOCKS_EXCLUDED(view_.mu());

  // A block's warm (layer-major) copy from its durable form (frames, or
  // layer records, dequantised when degraded); NOT_FOUND when evicted.
  // Takes no lock: rec is the caller's copy.
  absl::StatusOr<std::unique_ptr<WarmBlock>> Load(const BlockRecord& rec) const;
  // The frames a block kept as frames (DiskForm::kFrames) was sealed from,
  // in order: whole frames as appended, or where frames are stored in parts
  // their parts, each laid out as a frame of its tokens; (*tokens)[i] is
  // piece i's token count. Takes no lock.
  absl::Status ReadFrames(const BlockRecord& rec,
                          std::vector<std::string>* pieces,
                          std::vector<uint32_t>* tokens) const;
  // The stored records (K then V, full precision) of the given layers of a
  // block kept as layers (kFull or kInt8, dequantised). No lock.
  absl::StatusOr<std::vector<std::string>> LoadLayerRecords(
      const BlockRecord& rec, const std::vector<uint32_t>& layers) const;

 private:
  // A block as one read sees it: in RAM, or (BLOCK_LAYER_MAJOR of a block
  // stored as layers) only the wanted layers' records, or (tokens of a
  // block stored as frames) only the frames holding them, straight from the
  // store; either way consistent with one generation of the block.
  struct Snapshot {
    BlockRecord rec;  // Its card: info, disk form, frame_tokens; no more.
    BlockInfo info;   // Tier as of the read.
    std::shared_ptr<const WarmBlock> warm;  // Set, or
    std::vector<std::string> records;       // one per wanted layer, or
    // pieces of the block's frames (whole frames, or parts of them: frame
    // layout, each of piece_tokens[i] tokens from block offset
    // piece_first[i]), ascending and apart.
    std::vector<std::string> pieces;
    std::vector<uint32_t> piece_first, piece_tokens;
  };
  // `tokens`, when given, are the offsets a token read wants (a block kept
  // as frames is then read as the frames holding them).
  absl::StatusOr<Snapshot> SnapshotBlock(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& wanted,
      const std::vector<uint32_t>* tokens = nullptr) const
      ABSL_LOCKS_EXCLUDED(view_.mu());
  // Fills snap->pieces with what of snap->rec (kept as frames) holds
  // `tokens` (all of them when empty): the frames holding them, or with
  // frames stored in parts only the parts (block_reader_frames.cc).
  absl::Status LoadTokenFrames(const std::vector<uint32_t>& tokens,
                               Snapshot* snap) const;
  // DATA_LOSS unless each of snap.pieces has its tokens' bytes.
  absl::Status CheckPieceSizes(const Snapshot& snap) const;
  // DATA_LOSS unless the frames read for rec have its frames' sizes.
  static absl::Status CheckFrameSizes(const BlockRecord& rec,
                                      const std::vector<std::string>& frames,
                                      const Geometry& g);
  // K and V (slice bytes each) of the snapshot's layer wanted[i]: from the
  // warm block, or the halves of records[i].
  static std::pair<absl::string_view, absl::string_view> LayerSlices(
      const Snapshot& snap, const std::vector<uint32_t>& wanted, size_t i,
      size_t slice);
  // The rows of `tokens` (checked) of the snapshot's `wanted` layers into
  // dst (capacity bytes, else OUT_OF_RANGE), with streaming stores; from
  // snap.pieces when the snapshot holds frames.
  absl::StatusOr<uint64_t> GatherTokens(const Snapshot& snap,
                                        const std::vector<uint32_t>& tokens,
                                        const std::vector<uint32_t>& wanted,
                                        uint8_t* dst, uint64_t capacity) const;
  absl::Status GatherFromFrames(const Snapshot& snap,
                                const std::vector<uint32_t>& tokens,
                                const std::vector<uint32_t>& wanted,
                                uint8_t* dst) const;
  // layers, or every layer when empty; INVALID_ARGUMENT for one out of range.
  absl::StatusOr<std::vector<uint32_t>> WantedLayers(
      const std::vector<uint32_t>& layers) const;
  // NOT_FOUND when the stream is deleted.
  absl::Status NotFoundIfDeleted() const ABSL_LOCKS_EXCLUDED(view_.mu());

  const RecallView& view_;
  ColdStore* const store_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_TIERS_BLOCK_READER_H_

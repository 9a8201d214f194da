// RecallView: a stream's read model, everything a recall, a block read or a
// stats call sees of the stream, under one reader-writer lock: its durable
// state (StreamState), whether it is deleted, the sealed blocks
// (BlockTable: records, RAM copies, generations), the summary indexes, the
// token count of every recall unit, which blocks show each track, and the
// open block's mean key (score MASS's window estimate).
//
// The writers are the stream's append path and tier moves (serialised by
// the stream's append lock): they change the view in short exclusive
// sections, never across storage I/O. Readers (recall, reads, stats) take
// mu() shared and see one consistent state; a recall never waits for a
// commit.
//
//   kvmem::ReaderMutexLock lock(&view.mu());
//   const size_t eligible = view.EligibleBlocks(window_end);
//   for (const BlockEntry& e : view.blocks()) ...
//
// Thread safety: every accessor states the lock it needs (clang's
// -Wthread-safety checks them, tests/layers/thread_safety_selftest.sh);
// methods without a lock annotation take what they need themselves.
#ifndef KVMEM_ENGINE_VIEW_RECALL_VIEW_H_
#define KVMEM_ENGINE_VIEW_RECALL_VIEW_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "base/sync.h"
#include "engine/codec/record_codec.h"
#include "engine/index/stream_indexes.h"
#include "engine/signals/semantics.h"
#include "engine/types.h"
#include "engine/view/block_table.h"

namespace kvmem {

// RAM a kept block's signals hold, whatever its payload: its scene mean and
// its track presences, each presence with the entries the view's track
// maps give it (a new track's two map nodes charged to every presence: an
// upper bound). A client's frames can carry 1,024 detections and an 8,192-
// float scene embedding beside a one-token payload, so streams count these
// bytes with their payload against the byte limits (Stream::RetainedBytes).
uint64_t SignalRamBytes(const BlockRecord& rec);

// The open block's mean key and tokens (score MASS's window estimate; empty
// for scorers that do not ask for it).
struct OpenMean {
  std::vector<float> mean;
  uint32_t tokens = 0;
};

class RecallView {
 public:
  // REQUIRES: config (after defaults, validated) outlives the view.
  RecallView(const std::string& stream_id, const StreamConfig& config,
             const StreamState& state);
  RecallView(const RecallView&) = delete;
  RecallView& operator=(const RecallView&) = delete;

  kvmem::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // --- Fixed at construction; no lock. ---
  const std::string& stream_id() const { return id_; }
  const StreamConfig& config() const { return config_; }
  uint32_t summary_dim() const { return summary_dim_; }
  uint32_t layer_dim() const { return layer_dim_; }  // kv_heads * head_dim.
  // Recall units: token groups (groups_per_block > 1) or whole blocks; a
  // unit's id is block << unit_shift() | group.
  bool grouped() const { return config_.groups_per_block > 1; }
  uint32_t unit_shift() const { return grouped() ? kGroupShift : 0; }
  uint32_t units_per_block() const {
    return grouped() ? config_.groups_per_block : 1;
  }
  // What calls on a stream that is gone answer: NOT_FOUND once deleted,
  // or why it left this server (SetGone).
  absl::Status DeletedError() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Tokens per part of the stream's stored frames (StreamState::
  // frame_part_tokens; 0: whole). Fixed for a stream's life: no lock.
  uint32_t frame_part_tokens() const {
    return frame_part_tokens_.load(std::memory_order_relaxed);
  }

  // --- Reads: mu() held, shared or exclusive. ---
  const StreamState& state() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return state_;
  }
  bool deleted() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !gone_.ok(); }
  const BlockTable& blocks() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return blocks_;
  }
  const StreamIndexes& indexes() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return indexes_;
  }
  const std::map<uint64_t, TrackHistory>& tracks() const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return tracks_;
  }
  // The kept blocks that show track `track_id`, ascending; null for none.
  const std::vector<uint64_t>* TrackBlocks(uint64_t track_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Tokens of group g of kept block b (its tokens when not grouped).
  uint32_t UnitTokens(uint64_t b, uint32_t g) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return unit_tokens_[(b - blocks_.first()) * units_per_block() + g];
  }
  // ... of each of its units_per_block() groups, in group order.
  const uint32_t* BlockUnitTokens(uint64_t b) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return unit_tokens_.data() + (b - blocks_.first()) * units_per_block();
  }
  // The summary (summary_dim() floats) of a unit of a kept block.
  const float* UnitSummary(uint64_t unit) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  const OpenMean& open_mean() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return open_mean_;
  }
  // The first position of the hot window that ends at position window_end
  // (exclusive).
  uint64_t WindowStart(uint64_t window_end) const {
    return window_end > config_.hot_window_tokens
               ? window_end - config_.hot_window_tokens
               : 0;
  }
  // How many blocks (a prefix, by id) lie entirely before the hot window
  // that ends at position window_end (exclusive): the recallable ones.
  size_t EligibleBlocks(uint64_t window_end) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sampled recall of the indexes, those replaced by rebuilds included.
  IndexQuality Quality() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return indexes_.Quality(retired_quality_);
  }
  // NOT_FOUND for a block id the table does not hold: evicted (below
  // blocks().first()) or not sealed yet.
  absl::Status MissingBlockError(uint64_t block_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // --- Writes: mu() held exclusively. ---
  void SetState(const StreamState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    state_ = state;
    frame_part_tokens_.store(state.frame_part_tokens,
                             std::memory_order_relaxed);
  }
  void SetDeleted(bool deleted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream left this server (another owns it now): calls answer why.
  void SetGone(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    gone_ = std::move(why);
  }
  // Adds a sealed (or recovered) block: its summaries to the indexes unless
  // it is evicted, its units' tokens, its tracks.
  void Install(BlockEntry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room in the indexes for the records about to be installed
  // (StreamIndexes::Reserve).
  void ReserveIndexes(const std::vector<BlockRecord>& records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    indexes_.Reserve(records);
  }
  // Room in the indexes for `sealed`, made beside recalls (the reader's
  // lock) and adopted under the writer's before installing them, so the
  // writer's section never copies the indexes (StreamIndexes::Grow). The
  // growth keeps the old arrays: free it after unlocking.
  StreamIndexes::Growth GrowIndexesFor(const std::vector<BlockEntry>& sealed)
      const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void AdoptIndexGrowth(StreamIndexes::Growth* g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    indexes_.Adopt(g);
  }
  // Drops the leading run of wholly evicted blocks from RAM (BlockTable),
  // with their units and track entries.
  void DropEvictedRun() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishOpenMean(OpenMean m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    open_mean_ = std::move(m);
  }
  // Swaps *rec in as kept block id's record (a tier move; *rec gets the old
  // one), its signals' count following. REQUIRES: blocks().Has(id).
  void SetRecord(uint64_t id, BlockRecord* rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A kept block's entry, for a tier move. REQUIRES: blocks().Has(id).
  BlockEntry& entry(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return blocks_[id];
  }
  // Takes an evicted block's summaries (indexed with `groups` token groups)
  // out of the indexes and counts its payload as gone.
  void Unindex(uint64_t id, size_t groups, uint64_t payload_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountShotCut() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { shot_cuts_ += 1; }

  // --- Taking the lock themselves. ---
  // Rebuilds the indexes from the live summaries without blocking readers
  // (the build runs under rebuild_mu_ alone), then swaps them in. Returns
  // the blocks indexed. Rebuilds run one at a time.
  size_t RebuildIndexes() ABSL_LOCKS_EXCLUDED(rebuild_mu_, mu_);
  // Payload bytes of evicted blocks (their frames are gone from disk).
  uint64_t evicted_payload_bytes() const {
    return evicted_payload_bytes_.load(std::memory_order_relaxed);
  }
  // RAM the kept blocks' signals hold (SignalRamBytes of each).
  uint64_t signal_bytes() const {
    return signal_bytes_.load(std::memory_order_relaxed);
  }
  // The view's part of the stream's stats: state, block and byte counts
  // per tier, summaries, index quality, shot cuts and rebuilds.
  void FillStats(StreamStats* s) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string id_;
  const StreamConfig& config_;
  const uint32_t summary_dim_;
  const uint32_t layer_dim_;

  // One rebuild at a time (an explicit one beside a scheduled one); held
  // across the build, never by readers.
  kvmem::Mutex rebuild_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable kvmem::Mutex mu_;
  StreamState state_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> frame_part_tokens_{0};
  absl::Status gone_ ABSL_GUARDED_BY(mu_);  // OK: live.
  BlockTable blocks_ ABSL_GUARDED_BY(mu_);  // blocks_[i].rec.info.id == i
  StreamIndexes indexes_ ABSL_GUARDED_BY(mu_);
  // Sampled recall of indexes replaced by rebuilds.
  IndexQuality retired_quality_ ABSL_GUARDED_BY(mu_);
  // Each track shown by a kept block (erased with its last such block, in
  // DropEvictedRun: a tracker that names new ids all day made this grow
  // without bound).
  std::map<uint64_t, TrackHistory> tracks_ ABSL_GUARDED_BY(mu_);
  // Which kept blocks show each track (ascending ids).
  std::map<uint64_t, std::vector<uint64_t>> track_blocks_ ABSL_GUARDED_BY(mu_);
  // Tokens of each recall unit of the kept blocks, block-major: read for
  // every scanned candidate, so kept compact.
  std::vector<uint32_t> unit_tokens_ ABSL_GUARDED_BY(mu_);
  // Published in the same critical section as the blocks sealed from the
  // open block, so a recall never counts the same tokens twice.
  OpenMean open_mean_ ABSL_GUARDED_BY(mu_);
  uint64_t shot_cuts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rebuilds_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> evicted_payload_bytes_{0};
  std::atomic<uint64_t> signal_bytes_{0};
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_VIEW_RECALL_VIEW_H_

// Stream: one camera session's memory. Frames are appended in order, grouped
// into fixed-size blocks; a sealed block's summary (mean key per indexed
// layer) enters the stream's BlockIndex and the block becomes recallable once
// all its tokens have left the front end's hot window. Payloads live in the
// ColdStore; summaries and block metadata live in RAM and in the ColdStore.
//
// Thread safety: all public methods are safe to call concurrently. Appends and
// Close are serialised by append_mu_ (which is held across the durable
// commit); Recall and Stats take mu_ shared and never wait for a commit.
#ifndef KVMEM_ENGINE_STREAM_H_
#define KVMEM_ENGINE_STREAM_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/block_index.h"
#include "engine/record_codec.h"
#include "engine/summary_builder.h"
#include "engine/types.h"
#include "storage/cold_store.h"

namespace kvmem {

class Stream {
 public:
  // Creates a new stream and durably records its config and empty state.
  // REQUIRES: config has defaults filled and passed ValidateStreamConfig;
  // store outlives the stream.
  static absl::StatusOr<std::unique_ptr<Stream>> Create(
      const std::string& id, const StreamConfig& config, ColdStore* store);

  // Rebuilds a stream from its stored records: block index from block
  // records, the open block's running summary from its stored frames.
  static absl::StatusOr<std::unique_ptr<Stream>> Recover(
      const std::string& id, const StreamConfig& config,
      const StreamState& state, ColdStore* store);

  // Stores a frame durably. REQUIRES nothing of the caller: every field is
  // validated (INVALID_ARGUMENT naming the field), order is enforced
  // (ALREADY_EXISTS for a stored index, FAILED_PRECONDITION for a gap or a
  // closed stream), and a deleted stream answers NOT_FOUND.
  absl::StatusOr<AppendResult> Append(const Frame& frame);

  // Top-k blocks outside the hot window by inner product with the query,
  // then filled into the token budget in score order.
  absl::StatusOr<RecallResult> Recall(const RecallQuery& query);

  // Seals the open block (if any) and rejects further appends until Reopen.
  absl::Status Close();
  // Accepts appends again after Close. OK when already open.
  absl::Status Reopen();

  StreamStats Stats() const;
  absl::StatusOr<BlockInfo> GetBlock(uint64_t block_id) const;
  // Payload of a stored frame.
  absl::StatusOr<std::string> ReadFrame(uint64_t frame_index) const;

  // Called by the engine around deleting the stream: while marked, calls
  // answer NOT_FOUND. Waits for an in-flight append to finish. Unmarking is
  // for a delete whose storage write failed.
  void MarkDeleted(bool deleted);

  const std::string& id() const { return id_; }
  const StreamConfig& config() const { return config_; }

 private:
  Stream(const std::string& id, const StreamConfig& config, ColdStore* store,
         const StreamState& state);

  absl::Status ValidateFrame(const Frame& frame,
                             const StreamState& state) const;
  // Seals the open block described by *state: returns its record, adds it to
  // *write and advances *state past it. Nothing is durable until Commit.
  BlockRecord SealOpenBlock(const SummaryBuilder& summary, StreamState* state,
                            StreamWrite* write) const;
  // Installs a sealed block in RAM. REQUIRES: mu_ held exclusively.
  void InstallBlock(const BlockRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeletedError() const;
  absl::Status NotFoundIfDeleted() const;

  const std::string id_;
  const StreamConfig config_;
  ColdStore* const store_;
  const uint32_t summary_dim_;

  absl::Mutex append_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  SummaryBuilder open_summary_ ABSL_GUARDED_BY(append_mu_);

  mutable absl::Mutex mu_;
  StreamState state_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockInfo> blocks_ ABSL_GUARDED_BY(mu_);  // blocks_[i].id == i
  BlockIndex index_ ABSL_GUARDED_BY(mu_);
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;

  std::atomic<uint64_t> recalls_{0};
  std::atomic<uint64_t> recalled_blocks_{0};
  std::atomic<uint64_t> recalled_tokens_{0};
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_H_

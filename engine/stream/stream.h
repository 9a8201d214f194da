// Stream: one camera session's memory, the coordinator of its parts.
//
// Frames are appended in order and grouped into blocks by the open block's
// segmenter (fixed size, or following shots). A sealed block gets a summary
// (mean key per indexed layer) and token groups in the stream's indexes,
// its semantic signals (tracks, boxes, scene), and a warm copy in RAM in
// layer-major, DMA-aligned form. Every frame and every tier move is one
// atomic ColdStore commit, so a restart recovers exactly what was
// acknowledged. With EngineOptions::seal_after_ack the seal of a block an
// append filled is a commit of its own after that append's, on the
// background executor (or at the start of the next append or Close); a
// restart between the two finds a full open block and seals it. The parts, each
// with its own header, lock and tests:
//   RecallView    (engine/view/)    what recall, reads and stats see;
//   RecallScorer  (engine/recall/)  how recall scores, chosen by name;
//   RecallFeedback (engine/recall/) hits, counts and latencies of recalls;
//   TierManager   (engine/tiers/)   tier moves, budgets, staging;
//   BlockReader   (engine/tiers/)   block payloads from any tier;
//   AccelLedger   (engine/accel/)   the stream's accelerator costs.
// Stream keeps the append path (validation, the open block, sealing, the
// commit) and the wiring.
//
// Thread safety: all public methods are safe to call concurrently. Locks,
// always taken in this order:
//   append_mu_        serialises appends, Close, Reopen, recovery and
//                     deletion; held across their commits;
//   TierManager's     serialises tier moves; held across their commits;
//                     maintenance takes it alone, one recall hit at a time
//                     (deletion takes it after append_mu_, so no move
//                     writes a record of a stream being removed);
//   RecallView's      taken shared by recalls, reads and stats, exclusively
//                     only for short in-memory updates, never across I/O;
//   the leaf locks of RecallFeedback, AccelLedger, RebuildSchedule and the
//                     tier manager's latest signals.
// Recall never waits for a commit; the tier moves it causes (promotion,
// stage hits) run on the engine's background executor, and an append
// waits for at most one hit's moves (its own budget moves aside).
#ifndef KVMEM_ENGINE_STREAM_STREAM_H_
#define KVMEM_ENGINE_STREAM_STREAM_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/executor.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "engine/accel/accel_ledger.h"
#include "engine/accel/accelerator.h"
#include "engine/recall/recall_feedback.h"
#include "engine/recall/scorer.h"
#include "engine/stream/ingest_cpu.h"
#include "engine/stream/open_block.h"
#include "engine/tiers/block_reader.h"
#include "engine/tiers/tier_manager.h"
#include "engine/types.h"
#include "engine/view/rebuild_schedule.h"
#include "engine/view/recall_view.h"
#include "storage/cold_store.h"

namespace kvmem {

// What a stream shares with the rest of the engine.
struct StreamEnv {
  ColdStore* store = nullptr;
  Executor* background = nullptr;  // Tier moves and rebuilds; may be null.
  // RAM held by warm blocks of all streams, and its cap (0: none).
  std::atomic<uint64_t>* global_warm_bytes = nullptr;
  uint64_t global_warm_budget = 0;
  // RAM held by staged copies of all streams (within that cap's room).
  std::atomic<uint64_t>* global_stage_bytes = nullptr;
  // EngineOptions::demote_keeps_frames.
  bool demote_keeps_frames = false;
  // EngineOptions::frame_parts (for streams created).
  bool frame_parts = false;
  uint32_t frame_part_tokens = 0;  // EngineOptions::frame_part_tokens.
  // EngineOptions::seal_after_ack (needs background).
  bool seal_after_ack = false;
  uint32_t rebuild_kept_per_sealed = 8;  // EngineOptions'.
  // The retrieval backend searches and staging go through; null: the
  // shared cpu backend.
  Accelerator* accel = nullptr;
  // Receives warnings (an approximate index below the accelerator's recall
  // floor); may be empty.
  std::function<void(const std::string&)> warn;
  // Threads a recall may use besides its caller's (EngineOptions::
  // recall_threads); empty: none.
  RecallHelpers recall_helpers;
};

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  // Creates a new stream and durably records its config and empty state.
  // REQUIRES: config has defaults filled and passed ValidateStreamConfig;
  // env.store (and env.background) outlive the stream.
  static absl::StatusOr<std::unique_ptr<Stream>> Create(
      const std::string& id, const StreamConfig& config, const StreamEnv& env);

  // Rebuilds a stream from its stored records.
  static absl::StatusOr<std::unique_ptr<Stream>> Recover(
      const std::string& id, const StreamConfig& config,
      const StreamState& state, const StreamEnv& env);

  // Stores a frame durably, then applies the stream's tier budgets. Every
  // field is validated (INVALID_ARGUMENT naming it), order is enforced
  // (ALREADY_EXISTS for a stored index, FAILED_PRECONDITION for a gap or a
  // closed stream), and a deleted stream answers NOT_FOUND.
  absl::StatusOr<AppendResult> Append(Frame frame)
      ABSL_LOCKS_EXCLUDED(append_mu_);
  // Append's checks of a frame's header (stream closed or deleted, index,
  // token count, position) against the stream's state now, before its
  // payload arrives: a front end learns at once, not after sending the
  // whole frame. Append checks again (another call may append between).
  absl::Status CheckFrameHeader(const Frame& header) const;

  // The budgeted recall set (engine/recall/recaller.h): scored by the
  // stream's scorer, filled into the token budget; per layer when
  // query.per_layer, per KV head when query.per_head. Never returns blocks
  // inside the hot window or evicted blocks, and never returns a block only
  // because it is staged.
  absl::StatusOr<RecallResult> Recall(const RecallQuery& query);

  absl::Status Close() ABSL_LOCKS_EXCLUDED(append_mu_);
  absl::Status Reopen() ABSL_LOCKS_EXCLUDED(append_mu_);

  // What StreamHandle (engine/memory_engine.h) lends: stats, block
  // metadata, payload reads and the bytes quotas count, documented there.
  StreamStats Stats() const;
  // Seals a block an acknowledged frame completed if its seal has not run
  // yet (EngineOptions::seal_after_ack), or waits for a queued seal under
  // way to finish, budgets enforced; nothing otherwise.
  absl::Status SealIfPending() ABSL_LOCKS_EXCLUDED(append_mu_);
  absl::StatusOr<BlockInfo> GetBlock(uint64_t block_id) {
    KVMEM_RETURN_IF_ERROR(SealBeforeRead(block_id));
    return reader_.GetBlock(block_id);
  }
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockPayload(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, BlockInfo* info = nullptr) {
    KVMEM_RETURN_IF_ERROR(SealBeforeRead(block_id));
    return reader_.ReadBlockPayload(block_id, layout, layers, info);
  }
  absl::StatusOr<uint64_t> ReadBlockPayloadInto(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info = nullptr) {
    KVMEM_RETURN_IF_ERROR(SealBeforeRead(block_id));
    return reader_.ReadBlockPayloadInto(block_id, layout, layers, dst, capacity,
                                        info);
  }
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockTokens(
      uint64_t block_id, const std::vector<uint32_t>& tokens,
      const std::vector<uint32_t>& layers, BlockInfo* info = nullptr) {
    KVMEM_RETURN_IF_ERROR(SealBeforeRead(block_id));
    return reader_.ReadBlockTokens(block_id, tokens, layers, info);
  }
  absl::StatusOr<uint64_t> ReadBlockTokensInto(
      uint64_t block_id, const std::vector<uint32_t>& tokens,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info = nullptr) {
    KVMEM_RETURN_IF_ERROR(SealBeforeRead(block_id));
    return reader_.ReadBlockTokensInto(block_id, tokens, layers, dst, capacity,
                                       info);
  }
  uint64_t RetainedBytes() const;  // StreamHandle::RetainedBytes.

  // Frames acknowledged so far: the last durable frame + 1 (0 when none).
  uint64_t AcknowledgedFrames() const;

  const std::string& id() const { return id_; }
  const StreamConfig& config() const { return config_; }

 private:
  friend class MemoryEngine;    // Maintenance, rebuilds, deletion.
  friend class StreamTestPeer;  // tests/engine_fixture.h

  Stream(const std::string& id, const StreamConfig& config,
         const StreamEnv& env, const StreamState& state);

  // Applies recall feedback (hits, stage hits, promotions) and the budgets,
  // without the append lock. Runs on the background executor after recalls
  // (MemoryEngine::RunMaintenance runs it now).
  absl::Status RunMaintenance();
  void ScheduleMaintenance();
  // Rebuilds the indexes from the live summaries without blocking Recall,
  // then swaps them in. Returns the number of blocks indexed.
  size_t RebuildIndex();
  void MaybeScheduleRebuild(size_t sealed);
  void MarkDeleted(bool deleted) ABSL_LOCKS_EXCLUDED(append_mu_);
  // The stream left this server (another server owns it): every later call
  // answers `why`.
  void MarkGone(absl::Status why) ABSL_LOCKS_EXCLUDED(append_mu_);
  // The engine's ownership generation (MemoryEngine::ownership_generation_)
  // under which this server took the stream up: a stream held from before
  // a lapse of the server's ownership is not served under the next lease.
  // Set before the stream is published; read under the engine's mu_.
  uint64_t owner_generation() const { return owner_generation_; }
  void set_owner_generation(uint64_t g) { owner_generation_ = g; }
  // Where the open block keeps frame i's payload (tests check that ingest
  // hands the received buffer over without copying it); null when absent.
  const char* OpenPayloadData(size_t i) ABSL_LOCKS_EXCLUDED(append_mu_);

  // The append path (stream_append.cc).
  absl::Status ValidateFrame(const Frame& frame,
                             const StreamState& state) const;
  // ValidateFrame's checks of the header's fields (no payload).
  absl::Status ValidateHeader(const Frame& frame,
                              const StreamState& state) const;
  // A frame's scene embedding size against the stream's (into
  // next->scene_dim).
  absl::Status TakeSceneDim(const Frame& frame, StreamState* next) const;
  // Seals the open block: its record goes into *write, *state advances, and
  // the returned entry (with its warm copy) is ready to install.
  BlockEntry SealOpenBlock(StreamState* state, StreamWrite* write,
                           uint64_t now_frame, StageClock* clock = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // With tier_policy.ingest_precision INT8 or INT4: the frame's rows (in
  // parts when the stream stores them so) encoded into encoded_frame_, and
  // its payload replaced by their decoded values, so what the open block,
  // the seal and every later read see is what the store keeps.
  // INVALID_ARGUMENT for a value quantisation cannot take (NaN, Inf,
  // beyond +-65536).
  absl::Status EncodeAtIngest(Frame* frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // The appended frame (the open block's copy, in parts when the stream
  // stores them so), its signals and the next state into *write.
  void PutFrame(const Frame& frame, const StreamState& next, StreamWrite* write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // After a commit: the new state, the sealed blocks and the open block's
  // mean into the view, their warm bytes into the tiers.
  void InstallCommitted(const StreamState& next, std::vector<BlockEntry> sealed,
                        bool shot_cut)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // After a failed commit: the open block reloaded from the store.
  absl::Status AfterFailedCommit(const absl::Status& committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // After a commit: budgets, staging and rebuilds.
  absl::Status AfterCommit(uint64_t frame_index, size_t sealed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // Seals a full open block in a commit of its own (the background task
  // ScheduleSeal queues; recovery too); nothing when none is pending.
  absl::Status SealPendingBlock() ABSL_LOCKS_EXCLUDED(append_mu_);
  void ScheduleSeal();
  // A read of block_id, the block an acknowledged frame completed, finds it
  // sealed: its seal runs now if it has not run yet (the seal's error if it
  // fails). Nothing for any other block.
  absl::Status SealBeforeRead(uint64_t block_id)
      ABSL_LOCKS_EXCLUDED(append_mu_);
  // A recall answers as if the block were sealed at once: its seal runs
  // first when the answer depends on it, i.e. when some of its tokens lie
  // before the query's window (candidates) or when kvmem estimates the
  // window itself (no window_lse: the estimate counts a sealed block by its
  // groups, the open block by its mean). A front end that sends window_lse
  // with the block inside its window does not wait for the seal. Recall
  // answers even when the seal fails (a store that refuses writes).
  absl::Status SealBeforeRecall(const RecallQuery& q)
      ABSL_LOCKS_EXCLUDED(append_mu_);
  // Whether state's open block is full and waits for its seal
  // (EngineOptions::seal_after_ack; fixed blocks only). Reads the config
  // alone: under the view's lock or append_mu_.
  bool SealIsPending(const StreamState& s) const;
  // Loads the unsealed block of `state` from the store into the open block
  // (recovery, and after a failed commit).
  absl::Status ReplayOpenBlock(const StreamState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // Replays the open block when a failed replay left it stale (a store
  // that could not be read after a failed commit): what uses the open
  // block must see every frame the state says it holds.
  absl::Status FreshOpenBlock(const StreamState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // The open block's mean key and tokens, when the scorer asks for them.
  OpenMean OpenBlockMean() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);

  // Recovery (stream.cc): the stored block records, checked.
  absl::StatusOr<std::vector<BlockRecord>> LoadRecords(
      const StreamState& state) const;
  // Which blocks recorded warm come back warm: as many as the warm budgets
  // hold (TierManager::WarmRoomAtRecovery), promoted ones first, then the
  // newest; the others' tier becomes their durable copy's.
  void ChooseWarmAtRecovery(std::vector<BlockRecord>* records) const;
  // Builds again, from their frames, the token groups of the records a
  // crash left as their seal's stand-ins (BlockRecord::groups_pending), and
  // stores them as the seal did; DATA_LOSS if such a block has no frames.
  absl::Status CompleteRecords(std::vector<BlockRecord>* records) const;
  void WarnIfBelowRecallFloor();
  Accelerator& accel() const {
    return env_.accel != nullptr ? *env_.accel : SharedCpuAccelerator();
  }
  TierEnv MakeTierEnv();

  const std::string id_;
  const StreamConfig config_;
  const StreamEnv env_;
  const RecallScorer* const scorer_;  // Registered: lives for the program.

  kvmem::Mutex append_mu_;
  OpenBlock open_ ABSL_GUARDED_BY(append_mu_);
  // open_.signal_bytes(), an atomic, read from any thread without
  // append_mu_ (the quotas and stats ask while appends run).
  uint64_t OpenSignalBytes() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return open_.signal_bytes();
  }
  // open_ lacks frames the state says it holds (see FreshOpenBlock).
  bool open_stale_ ABSL_GUARDED_BY(append_mu_) = false;
  // The last frame as stored, when the stream encodes frames (EncodeAtIngest).
  std::string encoded_frame_ ABSL_GUARDED_BY(append_mu_);

  RecallView view_;
  BlockReader reader_;
  AccelLedger ledger_;
  TierManager tiers_;
  RecallFeedback feedback_;
  // The append path's CPU by stage (appends and seals; its own atomics).
  IngestCpu ingest_cpu_;
  // Seals ScheduleSeal queued that have not finished (budgets included):
  // SealIfPending waits for them, so stats never see a sealed block before
  // the budgets it counts against were enforced.
  std::atomic<uint32_t> seals_queued_{0};
  uint64_t owner_generation_ = 0;
  RebuildSchedule rebuilds_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_STREAM_H_

// Stream: one camera session's memory.
//
// Frames are appended in order and grouped into blocks by the Segmenter
// (fixed size, or following shots). A sealed block gets a summary (mean key
// per indexed layer) in the stream's indexes (one over all indexed layers,
// one per layer), its semantic signals (tracks, boxes, scene), and a warm
// copy in RAM in layer-major, DMA-aligned form (WarmBlock). Blocks then move
// down the tiers as budgets require, the replacement policy choosing which:
// warm (RAM) -> cold (RocksDB, full precision) -> degraded (RocksDB, int8)
// -> evicted (payload and summary dropped). A recalled block is promoted back
// to warm; two-phase prefetch may stage likely blocks in RAM ahead of a query.
// Every frame and every tier move is one atomic ColdStore commit, so a
// restart recovers exactly what was acknowledged.
//
// Thread safety: all public methods are safe to call concurrently.
//   append_mu_ serialises appends, Close, tier moves, staging and recovery
//              of feedback; it is held across commits.
//   mu_        guards what Recall and Stats read; taken shared by Recall and
//              exclusively only for short in-memory updates.
// Recall never waits for a commit; the tier moves it causes (promotion, stage
// hits) run on the engine's background executor.
#ifndef KVMEM_ENGINE_STREAM_STREAM_H_
#define KVMEM_ENGINE_STREAM_STREAM_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/executor.h"
#include "base/sync.h"
#include "engine/accel/accelerator.h"
#include "engine/codec/block_layout.h"
#include "engine/codec/record_codec.h"
#include "engine/index/block_index.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/semantic_cache.h"
#include "engine/stream/block_table.h"
#include "engine/stream/open_block.h"
#include "engine/stream/segmenter.h"
#include "engine/stream/semantics.h"
#include "engine/stream/summary_builder.h"
#include "engine/tiers/replacement.h"
#include "engine/types.h"
#include "storage/cold_store.h"

namespace kvmem {

// What a stream shares with the rest of the engine.
struct StreamEnv {
  ColdStore* store = nullptr;
  Executor* background = nullptr;  // Tier moves and rebuilds; may be null.
  // RAM held by warm blocks of all streams, and its cap (0: none).
  std::atomic<uint64_t>* global_warm_bytes = nullptr;
  uint64_t global_warm_budget = 0;
  // The retrieval backend searches and staging go through; null: the
  // shared cpu backend.
  Accelerator* accel = nullptr;
  // Receives warnings (an approximate index below the accelerator's recall
  // floor); may be empty.
  std::function<void(const std::string&)> warn;
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

  ~Stream();

  // Stores a frame durably, then applies the stream's tier budgets. Every
  // field is validated (INVALID_ARGUMENT naming it), order is enforced
  // (ALREADY_EXISTS for a stored index, FAILED_PRECONDITION for a gap or a
  // closed stream), and a deleted stream answers NOT_FOUND.
  absl::StatusOr<AppendResult> Append(Frame frame);

  // The budgeted recall set: candidates from the index (model signal) and
  // from the query's track ids (semantic signal), ranked by the combined
  // score, filled into the token budget; per layer when query.per_layer.
  // Never returns blocks inside the hot window or evicted blocks, and never
  // returns a block only because it is staged.
  absl::StatusOr<RecallResult> Recall(const RecallQuery& query);

  absl::Status Close();
  absl::Status Reopen();

  // What StreamHandle (engine/memory_engine.h) lends: stats, block
  // metadata, payload reads and the bytes quotas count, documented there.
  StreamStats Stats() const;
  absl::StatusOr<BlockInfo> GetBlock(uint64_t block_id) const;
  absl::StatusOr<std::vector<PayloadPiece>> ReadBlockPayload(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, BlockInfo* info = nullptr) const;
  absl::StatusOr<uint64_t> ReadBlockPayloadInto(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
      BlockInfo* info = nullptr) const;
  uint64_t RetainedPayloadBytes() const;

  // Frames acknowledged so far: the last durable frame + 1 (0 when none).
  uint64_t AcknowledgedFrames() const;

  const std::string& id() const { return id_; }
  const StreamConfig& config() const { return config_; }

 private:
  friend class MemoryEngine;    // Maintenance, rebuilds, deletion.
  friend class StreamTestPeer;  // tests/engine_fixture.h

  // Applies recall feedback (hits, stage hits, promotions) and the budgets.
  // Runs on the background executor after recalls (MemoryEngine::
  // RunMaintenance runs it now).
  absl::Status RunMaintenance();

  // Rebuilds the indexes from the live summaries without blocking Recall,
  // then swaps them in. Returns the number of blocks indexed.
  size_t RebuildIndex();

  void MarkDeleted(bool deleted);

  // Where the open block keeps frame i's payload (tests check that ingest
  // hands the received buffer over without copying it); null when absent.
  const char* OpenPayloadData(size_t i);

  struct Indexes {
    std::unique_ptr<BlockIndex> all;  // Concatenated layers.
    // One per indexed layer; empty with a single indexed layer (then
    // `all` serves per-layer recalls).
    std::vector<std::unique_ptr<BlockIndex>> layers;
    // Token groups (groups_per_block > 1): id = block * kGroupStride + group.
    std::unique_ptr<BlockIndex> groups;
  };
  static constexpr uint32_t kGroupShift = 8;
  static constexpr uint64_t kGroupStride = uint64_t{1} << kGroupShift;
  // `so_far` plus the sampled recall of ix's searching indexes.
  static IndexQuality RetiredQuality(const Indexes& ix,
                                     const IndexQuality& so_far);

  Stream(const std::string& id, const StreamConfig& config,
         const StreamEnv& env, const StreamState& state);

  absl::Status DeletedError() const;
  absl::Status UnknownBlockError(uint64_t block_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status NotFoundIfDeleted() const;
  absl::Status ValidateFrame(const Frame& frame,
                             const StreamState& state) const;

  // Seals the open block: its record goes into *write, *state advances, and
  // the returned entry (with its warm copy) is ready to install.
  BlockEntry SealOpenBlock(StreamState* state, StreamWrite* write,
                           uint64_t now_frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  void ResetOpenBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // Append's steps: a frame's scene embedding size against the stream's
  // (into next->scene_dim); after a failed commit, the open block reloaded
  // from the store; after a commit, budgets, staging and rebuilds.
  absl::Status TakeSceneDim(const Frame& frame, StreamState* next) const;
  absl::Status AfterFailedCommit(const absl::Status& committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  absl::Status AfterCommit(uint64_t frame_index, bool sealed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // Loads the unsealed block of `state` from the store into the open-block
  // builders (recovery, and after a failed commit).
  absl::Status ReplayOpenBlock(const StreamState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  void InstallBlock(BlockEntry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the leading run of wholly evicted blocks from RAM (BlockTable),
  // with their recall units and track entries.
  void DropEvictedRun() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NOT_FOUND for a block id the table does not hold: evicted (below
  // first()) or not sealed yet.
  absl::Status MissingBlockError(uint64_t block_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Indexes NewIndexes() const;

  // --- tiers (stream_tiers.cc); all REQUIRE append_mu_ ---
  // Moves blocks down until every budget holds, with room for
  // incoming_warm more bytes in the warm tier.
  // `exclude` (a block id, or -1) is never moved.
  absl::Status EnforceBudgets(uint64_t incoming_warm = 0, int64_t exclude = -1)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // The next move EnforceBudgets makes (victim -1: none).
  struct TierMove {
    enum Op { kDemote, kDegrade, kEvict };
    int64_t victim = -1;
    Op op = kDemote;
  };
  TierMove NextTierMove(uint64_t incoming_warm, int64_t exclude) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A recall picked staged block `id` (of `bytes` in RAM): make it warm.
  absl::Status ConfirmStaged(uint64_t id, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  absl::Status Demote(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  absl::Status Degrade(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  absl::Status Evict(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  absl::Status Promote(uint64_t id, bool staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  absl::Status StageLikelyBlocks(const std::vector<float>& pseudo_query,
                                 const FrameSignals& signals)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  void Unstage(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // Applies queued recall feedback: heat history, stage hits, promotions.
  absl::Status DrainFeedback() ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  ReplacementContext PolicyContext() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static Tier TierOf(const BlockEntry& e);
  uint64_t DiskBytes(const BlockRecord& rec) const;
  // The lowest-keep-score block matching pred, or -1.
  int64_t PickVictim(const std::function<bool(const BlockEntry&)>& pred,
                     const ReplacementContext& ctx) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Reads a block's layers from wherever they are (RAM, frames, layers).
  absl::StatusOr<std::unique_ptr<WarmBlock>> LoadBlock(
      const BlockRecord& rec) const;
  // The stored records (K then V, full precision) of the given layers of a
  // block kept as layers (kFull or kInt8, dequantised).
  absl::StatusOr<std::vector<std::string>> LoadLayerRecords(
      const BlockRecord& rec, const std::vector<uint32_t>& layers) const;
  // A block as one read sees it: in RAM, or (BLOCK_LAYER_MAJOR of a block
  // stored as layers) only the wanted layers' records, straight from the
  // store; either way consistent with one generation of the block.
  struct BlockSnapshot {
    BlockRecord rec;
    BlockInfo info;                         // Tier as of the read.
    std::shared_ptr<const WarmBlock> warm;  // Set, or
    std::vector<std::string> records;       // one per wanted layer.
  };
  absl::StatusOr<BlockSnapshot> SnapshotBlock(
      uint64_t block_id, PayloadLayout layout,
      const std::vector<uint32_t>& wanted) const;
  // layers, or every layer when empty; INVALID_ARGUMENT for one out of range.
  absl::StatusOr<std::vector<uint32_t>> WantedLayers(
      const std::vector<uint32_t>& layers) const;
  absl::Status CommitRecord(const BlockRecord& rec, StreamWrite write);
  // Commits a change of block id's durable form (its new record and the
  // storage changes in `write`) with the block's generation odd meanwhile;
  // on success installs rec and runs apply on the entry under mu_.
  absl::Status CommitMove(uint64_t id, BlockRecord rec, StreamWrite write,
                          const std::function<void(BlockEntry&)>& apply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  void ScheduleMaintenance();
  void MaybeScheduleRebuild() ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  // Warm-tier RAM accounting (stream and engine-wide).
  void AddWarm(int64_t bytes, bool staged) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- recall (engine/recall/stream_recall.cc) ---
  // Under a shared mu_: the eligible blocks, the candidates and the plan
  // into *r (score MASS or SUMMED); *now_frame: the newest frame.
  absl::Status PlanRecall(const RecallQuery& q,
                          const std::vector<float>& mean_query, RecallResult* r,
                          uint64_t* now_frame) const;
  void PlanSummed(const RecallQuery& q, const std::vector<float>& mean_query,
                  size_t eligible, RecallResult* r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Score SUMMED's candidates for one query vector against `index` (dims
  // from `offset` of each summary): the index's best and the query's track
  // candidates, each with its inner product and semantic score.
  std::vector<PlanUnit> BlockCandidates(const BlockIndex& index,
                                        const float* query, size_t offset,
                                        size_t dim, const FrameSignals& signals,
                                        size_t eligible, uint32_t top_k,
                                        uint32_t priority, CallCost* cost,
                                        uint32_t* search_us) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The same over token groups (groups_per_block > 1).
  std::vector<PlanUnit> GroupCandidates(const float* query,
                                        const FrameSignals& signals,
                                        size_t eligible, uint32_t top_k,
                                        uint32_t priority, CallCost* cost,
                                        uint32_t* search_us) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A plan's blocks as the recall answers them (block info, tier, staging;
  // token offsets when grouped; with mean_query, the score MASS reports).
  std::vector<RecalledBlock> ToRecalled(const RecallPlan& plan, bool grouped,
                                        const float* mean_query) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Counts a recall's blocks and queues their hits for maintenance.
  void QueueFeedback(const RecallResult& r, uint64_t now_frame);
  void WarnIfBelowRecallFloor();
  // Recent eligible, non-evicted blocks that show the query's tracks (at
  // most 64 per track), when the track or IoU weight is on: the semantic
  // signal's candidates.
  std::vector<size_t> TrackCandidates(const FrameSignals& signals,
                                      size_t eligible) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds a block's summaries (and groups) to `ix` / removes them.
  void AddToIndexes(Indexes* ix, uint64_t id, const BlockRecord& rec) const;
  static void RemoveFromIndexes(Indexes* ix, uint64_t id, size_t groups);
  void RecordRecallLatency(uint32_t us);
  Accelerator& accel() const {
    return env_.accel != nullptr ? *env_.accel : SharedCpuAccelerator();
  }
  // --- mass recall (stream_mass.cc) ---
  // Score MASS: scans the candidate index (token groups, or blocks) once per
  // query vector, estimates each candidate's attention mass per head
  // (mass_estimate.h), refines exactly the candidates that can reach the
  // budget, and fills r->blocks (or, with q.per_layer, one set per indexed
  // layer, with q.per_head one per indexed layer and KV head, in
  // r->layer_sets) within r->budget_tokens and r->top_k. The caller has
  // checked kMaxScoresPerRecall.
  // mean_query: the mean of q's vectors.
  void RecallByMass(const RecallQuery& q, const std::vector<float>& mean_query,
                    size_t eligible, RecallResult* r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // One recall set of the mass recall: the candidates `rows` (ids of
  // `unit` ids: block * UnitStride() + group) ranked by the estimate's
  // density over head range `range`, planned by RecallPlanner.
  struct MassRows;
  LayerRecallSet FillByMass(const RecallQuery& q, size_t eligible,
                            const MassRows& rows, size_t range,
                            const RecallResult& r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The index's scan of every unit per query vector (or PoolScans).
  void ScanUnits(const RecallQuery& q, const std::vector<float>& mean_query,
                 size_t eligible, RecallResult* r,
                 std::vector<SegmentScan>* scans) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Each scanned unit's tokens and role (recallable, window, ignored).
  void ClassifyRows(const RecallQuery& q, size_t eligible, MassRows* rows) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // [vector][head]: what attention reads besides the candidates.
  std::vector<float> WindowLse(const RecallQuery& q) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The semantic scores a mass recall knows up front.
  SemanticCache MassSemantics(const RecallQuery& q, size_t eligible) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Exact densities over head range `range` of the rows `first` (the scan
  // was approximate), into *density.
  void ExactDensities(const RecallQuery& q, const MassRows& rows, size_t range,
                      const std::vector<uint32_t>& first,
                      std::vector<float>* dots, std::vector<float>* exact,
                      std::vector<float>* density) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves the re-identification anchors (the best unit of each query
  // track's most recent recallable block) to the front of *units.
  void PutAnchorsFirst(const RecallQuery& q, size_t eligible,
                       const MassRows& rows, const std::vector<float>& density,
                       SemanticCache* sem, std::vector<bool>* ranked,
                       std::vector<PlanUnit>* units) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<uint64_t> AnchorBlocks(const RecallQuery& q,
                                     size_t eligible) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Candidate rows for index kinds that cannot scan (FAISS approximate):
  // the index's top results for the mean query plus the hot window's
  // units, scored exactly from their summaries.
  void PoolScans(const RecallQuery& q, const std::vector<float>& mean_query,
                 size_t eligible, uint32_t budget, CallCost* cost,
                 std::vector<SegmentScan>* scans) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Recall units: token groups (groups_per_block > 1) or whole blocks.
  uint32_t UnitShift() const { return index_groups() ? kGroupShift : 0; }
  uint32_t UnitsPerBlock() const {
    return index_groups() ? config_.groups_per_block : 1;
  }
  bool index_groups() const { return config_.groups_per_block > 1; }
  // Where unit_tokens_ keeps group g of kept block b.
  size_t UnitSlot(uint64_t b, uint32_t g) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (b - blocks_.first()) * UnitsPerBlock() + g;
  }
  const float* UnitSummary(uint64_t unit) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Exact per-head dots of a unit's summary with each of the `vectors`
  // query vectors: out[vector * heads + head].
  void UnitDots(uint64_t unit, const float* query, uint32_t vectors,
                float* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The open block's mean key and tokens, for the window estimate (score
  // MASS; empty otherwise). Published under mu_ in the same critical section
  // as the blocks sealed from the open block, so a recall never counts the
  // same tokens as a sealed block and in the open block's mean.
  struct OpenMean {
    std::vector<float> mean;
    uint32_t tokens = 0;
  };
  OpenMean OpenBlockMean() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(append_mu_);
  void PublishOpenMean(OpenMean m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Stages a planned recall's KV through the accelerator (cost into
  // r->accel).
  void StageRecall(RecallResult* r, uint32_t priority) const;
  // Adds to this stream's accelerator totals.
  void AccountAccel(const CallCost& c);
  // "" or why the index's sampled recall breaks the accelerator's floor.
  std::string RecallFloorWarning() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // How many blocks (a prefix, by id) lie entirely before the hot window
  // that ends at position window_end (exclusive).
  size_t EligibleBlocks(uint64_t window_end) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string id_;
  const StreamConfig config_;
  const StreamEnv env_;
  const uint32_t summary_dim_;
  const uint32_t layer_dim_;  // kv_heads * head_dim.
  const std::unique_ptr<ReplacementPolicy> policy_;

  kvmem::Mutex append_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  OpenBlock open_ ABSL_GUARDED_BY(append_mu_);
  FrameSignals latest_signals_ ABSL_GUARDED_BY(append_mu_);
  std::deque<uint64_t> staged_order_ ABSL_GUARDED_BY(append_mu_);  // FIFO.
  uint64_t blocks_since_rebuild_ ABSL_GUARDED_BY(append_mu_) = 0;
  // Payload bytes of evicted blocks (their frames are gone from disk).
  std::atomic<uint64_t> evicted_payload_bytes_{0};
  std::chrono::steady_clock::time_point last_rebuild_
      ABSL_GUARDED_BY(append_mu_);

  mutable kvmem::Mutex mu_;
  StreamState state_ ABSL_GUARDED_BY(mu_);
  BlockTable blocks_ ABSL_GUARDED_BY(mu_);  // blocks_[i].rec.info.id == i
  Indexes index_ ABSL_GUARDED_BY(mu_);
  // Sampled recall of indexes replaced by rebuilds.
  IndexQuality retired_quality_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, TrackHistory> tracks_ ABSL_GUARDED_BY(mu_);
  // Which blocks show each track (ascending ids), for semantic candidates.
  std::map<uint64_t, std::vector<uint64_t>> track_blocks_ ABSL_GUARDED_BY(mu_);
  // Tokens of each recall unit of the kept blocks, at UnitSlot(block,
  // group): read for every scanned candidate, so kept compact.
  std::vector<uint32_t> unit_tokens_ ABSL_GUARDED_BY(mu_);
  // The open block's mean key and tokens (score MASS's window estimate).
  std::vector<float> open_mean_ ABSL_GUARDED_BY(mu_);
  uint32_t open_mean_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool deleted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t warm_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stage_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  PolicyCounters counters_ ABSL_GUARDED_BY(mu_);

  // Recall feedback, drained by RunMaintenance.
  mutable kvmem::Mutex feedback_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> recalled_
      ABSL_GUARDED_BY(feedback_mu_);  // (block id, frame of the recall)
  bool maintenance_scheduled_ ABSL_GUARDED_BY(feedback_mu_) = false;
  bool rebuild_scheduled_ ABSL_GUARDED_BY(feedback_mu_) = false;
  std::vector<uint32_t> recall_us_ ABSL_GUARDED_BY(feedback_mu_);  // Ring.
  size_t recall_us_next_ ABSL_GUARDED_BY(feedback_mu_) = 0;

  mutable kvmem::Mutex accel_mu_;
  CallCost accel_cost_ ABSL_GUARDED_BY(accel_mu_);
  bool below_recall_floor_ ABSL_GUARDED_BY(accel_mu_) = false;

  std::atomic<uint64_t> recalls_{0};
  std::atomic<uint64_t> recalled_blocks_{0};
  std::atomic<uint64_t> recalled_tokens_{0};
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_STREAM_H_

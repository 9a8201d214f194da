// TierManager: where a stream's sealed blocks live, and the moves between
// tiers: warm (RAM, full precision) -> cold (the store, full precision) ->
// degraded (the store, int8) -> evicted (payload and summary dropped), each
// move one atomic commit of the block's new durable form. Budgets drive the
// moves (the stream's warm, cold and storage budgets and the engine's
// global warm cap), the replacement policy chooses the victims; recall
// feedback promotes recalled blocks back to warm when they earn it (see
// ApplyHits); two-phase prefetch stages likely blocks in RAM ahead of a
// query (a staged copy only becomes warm once a query confirms it).
//
// Thread safety: all public methods are safe to call concurrently; moves
// are serialised by mu_, which is held across their store commits (appends
// take it after the stream's append lock; a recall's maintenance takes it
// without that lock, one hit at a time, so an append never waits for more
// than one hit's moves). Moves change the view in short exclusive sections
// of the view's lock, so recalls and reads never wait for a commit.
// FillStats, the byte counts, NoteSignals and NoteInstalledWarm never wait
// for a move.
#ifndef KVMEM_ENGINE_TIERS_TIER_MANAGER_H_
#define KVMEM_ENGINE_TIERS_TIER_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "base/sync.h"
#include "engine/accel/accel_ledger.h"
#include "engine/accel/accelerator.h"
#include "engine/recall/recall_feedback.h"
#include "engine/tiers/block_reader.h"
#include "engine/tiers/replacement.h"
#include "engine/types.h"
#include "engine/view/recall_view.h"
#include "storage/cold_store.h"

namespace kvmem {

// What the tiers share with the rest of the engine.
struct TierEnv {
  ColdStore* store = nullptr;
  // RAM held by warm blocks of all streams, and its cap (0: none).
  std::atomic<uint64_t>* global_warm_bytes = nullptr;
  uint64_t global_warm_budget = 0;
  // RAM held by staged copies of all streams: a copy is staged only into
  // room the warm blocks and the staged copies leave under that cap.
  std::atomic<uint64_t>* global_stage_bytes = nullptr;
  // A first demotion keeps the block's frames (EngineOptions::
  // demote_keeps_frames) instead of rewriting it per layer.
  bool demote_keeps_frames = false;
  Accelerator* accel = nullptr;   // Prefetch searches.
  AccelLedger* ledger = nullptr;  // Their cost.
};

class TierManager {
 public:
  // REQUIRES: view, reader and everything env points to outlive the
  // manager.
  TierManager(RecallView* view, const BlockReader* reader, const TierEnv& env);
  // Gives this stream's warm bytes back to the global count.
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // Moves blocks down until every budget holds, with room for
  // incoming_warm more bytes in the warm tier; `exclude` (a block id, or
  // -1) is never moved. A deleted stream's blocks stay where they are.
  absl::Status EnforceBudgets(uint64_t incoming_warm = 0, int64_t exclude = -1)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Applies recall hits: each block's heat history, then a promotion to
  // warm (or, for a staged copy, a confirmation) if the block earns it: it
  // was recalled before within the heat half-life, and either the warm tier
  // has room for it or its keep score beats the warm block it would
  // push out by the policy's promotion_margin(), at most one such
  // displacing promotion per call. Takes mu_ per hit that may move (staged,
  // or not in RAM), applying the heat of the hits before it (at most 64)
  // in the same hold under one exclusive lock of the view. Goes on after an
  // error and returns the first.
  absl::Status ApplyHits(const std::vector<RecallHit>& hits)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stages up to prefetch_blocks likely blocks (SUMMED's best for the
  // pseudo query and the latest frame's signals) into the stage buffer.
  absl::Status StageLikelyBlocks(const std::vector<float>& pseudo_query)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The newest frame's signals, which the heat policy and staging score
  // against.
  void NoteSignals(FrameSignals signals) ABSL_LOCKS_EXCLUDED(signals_mu_);
  // Counts a warm copy of `bytes` the view is about to install: call it in
  // the same exclusive section of the view's lock as RecallView::Install
  // and before it (or before any move can run, at recovery), so a move sees
  // the block and its bytes together and never subtracts bytes that were
  // not added.
  void NoteInstalledWarm(uint64_t bytes);
  // The RAM a recovery may fill with blocks recorded warm: the stream's
  // warm budget and what the global one has left (UINT64_MAX: no cap). A
  // block's recorded tier is a hint, not its state: a demotion that keeps
  // the block's frames does not rewrite its record (13 MB at 7B, for a
  // tier that only recovery reads), so older blocks may still be recorded
  // warm; recovery loads those that fit, promoted ones first, then the
  // newest, and keeps the rest cold (Stream::ChooseWarmAtRecovery).
  uint64_t WarmRoomAtRecovery() const;
  // Runs f with no tier move in flight and none starting until it returns
  // (the stream marks itself deleted or gone in it: moves check that).
  void WithoutMoves(const std::function<void()>& f) ABSL_LOCKS_EXCLUDED(mu_);

  // The moves so far and the stage buffer's bytes into *c (PolicyCounters'
  // tier fields; shot cuts, rebuilds and latencies are the view's and
  // recall's, left as they are).
  void FillStats(PolicyCounters* c) const;

 private:
  friend class StreamTestPeer;  // tests/engine_fixture.h: Evict one block.
  struct TierMove {
    enum Op { kDemote, kDegrade, kEvict };
    int64_t victim = -1;  // -1: none.
    Op op = kDemote;
  };
  // The next move EnforceBudgets makes.
  TierMove NextTierMove(uint64_t incoming_warm, int64_t exclude) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
          ABSL_SHARED_LOCKS_REQUIRED(view_->mu());
  absl::Status EnforceBudgetsLocked(uint64_t incoming_warm, int64_t exclude)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Demote(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Degrade(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Evict(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Promote(uint64_t id, bool staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A recall picked staged block `id` (of `bytes` in RAM): make it warm.
  absl::Status ConfirmStaged(uint64_t id, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unstage(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A copy of `bytes` fits under the engine's warm cap beside the warm
  // blocks and all streams' staged copies (true without a cap).
  bool GlobalRoomToStage(uint64_t bytes) const;
  // The blocks staging picks for the pseudo query.
  std::vector<uint64_t> PickStaged(const std::vector<float>& pseudo_query) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `write` with rec's encoding added to it (unless !with_record:
  // the durable record stays as it was).
  absl::Status CommitRecord(const BlockRecord& rec, StreamWrite write,
                            bool with_record = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits a change of block id's durable form (its new record and the
  // storage changes in `write`) with the block's generation odd meanwhile;
  // on success installs rec and runs apply on the entry, under the view's
  // lock held exclusively (apply is annotated so; clang does not check a
  // lock across the std::function call itself). !with_record: a move that
  // changes no durable form (a demotion that keeps the block's frames)
  // leaves the stored record as it was (see WarmRoomAtRecovery).
  absl::Status CommitMove(uint64_t id, BlockRecord rec, StreamWrite write,
                          const std::function<void(BlockEntry&)>& apply,
                          bool with_record = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ReplacementContext PolicyContext() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_SHARED_LOCKS_REQUIRED(view_->mu());
  std::shared_ptr<const FrameSignals> LatestSignals() const
      ABSL_LOCKS_EXCLUDED(signals_mu_);
  // Whether recalled block `id` (its record before this hit: prior_hits,
  // prior_hit_frame) earns a promotion at frame `now` (see ApplyHits);
  // *displaces: it needs another warm block moved out first, which only
  // may_displace allows; *coldest_keep caches the keep score of the warm
  // block it would displace (NaN: not found yet; HUGE_VAL: none).
  bool AdmitPromotion(uint64_t id, float prior_hits, uint64_t prior_hit_frame,
                      uint64_t now, bool may_displace, double* coldest_keep,
                      bool* displaces) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_SHARED_LOCKS_REQUIRED(view_->mu());
  // The lowest-keep-score block matching pred, or -1.
  int64_t PickVictim(const std::function<bool(const BlockEntry&)>& pred,
                     const ReplacementContext& ctx) const
      ABSL_SHARED_LOCKS_REQUIRED(view_->mu());
  // Warm-tier RAM accounting (this stream's and the engine's).
  void AddWarm(int64_t bytes, bool staged);

  RecallView* const view_;
  const BlockReader* const reader_;
  const TierEnv env_;
  const StreamConfig& config_;
  const std::unique_ptr<ReplacementPolicy> policy_;

  kvmem::Mutex mu_;
  std::deque<uint64_t> staged_order_ ABSL_GUARDED_BY(mu_);  // FIFO.
  mutable kvmem::Mutex signals_mu_;  // A leaf: held only to swap a pointer.
  std::shared_ptr<const FrameSignals> latest_signals_
      ABSL_GUARDED_BY(signals_mu_);
  // Written in the same exclusive section of the view's lock as the
  // block's change (a move's under mu_ too); read anywhere.
  std::atomic<uint64_t> warm_bytes_{0};
  std::atomic<uint64_t> stage_bytes_{0};
  struct Moves {
    std::atomic<uint64_t> demotions{0}, degradations{0}, evictions{0},
        promotions{0}, promotions_declined{0}, staged{0}, stage_hits{0},
        stage_misses{0};
  } moves_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_TIERS_TIER_MANAGER_H_

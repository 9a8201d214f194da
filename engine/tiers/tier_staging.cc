// TierManager: two-phase prefetch (staging likely blocks, confirming or
// dropping them) and the recall hits that promote blocks.
#include <algorithm>
#include <cmath>

#include "base/status_macros.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/summed_scorer.h"
#include "engine/stream_config.h"
#include "engine/tiers/tier_manager.h"

namespace kvmem {

void TierManager::Unstage(uint64_t id) {
  kvmem::MutexLock lock(&view_->mu());
  if (!view_->blocks().Has(id)) return;  // Staged blocks are never evicted.
  BlockEntry& e = view_->entry(id);
  if (!e.staged) return;
  AddWarm(-static_cast<int64_t>(e.warm->allocated_bytes()), true);
  e.warm.reset();
  e.staged = false;
  moves_.stage_misses += 1;
}

std::vector<uint64_t> TierManager::PickStaged(
    const std::vector<float>& pseudo_query) const {
  const TierConfig& t = config_.tiers;
  std::vector<uint64_t> picks;
  CallCost prefetch_cost;  // The prefetch search counts as this stream's.
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    const BlockTable& blocks = view_->blocks();
    // The best 2 x prefetch_blocks candidates as score SUMMED ranks them.
    CandidateQuery q;
    q.vector = pseudo_query.data();
    q.dim = view_->summary_dim();
    const std::shared_ptr<const FrameSignals> latest = LatestSignals();
    const FrameSignals none;
    q.signals = latest != nullptr ? latest.get() : &none;
    q.eligible = view_->EligibleBlocks(view_->state().next_token_position);
    q.top_k = 2 * t.prefetch_blocks;
    std::vector<PlanUnit> units =
        SummedBlockCandidates(*view_, view_->indexes().all(), q, *env_.accel,
                              &prefetch_cost, nullptr);
    KeepBestBlocks(SummedPolicy(config_), q.top_k, &units);
    for (const PlanUnit& u : units) {
      const BlockEntry& e = blocks[u.block];
      if (e.warm || e.rec.disk == DiskForm::kNone) continue;
      picks.push_back(u.block);
      if (picks.size() == t.prefetch_blocks) break;
    }
  }
  if (env_.ledger != nullptr) env_.ledger->Add(prefetch_cost);
  return picks;
}

bool TierManager::GlobalRoomToStage(uint64_t bytes) const {
  if (env_.global_warm_budget == 0 || env_.global_warm_bytes == nullptr) {
    return true;
  }
  const uint64_t staged = env_.global_stage_bytes != nullptr
                              ? env_.global_stage_bytes->load()
                              : stage_bytes_.load();
  return env_.global_warm_bytes->load() + staged + bytes <=
         env_.global_warm_budget;
}

absl::Status TierManager::StageLikelyBlocks(
    const std::vector<float>& pseudo_query) {
  const TierConfig& t = config_.tiers;
  if (t.prefetch_blocks == 0) return absl::OkStatus();
  kvmem::MutexLock moves(&mu_);
  // Copies give way to warm blocks (this stream's or another's) that took
  // the room under the engine's cap since they were made.
  while (!GlobalRoomToStage(0) && !staged_order_.empty()) {
    Unstage(staged_order_.front());
    staged_order_.pop_front();
  }
  if (pseudo_query.size() != view_->summary_dim()) return absl::OkStatus();
  for (uint64_t id : PickStaged(pseudo_query)) {
    uint32_t tokens;
    {
      kvmem::ReaderMutexLock lock(&view_->mu());
      // Ids outlive the lock they came from.
      if (!view_->blocks().Has(id)) continue;
      tokens = view_->blocks()[id].rec.info.token_count;
    }
    const uint64_t bytes = WarmBlock::AllocatedBytes(config_.geometry, tokens);
    if (bytes > t.stage_budget_bytes) continue;
    // This stream's oldest copies make room under its stage budget, and
    // under the engine's warm cap (a copy is made only into room the warm
    // blocks and all streams' copies leave: with stage_budget_bytes of 2^64
    // one stream staged 260 MB beside a global cap of 8 MiB).
    while ((stage_bytes_.load(std::memory_order_relaxed) + bytes >
                t.stage_budget_bytes ||
            !GlobalRoomToStage(bytes)) &&
           !staged_order_.empty()) {
      Unstage(staged_order_.front());
      staged_order_.pop_front();
    }
    if (!GlobalRoomToStage(bytes)) break;
    KVMEM_RETURN_IF_ERROR(Promote(id, /*staged=*/true));
    staged_order_.push_back(id);
  }
  return absl::OkStatus();
}

absl::Status TierManager::ConfirmStaged(uint64_t id, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  // Confirmed by a query: the staged block becomes an ordinary warm one once
  // the warm tier has room for it (else it stays staged).
  KVMEM_RETURN_IF_ERROR(EnforceBudgetsLocked(bytes, static_cast<int64_t>(id)));
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    const TierConfig& t = config_.tiers;
    if (!view_->blocks()[id].staged ||
        (t.warm_budget_bytes > 0 &&
         warm_bytes_.load(std::memory_order_relaxed) + bytes >
             t.warm_budget_bytes)) {
      return absl::OkStatus();
    }
    rec = view_->blocks()[id].rec;
  }
  rec.info.tier = Tier::kWarm;
  KVMEM_RETURN_IF_ERROR(CommitRecord(rec, StreamWrite()));
  {
    kvmem::MutexLock lock(&view_->mu());
    BlockEntry& e = view_->entry(id);
    AddWarm(-static_cast<int64_t>(bytes), true);
    AddWarm(bytes, false);
    e.staged = false;
    e.sealed_record = false;
    view_->SetRecord(id, &rec);
    moves_.stage_hits += 1;
  }
  staged_order_.erase(
      std::remove(staged_order_.begin(), staged_order_.end(), id),
      staged_order_.end());
  return absl::OkStatus();
}

bool TierManager::AdmitPromotion(uint64_t id, float prior_hits,
                                 uint64_t prior_hit_frame, uint64_t now,
                                 bool may_displace, double* coldest_keep,
                                 bool* displaces) const {
  *displaces = false;
  const TierConfig& t = config_.tiers;
  // Recalled once is not evidence of a revisit: the block is read from the
  // store for that recall (a few of its tokens with token delivery), which
  // costs less than moving its whole payload up and another one down.
  if (prior_hits <= 0 || now < prior_hit_frame ||
      now - prior_hit_frame > t.heat_half_life_frames) {
    return false;
  }
  const BlockEntry& e = view_->blocks()[id];
  const uint64_t bytes =
      WarmBlock::AllocatedBytes(config_.geometry, e.rec.info.token_count);
  const bool stream_room =
      t.warm_budget_bytes == 0 ||
      warm_bytes_.load(std::memory_order_relaxed) + bytes <=
          t.warm_budget_bytes;
  const bool global_room =
      env_.global_warm_budget == 0 || env_.global_warm_bytes == nullptr ||
      env_.global_warm_bytes->load(std::memory_order_relaxed) + bytes <=
          env_.global_warm_budget;
  if (stream_room && global_room) return true;
  *displaces = true;
  if (!may_displace) return false;  // Without the scan below.
  // Room is made from this stream's warm blocks only: never by taking
  // another stream's RAM, never for a block hotter than the coldest one.
  const ReplacementContext ctx = PolicyContext();
  if (std::isnan(*coldest_keep)) {  // One scan of the blocks per pass.
    const int64_t victim = PickVictim(
        [id](const BlockEntry& w) {
          return w.warm && !w.staged && w.rec.info.id != id;
        },
        ctx);
    *coldest_keep = victim < 0
                        ? HUGE_VAL
                        : policy_->KeepScore(view_->blocks()[victim].rec, ctx);
  }
  return policy_->KeepScore(e.rec, ctx) >
         *coldest_keep + policy_->promotion_margin();
}

absl::Status TierManager::ApplyHits(const std::vector<RecallHit>& hits) {
  constexpr size_t kHeatBatch = 64;
  absl::Status first_error;
  bool displaced = false;  // At most one displacing promotion per call.
  // The coldest warm block's keep score, found once per call (NaN: not
  // yet); the demotion itself picks the coldest again.
  double coldest_keep = std::nan("");
  size_t next = 0;
  while (next < hits.size()) {
    // Per hit that may move, so an append waits for at most one hit's
    // moves (and the heat of the hits before it).
    kvmem::MutexLock moves(&mu_);
    // The heat of every hit up to the next one that may move (staged, or
    // not in RAM), under one exclusive hold of the view: one per hit made
    // each recall's release of its shared hold wake this thread, and the
    // next recall wait behind it.
    const RecallHit* hit = nullptr;
    bool candidate = false;
    float prior_hits = 0;
    uint64_t prior_hit_frame = 0;
    uint64_t staged_bytes = 0;
    {
      kvmem::MutexLock lock(&view_->mu());
      // At most kHeatBatch hits a hold: a long drained list must not keep
      // recalls out for long.
      for (size_t n = 0; n < kHeatBatch && next < hits.size() && hit == nullptr;
           ++n) {
        const RecallHit& h = hits[next++];
        if (view_->deleted() || !view_->blocks().Has(h.block)) continue;
        BlockEntry& e = view_->entry(h.block);
        const float prior = e.rec.hits;
        const uint64_t prior_frame = e.rec.last_hit_frame;
        e.rec.hits = static_cast<float>(
            DecayedHits(e.rec, h.frame, config_.tiers.heat_half_life_frames) +
            1);
        e.rec.last_hit_frame = h.frame;
        e.rec.last_access_frame = std::max(e.rec.last_access_frame, h.frame);
        if (e.staged) {
          staged_bytes = e.warm->allocated_bytes();
        } else {
          candidate = !e.warm && e.rec.disk != DiskForm::kNone;
        }
        if (staged_bytes > 0 || candidate) {
          hit = &h;
          prior_hits = prior;
          prior_hit_frame = prior_frame;
        }
      }
    }
    if (hit == nullptr) continue;  // A batch with nothing to move.
    bool promote = false;
    if (candidate) {
      // Shared: the victim scan reads every block and must not hold up
      // recalls (moves cannot interleave: mu_ is held).
      kvmem::ReaderMutexLock lock(&view_->mu());
      bool displaces = false;
      promote =
          AdmitPromotion(hit->block, prior_hits, prior_hit_frame, hit->frame,
                         !displaced, &coldest_keep, &displaces);
      displaced = displaced || (promote && displaces);
      if (!promote) moves_.promotions_declined += 1;
    }
    absl::Status s = promote ? Promote(hit->block, /*staged=*/false)
                             : ConfirmStaged(hit->block, staged_bytes);
    if (!s.ok() && first_error.ok()) first_error = s;  // Go on with the rest.
  }
  return first_error;
}

}  // namespace kvmem

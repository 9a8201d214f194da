// Stream: two-phase prefetch (staging likely blocks, confirming or
// dropping them), recall feedback and the maintenance that applies it.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {

void Stream::Unstage(uint64_t id) {
  kvmem::MutexLock lock(&mu_);
  if (!blocks_.Has(id)) return;  // Staged blocks are never evicted; still.
  BlockEntry& e = blocks_[id];
  if (!e.staged) return;
  AddWarm(-static_cast<int64_t>(e.warm->allocated_bytes()), true);
  e.warm.reset();
  e.staged = false;
  counters_.stage_misses += 1;
}

absl::Status Stream::StageLikelyBlocks(const std::vector<float>& pseudo_query,
                                       const FrameSignals& signals) {
  const TierConfig& t = config_.tiers;
  if (pseudo_query.size() != summary_dim_) return absl::OkStatus();
  std::vector<uint64_t> picks;
  CallCost prefetch_cost;  // The prefetch search counts as this stream's.
  {
    kvmem::ReaderMutexLock lock(&mu_);
    const size_t eligible = EligibleBlocks(state_.next_token_position);
    // The best 2 x prefetch_blocks candidates as score SUMMED ranks them.
    const uint32_t top_k = 2 * t.prefetch_blocks;
    std::vector<PlanUnit> units =
        BlockCandidates(*index_.all, pseudo_query.data(), 0, summary_dim_,
                        signals, eligible, top_k, 0, &prefetch_cost, nullptr);
    PlanPolicy policy;
    policy.mode = ScoreMode::kSummed;
    policy.model_scale =
        config_.weights.model /
        std::sqrt(static_cast<float>(config_.geometry.head_dim));
    RecallPlanner(policy).Rank(&units);
    if (units.size() > top_k) units.resize(top_k);
    for (const PlanUnit& u : units) {
      const BlockEntry& e = blocks_[u.block];
      if (e.warm || e.rec.disk == DiskForm::kNone) continue;
      picks.push_back(u.block);
      if (picks.size() == t.prefetch_blocks) break;
    }
  }
  AccountAccel(prefetch_cost);
  for (uint64_t id : picks) {
    uint32_t tokens;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      if (!blocks_.Has(id)) continue;  // Ids outlive the lock they came from.
      tokens = blocks_[id].rec.info.token_count;
    }
    const uint64_t bytes = WarmBlock::AllocatedBytes(config_.geometry, tokens);
    if (bytes > t.stage_budget_bytes) continue;
    for (;;) {
      uint64_t staged_now;
      {
        kvmem::ReaderMutexLock lock(&mu_);
        staged_now = stage_bytes_;
      }
      if (staged_now + bytes <= t.stage_budget_bytes || staged_order_.empty()) {
        break;
      }
      Unstage(staged_order_.front());
      staged_order_.pop_front();
    }
    KVMEM_RETURN_IF_ERROR(Promote(id, /*staged=*/true));
    staged_order_.push_back(id);
  }
  return absl::OkStatus();
}

absl::Status Stream::ConfirmStaged(uint64_t id, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  // Confirmed by a query: the staged block becomes an ordinary warm one once
  // the warm tier has room for it (else it stays staged).
  KVMEM_RETURN_IF_ERROR(EnforceBudgets(bytes, static_cast<int64_t>(id)));
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    const TierConfig& t = config_.tiers;
    if (!blocks_[id].staged || (t.warm_budget_bytes > 0 &&
                                warm_bytes_ + bytes > t.warm_budget_bytes)) {
      return absl::OkStatus();
    }
    rec = blocks_[id].rec;
  }
  rec.info.tier = Tier::kWarm;
  KVMEM_RETURN_IF_ERROR(CommitRecord(rec, StreamWrite()));
  kvmem::MutexLock lock(&mu_);
  BlockEntry& e = blocks_[id];
  AddWarm(-static_cast<int64_t>(bytes), true);
  AddWarm(bytes, false);
  e.staged = false;
  e.rec = std::move(rec);
  counters_.stage_hits += 1;
  staged_order_.erase(
      std::remove(staged_order_.begin(), staged_order_.end(), id),
      staged_order_.end());
  return absl::OkStatus();
}

absl::Status Stream::DrainFeedback() {
  std::vector<std::pair<uint64_t, uint64_t>> feedback;
  {
    kvmem::MutexLock lock(&feedback_mu_);
    feedback.swap(recalled_);
    maintenance_scheduled_ = false;
  }
  absl::Status first_error;
  for (const auto& [id, frame] : feedback) {
    bool promote = false;
    uint64_t staged_bytes = 0;
    {
      kvmem::MutexLock lock(&mu_);
      if (deleted_ || !blocks_.Has(id)) continue;
      BlockEntry& e = blocks_[id];
      e.rec.hits = static_cast<float>(
          DecayedHits(e.rec, frame, config_.tiers.heat_half_life_frames) + 1);
      e.rec.last_hit_frame = frame;
      e.rec.last_access_frame = std::max(e.rec.last_access_frame, frame);
      if (e.staged) {
        staged_bytes = e.warm->allocated_bytes();
      } else if (!e.warm && e.rec.disk != DiskForm::kNone) {
        promote = true;
      }
    }
    absl::Status s = promote ? Promote(id, /*staged=*/false)
                             : ConfirmStaged(id, staged_bytes);
    if (!s.ok() && first_error.ok()) first_error = s;  // Go on with the rest.
  }
  return first_error;
}

absl::Status Stream::RunMaintenance() {
  kvmem::MutexLock append_lock(&append_mu_);
  KVMEM_RETURN_IF_ERROR(DrainFeedback());
  return EnforceBudgets();
}

void Stream::ScheduleMaintenance() {
  {
    kvmem::MutexLock lock(&feedback_mu_);
    if (maintenance_scheduled_ || env_.background == nullptr) return;
    maintenance_scheduled_ = true;
  }
  std::weak_ptr<Stream> weak = weak_from_this();
  env_.background->Submit([weak] {
    if (auto s = weak.lock()) s->RunMaintenance().IgnoreError();
  });
}

}  // namespace kvmem

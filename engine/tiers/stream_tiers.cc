// Stream: tier moves, budgets, prefetch staging, feedback, index rebuilds
// and statistics.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/codec/quantize.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {

Tier Stream::TierOf(const BlockEntry& e) {
  // A staged copy sits in the stage buffer; the block's tier is still where
  // its durable copy is until a query confirms it.
  if (e.warm && !e.staged) return Tier::kWarm;
  switch (e.rec.disk) {
    case DiskForm::kFrames:
    case DiskForm::kFull:
      return Tier::kCold;
    case DiskForm::kInt8:
      return Tier::kDegraded;
    case DiskForm::kNone:
      return Tier::kEvicted;
  }
  return Tier::kUnspecified;
}

uint64_t Stream::DiskBytes(const BlockRecord& rec) const {
  switch (rec.disk) {
    case DiskForm::kFrames:
    case DiskForm::kFull:
      return rec.info.payload_bytes;
    case DiskForm::kInt8:
      return config_.geometry.layers *
             QuantizedLayerBytes(config_.geometry, rec.info.token_count);
    case DiskForm::kNone:
      return 0;
  }
  return 0;
}

ReplacementContext Stream::PolicyContext() const {
  ReplacementContext ctx;
  ctx.now_frame = state_.last_frame < 0 ? 0 : state_.last_frame;
  ctx.half_life_frames = config_.tiers.heat_half_life_frames;
  ctx.tracks = &tracks_;
  ctx.latest = &latest_signals_;
  return ctx;
}

int64_t Stream::PickVictim(const std::function<bool(const BlockEntry&)>& pred,
                           const ReplacementContext& ctx) const {
  int64_t victim = -1;
  double lowest = 0;
  for (const BlockEntry& e : blocks_) {
    if (!pred(e)) continue;
    const double keep = policy_->KeepScore(e.rec, ctx);
    if (victim < 0 || keep < lowest) {
      victim = static_cast<int64_t>(e.rec.info.id);
      lowest = keep;
    }
  }
  return victim;
}

absl::StatusOr<std::unique_ptr<WarmBlock>> Stream::LoadBlock(
    const BlockRecord& rec) const {
  const Geometry& g = config_.geometry;
  switch (rec.disk) {
    case DiskForm::kFrames: {
      std::vector<std::string> frames;
      for (uint64_t f = rec.info.first_frame; f <= rec.info.last_frame; ++f) {
        KVMEM_ASSIGN_OR_RETURN(std::string p, env_.store->GetFrame(id_, f));
        frames.push_back(std::move(p));
      }
      std::vector<absl::string_view> views(frames.begin(), frames.end());
      return WarmBlock::FromFrames(g, views, rec.frame_tokens);
    }
    case DiskForm::kFull:
    case DiskForm::kInt8: {
      std::vector<std::string> layers;
      for (uint32_t l = 0; l < g.layers; ++l) {
        KVMEM_ASSIGN_OR_RETURN(std::string bytes,
                               env_.store->GetBlockLayer(id_, rec.info.id, l));
        if (rec.disk == DiskForm::kInt8) {
          KVMEM_ASSIGN_OR_RETURN(
              bytes, DequantizeLayer(g, rec.info.token_count, bytes));
        }
        if (bytes.size() != 2 * LayerSliceElements(g, rec.info.token_count) *
                                DTypeBytes(g.dtype)) {
          return absl::DataLossError(absl::StrCat("layer ", l, " of block ",
                                                  rec.info.id, " has ",
                                                  bytes.size(), " bytes"));
        }
        layers.push_back(std::move(bytes));
      }
      return WarmBlock::FromLayers(g, rec.info.token_count, layers);
    }
    case DiskForm::kNone:
      break;
  }
  return absl::NotFoundError(absl::StrCat(
      "block ", rec.info.id, " of stream \"", id_, "\" was evicted"));
}

absl::Status Stream::CommitMove(uint64_t id, BlockRecord rec, StreamWrite write,
                                const std::function<void(BlockEntry&)>& apply) {
  {
    kvmem::MutexLock lock(&mu_);
    blocks_[id].generation += 1;  // Odd: readers retry until the move is over.
  }
  const absl::Status committed = CommitRecord(rec, std::move(write));
  kvmem::MutexLock lock(&mu_);
  BlockEntry& e = blocks_[id];
  e.generation += 1;  // Even again.
  if (!committed.ok()) return committed;
  e.rec = std::move(rec);
  apply(e);
  return absl::OkStatus();
}

absl::Status Stream::CommitRecord(const BlockRecord& rec, StreamWrite write) {
  write.stream_id = id_;
  write.blocks.emplace_back(rec.info.id, EncodeBlock(rec));
  return env_.store->Commit(write);
}

absl::Status Stream::EnforceBudgets(uint64_t incoming_warm, int64_t exclude) {
  const TierConfig& t = config_.tiers;
  enum class Op { kDemote, kDegrade, kEvict };
  // One move per round, re-measured each time. Room is made below before a
  // block moves down into a tier, so no tier overshoots its budget between
  // two moves (what a concurrent Stats would otherwise see).
  for (;;) {
    int64_t victim = -1;
    Op op = Op::kDemote;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      if (deleted_) return absl::OkStatus();
      const ReplacementContext ctx = PolicyContext();
      // Disk and cold totals take a pass over every block: only when a
      // budget needs them (a recall's maintenance runs this each time).
      uint64_t cold = 0, disk = 0;
      if (t.storage_cap_bytes > 0 || t.cold_budget_bytes > 0) {
        for (const BlockEntry& e : blocks_) {
          disk += DiskBytes(e.rec);
          if (TierOf(e) == Tier::kCold) cold += e.rec.info.payload_bytes;
        }
      }
      // A staged copy or the block being promoted must keep its durable form.
      auto coldest = [&](Tier tier) {
        return PickVictim(
            [tier, exclude](const BlockEntry& e) {
              return TierOf(e) == tier && !e.staged &&
                     static_cast<int64_t>(e.rec.info.id) != exclude;
            },
            ctx);
      };
      // Staged copies have their own per-stream budget and are not counted.
      const bool global_over =
          env_.global_warm_budget > 0 && env_.global_warm_bytes != nullptr &&
          env_.global_warm_bytes->load(std::memory_order_relaxed) +
                  incoming_warm >
              env_.global_warm_budget;
      if (t.storage_cap_bytes > 0 && disk > t.storage_cap_bytes) {
        // Degraded blocks go first; cold ones only when none is left.
        victim = coldest(Tier::kDegraded);
        if (victim < 0) victim = coldest(Tier::kCold);
        op = Op::kEvict;
      }
      if (victim < 0 && t.cold_budget_bytes > 0 && cold > t.cold_budget_bytes) {
        victim = coldest(Tier::kCold);
        op = Op::kDegrade;
      }
      if (victim < 0 && ((t.warm_budget_bytes > 0 &&
                          warm_bytes_ + incoming_warm > t.warm_budget_bytes) ||
                         (global_over && warm_bytes_ > 0))) {
        victim = PickVictim(
            [](const BlockEntry& e) { return e.warm && !e.staged; }, ctx);
        op = Op::kDemote;
        // Room in cold first, unless the victim lands in degraded anyway.
        if (victim >= 0 && t.cold_budget_bytes > 0 &&
            blocks_[victim].rec.disk != DiskForm::kInt8 &&
            cold + blocks_[victim].rec.info.payload_bytes >
                t.cold_budget_bytes) {
          const int64_t room = coldest(Tier::kCold);
          if (room >= 0) {
            victim = room;
            op = Op::kDegrade;
          }
        }
      }
    }
    if (victim < 0) return absl::OkStatus();
    const uint64_t id = static_cast<uint64_t>(victim);
    switch (op) {
      case Op::kDemote:
        KVMEM_RETURN_IF_ERROR(Demote(id));
        break;
      case Op::kDegrade:
        KVMEM_RETURN_IF_ERROR(Degrade(id));
        break;
      case Op::kEvict:
        KVMEM_RETURN_IF_ERROR(Evict(id));
        break;
    }
  }
}

absl::Status Stream::Demote(uint64_t id) {
  BlockRecord rec;
  std::shared_ptr<const WarmBlock> warm;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    rec = blocks_[id].rec;
    warm = blocks_[id].warm;
  }
  StreamWrite write;
  if (rec.disk == DiskForm::kFrames) {
    // First demotion: the block's durable copy changes from its frames to
    // per-layer records, written from the warm copy in the same batch.
    for (uint32_t l = 0; l < config_.geometry.layers; ++l) {
      write.block_layers.push_back({id, l, warm->LayerRecord(l)});
    }
    write.delete_frames.emplace_back(rec.info.first_frame, rec.info.last_frame);
    rec.disk = DiskForm::kFull;
  }
  rec.info.tier = rec.disk == DiskForm::kInt8 ? Tier::kDegraded : Tier::kCold;
  return CommitMove(
      id, std::move(rec), std::move(write), [this](BlockEntry& e) {
        AddWarm(-static_cast<int64_t>(e.warm->allocated_bytes()), false);
        e.warm.reset();
        counters_.demotions += 1;
      });
}

absl::Status Stream::Degrade(uint64_t id) {
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    rec = blocks_[id].rec;
  }
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<WarmBlock> full, LoadBlock(rec));
  StreamWrite write;
  for (uint32_t l = 0; l < config_.geometry.layers; ++l) {
    write.block_layers.push_back(
        {id, l,
         QuantizeLayer(config_.geometry, rec.info.token_count,
                       full->LayerRecord(l))});
  }
  if (rec.disk == DiskForm::kFrames) {
    write.delete_frames.emplace_back(rec.info.first_frame, rec.info.last_frame);
  }
  rec.disk = DiskForm::kInt8;
  rec.info.degraded = true;
  rec.info.tier = Tier::kDegraded;
  return CommitMove(id, std::move(rec), std::move(write),
                    [this](BlockEntry&) { counters_.degradations += 1; });
}

absl::Status Stream::Evict(uint64_t id) {
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    rec = blocks_[id].rec;
  }
  StreamWrite write;
  write.delete_block_layers.push_back(id);
  if (rec.disk == DiskForm::kFrames) {
    write.delete_frames.emplace_back(rec.info.first_frame, rec.info.last_frame);
  }
  const size_t groups = rec.group_summaries.size() / summary_dim_;
  const uint64_t bytes = rec.info.payload_bytes;
  // What an evicted block keeps, in RAM and on disk: its card (ids, frames,
  // positions, tokens, bytes, its frames' token counts), its heat and its
  // tracks (the track history the heat policy scores is rebuilt from them
  // at recovery); not what only recall reads (summary, token groups,
  // scene: recall never returns it). A fresh record, so no vector keeps
  // the capacity of what it held.
  BlockRecord slim;
  slim.info = rec.info;
  slim.frame_tokens = rec.frame_tokens;
  slim.tracks = rec.tracks;
  slim.info.tier = Tier::kEvicted;
  slim.disk = DiskForm::kNone;
  slim.last_access_frame = rec.last_access_frame;
  slim.hits = rec.hits;
  slim.last_hit_frame = rec.last_hit_frame;
  return CommitMove(id, std::move(slim), std::move(write),
                    [this, id, groups, bytes](BlockEntry&) {
                      RemoveFromIndexes(&index_, id, groups);
                      counters_.evictions += 1;
                      evicted_payload_bytes_.fetch_add(
                          bytes, std::memory_order_relaxed);
                      DropEvictedRun();
                    });
}

absl::Status Stream::Promote(uint64_t id, bool staged) {
  const TierConfig& t = config_.tiers;
  uint64_t bytes;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    // Evicted (its run may have left RAM): nothing to promote.
    if (!blocks_.Has(id) || blocks_[id].warm ||
        blocks_[id].rec.disk == DiskForm::kNone) {
      return absl::OkStatus();
    }
    bytes = WarmBlock::AllocatedBytes(config_.geometry,
                                      blocks_[id].rec.info.token_count);
  }
  if (!staged) {
    // Room first, so the warm tier never holds more than its budget; the
    // block itself is not a candidate for the moves that make it.
    KVMEM_RETURN_IF_ERROR(EnforceBudgets(bytes, static_cast<int64_t>(id)));
    kvmem::ReaderMutexLock lock(&mu_);
    if (t.warm_budget_bytes > 0 && warm_bytes_ + bytes > t.warm_budget_bytes) {
      return absl::OkStatus();  // Larger than the whole budget: stays put.
    }
  }
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    rec = blocks_[id].rec;  // Read after the moves above.
  }
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<WarmBlock> warm, LoadBlock(rec));
  if (!staged) {
    // Staging is speculative and stays in RAM; a promotion is recorded so a
    // restart brings the block back warm.
    rec.info.tier = Tier::kWarm;
    KVMEM_RETURN_IF_ERROR(CommitRecord(rec, StreamWrite()));
  }
  kvmem::MutexLock lock(&mu_);
  BlockEntry& e = blocks_[id];
  AddWarm(warm->allocated_bytes(), staged);
  e.warm = std::move(warm);
  e.staged = staged;
  e.rec = std::move(rec);
  if (staged) {
    counters_.staged += 1;
  } else {
    counters_.promotions += 1;
  }
  return absl::OkStatus();
}

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

void Stream::MaybeScheduleRebuild() {
  const TierConfig& t = config_.tiers;
  const auto now = std::chrono::steady_clock::now();
  const bool due =
      (t.rebuild_every_blocks > 0 &&
       blocks_since_rebuild_ >= t.rebuild_every_blocks) ||
      (t.rebuild_every_seconds > 0 &&
       now - last_rebuild_ >= std::chrono::seconds(t.rebuild_every_seconds));
  if (!due) return;
  blocks_since_rebuild_ = 0;
  last_rebuild_ = now;
  if (env_.background == nullptr) {
    RebuildIndex();
    return;
  }
  {
    kvmem::MutexLock lock(&feedback_mu_);
    if (rebuild_scheduled_) return;
    rebuild_scheduled_ = true;
  }
  std::weak_ptr<Stream> weak = weak_from_this();
  env_.background->Submit([weak] {
    if (auto s = weak.lock()) s->RebuildIndex();
  });
}

size_t Stream::RebuildIndex() {
  std::vector<BlockRecord> snapshot;  // Summaries only.
  size_t n;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    n = blocks_.size();
    for (const BlockEntry& e : blocks_) {
      if (e.rec.disk != DiskForm::kNone) {
        BlockRecord r;
        r.info.id = e.rec.info.id;
        r.summary = e.rec.summary;
        r.group_summaries = e.rec.group_summaries;
        snapshot.push_back(std::move(r));
      }
    }
  }
  // The expensive part runs without any lock: Recall keeps using the old
  // indexes meanwhile.
  Indexes fresh = NewIndexes();
  for (const BlockRecord& r : snapshot) AddToIndexes(&fresh, r.info.id, r);
  size_t indexed;
  {
    kvmem::MutexLock lock(&mu_);
    // Reconcile with what happened during the build, then swap. Blocks
    // sealed meanwhile may already be evicted and their run dropped (an
    // append holds append_mu_, not this lock, while the index builds).
    for (uint64_t id = std::max<uint64_t>(n, blocks_.first());
         id < blocks_.size(); ++id) {
      if (blocks_[id].rec.disk != DiskForm::kNone)
        AddToIndexes(&fresh, id, blocks_[id].rec);
    }
    for (const BlockRecord& r : snapshot) {
      if (!blocks_.Has(r.info.id) ||
          blocks_[r.info.id].rec.disk == DiskForm::kNone) {
        RemoveFromIndexes(&fresh, r.info.id,
                          r.group_summaries.size() / summary_dim_);
      }
    }
    retired_quality_ = RetiredQuality(index_, retired_quality_);
    index_ = std::move(fresh);
    counters_.rebuilds += 1;
    indexed = index_.all->size();
  }
  kvmem::MutexLock lock(&feedback_mu_);
  rebuild_scheduled_ = false;
  return indexed;
}

void Stream::RecordRecallLatency(uint32_t us) {
  kvmem::MutexLock lock(&feedback_mu_);
  constexpr size_t kRing = 1024;
  if (recall_us_.size() < kRing) {
    recall_us_.push_back(us);
  } else {
    recall_us_[recall_us_next_] = us;
  }
  recall_us_next_ = (recall_us_next_ + 1) % kRing;
}

StreamStats Stream::Stats() const {
  StreamStats s;
  s.stream_id = id_;
  s.config = config_;
  s.summary_dim = summary_dim_;
  s.recalls = recalls_.load(std::memory_order_relaxed);
  s.recalled_blocks = recalled_blocks_.load(std::memory_order_relaxed);
  s.recalled_tokens = recalled_tokens_.load(std::memory_order_relaxed);
  {
    kvmem::ReaderMutexLock lock(&mu_);
    s.closed = state_.closed;
    s.last_durable_frame = state_.last_frame;
    s.next_token_position = state_.next_token_position;
    s.frames = state_.frames;
    s.tokens = state_.tokens;
    s.sealed_blocks = blocks_.size();
    s.evicted.blocks = blocks_.first();  // The dropped run (BlockTable).
    s.open_block_frames = state_.open_block_frames;
    s.payload_bytes = state_.payload_bytes;
    for (const BlockEntry& e : blocks_) {
      if (e.rec.disk != DiskForm::kNone) {
        s.summary_bytes +=
            (e.rec.summary.size() + e.rec.group_summaries.size()) *
                sizeof(float) +
            e.rec.token_group.size();
      }
      switch (TierOf(e)) {
        case Tier::kWarm:
          s.warm.blocks += 1;
          s.warm.bytes += e.warm->allocated_bytes();
          break;
        case Tier::kCold:
          s.cold.blocks += 1;
          s.cold.bytes += DiskBytes(e.rec);
          break;
        case Tier::kDegraded:
          s.degraded.blocks += 1;
          s.degraded.bytes += DiskBytes(e.rec);
          break;
        default:
          s.evicted.blocks += 1;
      }
    }
    s.policy = counters_;
    s.policy.stage_bytes = stage_bytes_;
    IndexQuality q = RetiredQuality(index_, retired_quality_);
    s.index_recall_samples = q.samples;
    s.index_recall_at_k = q.recall();
    s.accel.warning = RecallFloorWarning();
  }
  const AcceleratorStats device = accel().Stats();
  s.accel.backend = device.backend;
  s.accel.sram_bytes = device.sram_bytes;
  s.accel.sram_hot_bytes = device.sram_hot_bytes;
  s.accel.sram_staging_bytes = device.sram_staging_bytes;
  s.accel.sram_repartitions = device.repartitions;
  s.accel.recall_floor = device.recall_floor;
  {
    kvmem::MutexLock lock(&accel_mu_);
    s.accel.cost = accel_cost_;
  }
  s.warm_bytes = s.warm.bytes;
  s.cold_bytes = s.cold.bytes;
  std::vector<uint32_t> lat;
  {
    kvmem::MutexLock lock(&feedback_mu_);
    lat = recall_us_;
  }
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    s.policy.recall_us_p50 = lat[lat.size() / 2];
    s.policy.recall_us_p99 =
        lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
    s.policy.recall_us_max = lat.back();
  }
  return s;
}

}  // namespace kvmem

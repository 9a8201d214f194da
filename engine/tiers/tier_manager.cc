#include "engine/tiers/tier_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/quantize.h"
#include "engine/stream_config.h"

namespace kvmem {

TierManager::TierManager(RecallView* view, const BlockReader* reader,
                         const TierEnv& env)
    : view_(view),
      reader_(reader),
      env_(env),
      config_(view->config()),
      policy_(NewReplacementPolicy(config_.tiers.replacement)) {}

TierManager::~TierManager() {
  AddWarm(-static_cast<int64_t>(warm_bytes_.load()), false);
  AddWarm(-static_cast<int64_t>(stage_bytes_.load()), true);
}

void TierManager::AddWarm(int64_t bytes, bool staged) {
  std::atomic<uint64_t>& local = staged ? stage_bytes_ : warm_bytes_;
  local.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  std::atomic<uint64_t>* global =
      staged ? env_.global_stage_bytes : env_.global_warm_bytes;
  if (global != nullptr) {
    global->fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  }
}

void TierManager::NoteInstalledWarm(uint64_t bytes) {
  AddWarm(static_cast<int64_t>(bytes), false);
}

void TierManager::NoteSignals(FrameSignals signals) {
  auto latest = std::make_shared<const FrameSignals>(std::move(signals));
  kvmem::MutexLock lock(&signals_mu_);
  latest_signals_.swap(latest);
}  // The old signals are freed here, outside the lock.

std::shared_ptr<const FrameSignals> TierManager::LatestSignals() const {
  kvmem::MutexLock lock(&signals_mu_);
  return latest_signals_;
}

void TierManager::WithoutMoves(const std::function<void()>& f) {
  kvmem::MutexLock lock(&mu_);
  f();
}

void TierManager::FillStats(PolicyCounters* c) const {
  c->demotions = moves_.demotions.load(std::memory_order_relaxed);
  c->degradations = moves_.degradations.load(std::memory_order_relaxed);
  c->evictions = moves_.evictions.load(std::memory_order_relaxed);
  c->promotions = moves_.promotions.load(std::memory_order_relaxed);
  c->promotions_declined =
      moves_.promotions_declined.load(std::memory_order_relaxed);
  c->staged = moves_.staged.load(std::memory_order_relaxed);
  c->stage_hits = moves_.stage_hits.load(std::memory_order_relaxed);
  c->stage_misses = moves_.stage_misses.load(std::memory_order_relaxed);
  c->stage_bytes = stage_bytes_.load(std::memory_order_relaxed);
}

ReplacementContext TierManager::PolicyContext() const {
  ReplacementContext ctx;
  const StreamState& state = view_->state();
  ctx.now_frame = state.last_frame < 0 ? 0 : state.last_frame;
  ctx.half_life_frames = config_.tiers.heat_half_life_frames;
  ctx.tracks = &view_->tracks();
  ctx.latest_owner = LatestSignals();
  ctx.latest = ctx.latest_owner.get();
  return ctx;
}

int64_t TierManager::PickVictim(
    const std::function<bool(const BlockEntry&)>& pred,
    const ReplacementContext& ctx) const {
  int64_t victim = -1;
  double lowest = 0;
  for (const BlockEntry& e : view_->blocks()) {
    if (!pred(e)) continue;
    const double keep = policy_->KeepScore(e.rec, ctx);
    if (victim < 0 || keep < lowest) {
      victim = static_cast<int64_t>(e.rec.info.id);
      lowest = keep;
    }
  }
  return victim;
}

absl::Status TierManager::CommitMove(
    uint64_t id, BlockRecord rec, StreamWrite write,
    const std::function<void(BlockEntry&)>& apply, bool with_record) {
  {
    kvmem::MutexLock lock(&view_->mu());
    // Odd: readers retry until the move is over.
    view_->entry(id).generation += 1;
  }
  const absl::Status committed =
      CommitRecord(rec, std::move(write), with_record);
  kvmem::MutexLock lock(&view_->mu());
  BlockEntry& e = view_->entry(id);
  e.generation += 1;  // Even again.
  if (!committed.ok()) return committed;
  // Swapped, not move-assigned: a std::string assigned from a short one
  // keeps its own buffer (libstdc++ copies into it), so an evicted block's
  // entry kept the capacity of its token codes (9 KiB a block in the soak:
  // its RSS grew ~200 KiB/s). The old record dies with `rec`.
  view_->SetRecord(id, &rec);
  if (with_record) e.sealed_record = false;
  apply(e);
  return absl::OkStatus();
}

absl::Status TierManager::CommitRecord(const BlockRecord& rec,
                                       StreamWrite write, bool with_record) {
  write.stream_id = view_->stream_id();
  if (with_record) write.blocks.emplace_back(rec.info.id, EncodeBlock(rec));
  return env_.store->Commit(write);
}

uint64_t TierManager::WarmRoomAtRecovery() const {
  uint64_t room = config_.tiers.warm_budget_bytes > 0
                      ? config_.tiers.warm_budget_bytes
                      : UINT64_MAX;
  if (env_.global_warm_budget > 0 && env_.global_warm_bytes != nullptr) {
    const uint64_t used = env_.global_warm_bytes->load();
    room = std::min(room, env_.global_warm_budget > used
                              ? env_.global_warm_budget - used
                              : 0);
  }
  return room;
}

absl::Status TierManager::EnforceBudgets(uint64_t incoming_warm,
                                         int64_t exclude) {
  kvmem::MutexLock lock(&mu_);
  return EnforceBudgetsLocked(incoming_warm, exclude);
}

absl::Status TierManager::EnforceBudgetsLocked(uint64_t incoming_warm,
                                               int64_t exclude) {
  // One move per round, re-measured each time. Room is made below before a
  // block moves down into a tier, so no tier overshoots its budget between
  // two moves (what a concurrent Stats would otherwise see).
  for (;;) {
    TierMove move;
    {
      kvmem::ReaderMutexLock lock(&view_->mu());
      if (view_->deleted()) return absl::OkStatus();
      move = NextTierMove(incoming_warm, exclude);
    }
    if (move.victim < 0) return absl::OkStatus();
    const uint64_t id = static_cast<uint64_t>(move.victim);
    switch (move.op) {
      case TierMove::kDemote:
        KVMEM_RETURN_IF_ERROR(Demote(id));
        break;
      case TierMove::kDegrade:
        KVMEM_RETURN_IF_ERROR(Degrade(id));
        break;
      case TierMove::kEvict:
        KVMEM_RETURN_IF_ERROR(Evict(id));
        break;
    }
  }
}

TierManager::TierMove TierManager::NextTierMove(uint64_t incoming_warm,
                                                int64_t exclude) const {
  const TierConfig& t = config_.tiers;
  const BlockTable& blocks = view_->blocks();
  TierMove move;
  const ReplacementContext ctx = PolicyContext();
  // Disk and cold totals take a pass over every block: only when a budget
  // needs them (a recall's maintenance runs this each time).
  uint64_t cold = 0, disk = 0;
  if (t.storage_cap_bytes > 0 || t.cold_budget_bytes > 0) {
    for (const BlockEntry& e : blocks) {
      const uint64_t bytes = DiskBytes(config_, e.rec);
      disk += bytes;
      if (TierOf(e) == Tier::kCold) cold += bytes;
    }
  }
  // A staged copy or the block being promoted must keep its durable form.
  auto coldest = [&](Tier tier) ABSL_SHARED_LOCKS_REQUIRED(view_->mu()) {
    return PickVictim(
        [tier, exclude](const BlockEntry& e) {
          return TierOf(e) == tier && !e.staged &&
                 static_cast<int64_t>(e.rec.info.id) != exclude;
        },
        ctx);
  };
  const uint64_t warm = warm_bytes_.load(std::memory_order_relaxed);
  // Staged copies have their own per-stream budget and are not counted.
  const bool global_over =
      env_.global_warm_budget > 0 && env_.global_warm_bytes != nullptr &&
      env_.global_warm_bytes->load(std::memory_order_relaxed) + incoming_warm >
          env_.global_warm_budget;
  if (t.storage_cap_bytes > 0 && disk > t.storage_cap_bytes) {
    // Degraded blocks go first; cold ones only when none is left.
    move.victim = coldest(Tier::kDegraded);
    if (move.victim < 0) move.victim = coldest(Tier::kCold);
    move.op = TierMove::kEvict;
  }
  if (move.victim < 0 && t.cold_budget_bytes > 0 &&
      cold > t.cold_budget_bytes) {
    move = {coldest(Tier::kCold), TierMove::kDegrade};
  }
  if (move.victim < 0 && ((t.warm_budget_bytes > 0 &&
                           warm + incoming_warm > t.warm_budget_bytes) ||
                          (global_over && warm > 0))) {
    move = {PickVictim([](const BlockEntry& e) { return e.warm && !e.staged; },
                       ctx),
            TierMove::kDemote};
    // Room in cold first, unless the victim lands in degraded anyway.
    if (move.victim >= 0 && t.cold_budget_bytes > 0 &&
        blocks[move.victim].rec.disk != DiskForm::kInt8 &&
        blocks[move.victim].rec.disk != DiskForm::kInt4 &&
        t.cold_precision == ColdPrecision::kFull &&
        cold + DiskBytes(config_, blocks[move.victim].rec) >
            t.cold_budget_bytes) {
      const int64_t room = coldest(Tier::kCold);
      if (room >= 0) move = {room, TierMove::kDegrade};
    }
  }
  return move;
}

absl::Status TierManager::Demote(uint64_t id) {
  BlockRecord rec;
  std::shared_ptr<const WarmBlock> warm;
  bool sealed_record;
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    rec = view_->blocks()[id].rec;
    warm = view_->blocks()[id].warm;
    sealed_record = view_->blocks()[id].sealed_record;
  }
  StreamWrite write;
  bool keeps_record = false;
  const ColdPrecision precision = config_.tiers.cold_precision;
  if (rec.disk == DiskForm::kFrames && precision != ColdPrecision::kFull) {
    // A stream kept compressed on disk: its first demotion writes the
    // compressed form from the warm copy, in place of its frames.
    const bool int4 = precision == ColdPrecision::kInt4;
    const uint32_t tokens = rec.info.token_count;
    for (uint32_t l = 0; l < config_.geometry.layers; ++l) {
      const std::string layer = warm->LayerRecord(l);
      write.block_layers.push_back(
          {id, l,
           int4 ? QuantizeLayerInt4(config_.geometry, tokens, layer)
                : QuantizeLayer(config_.geometry, tokens, layer)});
    }
    write.delete_frames.emplace_back(rec.info.first_frame, rec.info.last_frame);
    rec.disk = int4 ? DiskForm::kInt4 : DiskForm::kInt8;
    rec.info.degraded = true;
  } else if (rec.disk == DiskForm::kFrames &&
             (env_.demote_keeps_frames ||
              FramesEncoded(config_.tiers.ingest_precision))) {
    // The frames stay its durable copy (always when they are stored
    // compressed: per-layer records would be the full precision's bytes
    // again); their signals (only an open
    // block's are read back) are in the block's record. No durable form
    // changes: a record its seal wrote is not rewritten (13 MB at 7B; see
    // WarmRoomAtRecovery), one a promotion wrote is (recovery would take
    // it for warm).
    write.delete_frame_metas.emplace_back(rec.info.first_frame,
                                          rec.info.last_frame);
    keeps_record = sealed_record;
  } else if (rec.disk == DiskForm::kFrames) {
    // First demotion: the block's durable copy changes from its frames to
    // per-layer records, written from the warm copy in the same batch.
    for (uint32_t l = 0; l < config_.geometry.layers; ++l) {
      write.block_layers.push_back({id, l, warm->LayerRecord(l)});
    }
    write.delete_frames.emplace_back(rec.info.first_frame, rec.info.last_frame);
    rec.disk = DiskForm::kFull;
  }
  rec.info.tier = rec.disk == DiskForm::kInt8 || rec.disk == DiskForm::kInt4
                      ? Tier::kDegraded
                      : Tier::kCold;
  return CommitMove(
      id, std::move(rec), std::move(write),
      [this](BlockEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(view_->mu()) {
        AddWarm(-static_cast<int64_t>(e.warm->allocated_bytes()), false);
        e.warm.reset();
        moves_.demotions += 1;
      },
      /*with_record=*/!keeps_record);
}

absl::Status TierManager::Degrade(uint64_t id) {
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    rec = view_->blocks()[id].rec;
  }
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<WarmBlock> full, reader_->Load(rec));
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
                    [this](BlockEntry&) { moves_.degradations += 1; });
}

absl::Status TierManager::Evict(uint64_t id) {
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    rec = view_->blocks()[id].rec;
  }
  StreamWrite write;
  write.delete_block_layers.push_back(id);
  if (rec.disk == DiskForm::kFrames) {
    write.delete_frames.emplace_back(rec.info.first_frame, rec.info.last_frame);
  }
  const size_t groups = rec.group_summaries.size() / view_->summary_dim();
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
                    [this, id, groups, bytes](BlockEntry&)
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(view_->mu()) {
                          view_->Unindex(id, groups, bytes);
                          moves_.evictions += 1;
                          view_->DropEvictedRun();
                        });
}

absl::Status TierManager::Promote(uint64_t id, bool staged) {
  const TierConfig& t = config_.tiers;
  uint64_t bytes;
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    const BlockTable& blocks = view_->blocks();
    // Evicted (its run may have left RAM): nothing to promote.
    if (!blocks.Has(id) || blocks[id].warm ||
        blocks[id].rec.disk == DiskForm::kNone) {
      return absl::OkStatus();
    }
    bytes = WarmBlock::AllocatedBytes(config_.geometry,
                                      blocks[id].rec.info.token_count);
  }
  if (!staged) {
    // Room first, so the warm tier never holds more than its budget; the
    // block itself is not a candidate for the moves that make it.
    KVMEM_RETURN_IF_ERROR(
        EnforceBudgetsLocked(bytes, static_cast<int64_t>(id)));
    if (t.warm_budget_bytes > 0 &&
        warm_bytes_.load(std::memory_order_relaxed) + bytes >
            t.warm_budget_bytes) {
      return absl::OkStatus();  // Larger than the whole budget: stays put.
    }
  }
  BlockRecord rec;
  {
    kvmem::ReaderMutexLock lock(&view_->mu());
    rec = view_->blocks()[id].rec;  // Read after the moves above.
  }
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<WarmBlock> warm, reader_->Load(rec));
  if (!staged) {
    // Staging is speculative and stays in RAM; a promotion is recorded so a
    // restart brings the block back warm.
    rec.info.tier = Tier::kWarm;
    KVMEM_RETURN_IF_ERROR(CommitRecord(rec, StreamWrite()));
  }
  kvmem::MutexLock lock(&view_->mu());
  BlockEntry& e = view_->entry(id);
  AddWarm(warm->allocated_bytes(), staged);
  e.warm = std::move(warm);
  e.staged = staged;
  view_->SetRecord(id, &rec);
  if (staged) {
    moves_.staged += 1;
  } else {
    e.sealed_record = false;  // The promotion wrote its record.
    moves_.promotions += 1;
  }
  return absl::OkStatus();
}

}  // namespace kvmem

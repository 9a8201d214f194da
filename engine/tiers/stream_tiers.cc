// Stream: tier moves (demote, degrade, evict, promote), the budgets that
// drive them and the replacement policy choosing victims.
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
  // One move per round, re-measured each time. Room is made below before a
  // block moves down into a tier, so no tier overshoots its budget between
  // two moves (what a concurrent Stats would otherwise see).
  for (;;) {
    TierMove move;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      if (deleted_) return absl::OkStatus();
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

Stream::TierMove Stream::NextTierMove(uint64_t incoming_warm,
                                      int64_t exclude) const {
  const TierConfig& t = config_.tiers;
  TierMove move;
  const ReplacementContext ctx = PolicyContext();
  // Disk and cold totals take a pass over every block: only when a budget
  // needs them (a recall's maintenance runs this each time).
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
                           warm_bytes_ + incoming_warm > t.warm_budget_bytes) ||
                          (global_over && warm_bytes_ > 0))) {
    move = {PickVictim([](const BlockEntry& e) { return e.warm && !e.staged; },
                       ctx),
            TierMove::kDemote};
    // Room in cold first, unless the victim lands in degraded anyway.
    if (move.victim >= 0 && t.cold_budget_bytes > 0 &&
        blocks_[move.victim].rec.disk != DiskForm::kInt8 &&
        cold + blocks_[move.victim].rec.info.payload_bytes >
            t.cold_budget_bytes) {
      const int64_t room = coldest(Tier::kCold);
      if (room >= 0) move = {room, TierMove::kDegrade};
    }
  }
  return move;
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

}  // namespace kvmem

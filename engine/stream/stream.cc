#include "engine/stream/stream.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/stream/signals.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Token count of a stored frame payload of `bytes` bytes.
absl::StatusOr<uint32_t> StoredFrameTokens(const Geometry& g,
                                           const std::string& stream,
                                           uint64_t frame, size_t bytes) {
  const uint64_t per_token = FramePayloadBytes(g, 1);
  if (bytes == 0 || bytes % per_token != 0) {
    return absl::DataLossError(absl::StrCat("stream ", stream, ": frame ",
                                            frame, " has ", bytes, " bytes"));
  }
  return static_cast<uint32_t>(bytes / per_token);
}

}  // namespace

Stream::Stream(const std::string& id, const StreamConfig& config,
               const StreamEnv& env, const StreamState& state)
    : id_(id),
      config_(config),
      env_(env),
      summary_dim_(SummaryDim(config)),
      layer_dim_(config.geometry.kv_heads * config.geometry.head_dim),
      policy_(NewReplacementPolicy(config.tiers.replacement)),
      open_(config_),
      last_rebuild_(std::chrono::steady_clock::now()),
      state_(state) {
  kvmem::MutexLock lock(&mu_);
  index_ = NewIndexes();
}

uint64_t Stream::AcknowledgedFrames() const {
  kvmem::ReaderMutexLock lock(&mu_);
  return static_cast<uint64_t>(state_.last_frame + 1);
}

Stream::~Stream() {
  kvmem::MutexLock lock(&mu_);
  AddWarm(-static_cast<int64_t>(warm_bytes_), false);
  AddWarm(-static_cast<int64_t>(stage_bytes_), true);
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(
    const std::string& id, const StreamConfig& config, const StreamEnv& env) {
  StreamState state;
  StreamWrite write;
  write.stream_id = id;
  write.config = EncodeConfig(config);
  write.state = EncodeState(state);
  KVMEM_RETURN_IF_ERROR(env.store->Commit(write));
  return std::unique_ptr<Stream>(new Stream(id, config, env, state));
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Recover(
    const std::string& id, const StreamConfig& config, const StreamState& state,
    const StreamEnv& env) {
  std::unique_ptr<Stream> s(new Stream(id, config, env, state));
  auto frame_tokens = [&](uint64_t f) -> absl::StatusOr<uint32_t> {
    KVMEM_ASSIGN_OR_RETURN(std::string payload, env.store->GetFrame(id, f));
    return StoredFrameTokens(config.geometry, id, f, payload.size());
  };
  std::vector<BlockRecord> records;
  KVMEM_RETURN_IF_ERROR(env.store->ScanBlocks(
      id, [&](uint64_t block_id, absl::string_view bytes) -> absl::Status {
        KVMEM_ASSIGN_OR_RETURN(BlockRecord rec, DecodeBlock(bytes));
        const size_t want_dim =
            rec.disk == DiskForm::kNone ? 0 : s->summary_dim_;
        if (rec.info.id != block_id || block_id != records.size() ||
            rec.summary.size() != want_dim) {
          return absl::DataLossError(
              absl::StrCat("stream ", id, ": block record ", block_id,
                           " does not follow "
                           "block ",
                           records.size(), " or has a summary of ",
                           rec.summary.size(), " values"));
        }
        if (rec.frame_tokens.empty()) {  // Written before records kept them.
          for (uint64_t f = rec.info.first_frame; f <= rec.info.last_frame;
               ++f) {
            KVMEM_ASSIGN_OR_RETURN(uint32_t t, frame_tokens(f));
            rec.frame_tokens.push_back(t);
          }
        }
        records.push_back(std::move(rec));
        return absl::OkStatus();
      }));
  if (records.size() != state.next_block_id) {
    return absl::DataLossError(
        absl::StrCat("stream ", id, ": state expects ", state.next_block_id,
                     " blocks, store holds ", records.size()));
  }
  for (BlockRecord& rec : records) {
    BlockEntry entry;
    if (rec.info.tier == Tier::kWarm) {
      KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<WarmBlock> warm,
                             s->LoadBlock(rec));
      entry.warm = std::move(warm);
    }
    entry.rec = std::move(rec);
    kvmem::MutexLock lock(&s->mu_);
    s->InstallBlock(std::move(entry));
  }
  {
    kvmem::MutexLock lock(&s->mu_);
    s->DropEvictedRun();
  }
  kvmem::MutexLock lock(&s->append_mu_);
  KVMEM_RETURN_IF_ERROR(s->ReplayOpenBlock(state));
  // Budgets may have shrunk since the blocks were recorded warm. A store
  // that refuses writes (disk full) leaves the blocks where they are: the
  // next append applies the budgets again.
  if (absl::Status b = s->EnforceBudgets();
      !b.ok() && !absl::IsResourceExhausted(b)) {
    return b;
  }
  return s;
}

absl::Status Stream::ReplayOpenBlock(const StreamState& state) {
  ResetOpenBlock();
  for (uint64_t f = state.open_block_first_frame;
       f < state.open_block_first_frame + state.open_block_frames; ++f) {
    Frame frame;
    frame.index = f;
    KVMEM_ASSIGN_OR_RETURN(frame.payload, env_.store->GetFrame(id_, f));
    KVMEM_ASSIGN_OR_RETURN(
        frame.token_count,
        StoredFrameTokens(config_.geometry, id_, f, frame.payload.size()));
    absl::StatusOr<std::string> meta = env_.store->GetFrameMeta(id_, f);
    if (meta.ok()) {
      KVMEM_ASSIGN_OR_RETURN(frame.signals, DecodeSignals(*meta));
    } else if (!absl::IsNotFound(meta.status())) {
      return meta.status();
    }
    open_.Add(&frame, open_.Signature(frame));
    latest_signals_ = std::move(frame.signals);
  }
  OpenMean open = OpenBlockMean();
  kvmem::MutexLock lock(&mu_);
  PublishOpenMean(std::move(open));
  return absl::OkStatus();
}

absl::Status Stream::DeletedError() const {
  return absl::NotFoundError(absl::StrCat("stream \"", id_, "\" not found"));
}

absl::Status Stream::UnknownBlockError(uint64_t block_id) const {
  return absl::NotFoundError(absl::StrCat("block_ids has ", block_id,
                                          "; stream \"", id_, "\" has ",
                                          blocks_.size(), " sealed blocks"));
}

absl::Status Stream::MissingBlockError(uint64_t block_id) const {
  if (block_id < blocks_.first()) {
    return absl::NotFoundError(absl::StrCat("block ", block_id, " of stream \"",
                                            id_, "\" was evicted"));
  }
  return UnknownBlockError(block_id);
}

absl::Status Stream::NotFoundIfDeleted() const {
  kvmem::ReaderMutexLock lock(&mu_);
  return deleted_ ? DeletedError() : absl::OkStatus();
}

void Stream::ResetOpenBlock() { open_.Reset(); }

uint64_t Stream::RetainedPayloadBytes() const {
  uint64_t appended;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    appended = state_.payload_bytes;
  }
  return appended - evicted_payload_bytes_.load(std::memory_order_relaxed);
}

void Stream::AddWarm(int64_t bytes, bool staged) {
  uint64_t& local = staged ? stage_bytes_ : warm_bytes_;
  local += bytes;
  if (env_.global_warm_bytes != nullptr && !staged) {
    env_.global_warm_bytes->fetch_add(static_cast<uint64_t>(bytes),
                                      std::memory_order_relaxed);
  }
}

absl::Status Stream::Close() {
  kvmem::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    if (deleted_) return DeletedError();
    if (state_.closed) return absl::OkStatus();
    next = state_;
  }
  StreamWrite write;
  write.stream_id = id_;
  std::vector<BlockEntry> sealed;
  if (next.open_block_frames > 0) {
    sealed.push_back(
        SealOpenBlock(&next, &write, static_cast<uint64_t>(next.last_frame)));
  }
  next.closed = true;
  write.state = EncodeState(next);
  KVMEM_RETURN_IF_ERROR(env_.store->Commit(write));
  ResetOpenBlock();
  {
    kvmem::MutexLock lock(&mu_);
    state_ = next;
    for (BlockEntry& e : sealed) InstallBlock(std::move(e));
    PublishOpenMean(OpenMean{});  // The open block is empty now.
  }
  return EnforceBudgets();
}

absl::Status Stream::Reopen() {
  kvmem::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    if (deleted_) return DeletedError();
    if (!state_.closed) return absl::OkStatus();
    next = state_;
  }
  next.closed = false;
  StreamWrite write;
  write.stream_id = id_;
  write.state = EncodeState(next);
  KVMEM_RETURN_IF_ERROR(env_.store->Commit(write));
  kvmem::MutexLock lock(&mu_);
  state_ = next;
  return absl::OkStatus();
}

void Stream::MarkDeleted(bool deleted) {
  kvmem::MutexLock append_lock(&append_mu_);
  kvmem::MutexLock lock(&mu_);
  deleted_ = deleted;
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

// Stream: construction, recovery, Close/Reopen/deletion, stats, and the
// background work (maintenance, index rebuilds) it schedules.
#include "engine/stream/stream.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/timing.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/frame_parts.h"
#include "engine/recall/recaller.h"
#include "engine/recall/token_groups.h"
#include "engine/signals/frame_signals.h"
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

// FAILED_PRECONDITION when the config names a scorer this build lacks
// (MemoryEngine validates configs first; a stream never runs without one).
absl::Status HasScorer(const std::string& id, const StreamConfig& config) {
  if (FindRecallScorer(config.weights.scorer) != nullptr) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("stream \"", id, "\" names scorer \"", config.weights.scorer,
                   "\", which this build does not have"));
}

}  // namespace

Stream::Stream(const std::string& id, const StreamConfig& config,
               const StreamEnv& env, const StreamState& state)
    : id_(id),
      config_(config),
      env_(env),
      scorer_(FindRecallScorer(config.weights.scorer)),
      open_(config_),
      view_(id_, config_, state),
      reader_(view_, env.store),
      tiers_(&view_, &reader_, MakeTierEnv()),
      rebuilds_(config_.tiers, env.rebuild_kept_per_sealed) {}

TierEnv Stream::MakeTierEnv() {
  TierEnv t;
  t.store = env_.store;
  t.global_warm_bytes = env_.global_warm_bytes;
  t.global_warm_budget = env_.global_warm_budget;
  t.global_stage_bytes = env_.global_stage_bytes;
  t.demote_keeps_frames = env_.demote_keeps_frames;
  t.accel = &accel();
  t.ledger = &ledger_;
  return t;
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(
    const std::string& id, const StreamConfig& config, const StreamEnv& env) {
  KVMEM_RETURN_IF_ERROR(HasScorer(id, config));
  StreamState state;
  if (env.frame_parts) {
    state.frame_part_tokens = env.frame_part_tokens > 0
                                  ? env.frame_part_tokens
                                  : FramePartTokens(config.geometry);
  }
  StreamWrite write;
  write.stream_id = id;
  write.config = EncodeConfig(config);
  write.state = EncodeState(state);
  KVMEM_RETURN_IF_ERROR(env.store->Commit(write));
  return std::unique_ptr<Stream>(new Stream(id, config, env, state));
}

absl::StatusOr<std::vector<BlockRecord>> Stream::LoadRecords(
    const StreamState& state) const {
  auto frame_tokens = [&](uint64_t f) -> absl::StatusOr<uint32_t> {
    KVMEM_ASSIGN_OR_RETURN(std::string payload, env_.store->GetFrame(id_, f));
    KVMEM_RETURN_IF_ERROR(DecodeStoredFrame(
        config_.geometry, config_.tiers.ingest_precision, &payload));
    return StoredFrameTokens(config_.geometry, id_, f, payload.size());
  };
  std::vector<BlockRecord> records;
  KVMEM_RETURN_IF_ERROR(env_.store->ScanBlocks(
      id_, [&](uint64_t block_id, absl::string_view bytes) -> absl::Status {
        KVMEM_ASSIGN_OR_RETURN(BlockRecord rec, DecodeBlock(bytes));
        const size_t want_dim =
            rec.disk == DiskForm::kNone ? 0 : view_.summary_dim();
        if (rec.info.id != block_id || block_id != records.size() ||
            rec.summary.size() != want_dim) {
          return absl::DataLossError(absl::StrCat(
              "stream ", id_, ": block record ", block_id,
              " does not follow block ", records.size(),
              " or has a summary of ", rec.summary.size(), " values"));
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
        absl::StrCat("stream ", id_, ": state expects ", state.next_block_id,
                     " blocks, store holds ", records.size()));
  }
  return records;
}

absl::Status Stream::ReplayOpenBlock(const StreamState& state) {
  open_.Reset();
  open_stale_ = true;  // Until every frame is back.
  std::optional<FrameSignals> latest;
  for (uint64_t f = state.open_block_first_frame;
       f < state.open_block_first_frame + state.open_block_frames; ++f) {
    Frame frame;
    frame.index = f;
    KVMEM_ASSIGN_OR_RETURN(frame.payload, env_.store->GetFrame(id_, f));
    KVMEM_RETURN_IF_ERROR(DecodeStoredFrame(
        config_.geometry, config_.tiers.ingest_precision, &frame.payload));
    KVMEM_ASSIGN_OR_RETURN(
        frame.token_count,
        StoredFrameTokens(config_.geometry, id_, f, frame.payload.size()));
    if (const uint32_t part = view_.frame_part_tokens(); part > 0) {
      frame.payload =
          JoinFrame(config_.geometry, frame.token_count, part, frame.payload);
    }
    absl::StatusOr<std::string> meta = env_.store->GetFrameMeta(id_, f);
    if (meta.ok()) {
      KVMEM_ASSIGN_OR_RETURN(frame.signals, DecodeSignals(*meta));
    } else if (!absl::IsNotFound(meta.status())) {
      return meta.status();
    }
    open_.Add(&frame, open_.Signature(frame));
    latest = std::move(frame.signals);
  }
  if (latest) tiers_.NoteSignals(*std::move(latest));
  open_stale_ = false;
  OpenMean open = OpenBlockMean();
  kvmem::MutexLock lock(&view_.mu());
  view_.PublishOpenMean(std::move(open));
  return absl::OkStatus();
}

absl::Status Stream::FreshOpenBlock(const StreamState& state) {
  return open_stale_ ? ReplayOpenBlock(state) : absl::OkStatus();
}

void Stream::ChooseWarmAtRecovery(std::vector<BlockRecord>* records) const {
  // Recorded warm: blocks a promotion recorded (they have hits), and blocks
  // whose seal's record still stands, warm or demoted since: a demotion
  // that keeps the frames leaves that record but deletes the frames'
  // signals, so a sealed record whose first frame has no signals left was
  // demoted (one Get each; the heat policy demotes by heat kept in RAM, so
  // the order alone could trade a warm block for a cold one). Promoted
  // ones first, then the newest, while the warm tier has room.
  // Out of RAM: the tier of where its durable copy is.
  auto leave_ram = [](BlockRecord* rec) {
    BlockEntry stays;
    stays.rec.disk = rec->disk;
    rec->info.tier = TierOf(stays);
  };
  std::vector<BlockRecord*> warm;
  for (BlockRecord& rec : *records) {
    if (rec.info.tier != Tier::kWarm) continue;
    if (rec.hits == 0 && rec.disk == DiskForm::kFrames &&
        absl::IsNotFound(
            env_.store->GetFrameMeta(id_, rec.info.first_frame).status())) {
      leave_ram(&rec);
      continue;
    }
    warm.push_back(&rec);
  }
  std::stable_sort(warm.begin(), warm.end(),
                   [](const BlockRecord* a, const BlockRecord* b) {
                     if ((a->hits > 0) != (b->hits > 0)) return a->hits > 0;
                     return a->info.id > b->info.id;
                   });
  uint64_t room = tiers_.WarmRoomAtRecovery();
  for (BlockRecord* rec : warm) {
    const uint64_t bytes =
        WarmBlock::AllocatedBytes(config_.geometry, rec->info.token_count);
    if (bytes <= room) {
      room -= bytes;
      continue;
    }
    leave_ram(rec);
  }
}

absl::Status Stream::CompleteRecords(std::vector<BlockRecord>* records) const {
  const auto t0 = SteadyClock::now();
  size_t rebuilt = 0;
  for (BlockRecord& rec : *records) {
    if (!rec.groups_pending) continue;
    ++rebuilt;
    // Every move that drops the frames rewrites the whole record first.
    std::vector<std::string> pieces;
    std::vector<uint32_t> tokens;
    const absl::Status read =
        rec.disk == DiskForm::kFrames
            ? reader_.ReadFrames(rec, &pieces, &tokens)
            : absl::NotFoundError("its record says they are gone");
    if (!read.ok()) {
      return absl::DataLossError(absl::StrCat(
          "stream ", id_, ": block ", rec.info.id,
          "'s record lacks its token groups (a crash lost them) and its "
          "frames cannot be read to build them again: ",
          read.message()));
    }
    const std::vector<absl::string_view> views(pieces.begin(), pieces.end());
    // The seal's call (OpenBlock::Seal) on the same tokens in the same
    // order: the same groups and codes.
    TokenGroups groups =
        BuildTokenGroups(config_, views, tokens, config_.groups_per_block);
    rec.group_summaries = std::move(groups.summaries);
    rec.token_group = std::move(groups.token_group);
    rec.token_codes = std::move(groups.codes);
    rec.groups_pending = false;
    StreamWrite write;
    write.stream_id = id_;
    write.blocks.emplace_back(rec.info.id, EncodeBlock(rec));
    write.block_stand_ins.emplace_back(rec.info.id, EncodeBlockStandIn(rec));
    // A store that refuses the write (a full disk) keeps the stand-in: the
    // next recovery builds the groups again.
    env_.store->Commit(write).IgnoreError();
  }
  if (rebuilt > 0 && env_.warn) {
    env_.warn(absl::StrCat(
        "stream ", id_, ": rebuilt the token groups of ", rebuilt,
        " blocks from their frames in ", WholeMicrosSince(t0) / 1000,
        " ms (written outside the WAL and not flushed before the server "
        "stopped; kvmem-server --log_token_groups logs them)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Recover(
    const std::string& id, const StreamConfig& config, const StreamState& state,
    const StreamEnv& env) {
  KVMEM_RETURN_IF_ERROR(HasScorer(id, config));
  std::unique_ptr<Stream> s(new Stream(id, config, env, state));
  KVMEM_ASSIGN_OR_RETURN(std::vector<BlockRecord> records,
                         s->LoadRecords(state));
  KVMEM_RETURN_IF_ERROR(s->CompleteRecords(&records));
  {
    kvmem::MutexLock lock(&s->view_.mu());
    s->view_.ReserveIndexes(records);
  }
  s->ChooseWarmAtRecovery(&records);
  for (BlockRecord& rec : records) {
    BlockEntry entry;
    uint64_t warm_bytes = 0;
    // A record its seal wrote: warm and never hit (see ChooseWarm...).
    entry.sealed_record = rec.info.tier == Tier::kWarm && rec.hits == 0;
    if (rec.info.tier == Tier::kWarm) {
      KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<WarmBlock> warm,
                             s->reader_.Load(rec));
      warm_bytes = warm->allocated_bytes();
      entry.warm = std::move(warm);
    }
    entry.rec = std::move(rec);
    if (warm_bytes > 0) s->tiers_.NoteInstalledWarm(warm_bytes);  // First.
    kvmem::MutexLock lock(&s->view_.mu());
    s->view_.Install(std::move(entry));
  }
  {
    kvmem::MutexLock lock(&s->view_.mu());
    s->view_.DropEvictedRun();
  }
  kvmem::MutexLock lock(&s->append_mu_);
  KVMEM_RETURN_IF_ERROR(s->ReplayOpenBlock(state));
  // Budgets may have shrunk since the blocks were recorded warm. A store
  // that refuses writes (disk full) leaves the blocks where they are: the
  // next append applies the budgets again.
  if (absl::Status b = s->tiers_.EnforceBudgets();
      !b.ok() && !absl::IsResourceExhausted(b)) {
    return b;
  }
  return s;
}

uint64_t Stream::AcknowledgedFrames() const {
  kvmem::ReaderMutexLock lock(&view_.mu());
  return static_cast<uint64_t>(view_.state().last_frame + 1);
}

uint64_t Stream::RetainedBytes() const {
  uint64_t appended;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    appended = view_.state().payload_bytes;
  }
  return appended - view_.evicted_payload_bytes() + view_.signal_bytes() +
         OpenSignalBytes();
}

absl::Status Stream::Close() {
  kvmem::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    if (view_.deleted()) return view_.DeletedError();
    if (view_.state().closed) return absl::OkStatus();
    next = view_.state();
  }
  KVMEM_RETURN_IF_ERROR(FreshOpenBlock(next));
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
  open_.Reset();  // The open block is empty now.
  InstallCommitted(next, std::move(sealed), /*shot_cut=*/false);
  return tiers_.EnforceBudgets();
}

absl::Status Stream::Reopen() {
  kvmem::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    if (view_.deleted()) return view_.DeletedError();
    if (!view_.state().closed) return absl::OkStatus();
    next = view_.state();
  }
  next.closed = false;
  StreamWrite write;
  write.stream_id = id_;
  write.state = EncodeState(next);
  KVMEM_RETURN_IF_ERROR(env_.store->Commit(write));
  kvmem::MutexLock lock(&view_.mu());
  view_.SetState(next);
  return absl::OkStatus();
}

void Stream::MarkDeleted(bool deleted) {
  kvmem::MutexLock append_lock(&append_mu_);
  // Maintenance moves blocks without the append lock: none may be writing
  // a record while the stream's records are removed.
  tiers_.WithoutMoves([&] {
    kvmem::MutexLock lock(&view_.mu());
    view_.SetDeleted(deleted);
  });
}

void Stream::MarkGone(absl::Status why) {
  kvmem::MutexLock append_lock(&append_mu_);
  tiers_.WithoutMoves([&] {
    kvmem::MutexLock lock(&view_.mu());
    view_.SetGone(std::move(why));
  });
}

absl::StatusOr<RecallResult> Stream::Recall(const RecallQuery& q) {
  const auto t0 = SteadyClock::now();
  // A seal the store refuses (a full disk) leaves the block open: the
  // recall still answers, from the blocks sealed so far.
  SealBeforeRecall(q).IgnoreError();
  uint64_t now_frame = 0;
  KVMEM_ASSIGN_OR_RETURN(RecallResult result,
                         AnswerRecall(view_, *scorer_, accel(), q, &now_frame,
                                      env_.recall_helpers));
  ledger_.Add(result.accel);
  if (feedback_.CountRecall() % 16 == 15) WarnIfBelowRecallFloor();
  if (feedback_.Queue(result, now_frame, env_.background != nullptr)) {
    ScheduleMaintenance();
  }
  result.total_us = WholeMicrosSince(t0);
  feedback_.RecordLatency(result.total_us);
  return result;
}

void Stream::WarnIfBelowRecallFloor() {
  IndexQuality q;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    q = view_.Quality();
  }
  const std::string warning =
      RecallFloorWarning(view_, accel(), q.samples, q.recall());
  if (ledger_.NoteBelowFloor(!warning.empty()) && env_.warn) {
    env_.warn(warning);
  }
}

absl::Status Stream::RunMaintenance() {
  // Not under the append lock: tier moves of sealed blocks touch nothing an
  // append writes (the tier manager serialises the moves themselves), so a
  // promotion's reads and a demotion's writes never hold up a frame.
  KVMEM_RETURN_IF_ERROR(tiers_.ApplyHits(feedback_.Drain()));
  return tiers_.EnforceBudgets();
}

void Stream::ScheduleMaintenance() {
  std::weak_ptr<Stream> weak = weak_from_this();
  env_.background->Submit([weak] {
    if (auto s = weak.lock()) s->RunMaintenance().IgnoreError();
  });
}

void Stream::MaybeScheduleRebuild(size_t sealed) {
  if (sealed == 0) return;
  uint64_t kept;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    kept = view_.indexes().all().size();  // What a rebuild re-adds.
  }
  if (!rebuilds_.DueAfterSealing(sealed, kept)) return;
  if (env_.background == nullptr) {
    RebuildIndex();
    return;
  }
  if (!rebuilds_.Claim()) return;  // One queued at a time.
  std::weak_ptr<Stream> weak = weak_from_this();
  env_.background->Submit([weak] {
    if (auto s = weak.lock()) {
      s->RebuildIndex();
      s->rebuilds_.Done();
    }
  });
}

size_t Stream::RebuildIndex() { return view_.RebuildIndexes(); }

StreamStats Stream::Stats() const {
  StreamStats s;
  s.stream_id = id_;
  s.config = config_;
  s.summary_dim = view_.summary_dim();
  view_.FillStats(&s);  // State, tiers, index quality, shot cuts, rebuilds.
  s.signal_bytes += OpenSignalBytes();
  tiers_.FillStats(&s.policy);  // Moves and the stage buffer.
  feedback_.FillStats(&s);      // Recall counts and latency percentiles.
  s.accel.warning = RecallFloorWarning(view_, accel(), s.index_recall_samples,
                                       s.index_recall_at_k);
  const AcceleratorStats device = accel().Stats();
  s.accel.backend = device.backend;
  s.accel.sram_bytes = device.sram_bytes;
  s.accel.sram_hot_bytes = device.sram_hot_bytes;
  s.accel.sram_staging_bytes = device.sram_staging_bytes;
  s.accel.sram_repartitions = device.repartitions;
  s.accel.recall_floor = device.recall_floor;
  s.accel.cost = ledger_.Total();
  s.warm_bytes = s.warm.bytes;
  s.cold_bytes = s.cold.bytes;
  s.ingest_cpu_ns = ingest_cpu_.Snapshot();
  return s;
}

const char* Stream::OpenPayloadData(size_t i) {
  kvmem::MutexLock lock(&append_mu_);
  return open_.payload_data(i);
}

}  // namespace kvmem

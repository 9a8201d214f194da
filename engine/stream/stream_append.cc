// Stream: the append path: frame validation, the open block, sealing, the
// commit of a frame (and the block it seals) in one write, installing what
// was committed, and replaying the open block from the store.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/codec/dtype.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/frame_parts.h"
#include "engine/signals/frame_signals.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {

absl::Status Stream::CheckFrameHeader(const Frame& header) const {
  StreamState state;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    if (view_.deleted()) return view_.DeletedError();
    state = view_.state();
  }
  return ValidateHeader(header, state);
}

absl::Status Stream::ValidateHeader(const Frame& frame,
                                    const StreamState& state) const {
  if (state.closed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stream \"", id_, "\" is closed; reopen it with OpenStream to append"));
  }
  const uint64_t expected = static_cast<uint64_t>(state.last_frame + 1);
  if (frame.index < expected) {
    return absl::AlreadyExistsError(absl::StrCat(
        "frame.frame_index ", frame.index,
        " is already stored; last durable frame is ", state.last_frame));
  }
  if (frame.index > expected) {
    return absl::FailedPreconditionError(
        absl::StrCat("frame.frame_index ", frame.index,
                     " skips frames; next expected is ", expected));
  }
  const Geometry& g = config_.geometry;
  if (frame.token_count == 0 || frame.token_count > g.max_tokens_per_frame) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.token_count is ", frame.token_count,
                     "; must be in [1, ", g.max_tokens_per_frame, "]"));
  }
  if (frame.first_token_position < state.next_token_position) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.first_token_position ", frame.first_token_position,
                     " overlaps the previous frame; must be >= ",
                     state.next_token_position));
  }
  if (frame.first_token_position > (1ull << 62)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.first_token_position ", frame.first_token_position,
                     " is beyond 2^62"));
  }
  return absl::OkStatus();
}

absl::Status Stream::ValidateFrame(const Frame& frame,
                                   const StreamState& state) const {
  KVMEM_RETURN_IF_ERROR(ValidateHeader(frame, state));
  const Geometry& g = config_.geometry;
  const uint64_t want = FramePayloadBytes(g, frame.token_count);
  if (frame.payload.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame.payload has ", frame.payload.size(), " bytes; geometry (",
        g.layers, " layers x 2 x ", g.kv_heads, " kv_heads x ",
        frame.token_count, " tokens x ", g.head_dim, " head_dim x ",
        DTypeBytes(g.dtype), " bytes) needs ", want));
  }
  // The indexed layers' keys feed summaries and indexes: a NaN or Inf there
  // would poison every later score, and a huge finite key would overflow
  // them. (Other values are stored as sent.)
  const size_t width = DTypeBytes(g.dtype);
  const uint64_t slice = LayerSliceElements(g, frame.token_count);
  for (uint32_t layer : EffectiveIndexedLayers(config_)) {
    const auto* k = reinterpret_cast<const uint8_t*>(frame.payload.data()) +
                    2 * slice * width * layer;
    const int64_t bad = FindOutOfRange(k, slice, g.dtype);
    if (bad >= 0) {
      const uint64_t at = static_cast<uint64_t>(bad);
      const uint64_t per_head = uint64_t{frame.token_count} * g.head_dim;
      return absl::InvalidArgumentError(absl::StrCat(
          "frame.payload has a key that is NaN, Inf or beyond +-65536 at "
          "layer ",
          layer, ", kv_head ", at / per_head, ", token ",
          at % per_head / g.head_dim, ", dim ", at % g.head_dim,
          "; the keys of indexed layers must be finite and in [-65536, "
          "65536]"));
    }
  }
  return ValidateSignals("frame.signals", frame.signals);
}

BlockEntry Stream::SealOpenBlock(StreamState* state, StreamWrite* write,
                                 uint64_t now_frame, StageClock* clock) {
  BlockEntry e;
  BlockRecord& rec = e.rec;
  rec.info.id = state->next_block_id;
  rec.info.first_frame = state->open_block_first_frame;
  rec.info.last_frame =
      state->open_block_first_frame + state->open_block_frames - 1;
  rec.info.first_token_position = state->open_block_first_position;
  rec.info.end_token_position = state->next_token_position;
  rec.info.token_count = state->open_block_tokens;
  rec.info.payload_bytes = state->open_block_payload_bytes;
  rec.info.tier = Tier::kWarm;
  rec.disk = DiskForm::kFrames;
  e.warm = open_.Seal(&rec, clock);
  rec.last_access_frame = now_frame;
  write->blocks.emplace_back(rec.info.id, EncodeBlock(rec));
  if (!rec.token_codes.empty() || !rec.group_summaries.empty()) {
    // The store may log this and the groups apart (rebuilt if lost).
    write->block_stand_ins.emplace_back(rec.info.id, EncodeBlockStandIn(rec));
  }
  if (clock != nullptr) clock->Mark(IngestStage::kSealRest);
  e.sealed_record = true;
  state->next_block_id += 1;
  state->open_block_frames = 0;
  state->open_block_tokens = 0;
  state->open_block_payload_bytes = 0;
  return e;
}

OpenMean Stream::OpenBlockMean() const {
  OpenMean m;
  if (!scorer_->wants_open_mean()) return m;
  m.tokens = static_cast<uint32_t>(open_.tokens());
  if (m.tokens > 0) m.mean = open_.Mean();
  return m;
}

void Stream::InstallCommitted(const StreamState& next,
                              std::vector<BlockEntry> sealed, bool shot_cut) {
  uint64_t warm_bytes = 0;
  for (const BlockEntry& e : sealed) {
    if (e.warm) warm_bytes += e.warm->allocated_bytes();
  }
  OpenMean open = OpenBlockMean();
  // Grown beside recalls (this append is the only writer of the indexes
  // but a rebuild's or a move's, which the growth notices), adopted under
  // the writer's lock, the old arrays freed after it: recalls do not wait
  // for a copy of the indexes. (One caveat: abseil's mutex is starvation-free:
  // a reader may wait behind a waiting writer, so a tier move that asks for the
  // lock during the copy holds recalls until the copy ends: no longer than the
  // copy held them before.)
  StreamIndexes::Growth growth;
  if (!sealed.empty()) {
    kvmem::ReaderMutexLock lock(&view_.mu());
    growth = view_.GrowIndexesFor(sealed);
  }
  kvmem::MutexLock lock(&view_.mu());
  view_.AdoptIndexGrowth(&growth);
  // Counted with the blocks, before they enter the view: a move sees both
  // or neither, and never subtracts bytes that were not added.
  if (warm_bytes > 0) tiers_.NoteInstalledWarm(warm_bytes);
  view_.SetState(next);
  if (shot_cut) view_.CountShotCut();
  for (BlockEntry& e : sealed) view_.Install(std::move(e));
  // In the same critical section as the blocks sealed from the open block,
  // so a recall never counts the same tokens twice.
  view_.PublishOpenMean(std::move(open));
}

absl::StatusOr<AppendResult> Stream::Append(Frame frame) {
  kvmem::MutexLock append_lock(&append_mu_);
  StageClock clock(&ingest_cpu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    if (view_.deleted()) return view_.DeletedError();
    next = view_.state();
  }
  KVMEM_RETURN_IF_ERROR(ValidateFrame(frame, next));
  KVMEM_RETURN_IF_ERROR(TakeSceneDim(frame, &next));
  KVMEM_RETURN_IF_ERROR(FreshOpenBlock(next));
  clock.Mark(IngestStage::kValidate);
  KVMEM_RETURN_IF_ERROR(EncodeAtIngest(&frame));
  clock.Mark(IngestStage::kEncode);
  // Work on copies of the open block's state, applied only once committed.
  StreamWrite write;
  write.stream_id = id_;
  std::vector<BlockEntry> sealed;
  // A full block whose seal has not run yet is sealed first, in this commit
  // (the frame that filled it reported it).
  const bool pending = SealIsPending(next);
  if (pending) {
    sealed.push_back(SealOpenBlock(
        &next, &write, static_cast<uint64_t>(next.last_frame), &clock));
    open_.Reset();  // Replayed from the store if the commit fails.
  }
  const std::vector<float> signature =
      open_.shot_mode() ? open_.Signature(frame) : std::vector<float>();
  const Segmenter::Cut cut =
      open_.CutBefore(signature, frame.token_count, next.open_block_frames,
                      next.open_block_tokens);
  clock.Mark(IngestStage::kSummarize);
  if (cut != Segmenter::Cut::kNone) {
    sealed.push_back(SealOpenBlock(&next, &write, frame.index, &clock));
    open_.Reset();  // Replayed from the store if the commit fails.
  }
  if (next.open_block_frames == 0) {
    next.open_block_first_frame = frame.index;
    next.open_block_first_position = frame.first_token_position;
  }
  next.open_block_frames += 1;
  next.open_block_tokens += frame.token_count;
  next.open_block_payload_bytes += frame.payload.size();
  next.last_frame = static_cast<int64_t>(frame.index);
  next.next_token_position = frame.first_token_position + frame.token_count;
  next.frames += 1;
  next.tokens += frame.token_count;
  next.payload_bytes += frame.payload.size();

  open_.Add(&frame, signature);
  clock.Mark(IngestStage::kSummarize);
  // With seal_after_ack a full block is sealed after this append's commit.
  const bool defer = env_.seal_after_ack && env_.background != nullptr;
  const bool filled = open_.FullAfter(next.open_block_frames);
  const bool full = filled && !defer;
  if (full) {
    sealed.push_back(SealOpenBlock(&next, &write, frame.index, &clock));
  }

  PutFrame(frame, next, &write);
  clock.Mark(IngestStage::kEncode);
  if (absl::Status committed = env_.store->Commit(write); !committed.ok()) {
    return AfterFailedCommit(committed);
  }
  clock.Mark(IngestStage::kCommit);
  if (full) open_.Reset();
  const size_t sealed_blocks = sealed.size();
  InstallCommitted(next, std::move(sealed), cut == Segmenter::Cut::kShot);
  tiers_.NoteSignals(std::move(frame.signals));
  if (filled && defer) ScheduleSeal();
  const absl::Status after = AfterCommit(frame.index, sealed_blocks);
  clock.Mark(IngestStage::kInstall);
  KVMEM_RETURN_IF_ERROR(after);
  // Whether this frame completed a block (sealed now or soon), or cut one.
  return AppendResult{next.last_frame,
                      sealed_blocks > (pending ? 1u : 0u) || filled};
}

absl::Status Stream::EncodeAtIngest(Frame* frame) {
  const ColdPrecision p = config_.tiers.ingest_precision;
  if (!FramesEncoded(p)) return absl::OkStatus();
  const Geometry& g = config_.geometry;
  const int64_t bad =
      FindOutOfRange(reinterpret_cast<const uint8_t*>(frame->payload.data()),
                     frame->payload.size() / DTypeBytes(g.dtype), g.dtype);
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame.payload has a value that is NaN, Inf or beyond +-65536 at "
        "element ",
        bad, "; a stream with tier_policy.ingest_precision ",
        p == ColdPrecision::kInt4 ? "INT4" : "INT8",
        " quantises every value and needs them finite and in [-65536, "
        "65536]"));
  }
  // Encoded once, row by row in the frame's own order (each row on its
  // own, so the order is free); the encoded rows moved into the stored part
  // layout (a fraction of the frame's bytes); and decoded straight back into
  // the payload: no full-size copy of the frame around the codec.
  const uint32_t part = view_.frame_part_tokens();
  thread_local std::string in_frame_order;
  std::string* rows = part > 0 ? &in_frame_order : &encoded_frame_;
  EncodeFrameRows(g, p, frame->payload, rows);
  if (part > 0) {
    SplitFrameRows(g, frame->token_count, part, EncodedRowBytes(g, p), *rows,
                   &encoded_frame_);
  }
  return DecodeFrameRows(g, p, *rows, &frame->payload);
}

void Stream::PutFrame(const Frame& frame, const StreamState& next,
                      StreamWrite* write) {
  const Geometry& g = config_.geometry;
  const uint32_t part = view_.frame_part_tokens();
  // A part as stored: FramePartBytes at full precision, else encoded.
  const ColdPrecision p = config_.tiers.ingest_precision;
  if (part > 0) write->frame_part_bytes = EncodedFrameBytes(g, p, part);
  if (FramesEncoded(p)) {
    write->frame.emplace(frame.index, encoded_frame_);
  } else if (part > 0) {
    // Stored in parts of consecutive tokens (engine/codec/frame_parts.h);
    // the open block keeps the frame as appended. One buffer per thread.
    thread_local std::string parted;
    SplitFrame(g, frame.token_count, part, open_.last_payload(), &parted);
    write->frame.emplace(frame.index, parted);
  } else {
    write->frame.emplace(frame.index, open_.last_payload());
  }
  write->frame_meta = EncodeSignals(frame.signals);
  write->state = EncodeState(next);
}

void Stream::ScheduleSeal() {
  if (env_.background == nullptr) return;  // The next append or Close seals.
  seals_queued_.fetch_add(1, std::memory_order_acq_rel);
  std::weak_ptr<Stream> weak = weak_from_this();
  env_.background->Submit([weak] {
    if (auto s = weak.lock()) {
      s->SealPendingBlock().IgnoreError();
      s->seals_queued_.fetch_sub(1, std::memory_order_acq_rel);
    }
  });
}

bool Stream::SealIsPending(const StreamState& s) const {
  // The open block's Segmenter::FullAfter, from the same config: no lock
  // on the open block needed.
  return s.open_block_frames > 0 && !s.closed &&
         config_.segment_mode != SegmentMode::kShot &&
         s.open_block_frames >= config_.frames_per_block;
}

absl::Status Stream::SealBeforeRead(uint64_t block_id) {
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    const StreamState& s = view_.state();
    if (block_id != s.next_block_id || !SealIsPending(s)) {
      return absl::OkStatus();
    }
  }
  return SealPendingBlock();
}

absl::Status Stream::SealIfPending() {
  // A queued seal may have installed its block and still be enforcing the
  // budgets (under append_mu_): taking the lock waits for it to finish.
  if (seals_queued_.load(std::memory_order_acquire) > 0) {
    return SealPendingBlock();
  }
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    if (!SealIsPending(view_.state())) return absl::OkStatus();
  }
  return SealPendingBlock();
}

absl::Status Stream::SealBeforeRecall(const RecallQuery& q) {
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    const StreamState& s = view_.state();
    if (!SealIsPending(s)) return absl::OkStatus();
    // The window's end as the recall takes it (engine/recall/recaller.cc).
    const uint64_t window_end = q.current_token_position == 0
                                    ? s.next_token_position
                                    : q.current_token_position + 1;
    const bool candidates =
        s.open_block_first_position < view_.WindowStart(window_end);
    const bool estimated = q.window_lse.empty() && scorer_->wants_open_mean();
    if (!candidates && !estimated) return absl::OkStatus();
  }
  return SealPendingBlock();
}

absl::Status Stream::SealPendingBlock() {
  kvmem::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    if (view_.deleted()) return view_.DeletedError();
    next = view_.state();
  }
  // Sealed already (by the next append, or Close), or nothing to seal.
  if (!SealIsPending(next)) return absl::OkStatus();
  StageClock clock(&ingest_cpu_);
  KVMEM_RETURN_IF_ERROR(FreshOpenBlock(next));
  clock.Mark(IngestStage::kValidate);
  const auto last = static_cast<uint64_t>(next.last_frame);
  StreamWrite write;
  write.stream_id = id_;
  std::vector<BlockEntry> sealed;
  sealed.push_back(SealOpenBlock(&next, &write, last, &clock));
  write.state = EncodeState(next);
  clock.Mark(IngestStage::kEncode);
  if (absl::Status committed = env_.store->Commit(write); !committed.ok()) {
    return AfterFailedCommit(committed);
  }
  clock.Mark(IngestStage::kCommit);
  open_.Reset();
  InstallCommitted(next, std::move(sealed), /*shot_cut=*/false);
  const absl::Status after = AfterCommit(last, 1);
  clock.Mark(IngestStage::kInstall);
  return after;
}

absl::Status Stream::TakeSceneDim(const Frame& frame, StreamState* next) const {
  const size_t scene_dim = frame.signals.scene_embedding.size();
  if (scene_dim != 0 && next->scene_dim != 0 && scene_dim != next->scene_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.signals.scene_embedding has ", scene_dim,
                     " values; stream \"", id_, "\" has had ", next->scene_dim,
                     " (one embedding model per stream)"));
  }
  if (scene_dim != 0) next->scene_dim = static_cast<uint32_t>(scene_dim);
  return absl::OkStatus();
}

absl::Status Stream::AfterFailedCommit(const absl::Status& committed) {
  // Nothing became durable: rebuild the open block as the store has it.
  StreamState durable;
  {
    kvmem::ReaderMutexLock lock(&view_.mu());
    durable = view_.state();
  }
  absl::Status replayed = ReplayOpenBlock(durable);
  if (!replayed.ok()) {
    return absl::Status(committed.code(),
                        absl::StrCat(committed.message(),
                                     "; and reloading "
                                     "the open block failed: ",
                                     replayed.message()));
  }
  return committed;
}

absl::Status Stream::AfterCommit(uint64_t frame_index, size_t sealed) {
  // Only a seal changes what the budgets count (sealed blocks; another
  // stream's seal over the global budget is enforced by that stream). So
  // an append that sealed nothing does not take the tier manager's lock,
  // which a recall's promotion holds while it reads the block and rewrites
  // its record (at 7B, 64 MiB and 13 MB): in kvmem bench --cameras=2 such
  // appends waited for it up to 313 ms, a frame period.
  absl::Status moved = sealed > 0 ? tiers_.EnforceBudgets() : absl::OkStatus();
  if (moved.ok() && config_.tiers.prefetch_blocks > 0) {
    moved = tiers_.StageLikelyBlocks(open_.tokens() > 0 ? open_.Mean()
                                                        : std::vector<float>());
  }
  MaybeScheduleRebuild(sealed);
  if (!moved.ok()) {
    return absl::Status(moved.code(),
                        absl::StrCat("frame ", frame_index,
                                     " is stored, but moving blocks between "
                                     "tiers failed: ",
                                     moved.message()));
  }
  return absl::OkStatus();
}

}  // namespace kvmem

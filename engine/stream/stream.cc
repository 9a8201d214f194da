#include "engine/stream/stream.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/recall/token_groups.h"
#include "engine/stream/signals.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

std::vector<absl::string_view> Views(const std::vector<std::string>& v) {
  return std::vector<absl::string_view>(v.begin(), v.end());
}

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
      open_summary_(config),
      segmenter_(config),
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

Stream::Indexes Stream::NewIndexes() const {
  Indexes ix;
  // Segments of head_dim: score MASS scans them per KV head.
  const uint32_t hd = config_.geometry.head_dim;
  ix.all =
      std::make_unique<BlockIndex>(summary_dim_, config_.index_factory, hd);
  // Per-layer indexes serve SUMMED's per-layer recall (MASS scores layers
  // from the same scan); with one indexed layer they would copy `all`. The
  // same predicates size the config's validation (IndexDims).
  const bool per_layer = HasPerLayerIndexes(config_);
  for (size_t i = 0; per_layer && i < config_.indexed_layers.size(); ++i) {
    ix.layers.push_back(
        std::make_unique<BlockIndex>(layer_dim_, config_.index_factory, hd));
  }
  if (HasGroupIndex(config_)) {
    ix.groups =
        std::make_unique<BlockIndex>(summary_dim_, config_.index_factory, hd);
  }
  return ix;
}

IndexQuality Stream::RetiredQuality(const Indexes& ix,
                                    const IndexQuality& so_far) {
  IndexQuality q = so_far;
  for (const BlockIndex* b : {ix.all.get(), ix.groups.get()}) {
    if (b == nullptr) continue;
    const IndexQuality x = b->quality();
    q.samples += x.samples;
    q.hits += x.hits;
    q.wanted += x.wanted;
  }
  return q;
}

void Stream::AddToIndexes(Indexes* ix, uint64_t id,
                          const BlockRecord& rec) const {
  ix->all->Add(id, rec.summary.data());
  for (size_t li = 0; li < ix->layers.size(); ++li) {
    ix->layers[li]->Add(id, rec.summary.data() + li * layer_dim_);
  }
  if (ix->groups != nullptr) {
    const size_t n = rec.group_summaries.size() / summary_dim_;
    for (size_t g = 0; g < n; ++g) {
      ix->groups->Add(id * kGroupStride + g,
                      rec.group_summaries.data() + g * summary_dim_);
    }
  }
}

void Stream::RemoveFromIndexes(Indexes* ix, uint64_t id, size_t groups) {
  ix->all->Remove(id);
  for (auto& layer : ix->layers) layer->Remove(id);
  if (ix->groups != nullptr) {
    for (size_t g = 0; g < groups; ++g)
      ix->groups->Remove(id * kGroupStride + g);
  }
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
    segmenter_.Add(FrameSignature(frame));
    open_summary_.AddFrame(frame.payload, frame.token_count);
    open_semantics_.AddFrame(f, frame.signals);
    open_tokens_.push_back(frame.token_count);
    open_payloads_.push_back(std::move(frame.payload));
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

absl::Status Stream::ValidateFrame(const Frame& frame,
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

std::vector<float> Stream::FrameSignature(const Frame& frame) const {
  if (!frame.signals.scene_embedding.empty()) {
    return frame.signals.scene_embedding;
  }
  SummaryBuilder one(config_);
  one.AddFrame(frame.payload, frame.token_count);
  return one.Mean();
}

Stream::BlockEntry Stream::SealOpenBlock(StreamState* state, StreamWrite* write,
                                         uint64_t now_frame) {
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
  rec.frame_tokens = open_tokens_;
  rec.summary = open_summary_.Mean();
  if (config_.groups_per_block > 1) {
    TokenGroups groups = BuildTokenGroups(
        config_, Views(open_payloads_), open_tokens_, config_.groups_per_block);
    rec.group_summaries = std::move(groups.summaries);
    rec.token_group = std::move(groups.token_group);
  }
  rec.tracks = open_semantics_.Tracks();
  rec.scene = open_semantics_.SceneMean();
  rec.last_access_frame = now_frame;
  e.warm = WarmBlock::FromFrames(config_.geometry, Views(open_payloads_),
                                 open_tokens_);
  write->blocks.emplace_back(rec.info.id, EncodeBlock(rec));
  state->next_block_id += 1;
  state->open_block_frames = 0;
  state->open_block_tokens = 0;
  state->open_block_payload_bytes = 0;
  return e;
}

void Stream::ResetOpenBlock() {
  open_summary_.Reset();
  segmenter_.Reset();
  open_semantics_.Reset();
  open_payloads_.clear();
  open_tokens_.clear();
}

uint64_t Stream::RetainedPayloadBytes() const {
  uint64_t appended;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    appended = state_.payload_bytes;
  }
  return appended - evicted_payload_bytes_.load(std::memory_order_relaxed);
}

void Stream::InstallBlock(BlockEntry entry) {
  const BlockRecord& rec = entry.rec;
  if (rec.disk != DiskForm::kNone) AddToIndexes(&index_, rec.info.id, rec);
  if (rec.disk == DiskForm::kNone) {  // Recovered evicted.
    evicted_payload_bytes_.fetch_add(rec.info.payload_bytes,
                                     std::memory_order_relaxed);
  }
  for (const TrackPresence& t : rec.tracks) {
    auto [it, inserted] = tracks_.try_emplace(t.track_id);
    TrackHistory& h = it->second;
    if (inserted) h.first_frame = t.first_frame;
    h.first_frame = std::min(h.first_frame, t.first_frame);
    h.last_frame = std::max(h.last_frame, t.last_frame);
    h.blocks += 1;
    track_blocks_[t.track_id].push_back(rec.info.id);
  }
  if (entry.warm) AddWarm(entry.warm->allocated_bytes(), false);
  const uint32_t per = UnitsPerBlock();
  unit_tokens_.resize(UnitSlot(rec.info.id + 1, 0), 0);
  if (per == 1) {
    unit_tokens_[UnitSlot(rec.info.id, 0)] = rec.info.token_count;
  } else {
    for (uint8_t g : rec.token_group) {
      if (g < per) ++unit_tokens_[UnitSlot(rec.info.id, g)];
    }
  }
  blocks_.push_back(std::move(entry));
}

void Stream::DropEvictedRun() {
  const size_t dropped = blocks_.DropLeading([](const BlockEntry& e) {
    return e.rec.disk == DiskForm::kNone && !e.warm && !e.staged &&
           e.generation % 2 == 0;
  });
  if (dropped == 0) return;
  unit_tokens_.erase(unit_tokens_.begin(),
                     unit_tokens_.begin() + dropped * UnitsPerBlock());
  for (auto it = track_blocks_.begin(); it != track_blocks_.end();) {
    std::vector<uint64_t>& ids = it->second;  // Ascending.
    ids.erase(ids.begin(),
              std::lower_bound(ids.begin(), ids.end(), blocks_.first()));
    it = ids.empty() ? track_blocks_.erase(it) : std::next(it);
  }
}

Stream::OpenMean Stream::OpenBlockMean() const {
  OpenMean m;
  if (config_.weights.score != ScoreMode::kMass) return m;
  m.tokens = static_cast<uint32_t>(open_summary_.tokens());
  if (m.tokens > 0) m.mean = open_summary_.Mean();
  return m;
}

void Stream::PublishOpenMean(OpenMean m) {
  open_mean_ = std::move(m.mean);
  open_mean_tokens_ = m.tokens;
}

void Stream::AddWarm(int64_t bytes, bool staged) {
  uint64_t& local = staged ? stage_bytes_ : warm_bytes_;
  local += bytes;
  if (env_.global_warm_bytes != nullptr && !staged) {
    env_.global_warm_bytes->fetch_add(static_cast<uint64_t>(bytes),
                                      std::memory_order_relaxed);
  }
}

absl::StatusOr<AppendResult> Stream::Append(Frame frame) {
  kvmem::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    kvmem::ReaderMutexLock lock(&mu_);
    if (deleted_) return DeletedError();
    next = state_;
  }
  KVMEM_RETURN_IF_ERROR(ValidateFrame(frame, next));
  const size_t scene_dim = frame.signals.scene_embedding.size();
  if (scene_dim != 0 && next.scene_dim != 0 && scene_dim != next.scene_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.signals.scene_embedding has ", scene_dim,
                     " values; stream \"", id_, "\" has had ", next.scene_dim,
                     " (one embedding model per stream)"));
  }
  if (scene_dim != 0) next.scene_dim = static_cast<uint32_t>(scene_dim);
  const std::vector<float> signature =
      segmenter_.shot_mode() ? FrameSignature(frame) : std::vector<float>();
  const Segmenter::Cut cut =
      segmenter_.CutBefore(signature, frame.token_count, next.open_block_frames,
                           next.open_block_tokens);

  // Work on copies of the open block's state, applied only once committed.
  StreamWrite write;
  write.stream_id = id_;
  std::vector<BlockEntry> sealed;
  if (cut != Segmenter::Cut::kNone) {
    sealed.push_back(SealOpenBlock(&next, &write, frame.index));
    ResetOpenBlock();  // Replayed from the store if the commit fails.
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

  open_summary_.AddFrame(frame.payload, frame.token_count);
  open_semantics_.AddFrame(frame.index, frame.signals);
  segmenter_.Add(signature);
  open_tokens_.push_back(frame.token_count);
  open_payloads_.push_back(std::move(frame.payload));
  const bool full = segmenter_.FullAfter(next.open_block_frames);
  if (full) sealed.push_back(SealOpenBlock(&next, &write, frame.index));

  write.frame.emplace(frame.index, open_payloads_.back());
  write.frame_meta = EncodeSignals(frame.signals);
  write.state = EncodeState(next);
  absl::Status committed = env_.store->Commit(write);
  if (!committed.ok()) {
    // Nothing became durable: rebuild the open block as the store has it.
    StreamState durable;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      durable = state_;
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
  if (full) ResetOpenBlock();
  OpenMean open = OpenBlockMean();
  {
    kvmem::MutexLock lock(&mu_);
    state_ = next;
    if (cut == Segmenter::Cut::kShot) counters_.shot_cuts += 1;
    for (BlockEntry& e : sealed) InstallBlock(std::move(e));
    PublishOpenMean(std::move(open));
  }
  latest_signals_ = std::move(frame.signals);
  blocks_since_rebuild_ += sealed.size();
  AppendResult result{next.last_frame, !sealed.empty()};

  absl::Status moved = EnforceBudgets();
  if (moved.ok() && config_.tiers.prefetch_blocks > 0) {
    moved = StageLikelyBlocks(open_summary_.tokens() > 0 ? open_summary_.Mean()
                                                         : std::vector<float>(),
                              latest_signals_);
  }
  if (!sealed.empty()) MaybeScheduleRebuild();
  if (!moved.ok()) {
    return absl::Status(moved.code(),
                        absl::StrCat("frame ", frame.index,
                                     " is stored, but moving blocks between "
                                     "tiers failed: ",
                                     moved.message()));
  }
  return result;
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

absl::StatusOr<BlockInfo> Stream::GetBlock(uint64_t block_id) const {
  kvmem::ReaderMutexLock lock(&mu_);
  if (deleted_) return DeletedError();
  if (!blocks_.Has(block_id)) return MissingBlockError(block_id);
  const BlockEntry& e = blocks_[block_id];
  if (e.rec.disk == DiskForm::kNone && !e.warm) {
    return absl::NotFoundError(absl::StrCat("block ", block_id, " of stream \"",
                                            id_, "\" was evicted"));
  }
  BlockInfo info = e.rec.info;
  info.tier = TierOf(e);
  return info;
}

absl::StatusOr<std::vector<PayloadPiece>> Stream::ReadBlockPayload(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& layers, BlockInfo* info) const {
  const Geometry& g = config_.geometry;
  for (uint32_t l : layers) {
    if (l >= g.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers has ", l, "; the stream has ", g.layers, " layers"));
    }
  }
  BlockRecord rec;
  std::shared_ptr<const WarmBlock> warm;
  // A tier move may replace the block's durable form while we read it: the
  // block's generation is odd during a move and changes with it, so a read
  // that overlapped one is done again.
  BlockInfo read_info;
  for (int attempt = 0;; ++attempt) {
    uint64_t generation;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      if (deleted_) return DeletedError();
      if (!blocks_.Has(block_id)) return MissingBlockError(block_id);
      const BlockEntry& e = blocks_[block_id];
      generation = e.generation;
      rec = e.rec;
      warm = e.warm;
      read_info = e.rec.info;
      read_info.tier = TierOf(e);
    }
    absl::StatusOr<std::unique_ptr<WarmBlock>> loaded =
        absl::UnavailableError("a move of the block is being committed");
    if (generation % 2 == 0) {
      if (warm) break;
      loaded = LoadBlock(rec);
    }
    bool unchanged;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      unchanged =
          blocks_.Has(block_id) && blocks_[block_id].generation == generation;
    }
    if (loaded.ok() && unchanged) {
      warm = *std::move(loaded);
      break;
    }
    if ((unchanged && generation % 2 == 0) || attempt == 10000) {
      return loaded.status();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (info != nullptr) *info = read_info;
  // Had the stream been deleted (and its id reused) during the read, the
  // bytes could belong to the new stream.
  KVMEM_RETURN_IF_ERROR(NotFoundIfDeleted());
  std::vector<PayloadPiece> pieces;
  if (layout == PayloadLayout::kFrameMajor) {
    uint64_t f = rec.info.first_frame;
    for (std::string& bytes : warm->ToFrames(rec.frame_tokens)) {
      pieces.push_back({f++, 0, std::move(bytes)});
    }
    return pieces;
  }
  std::vector<uint32_t> wanted = layers;
  if (wanted.empty()) {
    for (uint32_t l = 0; l < g.layers; ++l) wanted.push_back(l);
  }
  for (uint32_t l : wanted) {
    pieces.push_back({rec.info.first_frame, l, warm->LayerRecord(l)});
  }
  return pieces;
}

void Stream::MarkDeleted(bool deleted) {
  kvmem::MutexLock append_lock(&append_mu_);
  kvmem::MutexLock lock(&mu_);
  deleted_ = deleted;
}

const char* Stream::OpenPayloadData(size_t i) {
  kvmem::MutexLock lock(&append_mu_);
  return i < open_payloads_.size() ? open_payloads_[i].data() : nullptr;
}

}  // namespace kvmem

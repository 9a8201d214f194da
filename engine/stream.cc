#include "engine/stream.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/recall_planner.h"
#include "engine/signals.h"
#include "engine/status_macros.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

uint32_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - t0)
          .count());
}

}  // namespace

Stream::Stream(const std::string& id, const StreamConfig& config,
               ColdStore* store, const StreamState& state)
    : id_(id),
      config_(config),
      store_(store),
      summary_dim_(SummaryDim(config)),
      open_summary_(config),
      state_(state),
      index_(SummaryDim(config)) {}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(
    const std::string& id, const StreamConfig& config, ColdStore* store) {
  StreamState state;
  StreamWrite write;
  write.stream_id = id;
  write.config = EncodeConfig(config);
  write.state = EncodeState(state);
  KVMEM_RETURN_IF_ERROR(store->Commit(write));
  return std::unique_ptr<Stream>(new Stream(id, config, store, state));
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Recover(
    const std::string& id, const StreamConfig& config, const StreamState& state,
    ColdStore* store) {
  std::unique_ptr<Stream> s(new Stream(id, config, store, state));
  {
    absl::MutexLock lock(&s->mu_);
    KVMEM_RETURN_IF_ERROR(store->ScanBlocks(
        id, [&](uint64_t block_id, absl::string_view bytes) -> absl::Status {
          KVMEM_ASSIGN_OR_RETURN(BlockRecord rec, DecodeBlock(bytes));
          if (rec.info.id != block_id || block_id != s->blocks_.size() ||
              rec.summary.size() != s->summary_dim_) {
            return absl::DataLossError(absl::StrCat(
                "stream ", id, ": block record ", block_id,
                " does not follow block ", s->blocks_.size(),
                " or has a summary of ", rec.summary.size(), " values"));
          }
          s->InstallBlock(rec);
          return absl::OkStatus();
        }));
    if (s->blocks_.size() != state.next_block_id) {
      return absl::DataLossError(
          absl::StrCat("stream ", id, ": state expects ", state.next_block_id,
                       " blocks, store holds ", s->blocks_.size()));
    }
  }
  // Replay the unsealed block's frames into its running summary.
  absl::MutexLock lock(&s->append_mu_);
  const uint64_t per_token = FramePayloadBytes(config.geometry, 1);
  for (uint64_t f = state.open_block_first_frame;
       f < state.open_block_first_frame + state.open_block_frames; ++f) {
    KVMEM_ASSIGN_OR_RETURN(std::string payload, store->GetFrame(id, f));
    if (payload.empty() || payload.size() % per_token != 0) {
      return absl::DataLossError(absl::StrCat(
          "stream ", id, ": frame ", f, " has ", payload.size(), " bytes"));
    }
    s->open_summary_.AddFrame(
        payload, static_cast<uint32_t>(payload.size() / per_token));
  }
  return s;
}

absl::Status Stream::DeletedError() const {
  return absl::NotFoundError(absl::StrCat("stream \"", id_, "\" not found"));
}

absl::Status Stream::NotFoundIfDeleted() const {
  absl::ReaderMutexLock lock(&mu_);
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
    return absl::AlreadyExistsError(
        absl::StrCat("frame.frame_index ", frame.index,
                     " is already stored; last durable "
                     "frame is ",
                     state.last_frame));
  }
  if (frame.index > expected) {
    return absl::FailedPreconditionError(absl::StrCat("frame.frame_index ",
                                                      frame.index,
                                                      " skips frames; next "
                                                      "expected is ",
                                                      expected));
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
  return ValidateSignals("frame.signals", frame.signals);
}

BlockRecord Stream::SealOpenBlock(const SummaryBuilder& summary,
                                  StreamState* state,
                                  StreamWrite* write) const {
  BlockRecord rec;
  rec.info.id = state->next_block_id;
  rec.info.first_frame = state->open_block_first_frame;
  rec.info.last_frame =
      state->open_block_first_frame + state->open_block_frames - 1;
  rec.info.first_token_position = state->open_block_first_position;
  rec.info.end_token_position = state->next_token_position;
  rec.info.token_count = state->open_block_tokens;
  rec.info.payload_bytes = state->open_block_payload_bytes;
  rec.info.tier = Tier::kCold;
  rec.summary = summary.Mean();
  write->blocks.emplace_back(rec.info.id, EncodeBlock(rec));
  state->next_block_id += 1;
  state->open_block_frames = 0;
  state->open_block_tokens = 0;
  state->open_block_payload_bytes = 0;
  return rec;
}

void Stream::InstallBlock(const BlockRecord& record) {
  blocks_.push_back(record.info);
  index_.Add(record.info.id, record.summary.data());
}

absl::StatusOr<AppendResult> Stream::Append(const Frame& frame) {
  absl::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (deleted_) {
      return DeletedError();
    }
    next = state_;
  }
  KVMEM_RETURN_IF_ERROR(ValidateFrame(frame, next));

  SummaryBuilder summary = open_summary_;
  summary.AddFrame(frame.payload, frame.token_count);
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

  StreamWrite write;
  write.stream_id = id_;
  write.frame.emplace(frame.index, frame.payload);
  std::optional<BlockRecord> sealed;
  if (next.open_block_frames >= config_.frames_per_block) {
    sealed = SealOpenBlock(summary, &next, &write);
  }
  write.state = EncodeState(next);
  KVMEM_RETURN_IF_ERROR(store_->Commit(write));

  {
    absl::MutexLock lock(&mu_);
    state_ = next;
    if (sealed) InstallBlock(*sealed);
  }
  if (sealed) {
    open_summary_.Reset();
  } else {
    open_summary_ = std::move(summary);
  }
  return AppendResult{next.last_frame, sealed.has_value()};
}

absl::Status Stream::Close() {
  absl::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (deleted_) {
      return DeletedError();
    }
    if (state_.closed) return absl::OkStatus();
    next = state_;
  }
  StreamWrite write;
  write.stream_id = id_;
  std::optional<BlockRecord> sealed;
  if (next.open_block_frames > 0) {
    sealed = SealOpenBlock(open_summary_, &next, &write);
  }
  next.closed = true;
  write.state = EncodeState(next);
  KVMEM_RETURN_IF_ERROR(store_->Commit(write));
  absl::MutexLock lock(&mu_);
  state_ = next;
  if (sealed) InstallBlock(*sealed);
  open_summary_.Reset();
  return absl::OkStatus();
}

absl::Status Stream::Reopen() {
  absl::MutexLock append_lock(&append_mu_);
  StreamState next;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (deleted_) return DeletedError();
    if (!state_.closed) return absl::OkStatus();
    next = state_;
  }
  next.closed = false;
  StreamWrite write;
  write.stream_id = id_;
  write.state = EncodeState(next);
  KVMEM_RETURN_IF_ERROR(store_->Commit(write));
  absl::MutexLock lock(&mu_);
  state_ = next;
  return absl::OkStatus();
}

absl::StatusOr<RecallResult> Stream::Recall(const RecallQuery& q) {
  const auto t0 = std::chrono::steady_clock::now();
  if (q.query.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query is empty; stream \"", id_, "\" expects ", summary_dim_,
        " floats ([indexed_layer][kv_head][head_dim])"));
  }
  if (q.query.size() != summary_dim_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query has ", q.query.size(), " floats; stream \"", id_, "\" expects ",
        summary_dim_, " ([indexed_layer][kv_head][head_dim])"));
  }
  KVMEM_RETURN_IF_ERROR(CheckFinite("query", q.query));
  KVMEM_RETURN_IF_ERROR(ValidateSignals("signals", q.signals));
  RecallResult result;
  result.top_k = q.top_k == 0 ? config_.default_top_k : q.top_k;
  result.budget_tokens =
      q.max_tokens == 0 ? config_.default_max_tokens : q.max_tokens;
  if (result.top_k > kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget.top_k is ", q.top_k, "; must be in [1, ", kMaxTopK, "]"));
  }
  if (result.budget_tokens > (1u << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget.max_tokens is ", q.max_tokens, "; must be at most ", 1u << 24));
  }

  std::vector<RecalledBlock> ranked;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (deleted_) {
      return DeletedError();
    }
    const uint64_t window_end = q.current_token_position == 0
                                    ? state_.next_token_position
                                    : q.current_token_position + 1;
    const uint64_t window_start = window_end > config_.hot_window_tokens
                                      ? window_end - config_.hot_window_tokens
                                      : 0;
    // Blocks are in position order, so the recallable ones are a prefix.
    const size_t eligible =
        std::partition_point(blocks_.begin(), blocks_.end(),
                             [&](const BlockInfo& b) {
                               return b.end_token_position <= window_start;
                             }) -
        blocks_.begin();
    result.candidates = static_cast<uint32_t>(eligible);
    const uint32_t k =
        static_cast<uint32_t>(std::min<uint64_t>(result.top_k, eligible));
    if (k > 0) {
      // Blocks still in the window can outrank eligible ones: ask for enough
      // extra results that k eligible ones survive the filter.
      const auto hits =
          index_.Search(q.query.data(),
                        static_cast<uint32_t>(k + (blocks_.size() - eligible)));
      result.search_us = MicrosSince(t0);
      for (const ScoredId& h : hits) {
        if (h.id >= eligible) continue;
        ranked.push_back({blocks_[h.id], h.score, 0.0f});
        if (ranked.size() == k) break;
      }
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  const float gate_scale =
      std::sqrt(static_cast<float>(config_.geometry.head_dim)) *
      config_.gate_temperature;
  result.blocks = PlanBudgetedRecall(ranked, result.budget_tokens, gate_scale);
  for (const auto& b : result.blocks)
    result.total_tokens += b.block.token_count;
  result.plan_us = MicrosSince(t1);
  recalls_.fetch_add(1, std::memory_order_relaxed);
  recalled_blocks_.fetch_add(result.blocks.size(), std::memory_order_relaxed);
  recalled_tokens_.fetch_add(result.total_tokens, std::memory_order_relaxed);
  result.total_us = MicrosSince(t0);
  return result;
}

StreamStats Stream::Stats() const {
  StreamStats s;
  s.stream_id = id_;
  s.config = config_;
  s.summary_dim = summary_dim_;
  s.recalls = recalls_.load(std::memory_order_relaxed);
  s.recalled_blocks = recalled_blocks_.load(std::memory_order_relaxed);
  s.recalled_tokens = recalled_tokens_.load(std::memory_order_relaxed);
  absl::ReaderMutexLock lock(&mu_);
  s.closed = state_.closed;
  s.last_durable_frame = state_.last_frame;
  s.next_token_position = state_.next_token_position;
  s.frames = state_.frames;
  s.tokens = state_.tokens;
  s.sealed_blocks = blocks_.size();
  s.open_block_frames = state_.open_block_frames;
  s.payload_bytes = state_.payload_bytes;
  s.cold_bytes = state_.payload_bytes;
  s.warm_bytes = 0;
  s.summary_bytes = blocks_.size() * summary_dim_ * sizeof(float);
  return s;
}

absl::StatusOr<BlockInfo> Stream::GetBlock(uint64_t block_id) const {
  absl::ReaderMutexLock lock(&mu_);
  if (deleted_) {
    return DeletedError();
  }
  if (block_id >= blocks_.size()) {
    return absl::NotFoundError(absl::StrCat("block_ids has ", block_id,
                                            "; stream \"", id_, "\" has ",
                                            blocks_.size(), " sealed blocks"));
  }
  return blocks_[block_id];
}

absl::StatusOr<std::string> Stream::ReadFrame(uint64_t frame_index) const {
  KVMEM_RETURN_IF_ERROR(NotFoundIfDeleted());
  absl::StatusOr<std::string> payload = store_->GetFrame(id_, frame_index);
  // Checked again: had the stream been deleted (and its id reused) during the
  // read, the bytes could belong to the new stream.
  KVMEM_RETURN_IF_ERROR(NotFoundIfDeleted());
  return payload;
}

void Stream::MarkDeleted(bool deleted) {
  absl::MutexLock append_lock(&append_mu_);
  absl::MutexLock lock(&mu_);
  deleted_ = deleted;
}

}  // namespace kvmem

#include "engine/view/recall_view.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/stream_config.h"

namespace kvmem {

RecallView::RecallView(const std::string& stream_id, const StreamConfig& config,
                       const StreamState& state)
    : id_(stream_id),
      config_(config),
      summary_dim_(SummaryDim(config)),
      layer_dim_(config.geometry.kv_heads * config.geometry.head_dim),
      state_(state),
      frame_part_tokens_(state.frame_part_tokens),
      indexes_(config) {}

absl::Status RecallView::DeletedError() const { return gone_; }

void RecallView::SetDeleted(bool deleted) {
  gone_ =
      deleted
          ? absl::NotFoundError(absl::StrCat("stream \"", id_, "\" not found"))
          : absl::OkStatus();
}

absl::Status RecallView::MissingBlockError(uint64_t block_id) const {
  if (block_id < blocks_.first()) {
    return absl::NotFoundError(absl::StrCat("block ", block_id, " of stream \"",
                                            id_, "\" was evicted"));
  }
  return absl::NotFoundError(absl::StrCat("block_ids has ", block_id,
                                          "; stream \"", id_, "\" has ",
                                          blocks_.size(), " sealed blocks"));
}

const std::vector<uint64_t>* RecallView::TrackBlocks(uint64_t track_id) const {
  auto it = track_blocks_.find(track_id);
  return it == track_blocks_.end() ? nullptr : &it->second;
}

const float* RecallView::UnitSummary(uint64_t unit) const {
  const BlockRecord& rec = blocks_[unit >> unit_shift()].rec;
  return grouped() ? rec.group_summaries.data() +
                         (unit & (kGroupStride - 1)) * summary_dim_
                   : rec.summary.data();
}

size_t RecallView::EligibleBlocks(uint64_t window_end) const {
  const uint64_t window_start = WindowStart(window_end);
  // Blocks are in position order, so the recallable ones are a prefix (the
  // dropped evicted run included).
  return blocks_.first() +
         (std::partition_point(blocks_.begin(), blocks_.end(),
                               [&](const BlockEntry& b) {
                                 return b.rec.info.end_token_position <=
                                        window_start;
                               }) -
          blocks_.begin());
}

uint64_t SignalRamBytes(const BlockRecord& rec) {
  // A presence's own bytes in the record, two map nodes (the track's
  // history and its block list: a red-black node with key and value, 80
  // bytes as glibc allocates them, counted as 96) and the block list's
  // buffer (a 32-byte chunk for one id): a track a single block shows, as
  // a tracker naming new ids does, costs about 232 bytes.
  constexpr uint64_t kPerPresence = sizeof(TrackPresence) + 2 * 96 + 32;
  return rec.scene.size() * sizeof(float) + rec.tracks.size() * kPerPresence;
}

void RecallView::Install(BlockEntry entry) {
  const BlockRecord& rec = entry.rec;
  signal_bytes_.fetch_add(SignalRamBytes(rec), std::memory_order_relaxed);
  if (rec.disk != DiskForm::kNone) indexes_.Add(rec.info.id, rec);
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
  const uint32_t per = units_per_block();
  const size_t slot = (rec.info.id - blocks_.first()) * per;
  unit_tokens_.resize(slot + per, 0);
  if (per == 1) {
    unit_tokens_[slot] = rec.info.token_count;
  } else {
    for (uint8_t g : rec.token_group) {
      if (g < per) ++unit_tokens_[slot + g];
    }
  }
  blocks_.push_back(std::move(entry));
}

StreamIndexes::Growth RecallView::GrowIndexesFor(
    const std::vector<BlockEntry>& sealed) const {
  size_t blocks = 0, groups = 0;
  for (const BlockEntry& e : sealed) {
    if (e.rec.disk == DiskForm::kNone || e.rec.summary.empty()) continue;
    blocks += 1;
    groups += e.rec.group_summaries.size() / summary_dim();
  }
  return indexes_.Grow(blocks, groups);
}

void RecallView::DropEvictedRun() {
  uint64_t freed = 0;
  const size_t dropped = blocks_.DropLeading([&freed](const BlockEntry& e) {
    const bool gone = e.rec.disk == DiskForm::kNone && !e.warm && !e.staged &&
                      e.generation % 2 == 0;
    if (gone) freed += SignalRamBytes(e.rec);
    return gone;
  });
  if (dropped == 0) return;
  signal_bytes_.fetch_sub(freed, std::memory_order_relaxed);
  unit_tokens_.erase(unit_tokens_.begin(),
                     unit_tokens_.begin() + dropped * units_per_block());
  for (auto it = track_blocks_.begin(); it != track_blocks_.end();) {
    std::vector<uint64_t>& ids = it->second;  // Ascending.
    ids.erase(ids.begin(),
              std::lower_bound(ids.begin(), ids.end(), blocks_.first()));
    if (ids.empty()) {
      tracks_.erase(it->first);
      it = track_blocks_.erase(it);
    } else {
      ++it;
    }
  }
}

void RecallView::SetRecord(uint64_t id, BlockRecord* rec) {
  BlockRecord& kept = blocks_[id].rec;
  const uint64_t was = SignalRamBytes(kept);
  std::swap(kept, *rec);
  signal_bytes_.fetch_add(SignalRamBytes(kept) - was,
                          std::memory_order_relaxed);  // Modulo 2^64.
}

void RecallView::Unindex(uint64_t id, size_t groups, uint64_t payload_bytes) {
  indexes_.Remove(id, groups);
  evicted_payload_bytes_.fetch_add(payload_bytes, std::memory_order_relaxed);
}

size_t RecallView::RebuildIndexes() {
  kvmem::MutexLock rebuilding(&rebuild_mu_);
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
  // The expensive part runs without any lock: recalls keep using the old
  // indexes meanwhile.
  StreamIndexes fresh(config_);
  fresh.Reserve(snapshot);
  for (const BlockRecord& r : snapshot) fresh.Add(r.info.id, r);
  kvmem::MutexLock lock(&mu_);
  // Reconcile with what happened during the build, then swap. Blocks
  // sealed meanwhile may already be evicted and their run dropped (an
  // append holds the stream's append lock, not this one, while the index
  // builds).
  for (uint64_t id = std::max<uint64_t>(n, blocks_.first());
       id < blocks_.size(); ++id) {
    if (blocks_[id].rec.disk != DiskForm::kNone) fresh.Add(id, blocks_[id].rec);
  }
  for (const BlockRecord& r : snapshot) {
    if (!blocks_.Has(r.info.id) ||
        blocks_[r.info.id].rec.disk == DiskForm::kNone) {
      fresh.Remove(r.info.id, r.group_summaries.size() / summary_dim_);
    }
  }
  retired_quality_ = indexes_.Quality(retired_quality_);
  // Swapped, not assigned: the old indexes are freed with `fresh`, after
  // the lock is let go (gigabytes at 7B's summary width).
  std::swap(indexes_, fresh);
  rebuilds_ += 1;
  return indexes_.all().size();
}

void RecallView::FillStats(StreamStats* s) const {
  kvmem::ReaderMutexLock lock(&mu_);
  s->closed = state_.closed;
  s->last_durable_frame = state_.last_frame;
  s->next_token_position = state_.next_token_position;
  s->frames = state_.frames;
  s->tokens = state_.tokens;
  s->sealed_blocks = blocks_.size();
  s->evicted.blocks = blocks_.first();  // The dropped run (BlockTable).
  s->open_block_frames = state_.open_block_frames;
  s->payload_bytes = state_.payload_bytes;
  s->index_copied_in_place = indexes_.copied_in_place();
  s->index_bytes = indexes_.memory_bytes();
  s->track_histories = tracks_.size();
  s->signal_bytes = signal_bytes();
  for (const BlockEntry& e : blocks_) {
    if (e.rec.disk != DiskForm::kNone) {
      s->summary_bytes +=
          (e.rec.summary.size() + e.rec.group_summaries.size()) *
              sizeof(float) +
          e.rec.token_group.size();
      s->token_code_bytes += e.rec.token_codes.size();
    }
    switch (TierOf(e)) {
      case Tier::kWarm:
        s->warm.blocks += 1;
        s->warm.bytes += e.warm->allocated_bytes();
        break;
      case Tier::kCold:
        s->cold.blocks += 1;
        s->cold.bytes += DiskBytes(config_, e.rec);
        break;
      case Tier::kDegraded:
        s->degraded.blocks += 1;
        s->degraded.bytes += DiskBytes(config_, e.rec);
        break;
      default:
        s->evicted.blocks += 1;
    }
  }
  const IndexQuality q = Quality();
  s->index_recall_samples = q.samples;
  s->index_recall_at_k = q.recall();
  s->policy.shot_cuts = shot_cuts_;
  s->policy.rebuilds = rebuilds_;
}

}  // namespace kvmem

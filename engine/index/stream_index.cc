// Stream: its indexes (all layers, per layer, token groups): building,
// adding and removing blocks, and rebuilds that swap in without blocking
// recalls.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {

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

}  // namespace kvmem

#include "engine/index/stream_indexes.h"

#include <atomic>

#include "engine/stream_config.h"

namespace kvmem {
namespace {

std::atomic<uint64_t> next_serial{1};

}  // namespace

StreamIndexes::StreamIndexes(const StreamConfig& config)
    : serial_(next_serial.fetch_add(1, std::memory_order_relaxed)),
      summary_dim_(SummaryDim(config)),
      layer_dim_(config.geometry.kv_heads * config.geometry.head_dim) {
  // Segments of head_dim: score MASS scans them per KV head.
  const uint32_t hd = config.geometry.head_dim;
  all_ = std::make_unique<BlockIndex>(summary_dim_, config.index_factory, hd);
  // The same predicates size the config's validation (IndexDims).
  const bool per_layer = HasPerLayerIndexes(config);
  for (size_t i = 0; per_layer && i < config.indexed_layers.size(); ++i) {
    layers_.push_back(
        std::make_unique<BlockIndex>(layer_dim_, config.index_factory, hd));
  }
  if (HasGroupIndex(config)) {
    groups_ =
        std::make_unique<BlockIndex>(summary_dim_, config.index_factory, hd);
  }
}

void StreamIndexes::Add(uint64_t id, const BlockRecord& rec) {
  all_->Add(id, rec.summary.data());
  for (size_t li = 0; li < layers_.size(); ++li) {
    layers_[li]->Add(id, rec.summary.data() + li * layer_dim_);
  }
  if (groups_ != nullptr) {
    const size_t n = rec.group_summaries.size() / summary_dim_;
    for (size_t g = 0; g < n; ++g) {
      groups_->Add(id * kGroupStride + g,
                   rec.group_summaries.data() + g * summary_dim_);
    }
  }
}

void StreamIndexes::Reserve(const std::vector<BlockRecord>& records) {
  size_t blocks = all_->size(), groups = groups_ ? groups_->size() : 0;
  for (const BlockRecord& rec : records) {
    if (rec.summary.empty()) continue;
    blocks += 1;
    groups += rec.group_summaries.size() / summary_dim_;
  }
  blocks += blocks / 8;
  groups += groups / 8;
  all_->Reserve(blocks);
  for (auto& layer : layers_) layer->Reserve(blocks);
  if (groups_ != nullptr) groups_->Reserve(groups);
}

std::vector<BlockIndex*> StreamIndexes::Parts() const {
  std::vector<BlockIndex*> out = {all_.get()};
  for (const auto& layer : layers_) out.push_back(layer.get());
  out.push_back(groups_.get());  // May be null.
  return out;
}

StreamIndexes::Growth StreamIndexes::Grow(size_t blocks, size_t groups) const {
  Growth g;
  g.serial = serial_;
  const std::vector<BlockIndex*> parts = Parts();
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t extra = i + 1 == parts.size() ? groups : blocks;
    g.parts.push_back(parts[i] == nullptr ? nullptr : parts[i]->Grow(extra));
  }
  return g;
}

void StreamIndexes::Adopt(Growth* g) {
  if (g->serial != serial_) return;
  const std::vector<BlockIndex*> parts = Parts();
  for (size_t i = 0; i < parts.size() && i < g->parts.size(); ++i) {
    if (parts[i] != nullptr && g->parts[i] != nullptr) {
      parts[i]->Adopt(g->parts[i].get());
    }
  }
}

uint64_t StreamIndexes::Sum(uint64_t (BlockIndex::*of)() const) const {
  uint64_t n = 0;
  for (const BlockIndex* b : Parts()) n += b == nullptr ? 0 : (b->*of)();
  return n;
}

uint64_t StreamIndexes::memory_bytes() const {
  return Sum(&BlockIndex::memory_bytes);
}

uint64_t StreamIndexes::copied_in_place() const {
  return Sum(&BlockIndex::copied_in_place);
}

void StreamIndexes::Remove(uint64_t id, size_t groups) {
  all_->Remove(id);
  for (auto& layer : layers_) layer->Remove(id);
  if (groups_ != nullptr) {
    for (size_t g = 0; g < groups; ++g) groups_->Remove(id * kGroupStride + g);
  }
}

IndexQuality StreamIndexes::Quality(const IndexQuality& so_far) const {
  IndexQuality q = so_far;
  for (const BlockIndex* b : {all_.get(), groups_.get()}) {
    if (b == nullptr) continue;
    const IndexQuality x = b->quality();
    q.samples += x.samples;
    q.hits += x.hits;
    q.wanted += x.wanted;
  }
  return q;
}

}  // namespace kvmem

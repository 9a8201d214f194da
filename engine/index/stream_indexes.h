// StreamIndexes: the vector indexes of one stream's summaries. `all` holds
// each block's summary (every indexed layer, concatenated); with several
// indexed layers and a scorer that asks for them (SUMMED's per-layer
// recall), `layers` holds one index per indexed layer; with token groups
// (groups_per_block > 1), `groups` holds each group's summary under the id
// block * kGroupStride + group. Every index is segmented by head_dim, so
// score MASS can scan it per KV head.
//
// Thread safety: as BlockIndex: searches may run concurrently, Add and
// Remove may not run with anything. The stream's RecallView guards the
// indexes it serves; a rebuild fills a fresh StreamIndexes no one else sees.
#ifndef KVMEM_ENGINE_INDEX_STREAM_INDEXES_H_
#define KVMEM_ENGINE_INDEX_STREAM_INDEXES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/codec/record_codec.h"
#include "engine/index/block_index.h"
#include "engine/types.h"

namespace kvmem {

// Token-group ids: block << kGroupShift | group.
inline constexpr uint32_t kGroupShift = 8;
inline constexpr uint64_t kGroupStride = uint64_t{1} << kGroupShift;

class StreamIndexes {
 public:
  // Empty indexes for a stream of this config (after defaults, validated):
  // per-layer ones when HasPerLayerIndexes(config), the groups' when
  // HasGroupIndex(config) (engine/stream_config.h).
  explicit StreamIndexes(const StreamConfig& config);

  // Adds a block's summaries (and its groups') / removes them; `groups` is
  // the number of token groups the block was indexed with.
  void Add(uint64_t id, const BlockRecord& rec);
  void Remove(uint64_t id, size_t groups);
  // Room for these records' summaries (those that have one: evicted
  // records have none) and an eighth more for the blocks sealed after, so
  // adding many blocks at once (a recovery, a rebuild) does not copy the
  // indexes as they grow.
  void Reserve(const std::vector<BlockRecord>& records);

  // Room for `blocks` more blocks' summaries and `groups` more groups',
  // made beside searches (the view's reader lock) and adopted under its
  // writer's lock by Adopt: an append never copies the indexes under the
  // lock recalls wait for (BlockIndex::Grow). Indexes replaced in between
  // (a rebuild) or changed leave a growth unused.
  struct Growth {
    uint64_t serial = 0;  // Of the StreamIndexes that made it.
    // all, each layer's, groups': null where there is room (or the kind
    // grows in place).
    std::vector<std::unique_ptr<BlockIndex::Growth>> parts;
  };
  Growth Grow(size_t blocks, size_t groups) const;
  // The parts made by this object's Grow, its indexes unchanged since, are
  // swapped in; g keeps the old arrays, for the caller to free off the lock.
  void Adopt(Growth* g);
  // BlockIndex::copied_in_place over the indexes.
  uint64_t copied_in_place() const;
  // BlockIndex::memory_bytes over the indexes.
  uint64_t memory_bytes() const;

  const BlockIndex& all() const { return *all_; }
  // Indexed layer li's index: its own, or `all` with one indexed layer.
  const BlockIndex& layer(size_t li) const {
    return layers_.empty() ? *all_ : *layers_[li];
  }
  // Null without token groups.
  const BlockIndex* groups() const { return groups_.get(); }
  // The index recall units live in: the groups', else the blocks'.
  const BlockIndex& units() const { return groups_ ? *groups_ : *all_; }

  // `so_far` plus the sampled recall of the indexes that search (the
  // summaries' and the groups').
  IndexQuality Quality(const IndexQuality& so_far) const;

 private:
  // The indexes in Growth::parts' order.
  std::vector<BlockIndex*> Parts() const;
  // `of` summed over the indexes.
  uint64_t Sum(uint64_t (BlockIndex::*of)() const) const;

  uint64_t serial_ = 0;  // Unique per object (Growth::serial).
  uint32_t summary_dim_ = 0;
  uint32_t layer_dim_ = 0;  // kv_heads * head_dim.
  std::unique_ptr<BlockIndex> all_;
  std::vector<std::unique_ptr<BlockIndex>> layers_;
  std::unique_ptr<BlockIndex> groups_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_STREAM_INDEXES_H_

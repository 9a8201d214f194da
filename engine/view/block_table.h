// BlockTable: a stream's sealed blocks by id, each a BlockEntry (its record,
// its RAM copy while it has one, whether it is only staged, the generation
// of its durable form). The leading run of wholly evicted blocks is dropped
// from RAM, so a stream's memory does not grow with its age.
//
// Thread safety: none; the stream's RecallView guards it.
#ifndef KVMEM_ENGINE_VIEW_BLOCK_TABLE_H_
#define KVMEM_ENGINE_VIEW_BLOCK_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "engine/codec/block_layout.h"
#include "engine/codec/record_codec.h"
#include "engine/types.h"

namespace kvmem {

struct BlockEntry {
  BlockRecord rec;
  std::shared_ptr<const WarmBlock> warm;  // Set while in RAM.
  bool staged = false;                    // In RAM only because staged.
  // Its stored record is the one its seal wrote (warm, no hits): a
  // demotion that keeps its frames need not rewrite it, since recovery
  // tells such records from promotions' (Stream::Recover).
  bool sealed_record = false;
  // Odd while a move of its durable form is being committed; bumped before
  // and after, so readers outside append_mu_ can tell a torn read.
  uint64_t generation = 0;
};

// The tier a block is in as readers see it: warm while it has a RAM copy
// that is not only staged, else where its durable copy is.
Tier TierOf(const BlockEntry& e);

// Bytes a block's durable form holds on disk (0 when evicted): its frames
// as the stream writes them (tier_policy.ingest_precision), its layers.
uint64_t DiskBytes(const StreamConfig& c, const BlockRecord& rec);

// The sealed blocks by id. The leading blocks that are wholly gone
// (evicted: no disk form, no RAM copy, no move in progress) are dropped
// from RAM as a run, so a stream's RAM does not grow with its age: ids
// below first() were all evicted. Ids in [first(), size()) are kept,
// evicted ones among them too (their cards, until the run reaches them).
// Their records stay in the store, and recovery drops the run again.
class BlockTable {
 public:
  uint64_t size() const { return first_ + kept_.size(); }  // The next id.
  uint64_t first() const { return first_; }
  bool Has(uint64_t id) const { return id >= first_ && id < size(); }
  BlockEntry& operator[](uint64_t id) { return kept_[id - first_]; }
  const BlockEntry& operator[](uint64_t id) const { return kept_[id - first_]; }
  std::deque<BlockEntry>::const_iterator begin() const { return kept_.begin(); }
  std::deque<BlockEntry>::const_iterator end() const { return kept_.end(); }
  void push_back(BlockEntry e) { kept_.push_back(std::move(e)); }
  // Drops leading entries while gone(entry); returns how many.
  size_t DropLeading(const std::function<bool(const BlockEntry&)>& gone) {
    size_t n = 0;
    while (!kept_.empty() && gone(kept_.front())) {
      kept_.pop_front();
      ++first_;
      ++n;
    }
    return n;
  }

 private:
  uint64_t first_ = 0;
  std::deque<BlockEntry> kept_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_VIEW_BLOCK_TABLE_H_

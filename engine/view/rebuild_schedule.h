// RebuildSchedule: when a stream's indexes are rebuilt from its live
// summaries (tier_policy.rebuild_every_blocks sealed blocks, or
// rebuild_every_seconds, whichever comes first, and no sooner than an
// eighth of the kept blocks, by default, sealed since the last), with at most
// one rebuild queued on the background executor (RecallView runs rebuilds one
// at a time whoever asks).
//
// Thread safety: all methods are safe to call concurrently.
#ifndef KVMEM_ENGINE_VIEW_REBUILD_SCHEDULE_H_
#define KVMEM_ENGINE_VIEW_REBUILD_SCHEDULE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "base/sync.h"
#include "engine/types.h"

namespace kvmem {

class RebuildSchedule {
 public:
  // kept_per_sealed: the floor below (EngineOptions::
  // rebuild_kept_per_sealed; 0: none).
  RebuildSchedule(const TierConfig& t, uint32_t kept_per_sealed)
      : kept_per_sealed_(kept_per_sealed),
        every_blocks_(t.rebuild_every_blocks),
        every_(std::chrono::seconds(t.rebuild_every_seconds)),
        last_(std::chrono::steady_clock::now()) {}

  // Counts `sealed` newly sealed blocks of a stream that keeps `kept`
  // blocks in its indexes; true when they make a rebuild due (the count
  // and the clock then start again). A rebuild copies and re-adds every
  // kept block's summaries: one is due only once the blocks sealed since
  // the last are at least 1/kept_per_sealed of the kept ones, whatever
  // the triggers say, so its cost per sealed block stays bounded (at most
  // kept_per_sealed blocks' re-adds) however small a client sets them
  // (rebuild_every_blocks = 1 made every seal of a long stream copy its
  // whole index).
  bool DueAfterSealing(size_t sealed, size_t kept) ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    since_ += sealed;
    if (sealed == 0 ||
        (kept_per_sealed_ > 0 && since_ * kept_per_sealed_ < kept)) {
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    const bool due = (every_blocks_ > 0 && since_ >= every_blocks_) ||
                     (every_.count() > 0 && now - last_ >= every_);
    if (!due) return false;
    since_ = 0;
    last_ = now;
    return true;
  }
  // Claims the one rebuild that may be queued; false when one already is.
  bool Claim() ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    if (queued_) return false;
    queued_ = true;
    return true;
  }
  // A rebuild ran: the next may be queued.
  void Done() ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    queued_ = false;
  }

 private:
  const uint64_t kept_per_sealed_;
  const uint64_t every_blocks_;
  const std::chrono::seconds every_;
  kvmem::Mutex mu_;
  uint64_t since_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_ ABSL_GUARDED_BY(mu_);
  bool queued_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_VIEW_REBUILD_SCHEDULE_H_

// RecallFeedback: what one stream's recalls leave behind for maintenance
// and stats: the blocks they returned (hits, for the heat policy, stage
// hits and promotions, applied later by the stream's maintenance), how many
// recalls, blocks and tokens there were, and the latest recalls' latencies.
//
// Thread safety: all methods are safe to call concurrently; recalls push
// and maintenance drains under one small lock, never held across other
// work.
#ifndef KVMEM_ENGINE_RECALL_RECALL_FEEDBACK_H_
#define KVMEM_ENGINE_RECALL_RECALL_FEEDBACK_H_

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/sync.h"
#include "engine/types.h"

namespace kvmem {

// A recall returned block `block` at frame `frame`.
struct RecallHit {
  uint64_t block = 0;
  uint64_t frame = 0;
  bool operator<(const RecallHit& o) const {
    return block != o.block ? block < o.block : frame < o.frame;
  }
  bool operator==(const RecallHit& o) const {
    return block == o.block && frame == o.frame;
  }
};

class RecallFeedback {
 public:
  // Counts a recall's blocks and tokens and queues one hit per distinct
  // block (per-layer sets may share blocks) at now_frame. Returns true when
  // maintenance should be scheduled: hits were queued, none is scheduled
  // yet, and can_schedule (the caller has somewhere to run it); it then
  // counts as scheduled until Drain.
  bool Queue(const RecallResult& r, uint64_t now_frame, bool can_schedule)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The hits queued so far, in queue order; maintenance is no longer
  // scheduled.
  std::vector<RecallHit> Drain() ABSL_LOCKS_EXCLUDED(mu_);

  // Counts a recall (returns the recalls counted before it).
  uint64_t CountRecall() {
    return recalls_.fetch_add(1, std::memory_order_relaxed);
  }
  // Keeps a recall's latency (the last 1024).
  void RecordLatency(uint32_t us) ABSL_LOCKS_EXCLUDED(mu_);
  // recalls, recalled_blocks, recalled_tokens and the latency percentiles
  // into *s.
  void FillStats(StreamStats* s) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr size_t kLatencyRing = 1024;

  mutable kvmem::Mutex mu_;
  std::vector<RecallHit> hits_ ABSL_GUARDED_BY(mu_);
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint32_t> latency_us_ ABSL_GUARDED_BY(mu_);  // A ring.
  size_t latency_next_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> recalls_{0};
  std::atomic<uint64_t> recalled_blocks_{0};
  std::atomic<uint64_t> recalled_tokens_{0};
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALL_FEEDBACK_H_

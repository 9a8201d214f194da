#include "engine/recall/recall_feedback.h"

#include <algorithm>

#include "base/percentile.h"

namespace kvmem {

bool RecallFeedback::Queue(const RecallResult& r, uint64_t now_frame,
                           bool can_schedule) {
  std::vector<RecallHit> hits;
  auto account = [&](const std::vector<RecalledBlock>& blocks,
                     uint32_t tokens) {
    for (const auto& b : blocks) hits.push_back({b.block.id, now_frame});
    recalled_blocks_.fetch_add(blocks.size(), std::memory_order_relaxed);
    recalled_tokens_.fetch_add(tokens, std::memory_order_relaxed);
  };
  if (r.layer_sets.empty()) account(r.blocks, r.total_tokens);
  for (const LayerRecallSet& set : r.layer_sets) {
    account(set.blocks, set.total_tokens);
  }
  if (hits.empty()) return false;
  // Per-layer sets may share blocks: one hit per block and query.
  std::sort(hits.begin(), hits.end());
  hits.erase(std::unique(hits.begin(), hits.end()), hits.end());
  kvmem::MutexLock lock(&mu_);
  hits_.insert(hits_.end(), hits.begin(), hits.end());
  if (scheduled_ || !can_schedule) return false;
  scheduled_ = true;
  return true;
}

std::vector<RecallHit> RecallFeedback::Drain() {
  std::vector<RecallHit> hits;
  kvmem::MutexLock lock(&mu_);
  hits.swap(hits_);
  scheduled_ = false;
  return hits;
}

void RecallFeedback::RecordLatency(uint32_t us) {
  kvmem::MutexLock lock(&mu_);
  if (latency_us_.size() < kLatencyRing) {
    latency_us_.push_back(us);
  } else {
    latency_us_[latency_next_] = us;
  }
  latency_next_ = (latency_next_ + 1) % kLatencyRing;
}

void RecallFeedback::FillStats(StreamStats* s) const {
  s->recalls = recalls_.load(std::memory_order_relaxed);
  s->recalled_blocks = recalled_blocks_.load(std::memory_order_relaxed);
  s->recalled_tokens = recalled_tokens_.load(std::memory_order_relaxed);
  std::vector<uint32_t> lat;
  {
    kvmem::MutexLock lock(&mu_);
    lat = latency_us_;
  }
  if (lat.empty()) return;
  std::sort(lat.begin(), lat.end());
  s->policy.recall_us_p50 = SortedPercentile(lat, 0.50);
  s->policy.recall_us_p99 = SortedPercentile(lat, 0.99);
  s->policy.recall_us_max = lat.back();
}

}  // namespace kvmem

// SemanticCache: the weighted semantic score of a recall's blocks
// (engine/signals/semantics.h), computed once per block on demand.
//
// Thread safety: none; one per recall.
#ifndef KVMEM_ENGINE_RECALL_SEMANTIC_CACHE_H_
#define KVMEM_ENGINE_RECALL_SEMANTIC_CACHE_H_

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>

namespace kvmem {

class SemanticCache {
 public:
  // on: whether any semantic weight is set; score(b): block b's score.
  SemanticCache(bool on, std::function<float(uint64_t)> score)
      : on_(on), score_(std::move(score)) {}
  bool on() const { return on_; }
  void Reserve(size_t n) { known_.reserve(n); }
  // Block b's score, computed now if it was not yet.
  float Get(uint64_t b) {
    auto [it, fresh] = known_.try_emplace(b, 0.0f);
    if (fresh) it->second = score_(b);
    return it->second;
  }
  // Block b's score if computed, else 0 (and 0 when semantics are off).
  float Known(uint64_t b) const {
    if (!on_) return 0.0f;
    auto it = known_.find(b);
    return it == known_.end() ? 0.0f : it->second;
  }

 private:
  bool on_;
  std::function<float(uint64_t)> score_;
  std::unordered_map<uint64_t, float> known_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_SEMANTIC_CACHE_H_

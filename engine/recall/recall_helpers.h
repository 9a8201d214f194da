// RecallHelpers: the threads one recall may spread its two largest loops
// over (the scan of every unit per query vector, the token stage's scoring
// of its pool): the caller's own plus the helpers of a ForkJoinPool
// (base/fork_join.h; EngineOptions::recall_threads), shared by every
// recall of the engine. A helper busy with another recall leaves the
// indices to the caller, so a busy pool slows a recall down to one thread,
// never stalls it.
#ifndef KVMEM_ENGINE_RECALL_RECALL_HELPERS_H_
#define KVMEM_ENGINE_RECALL_RECALL_HELPERS_H_

#include <cstddef>
#include <functional>

#include "base/fork_join.h"

namespace kvmem {

struct RecallHelpers {
  ForkJoinPool* pool = nullptr;  // Null: the caller alone.
  bool on() const { return pool != nullptr; }
  // A recall's loops to come (ForkJoinPool::Enter/Leave): helpers poll
  // for them while it runs, and sleep once no recall does.
  void Enter() const {
    if (pool != nullptr) pool->Enter();
  }
  void Leave() const {
    if (pool != nullptr) pool->Leave();
  }
  // fn(0), ..., fn(n - 1): on the helpers too when on(). fn's calls run
  // concurrently: each writes only its own index's outputs.
  void For(size_t n, const std::function<void(size_t)>& fn) const {
    if (pool == nullptr) {
      for (size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    pool->For(n, fn);
  }
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_RECALL_HELPERS_H_

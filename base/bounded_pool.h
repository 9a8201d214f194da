// BoundedPool: large buffers kept between uses, a bounded number of them.
//
// A buffer of tens of megabytes allocated fresh for each use costs its page
// faults (the kernel zeroing every new page: on a VM each first touch exits
// to the hypervisor) and, where it grows by doubling, a copy per doubling.
// Work that runs on whichever thread is free (a seal, a store commit) keeps
// its buffers here, not per thread: at most max_items of at most max_bytes
// each, whatever the thread count; a use beyond them takes a fresh buffer.
#ifndef KVMEM_BASE_BOUNDED_POOL_H_
#define KVMEM_BASE_BOUNDED_POOL_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/sync.h"

namespace kvmem {

template <typename T>
class BoundedPool {
 public:
  BoundedPool(size_t max_items, size_t max_bytes)
      : max_items_(max_items), max_bytes_(max_bytes) {}

  // A kept buffer, or T() when none is kept.
  T Take() ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    if (free_.empty()) return T();
    T b = std::move(free_.back());
    free_.pop_back();
    return b;
  }

  // Keeps `b`, which holds `bytes`, for a later Take when it holds some and
  // at most max_bytes and fewer than max_items are kept; drops it otherwise.
  void GiveBack(T b, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    if (bytes == 0 || bytes > max_bytes_) return;
    kvmem::MutexLock lock(&mu_);
    if (free_.size() < max_items_) free_.push_back(std::move(b));
  }

 private:
  const size_t max_items_, max_bytes_;
  kvmem::Mutex mu_;
  std::vector<T> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmem

#endif  // KVMEM_BASE_BOUNDED_POOL_H_

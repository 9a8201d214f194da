// ForkJoinPool: helper threads for loops that last a fraction of a
// millisecond (one recall's scan and token scoring), where a blocking
// hand-off costs as much as the work it hands off.
//
// Executor + ParallelFor (base/executor.h) hands off through a mutex and a
// condition: measured on a 2-vCPU VM, a caller that blocked waiting for its
// helper's last task woke ~190 us after it ended (an idle vCPU is slow to
// wake), so 8 tasks of 60 us on two threads took 494 us, more than on one.
// Here the helpers and the caller poll instead of blocking, for a bounded
// time. A caller brackets its loops with Enter() and Leave() (one recall:
// its scan and its token stage); while callers are inside, but no more of
// them than there are helpers, an idle helper polls for the next loop (at
// most `spin` at a time), otherwise it sleeps until one enters. With more
// callers inside than helpers the cores are taken (e.g. many streams'
// recalls at once): For then runs the caller's loop alone, and helpers do
// not poll, which would only take CPU from the callers. A sleeping helper is
// slow to join (on that VM an idle vCPU took 100-200 us to run a woken thread,
// or the kernel placed it on the caller's vCPU), so Enter() wakes the helpers
// ahead of the caller's first loop. A caller polls for its loop's last index
// (already running on a helper: the wait is at most one index long) and blocks
// only after `spin` of that. Helpers poll only while some caller is inside, so
// they take no CPU from what a caller does after Leave() (a recall's
// delivery).
//
// Thread safety: For may be called from any number of threads at once;
// helpers take indices of every loop posted, oldest first.
#ifndef KVMEM_BASE_FORK_JOIN_H_
#define KVMEM_BASE_FORK_JOIN_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace kvmem {

class ForkJoinPool {
 public:
  // `helpers` threads (at least 1) that poll for `spin` when idle.
  ForkJoinPool(int helpers, absl::Duration spin);
  ~ForkJoinPool();
  ForkJoinPool(const ForkJoinPool&) = delete;
  ForkJoinPool& operator=(const ForkJoinPool&) = delete;

  int helpers() const { return static_cast<int>(threads_.size()); }

  // Runs fn(0), ..., fn(n - 1) on this thread and the helpers, each index
  // once, concurrently (on this thread alone when more callers are inside
  // than there are helpers); returns when all have run.
  void For(size_t n, const std::function<void(size_t)>& fn);

  // A caller's loops to come: helpers poll while any caller is inside.
  // Every Enter() is matched by one Leave().
  void Enter();
  void Leave();

 private:
  struct Loop;
  void Run();
  // The oldest posted loop with an index left, or null; drops loops whose
  // indices are all taken. REQUIRES: mu_ held.
  std::shared_ptr<Loop> NextLoop();
  // Whether idle helpers poll: callers inside, no more than helpers.
  bool Polling() const;

  const absl::Duration spin_;
  std::mutex mu_;
  std::condition_variable posted_cv_;
  std::deque<std::shared_ptr<Loop>> loops_;  // Guarded by mu_.
  bool stopping_ = false;                    // Guarded by mu_.
  int sleeping_ = 0;                         // Guarded by mu_.
  std::atomic<uint64_t> posted_{0};          // Loops posted (and Enter calls).
  std::atomic<int> inside_{0};               // Callers between Enter and Leave.
  std::vector<std::thread> threads_;
};

}  // namespace kvmem

#endif  // KVMEM_BASE_FORK_JOIN_H_

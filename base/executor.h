// Executor: a fixed pool of worker threads for work that may block (RocksDB
// commits and reads, fsync). The server runs storage-bound RPC work on one so
// gRPC's callback threads never wait on I/O; the engine runs tier moves,
// promotions and index rebuilds on another, off every caller's path.
//
// Thread safety: Submit may be called from any thread. The destructor runs
// every task already submitted, then joins the workers.
#ifndef KVMEM_BASE_EXECUTOR_H_
#define KVMEM_BASE_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/sync.h"

namespace kvmem {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Submit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  kvmem::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Runs fn(0), ..., fn(n - 1) on this thread and on up to `helpers` tasks of
// `executor`, each claiming the next index as it becomes free; returns when
// all have run. Safe from a task of the same executor: an index no helper
// has claimed yet is run here, so this never waits on a queued task.
void ParallelFor(Executor* executor, size_t n, int helpers,
                 const std::function<void(size_t)>& fn);

}  // namespace kvmem

#endif  // KVMEM_BASE_EXECUTOR_H_

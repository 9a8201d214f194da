#include "base/executor.h"

#include <atomic>
#include <memory>

namespace kvmem {

Executor::Executor(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
}

Executor::~Executor() {
  {
    kvmem::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void Executor::Submit(std::function<void()> task) {
  kvmem::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void Executor::Run() {
  for (;;) {
    std::function<void()> task;
    {
      kvmem::MutexLock lock(&mu_);
      mu_.Await(kvmem::Condition(
          +[](Executor* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
            return e->stopping_ || !e->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // Stopping and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ParallelFor(Executor* executor, size_t n, int helpers,
                 const std::function<void(size_t)>& fn) {
  struct State {
    explicit State(size_t n) : n(n) {}
    const size_t n;
    std::atomic<size_t> next{0};
    kvmem::Mutex mu;
    size_t done ABSL_GUARDED_BY(mu) = 0;
    static bool AllDone(State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return s->done == s->n;
    }
  };
  auto state = std::make_shared<State>(n);
  // fn is only called for a claimed index, and this call returns after all
  // n have run: a helper that starts later finds nothing left and never
  // touches fn.
  auto work = [state, n, f = &fn] {
    for (size_t i; (i = state->next.fetch_add(1)) < n;) {
      (*f)(i);
      kvmem::MutexLock lock(&state->mu);
      ++state->done;
    }
  };
  for (int h = 0; h < helpers && static_cast<size_t>(h + 1) < n; ++h) {
    executor->Submit(work);
  }
  work();
  kvmem::MutexLock lock(&state->mu);
  state->mu.Await(kvmem::Condition(&State::AllDone, state.get()));
}

}  // namespace kvmem

#include "base/executor.h"

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

}  // namespace kvmem

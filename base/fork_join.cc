#include "base/fork_join.h"

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvmem {
namespace {

void Relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

using Clock = std::chrono::steady_clock;

}  // namespace

struct ForkJoinPool::Loop {
  Loop(const std::function<void(size_t)>* fn, size_t n) : fn(fn), n(n) {}
  const std::function<void(size_t)>* const fn;  // Valid until done == n.
  const size_t n;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  // A caller that stopped polling sleeps here until done == n.
  std::mutex mu;
  std::condition_variable done_cv;
  bool sleeping = false;  // Guarded by mu.

  // Claims and runs indices until none is left.
  void Work() {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      (*fn)(i);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        if (sleeping) done_cv.notify_all();
      }
    }
  }
};

ForkJoinPool::ForkJoinPool(int helpers, absl::Duration spin) : spin_(spin) {
  if (helpers < 1) helpers = 1;
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { Run(); });
}

ForkJoinPool::~ForkJoinPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  posted_.fetch_add(1);
  posted_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<ForkJoinPool::Loop> ForkJoinPool::NextLoop() {
  while (!loops_.empty()) {
    if (loops_.front()->next.load() < loops_.front()->n) return loops_.front();
    loops_.pop_front();
  }
  return nullptr;
}

void ForkJoinPool::Run() {
  const auto spin = absl::ToChronoNanoseconds(spin_);
  for (;;) {
    std::shared_ptr<Loop> loop;
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      seen = posted_.load();
      loop = NextLoop();
    }
    if (loop != nullptr) {
      loop->Work();
      continue;
    }
    // Nothing to do: while a caller is inside, poll for its next loop;
    // then sleep until a loop is posted or a caller enters.
    const auto until = Clock::now() + spin;
    while (posted_.load() == seen && Polling() && Clock::now() < until) {
      Relax();
    }
    if (posted_.load() != seen) continue;
    std::unique_lock<std::mutex> lock(mu_);
    ++sleeping_;
    posted_cv_.wait(lock, [&] { return stopping_ || posted_.load() != seen; });
    --sleeping_;
  }
}

void ForkJoinPool::Enter() {
  if (inside_.fetch_add(1) + 1 > helpers()) return;  // Cores are taken.
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.fetch_add(1);
    wake = sleeping_ > 0;
  }
  if (wake) posted_cv_.notify_all();
}

void ForkJoinPool::Leave() { inside_.fetch_sub(1); }

bool ForkJoinPool::Polling() const {
  const int inside = inside_.load();
  return inside > 0 && inside <= helpers();
}

void ForkJoinPool::For(size_t n, const std::function<void(size_t)>& fn) {
  if (n < 2 || inside_.load() > helpers()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto loop = std::make_shared<Loop>(&fn, n);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loops_.push_back(loop);
    posted_.fetch_add(1);
    wake = sleeping_ > 0;
  }
  if (wake) posted_cv_.notify_all();
  loop->Work();
  // The indices left are running on helpers: poll for them, then sleep.
  const auto until = Clock::now() + absl::ToChronoNanoseconds(spin_);
  while (loop->done.load() < n && Clock::now() < until) Relax();
  if (loop->done.load() < n) {
    std::unique_lock<std::mutex> lock(loop->mu);
    loop->sleeping = true;
    loop->done_cv.wait(lock, [&] { return loop->done.load() == n; });
  }
}

}  // namespace kvmem

// ForkJoinPool (base/fork_join.h): every index runs exactly once, loops of
// several callers at once all finish, a helper runs indices when the caller
// is alone, and a caller runs its loop alone when more callers are inside
// than there are helpers.
#include "base/fork_join.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(ForkJoinPoolTest, EveryIndexRunsOnceForManyCallersAtOnce) {
  ForkJoinPool pool(2, absl::Microseconds(200));
  constexpr int kCallers = 4, kLoops = 200;
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&pool, &wrong, c] {
      for (int l = 0; l < kLoops; ++l) {
        const size_t n = 1 + (l * 7 + c) % 37;
        std::vector<std::atomic<int>> hits(n);
        pool.Enter();
        pool.For(n, [&hits](size_t i) { hits[i].fetch_add(1); });
        pool.Leave();
        for (const auto& h : hits) wrong += h.load() != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Alone, a caller's loop runs on the helper too: each index waits until
// some index ran on another thread (or a second passed), so a loop whose
// indices all ran on the caller would take a second per index.
TEST(ForkJoinPoolTest, AHelperRunsIndicesOfALoneCaller) {
  ForkJoinPool pool(1, absl::Milliseconds(2));
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  std::atomic<bool> other{false};
  pool.Enter();
  const auto t0 = std::chrono::steady_clock::now();
  pool.For(4, [&](size_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ran_on.insert(std::this_thread::get_id());
    }
    if (std::this_thread::get_id() != caller) other = true;
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!other.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  });
  pool.Leave();
  EXPECT_EQ(ran_on.size(), 2u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(ForkJoinPoolTest, MoreCallersInsideThanHelpersRunTheirLoopsAlone) {
  ForkJoinPool pool(1, absl::Milliseconds(2));
  pool.Enter();
  pool.Enter();  // Two callers inside, one helper: the cores are taken.
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  pool.For(64, [&](size_t) {
    elsewhere += std::this_thread::get_id() != caller;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  pool.Leave();
  pool.Leave();
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(ForkJoinPoolTest, LoopsWithoutEnterAndEmptyLoopsWork) {
  ForkJoinPool pool(3, absl::Microseconds(50));
  std::atomic<int> sum{0};
  pool.For(0, [&](size_t) { sum += 1000; });
  pool.For(1, [&](size_t i) { sum += static_cast<int>(i) + 1; });
  pool.For(100, [&](size_t i) { sum += static_cast<int>(i); });
  EXPECT_EQ(sum.load(), 1 + 4950);
}

}  // namespace
}  // namespace kvmem

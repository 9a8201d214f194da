// The Executor (base/executor.h): every submitted task runs, including
// those submitted while it shuts down, and its workers run tasks at once.
#include "base/executor.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(ExecutorTest, DestructorRunsEveryTaskAlreadySubmitted) {
  std::atomic<int> ran{0};
  {
    Executor e(2);
    for (int i = 0; i < 1000; ++i) {
      e.Submit([&ran] {
        ran.fetch_add(1);
        std::this_thread::yield();
      });
    }
  }  // Joined here.
  EXPECT_EQ(ran.load(), 1000);
}

TEST(ExecutorTest, TasksSubmittedByTasksDuringShutdownRunToo) {
  std::atomic<int> ran{0};
  // A chain: each task submits the next, the way a finished read starts
  // the next one. Shutdown begins while the chain is still going. (The
  // chain outlives the executor: the destructor runs its last links.)
  Executor* executor = nullptr;
  std::function<void(int)> step = [&](int left) {
    ran.fetch_add(1);
    if (left > 0) executor->Submit([&step, left] { step(left - 1); });
  };
  {
    Executor e(1);
    executor = &e;
    e.Submit([&step] { step(99); });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ExecutorTest, WorkersRunTasksConcurrently) {
  // Two tasks that each wait for the other to start: only two workers
  // running at once let both see the other within the time limit.
  std::atomic<int> started{0};
  std::atomic<int> met{0};
  {
    Executor e(2);
    for (int i = 0; i < 2; ++i) {
      e.Submit([&] {
        started.fetch_add(1);
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (started.load() < 2 &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        if (started.load() == 2) met.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(met.load(), 2);
}

TEST(ExecutorTest, FewerThanOneThreadMeansOne) {
  std::atomic<int> ran{0};
  {
    Executor e(0);
    e.Submit([&ran] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 1);
}

// ParallelFor runs every index exactly once, uses the executor's threads,
// and finishes when called from a task of an executor whose every worker
// is busy (the caller runs what no helper has claimed).
TEST(ExecutorTest, ParallelForRunsEachIndexOnceEvenFromASaturatedPool) {
  // Before the executor: its destructor runs the tasks still queued.
  std::atomic<int> done{0};
  std::atomic<bool> release{false};
  std::vector<std::atomic<int>> hits(1000);
  Executor e(2);
  ParallelFor(&e, hits.size(), 3, [&](size_t i) { hits[i].fetch_add(1); });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);

  // Both workers run a ParallelFor whose helpers can never start: the one
  // worker left is blocked until both calls return.
  for (int t = 0; t < 2; ++t) {
    e.Submit([&] {
      std::atomic<int> ran{0};
      ParallelFor(&e, 50, 4, [&](size_t) { ran.fetch_add(1); });
      EXPECT_EQ(ran.load(), 50);
      done.fetch_add(1);
    });
  }
  e.Submit([&] {
    while (!release.load()) std::this_thread::yield();
  });
  for (int i = 0; i < 2000 && done.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(done.load(), 2);
  release.store(true);
}

}  // namespace
}  // namespace kvmem

// The Executor (base/executor.h): every submitted task runs, including
// those submitted while it shuts down, and its workers run tasks at once.
#include "base/executor.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

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

}  // namespace
}  // namespace kvmem

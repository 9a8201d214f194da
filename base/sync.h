// kvmem's locks. Normally they are abseil's (aliases below). Under
// ThreadSanitizer (a build with -DKVMEM_TSAN=1, tests/tsan.sh) they are the
// same interface over std::shared_mutex and std::condition_variable_any:
// Debian's abseil is not built with TSan, so every absl::Mutex hand-off looks
// like a data race to it, while the standard library's locks are
// intercepted. Only what kvmem uses is provided.
#ifndef KVMEM_BASE_SYNC_H_
#define KVMEM_BASE_SYNC_H_

#include "absl/base/thread_annotations.h"

#if defined(KVMEM_TSAN) && KVMEM_TSAN

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/time/time.h"

namespace kvmem {

// A predicate over state the mutex guards, as absl::Condition.
class Condition {
 public:
  explicit Condition(const bool* flag)
      : eval_([](const void* f) { return *static_cast<const bool*>(f); }),
        arg_(flag) {}
  template <typename T>
  Condition(bool (*fn)(T*), T* arg)
      : fn_(reinterpret_cast<bool (*)(void*)>(fn)), arg_(arg) {}
  bool Eval() const {
    return fn_ != nullptr ? fn_(const_cast<void*>(arg_)) : eval_(arg_);
  }

 private:
  bool (*eval_)(const void*) = nullptr;
  bool (*fn_)(void*) = nullptr;
  const void* arg_;
};

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { m_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    m_.unlock();
    changed_.notify_all();  // Await re-checks its condition on any unlock.
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { m_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { m_.unlock_shared(); }
  // REQUIRES: held exclusively.
  void Await(const Condition& c) {
    while (!c.Eval()) changed_.wait(m_);
  }
  bool AwaitWithTimeout(const Condition& c, absl::Duration timeout) {
    const auto until =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    while (!c.Eval()) {
      if (changed_.wait_until(m_, until) == std::cv_status::timeout) {
        return c.Eval();
      }
    }
    return true;
  }

 private:
  friend class CondVar;
  std::shared_mutex m_;
  std::condition_variable_any changed_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // REQUIRES: mu held exclusively.
  void Wait(Mutex* mu) { cv_.wait(mu->m_); }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

class Notification {
 public:
  // Notifies under the lock: a waiter that sees done_ may destroy this
  // object as soon as the lock is free (TSan found the unlocked version).
  void Notify() {
    std::lock_guard<std::mutex> lock(m_);
    done_ = true;
    cv_.notify_all();
  }
  void WaitForNotification() {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [this] { return done_; });
  }
  bool HasBeenNotified() {
    std::lock_guard<std::mutex> lock(m_);
    return done_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
};

// Memory accesses made by this thread while one exists are not recorded.
// For calls into RocksDB's write path (RocksColdStore): RocksDB is not built
// with TSan, so the group commit's hand-off (a leader thread copies the
// waiting followers' batches into one WAL record and memtable insert, the
// followers spinning on atomics TSan cannot see) shows up as races on the
// followers' batches and the memtable. Only the accesses TSan can see from
// that uninstrumented code (memcpy, memcmp and string calls it makes) are
// dropped; kvmem's own accesses before and after the call are still checked.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
class UninstrumentedCall {
 public:
  UninstrumentedCall() { __tsan_ignore_thread_begin(); }
  ~UninstrumentedCall() { __tsan_ignore_thread_end(); }
  UninstrumentedCall(const UninstrumentedCall&) = delete;
  UninstrumentedCall& operator=(const UninstrumentedCall&) = delete;
};

}  // namespace kvmem

#else  // abseil's

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace kvmem {
using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using ReaderMutexLock = absl::ReaderMutexLock;
using CondVar = absl::CondVar;
using Condition = absl::Condition;
using Notification = absl::Notification;
// See the ThreadSanitizer build's: nothing outside it.
class UninstrumentedCall {
 public:
  UninstrumentedCall() {}
};
}  // namespace kvmem

#endif

#endif  // KVMEM_BASE_SYNC_H_

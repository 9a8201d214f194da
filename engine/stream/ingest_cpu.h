// IngestCpu: where an append's CPU goes, stage by stage (issue 28: "a
// figure per stage"). Each stage's time is the appending thread's own CPU
// time (CLOCK_THREAD_CPUTIME_ID) between two marks, summed per stream; a
// seal that runs on the background worker (seal after the ack) is counted
// there. What the server spends outside these stages (gRPC and protobuf,
// RocksDB's flushes and compactions, recalls) is the process's CPU less
// their sum: `kvmem bench` reports both. Cost: seven clock reads an append
// and three a seal (~1.4 us each where the clock is a system call, as on
// the 2-vCPU VM of docs/benchmarks.md: ~0.3 % of a 256 KiB frame's append).
//
// Thread safety: Add is safe from any thread (relaxed atomics); a
// StageClock belongs to one thread.
#ifndef KVMEM_ENGINE_STREAM_INGEST_CPU_H_
#define KVMEM_ENGINE_STREAM_INGEST_CPU_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "engine/types.h"

namespace kvmem {

using IngestCpuNs = std::array<uint64_t, kIngestStages>;

// This thread's CPU time in nanoseconds.
uint64_t ThreadCpuNs();

class IngestCpu {
 public:
  void Add(IngestStage s, uint64_t ns) {
    ns_[static_cast<int>(s)].fetch_add(ns, std::memory_order_relaxed);
  }
  IngestCpuNs Snapshot() const {
    IngestCpuNs out{};
    for (int i = 0; i < kIngestStages; ++i) {
      out[i] = ns_[i].load(std::memory_order_relaxed);
    }
    return out;
  }

 private:
  std::array<std::atomic<uint64_t>, kIngestStages> ns_{};
};

// Marks stage boundaries on one thread: Mark(s) charges the CPU time since
// the last mark (or construction) to stage s. A null sink charges nothing.
class StageClock {
 public:
  explicit StageClock(IngestCpu* sink)
      : sink_(sink), last_(sink != nullptr ? ThreadCpuNs() : 0) {}
  void Mark(IngestStage s) {
    if (sink_ == nullptr) return;
    const uint64_t now = ThreadCpuNs();
    if (now > last_) sink_->Add(s, now - last_);
    last_ = now;
  }

 private:
  IngestCpu* sink_;
  uint64_t last_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_STREAM_INGEST_CPU_H_

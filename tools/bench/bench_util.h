// Helpers the bench programs share: a process's CPU time and RSS from /proc,
// and random fp16 payloads.
#ifndef KVMEM_TOOLS_BENCH_BENCH_UTIL_H_
#define KVMEM_TOOLS_BENCH_BENCH_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvmem {

// CPU seconds (user + system) and RSS of a process, from /proc; zeros for
// pid < 0.
struct ProcSample {
  double cpu_s = 0;
  double rss_mib = 0;
};
ProcSample SampleProcess(int pid);

// n fp16 values in [-1, 1].
std::string RandomFp16(size_t n, uint64_t seed);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_UTIL_H_

// Helpers the bench programs share: a process's CPU time and RSS from /proc,
// random fp16 payloads, and the tokens a recall response names.
#ifndef KVMEM_TOOLS_BENCH_BENCH_UTIL_H_
#define KVMEM_TOOLS_BENCH_BENCH_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvmem/v1/service.pb.h"

namespace kvmem {

// CPU seconds (user + system) and RSS of a process, from /proc; zeros for
// pid < 0.
struct ProcSample {
  double cpu_s = 0;
  double rss_mib = 0;
  // Bytes the process caused to be written to storage (/proc/<pid>/io
  // write_bytes: its page-cache writes as the kernel sends them to disk).
  double disk_write_bytes = 0;
};
// This process's CPU seconds (every thread, finished ones included), at
// the clock's resolution rather than /proc's ticks.
double SelfCpuSeconds();
ProcSample SampleProcess(int pid);

// a / b, or 0 when b is not positive (a figure beside a reference that was
// not measured).
inline double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The K and V values of one token over every layer.
inline uint64_t KvValuesPerToken(uint32_t layers, uint32_t kv_heads,
                                 uint32_t head_dim) {
  return uint64_t{layers} * 2 * kv_heads * head_dim;
}

// n fp16 values in [-1, 1].
std::string RandomFp16(size_t n, uint64_t seed);

// The tokens of every set of a recall response, per block (a block a set
// takes whole: all its tokens), sorted by block: what a front end holds
// after the recall's delivery (RecallDelivery.held_tokens).
std::vector<v1::BlockTokens> RecalledTokens(const v1::RecallResponse& resp);
// The tokens in such a list.
uint64_t TokenCount(const std::vector<v1::BlockTokens>& tokens);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_UTIL_H_

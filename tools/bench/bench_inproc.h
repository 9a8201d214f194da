// The in-process figures of `kvmem bench` (bench.h): the recall kernel
// against FAISS flat, and stream recall by per-head mass against the summed
// score. Internal to the bench.
#ifndef KVMEM_TOOLS_BENCH_BENCH_INPROC_H_
#define KVMEM_TOOLS_BENCH_BENCH_INPROC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "tools/bench/bench.h"

namespace kvmem {

// One top-k query at a time over the same data: the exact progressive
// index and FAISS flat, each over every query in its own loop (warm
// caches, as a server answering recalls back to back); latencies per query
// and the progressive answers' overlap with flat's (recall and candidates
// may be null).
void InprocIndex(uint32_t n, uint32_t dim, uint32_t k, uint32_t queries,
                 uint64_t seed, Latency* prog_lat, Latency* flat_lat,
                 double* recall, double* candidates);

// Stream recall in process: the same inproc_vectors one-frame blocks in two
// streams (RocksDB in scratch_dir), one scored by per-head mass and one by
// the summed score, on the Progressive index; queries alternate between
// them, so both see the same machine state. Summaries are inproc_dim wide:
// one indexed layer of inproc_dim / 64 KV heads.
absl::Status InprocStreamRecall(const BenchOptions& o, Latency* mass,
                                Latency* summed);

// Token-resolution recall at the same scale: inproc_vectors one-frame
// blocks of 16 tokens in 4 token groups, two streams with score MASS, one
// ending at the tokens (scorer "mass", the default) and one at the groups
// ("mass_groups"), queries alternating, a budget of 64 tokens; the tokens
// each recall scored one by one, on average, into *tokens_scored.
absl::Status InprocTokenRecall(const BenchOptions& o, Latency* tokens,
                               Latency* groups, double* tokens_scored);

// /proc/cpuinfo's first model name ("" when absent).
std::string CpuModel();

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_INPROC_H_

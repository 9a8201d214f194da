// `kvmem bench --fetch`: the token path, what a recall costs until its KV
// bytes are in the front end's memory. Per tier (warm, cold with the page
// cache warm and, where root may drop it, dropped; degraded) and per
// geometry (a 7B model's, the demo's), FetchBlocks of a recall-sized set
// through KvmemClient, beside references measured in the same run over the
// same bytes: memcpy, a raw unix socket between two threads, a trivial
// gRPC server in this process streaming them as FetchBlocks does, and
// RocksDB's Get of the same layer records in a store of its own; plus
// recall + fetch end to end at the 7B geometry against the frame period.
#ifndef KVMEM_TOOLS_BENCH_BENCH_FETCH_H_
#define KVMEM_TOOLS_BENCH_BENCH_FETCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/bench.h"

namespace kvmem {

struct FetchGeometry {
  std::string name;                                 // "7b", "demo"
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;  // fp16
  uint32_t tokens_per_frame = 0, frames_per_block = 0;
  uint32_t blocks = 0;  // The fetched set.
  uint64_t block_bytes() const {
    return uint64_t{layers} * 2 * kv_heads * head_dim * 2 * tokens_per_frame *
           frames_per_block;
  }
};

// The 7B geometry of the issue (32 layers x 8 KV heads x 128, fp16: 128 KiB
// per token; 8 blocks of 64 tokens = 64 MiB) and the demo's (4 x 2 x 64,
// 128-token frames; 8 blocks of 8 frames = 16 MiB).
std::vector<FetchGeometry> DefaultFetchGeometries();

// MB/s (1e6 bytes per second) of the set, from the median of `calls` calls;
// 0 when not measured.
struct FetchFigures {
  FetchGeometry g;
  uint64_t set_bytes = 0;
  double memcpy = 0, unix_socket = 0, trivial_grpc = 0;
  // RocksDB alone: one Get per layer record of the set, store of the
  // server's default options (the cold tier's reference).
  double store_get = 0;
  double warm_grpc = 0, cold = 0, cold_dropped = 0, degraded = 0;
};

struct FetchReport {
  std::string cpu, fp16_kernel;
  int calls = 0;
  bool page_cache_dropped = false;  // cold_dropped measured.
  std::vector<FetchFigures> geometries;
  // Recall (a 614-token budget: 9 blocks of 64 tokens, 72 MiB) + FetchBlocks
  // of its set, warm tier, 7B geometry; per call, in ms.
  Latency recall_fetch_ms;
  uint64_t recall_fetch_bytes = 0;
};

// o.target: the kvmem-server; o.scratch_dir: for the sockets (must exist).
absl::StatusOr<FetchReport> RunFetchBench(const BenchOptions& o, int calls);
std::string FetchJson(const FetchReport& r);
std::string FetchText(const FetchReport& r);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_FETCH_H_

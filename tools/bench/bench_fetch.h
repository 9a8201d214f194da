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

// A 7B model's geometry (32 layers x 8 KV heads x 128, fp16: 128 KiB
// per token; 8 blocks of 64 tokens = 64 MiB) and the demo's (4 x 2 x 64,
// 128-token frames; 8 blocks of 8 frames = 16 MiB).
std::vector<FetchGeometry> DefaultFetchGeometries();

// How the client fetches: gRPC bytes into a reused buffer (FetchInto) or
// as new strings per block (FetchBlocks), or shared memory (FetchShared);
// block layer-major (the layout warm blocks and the layer records have) or
// frame-major.
enum class FetchPath { kGrpc, kGrpcFrames, kShm, kShmFrames };
inline constexpr FetchPath kFetchPaths[] = {
    FetchPath::kGrpc, FetchPath::kGrpcFrames, FetchPath::kShm,
    FetchPath::kShmFrames};
// "grpc", "grpc_frame_major", "shm", "shm_frame_major".
const char* FetchPathName(FetchPath p);

// MB/s (1e6 bytes per second) of the set, from the median of `calls` calls;
// 0 when not measured.
struct FetchFigures {
  FetchGeometry g;
  uint64_t set_bytes = 0;
  double memcpy = 0, unix_socket = 0;
  // The trivial gRPC server, through FetchInto (as kGrpc) and FetchBlocks
  // (as kGrpcFrames).
  double trivial_grpc = 0, trivial_grpc_strings = 0;
  // RocksDB alone: one Get per layer record of the set, store of the
  // server's default options (the cold tier's reference): RocksDB's check
  // off and kvmem's CRC32C trailer checked, as the server reads; and
  // RocksDB's own check (software CRC32C in Debian's build).
  double store_get = 0, store_get_rocksdb_crc = 0;
  // [tier: warm, cold, degraded][FetchPath]
  double tier[3][4] = {};
  double cold_dropped = 0;  // kGrpc, page cache dropped before each call.
};

struct FetchReport {
  std::string cpu, fp16_kernel, crc_kernel;
  int calls = 0;
  bool page_cache_dropped = false;  // cold_dropped measured.
  std::vector<FetchFigures> geometries;
  // Recall (a 614-token budget: 9 blocks of 64 tokens, 72 MiB) with its
  // set's bytes, warm tier, 7B geometry, layer-major; per call, in ms:
  // delivered through shared memory in the same exchange, and a Recall
  // then FetchInto over gRPC; the recall alone for scale.
  Latency recall_fetch_ms, recall_fetch_grpc_ms, recall_only_ms;
  // The recall's own timing (RecallTiming.total_us, token_us), in ms.
  Latency recall_engine_ms, recall_token_stage_ms;
  uint64_t recall_fetch_bytes = 0;
  // A camera's frame-to-frame recalls (a slowly turning query, 30 frames)
  // naming the blocks held from the previous frame: mean bytes delivered
  // per recall, against the whole set each time.
  double delta_mean_mib = 0, full_mean_mib = 0;
  double delta_mean_blocks = 0, full_mean_blocks = 0;
  // The same recall delivered in TOKEN_LAYER_MAJOR through shared memory
  // (only the recalled tokens): per call in ms, the bytes moved and the
  // recalled tokens' own bytes (tokens x layers x 2 x kv_heads x head_dim x
  // 2); and the camera's recalls naming the tokens they hold.
  Latency recall_tokens_ms;
  uint64_t recall_tokens_bytes = 0, recalled_token_bytes = 0;
  double token_delta_mean_mib = 0, token_full_mean_mib = 0;
};

// o.target: the kvmem-server; o.scratch_dir: for the sockets (must exist).
absl::StatusOr<FetchReport> RunFetchBench(const BenchOptions& o, int calls);
std::string FetchJson(const FetchReport& r);
std::string FetchText(const FetchReport& r);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_FETCH_H_

// `kvmem bench`: an end-to-end load generator, with the references it is
// judged against measured in the same run:
//   - in process: one top-k query over N summaries (default 10,800 x 128,
//     one camera-hour at 3 fps) through the exact progressive index (the
//     SIMD int8 kernel + fp32 rerank) and through FAISS's flat index;
//   - storage: the storage engine alone (RocksColdStore, WAL on, the
//     server's options) putting frames of the bench's frame size from as
//     many threads as streams;
//   - transport: the same frames client-streamed (AppendFrames, same
//     chunking) to a no-op sink served in this process over a unix socket;
//     an empty unary RPC (grpc.health.v1 Check) from as many callers as
//     streams;
//   - the service: N camera streams appending at full rate
//     (AppendFrames), then (once the server's background work settled)
//     recalling (ids only) concurrently, then, with fps > 0, live
//     sessions appending and recalling each frame at that pace, then
//     appending as much again while a few callers recall and send empty
//     RPCs in turn; the server's RSS (before that last phase) and CPU when
//     its pid is known.
//
// Thread safety: RunBench is self-contained; call it from one thread.
#ifndef KVMEM_TOOLS_BENCH_BENCH_H_
#define KVMEM_TOOLS_BENCH_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvmem/v1/types.pb.h"
#include "tools/bench/bench_stages.h"

namespace kvmem {

struct BenchOptions {
  std::string target;         // The kvmem-server under load.
  std::string scratch_dir;    // Storage reference and sink socket; must exist.
  bool keep_streams = false;  // Leave the streams in the server at the end.
  int server_pid = -1;        // For RSS/CPU; -1: not sampled.
  int streams = 16;
  int frames = 120;   // Per stream, full-rate ingest phase.
  int recalls = 300;  // Per stream, recall phase (and empty RPCs).
  double fps = 0;     // Live phase pace per stream; 0 skips it.
  double live_seconds = 10;
  // Callers recalling while every stream ingests again at full rate (the
  // loaded phase); 0 skips it.
  int loaded_recallers = 4;
  // Frame geometry: 4 x 2 x 64 fp16, 128 tokens = 256 KiB per frame.
  uint32_t layers = 4, kv_heads = 2, head_dim = 64, tokens_per_frame = 128;
  uint32_t hot_window_tokens = 2048;
  // Warm (RAM) budget per stream. Blocks past it are demoted, which
  // rewrites their KV layer-major (a second write of every byte).
  uint64_t warm_budget_bytes = 64ull << 20;
  // How the streams keep blocks that leave RAM (tier_policy.
  // cold_precision): "full", "int8" or "int4".
  std::string cold_precision = "full";
  // How the streams write frames when appended (tier_policy.
  // ingest_precision): "full", "int8" or "int4".
  std::string ingest_precision = "full";
  uint32_t recall_top_k = 16;
  uint32_t recall_max_tokens = 512;
  // In-process index figures.
  uint32_t inproc_vectors = 10800, inproc_dim = 128, inproc_k = 16;
  uint32_t inproc_queries = 2000;
  uint32_t inproc_wide_dim = 1024;  // A second, wide run; 0 skips it.
  uint64_t seed = 1;
  std::function<void(const std::string&)> progress;  // Phase messages.
};

struct Latency {
  uint64_t count = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
};
// The proto value of a cold precision's name ("full", "int8", "int4");
// COLD_PRECISION_UNSPECIFIED for any other.
v1::ColdPrecision ColdPrecisionOf(const std::string& name);

// Sorts *us and summarises it.
Latency Summarize(std::vector<double>* us);

struct BenchReport {
  uint64_t frame_bytes = 0;
  int streams = 0;
  // In process (inproc_vectors x inproc_dim, k = inproc_k).
  std::string kernel;  // The int8 kernel in use ("avx2", "scalar").
  // The token stage's lanes kernel ("avx512vnni", or "off": the avx2 path).
  std::string token_lanes;
  Latency inproc, flat;
  double inproc_recall_at_k = 0;   // Progressive vs flat top-k overlap.
  double inproc_candidates = 0;    // Mean vectors rescored in fp32.
  Latency wide_inproc, wide_flat;  // inproc_wide_dim; count 0 when skipped.
  // In process, a stream of inproc_vectors one-frame blocks (summaries of
  // inproc_dim, 64-dim heads) on the Progressive index, recalled with the
  // default budget: by per-head attention mass (score MASS, the default)
  // and by the summed score (SUMMED, before), queries alternating.
  Latency stream_mass, stream_summed;
  // In process, inproc_vectors one-frame blocks of 16 tokens in 4 groups:
  // recall at token resolution (the default) and at group resolution.
  Latency stream_tokens, stream_groups;
  double stream_tokens_scored = 0;  // Per token-resolution recall.
  std::string cpu;                  // /proc/cpuinfo's model name.
  // References.
  double storage_put_mb_per_s = 0;
  double raw_stream_mb_per_s = 0;
  Latency empty_rpc;
  // The service.
  double ingest_mb_per_s = 0, ingest_frames_per_s = 0;
  // After ingest, all streams: the blocks out of RAM (cold and degraded
  // tiers) and their bytes on disk, and the bytes appended to them.
  std::string cold_precision, ingest_precision;
  uint64_t cold_tier_blocks = 0, cold_tier_bytes = 0;
  Latency recall;
  // Loaded phase (loaded_recallers > 0): every stream appends its frames
  // again at full rate while loaded_recallers callers each alternate a
  // recall (as the recall phase's) and an empty RPC, so both meet the same
  // load; the recall's own time in the engine beside it.
  Latency loaded_recall, loaded_recall_engine, loaded_empty_rpc;
  int loaded_recallers = 0;
  double loaded_ingest_mb_per_s = 0;
  // Live phase (fps > 0).
  double live_fps = 0;  // Asked per stream.
  // Achieved, all streams: frames answered over the span from the first
  // camera's first frame to the last one's last answer (session setup and
  // stream deletion outside it), at least the nominal n / fps.
  double live_frames_per_s = 0;
  Latency live_append, live_recall;
  Latency live_recall_engine;  // The engine's own time (RecallTiming.total_us).
  Latency live_empty_rpc;      // After each recall, same connection.
  // Server process (server_pid >= 0).
  double server_rss_mib = 0;  // Before the loaded phase.
  double server_cpu_ingest = 0, server_cpu_recall = 0;  // Cores busy.
  // CPU seconds per GB of frames: the two references (this process: the
  // puts with RocksDB's threads; the no-op sink with its clients) and the
  // ingest phase (the server's and this process's, its clients, up to the
  // last append's ack; the stages also count the seals pending then); the
  // ingest figure 0 when not measured (no server_pid). cpus: the machine's
  // online CPUs.
  double storage_cpu_s_per_gb = 0, transport_cpu_s_per_gb = 0;
  double ingest_cpu_s_per_gb = 0;
  int cpus = 0;
  IngestStages ingest_stages;  // The ingest phase's CPU by stage.
};

absl::StatusOr<BenchReport> RunBench(const BenchOptions& options);

// The report as JSON (the figures above, by name).
std::string BenchJson(const BenchReport& r);
// A human summary: each figure beside its reference and the ratio.
std::string BenchText(const BenchReport& r);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_H_

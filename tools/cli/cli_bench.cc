// kvmem bench: load a kvmem-server with camera streams and report its
// figures beside references measured in the same run (tools/bench/bench.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
// WasPresentOnCommandLine: --cameras is also the demo's flag, with a
// default of its own.
#include "absl/flags/internal/parse.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_cameras.h"
#include "tools/bench/bench_fetch.h"
#include "tools/cli/cli.h"
#include "tools/common/server_process.h"

ABSL_FLAG(int, streams, 16, "bench: camera streams (client threads).");
ABSL_FLAG(int, recalls, 300, "bench: recalls (and empty RPCs) per stream.");
ABSL_FLAG(double, live_fps, 0,
          "bench: after the full-rate phases, sessions append and recall "
          "each frame at this pace per stream (0: no live phase).");
ABSL_FLAG(double, live_seconds, 10, "bench: length of the live phase.");
ABSL_FLAG(int, loaded_recallers, 4,
          "bench: callers that recall, each recall followed by an empty RPC, "
          "while every stream appends its frames again at full rate (the "
          "loaded phase; 0: no loaded phase).");
ABSL_FLAG(uint64_t, warm_budget_mib, 64,
          "bench: warm (RAM) budget per stream; past it blocks are demoted, "
          "rewriting their KV layer-major on disk.");
ABSL_FLAG(bool, fetch, false,
          "bench: instead of the load phases, the token path: FetchBlocks per "
          "tier (warm, cold, degraded) at a 7B and the demo's geometry beside "
          "memcpy, a raw unix socket and a trivial gRPC server of the same "
          "bytes, and recall + fetch end to end (tools/bench/bench_fetch.h).");
ABSL_FLAG(int, fetch_calls, 25, "bench --fetch: calls per figure (median).");
ABSL_FLAG(double, camera_seconds, 20, "bench --cameras: seconds per step.");
ABSL_FLAG(uint32_t, camera_history_frames, 256,
          "bench --cameras: before each step, each camera appends history "
          "at full speed until a block of its stream has left RAM (the "
          "steady state), at most this many frames (0: none).");
ABSL_FLAG(uint32_t, camera_indexed_layers, 0,
          "bench --cameras: index the first N layers of each camera "
          "(index_policy.indexed_layers; 0: the stream default, every "
          "layer).");
ABSL_FLAG(double, camera_query_turn, 0.31,
          "bench --cameras: how far each camera's query turns per frame (its "
          "fresh-noise share: 0.31 keeps 0.95 of the last; 1: an unrelated "
          "query every frame).");
ABSL_FLAG(bool, camera_held_tokens, true,
          "bench --cameras: each recall names the tokens the camera holds "
          "from the frame before and receives only the others (false: "
          "every recall delivers its whole set).");
ABSL_FLAG(std::string, cold_precision, "full",
          "bench: how the streams keep blocks that leave RAM: full (the "
          "default), int8 or int4 (tier_policy.cold_precision).");
ABSL_FLAG(std::string, ingest_precision, "full",
          "bench and eval: how kvmem's streams write frames when appended: "
          "full (the default), int8 or int4 (tier_policy.ingest_precision); "
          "eval's int8 / int4 output errors then read every token quantised "
          "as written.");
ABSL_FLAG(uint32_t, index_vectors, 10800,
          "bench: summaries in the in-process index figures (10,800: one "
          "camera-hour at 3 fps).");
ABSL_FLAG(uint32_t, index_queries, 2000,
          "bench: queries timed in the in-process index figures.");
ABSL_FLAG(std::string, scratch_dir, "",
          "bench: directory for the storage reference, the sink socket and a "
          "server it starts (default /tmp/kvmem-bench-PID; removed after).");
ABSL_FLAG(bool, keep_streams, false,
          "bench: leave the benchmark's streams in the server at the end "
          "(with --addr: e.g. to time another server taking them over).");
ABSL_FLAG(std::string, server_store, "",
          "bench: the --store of the server it starts (empty: its RocksDB "
          "default), e.g. rados:POOL to measure ingest into Ceph.");
ABSL_FLAG(std::string, server_ceph_conf, "",
          "bench: the --ceph_conf of the server it starts, with "
          "--server_store=rados:POOL.");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "bench: more flags for the server it starts, comma-separated "
          "(e.g. --server_flags=--cold_form=layers; a value cannot hold a "
          "comma).");

// --cameras (cli_demo.cc's flag) given to bench: instead of the load
// phases, how many 7B cameras the node carries (tools/bench/bench_cameras.h),
// trying 1, 2, ... up to that many.
ABSL_DECLARE_FLAG(int, cameras);
ABSL_DECLARE_FLAG(int, frames);
ABSL_DECLARE_FLAG(uint32_t, layers);
ABSL_DECLARE_FLAG(uint32_t, kv_heads);
ABSL_DECLARE_FLAG(uint32_t, head_dim);
ABSL_DECLARE_FLAG(uint32_t, tokens_per_frame);
ABSL_DECLARE_FLAG(uint32_t, hot_window_tokens);
ABSL_DECLARE_FLAG(uint64_t, seed);

namespace kvmem {
namespace {

// The flag's value when it was given on the command line (even at its
// default), else fallback: bench --cameras has defaults of its own (a 7B
// camera) for flags the demo defines with others.
template <typename T>
T GivenOr(const absl::Flag<T>& flag, const char* name, T fallback) {
  return absl::flags_internal::WasPresentOnCommandLine(name)
             ? absl::GetFlag(flag)
             : fallback;
}

// Prints a report, as JSON or text; 1 after a message when the run failed.
template <typename Report>
int PrintReport(const absl::StatusOr<Report>& r, bool json,
                std::string (*as_json)(const Report&),
                std::string (*as_text)(const Report&)) {
  if (!r.ok()) {
    std::fprintf(stderr, "kvmem bench: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("%s", json ? as_json(*r).c_str() : as_text(*r).c_str());
  return 0;
}

}  // namespace

int RunBench(const std::vector<std::string>&) {
  BenchOptions o;
  o.streams = absl::GetFlag(FLAGS_streams);
  o.recalls = absl::GetFlag(FLAGS_recalls);
  o.frames = FlagOr(FLAGS_frames, "frames", 120);
  o.fps = absl::GetFlag(FLAGS_live_fps);
  o.live_seconds = absl::GetFlag(FLAGS_live_seconds);
  o.loaded_recallers = absl::GetFlag(FLAGS_loaded_recallers);
  o.layers = FlagOr(FLAGS_layers, "layers", 4u);
  o.kv_heads = FlagOr(FLAGS_kv_heads, "kv_heads", 2u);
  o.head_dim = FlagOr(FLAGS_head_dim, "head_dim", 64u);
  o.tokens_per_frame = FlagOr(FLAGS_tokens_per_frame, "tokens_per_frame", 128u);
  o.hot_window_tokens =
      FlagOr(FLAGS_hot_window_tokens, "hot_window_tokens", 2048u);
  o.seed = FlagOr<uint64_t>(FLAGS_seed, "seed", 1);
  o.inproc_vectors = absl::GetFlag(FLAGS_index_vectors);
  o.warm_budget_bytes = absl::GetFlag(FLAGS_warm_budget_mib) << 20;
  o.inproc_queries = absl::GetFlag(FLAGS_index_queries);
  const std::string precision = absl::GetFlag(FLAGS_cold_precision);
  if (ColdPrecisionOf(precision) == v1::COLD_PRECISION_UNSPECIFIED) {
    std::fprintf(stderr,
                 "kvmem bench: --cold_precision is \"%s\"; use full, int8 or "
                 "int4\n",
                 precision.c_str());
    return 2;
  }
  o.cold_precision = precision;
  o.ingest_precision = absl::GetFlag(FLAGS_ingest_precision);
  if (ColdPrecisionOf(o.ingest_precision) == v1::COLD_PRECISION_UNSPECIFIED) {
    std::fprintf(stderr,
                 "kvmem bench: --ingest_precision is \"%s\"; use full, int8 "
                 "or int4\n",
                 o.ingest_precision.c_str());
    return 2;
  }
  if (o.streams < 1 || o.streams > 1024 || o.frames < 1 || o.recalls < 1 ||
      o.fps < 0 || o.inproc_vectors < 16 || o.inproc_queries < 1 ||
      o.loaded_recallers < 0 || o.loaded_recallers > 256) {
    std::fprintf(stderr,
                 "kvmem bench: need 1..1024 --streams, >= 1 --frames and "
                 "--recalls, --live_fps >= 0, --index_vectors >= 16, "
                 "--index_queries >= 1 and 0..256 --loaded_recallers\n");
    return 2;
  }
  const bool cameras = absl::flags_internal::WasPresentOnCommandLine("cameras");
  if (cameras &&
      (absl::GetFlag(FLAGS_cameras) < 1 || absl::GetFlag(FLAGS_cameras) > 256 ||
       !(absl::GetFlag(FLAGS_camera_seconds) > 0) ||
       !(absl::GetFlag(FLAGS_camera_query_turn) >= 0 &&
         absl::GetFlag(FLAGS_camera_query_turn) <= 1))) {
    std::fprintf(stderr,
                 "kvmem bench: --cameras must be 1..256, --camera_seconds "
                 "> 0 and --camera_query_turn 0..1 (got %d, %g, %g)\n",
                 absl::GetFlag(FLAGS_cameras),
                 absl::GetFlag(FLAGS_camera_seconds),
                 absl::GetFlag(FLAGS_camera_query_turn));
    return 2;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  o.progress = [](const std::string& m) {
    std::fprintf(stderr, "kvmem bench: %s\n", m.c_str());
  };
  std::string scratch = absl::GetFlag(FLAGS_scratch_dir);
  const bool own_scratch = scratch.empty();
  if (own_scratch) scratch = absl::StrCat("/tmp/kvmem-bench-", ::getpid());
  std::error_code ec;
  std::filesystem::create_directories(scratch, ec);
  o.scratch_dir = scratch + "/refs";
  std::filesystem::remove_all(o.scratch_dir, ec);
  std::filesystem::create_directories(o.scratch_dir, ec);
  if (ec) {
    std::fprintf(stderr, "kvmem bench: cannot create %s: %s\n",
                 o.scratch_dir.c_str(), ec.message().c_str());
    return 1;
  }
  std::unique_ptr<ScratchServer> server;
  o.target = absl::GetFlag(FLAGS_addr);
  o.keep_streams = absl::GetFlag(FLAGS_keep_streams);
  if (o.target.empty()) {
    std::string error;
    std::vector<std::string> args;
    if (const std::string st = absl::GetFlag(FLAGS_server_store); !st.empty()) {
      args.push_back("--store=" + st);
    }
    if (const std::string cc = absl::GetFlag(FLAGS_server_ceph_conf);
        !cc.empty()) {
      args.push_back("--ceph_conf=" + cc);
    }
    for (const std::string& f : absl::GetFlag(FLAGS_server_flags)) {
      args.push_back(f);
    }
    server = ScratchServer::Start(scratch + "/server", args, &error);
    if (server == nullptr) {
      std::fprintf(stderr, "kvmem bench: %s\n", error.c_str());
      return 1;
    }
    o.target = server->target();
    o.server_pid = server->process().pid();
  }
  auto cleanup = [&] {
    server.reset();
    std::filesystem::remove_all(o.scratch_dir, ec);
    if (own_scratch) std::filesystem::remove_all(scratch, ec);
  };
  if (absl::GetFlag(FLAGS_fetch)) {
    const int calls = std::max(1, absl::GetFlag(FLAGS_fetch_calls));
    absl::StatusOr<FetchReport> f = RunFetchBench(o, calls);
    cleanup();
    return PrintReport(f, json, FetchJson, FetchText);
  }
  if (cameras) {
    CamerasOptions co;
    co.target = o.target;
    co.scratch_dir = o.scratch_dir;
    co.server_pid = o.server_pid;
    co.max_cameras = absl::GetFlag(FLAGS_cameras);
    // A 7B model's geometry unless the flags say otherwise.
    co.layers = GivenOr(FLAGS_layers, "layers", co.layers);
    co.kv_heads = GivenOr(FLAGS_kv_heads, "kv_heads", co.kv_heads);
    co.head_dim = GivenOr(FLAGS_head_dim, "head_dim", co.head_dim);
    co.tokens_per_frame = GivenOr(FLAGS_tokens_per_frame, "tokens_per_frame",
                                  co.tokens_per_frame);
    co.hot_window_tokens = GivenOr(FLAGS_hot_window_tokens, "hot_window_tokens",
                                   co.hot_window_tokens);
    co.seconds = absl::GetFlag(FLAGS_camera_seconds);
    co.max_history_frames = absl::GetFlag(FLAGS_camera_history_frames);
    co.indexed_layers = absl::GetFlag(FLAGS_camera_indexed_layers);
    co.query_turn = absl::GetFlag(FLAGS_camera_query_turn);
    co.held_tokens = absl::GetFlag(FLAGS_camera_held_tokens);
    co.cold_precision = o.cold_precision;
    co.ingest_precision = o.ingest_precision;
    co.seed = o.seed;
    co.progress = o.progress;
    absl::StatusOr<CamerasReport> c = RunCamerasBench(co);
    cleanup();
    return PrintReport(c, json, CamerasJson, CamerasText);
  }
  absl::StatusOr<BenchReport> r = kvmem::RunBench(o);
  cleanup();
  return PrintReport(r, json, BenchJson, BenchText);
}

}  // namespace kvmem

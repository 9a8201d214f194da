// `kvmem bench --cameras`: how many cameras one node carries. N simulated
// cameras of a 7B video LLM (32 layers x 8 KV heads x 128 dims, fp16, 128
// tokens per frame at 3 frames/s: 16 MiB per frame, 48 MiB/s per camera)
// each open a Session with every stream setting but the geometry and the
// hot window (2,048 tokens) left at its default, and per frame, at the camera's
// pace, append the frame and recall (614-token budget) with the recalled tokens
// delivered through shared memory, as a front end does: its query turns
// slowly from frame to frame, and it names the tokens it holds from the
// frame before (RecallDelivery.held_tokens), so a recall delivers what is
// new to it (options below; both off: a fresh set every frame). N rises from 1
// until the node falls behind; beside it, in the same run, the N that RocksDB
// puts of the same frames alone would carry (the storage's bound).
//
// Each step measures the steady state: before its clock starts, every
// camera appends history at full speed (no recalls) until a block of its
// stream has left RAM (the engine's warm tier is full, so every later seal
// moves a block down, as in a camera's second minute), or
// CamerasOptions::max_history_frames. Without it a 20-s step of one camera
// never reached the warm cap (1 GiB: 21 s of one camera) and counted a
// camera as kept up that fell behind once blocks left RAM.
//
// A camera falls behind when its append backlog grows (the median lateness
// of its last third of frames passes that of its first third by more than
// a frame period, or a frame starts 3 s late) or its recall + delivery p99
// passes a third of the frame period (the front end's share of a frame's
// time).
//
// Thread safety: RunCamerasBench is self-contained; call it from one
// thread.
#ifndef KVMEM_TOOLS_BENCH_BENCH_CAMERAS_H_
#define KVMEM_TOOLS_BENCH_BENCH_CAMERAS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/bench.h"

namespace kvmem {

struct CamerasOptions {
  std::string target;       // The kvmem-server under load.
  std::string scratch_dir;  // The storage reference's store; must exist.
  int server_pid = -1;      // For its CPU; -1: not sampled.
  int max_cameras = 8;      // The largest N tried.
  double seconds = 10;      // Per step (N cameras at once).
  double fps = 3;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128, tokens_per_frame = 128;
  uint32_t hot_window_tokens = 2048;  // 16 frames: 5.3 s.
  uint32_t recall_max_tokens = 614;
  std::string cold_precision = "full";    // tier_policy.cold_precision.
  std::string ingest_precision = "full";  // tier_policy.ingest_precision.
  // History per camera before each step (see above): at most this many
  // frames; 0: none (a step from an empty stream).
  uint32_t max_history_frames = 256;
  // Index the first this many layers (0: the stream default, all).
  uint32_t indexed_layers = 0;
  // Each frame's query is sqrt(1 - t^2) x the last + t x fresh noise, t =
  // query_turn (0.31: 0.95 x the last, as bench --fetch's deltas); 1: an
  // unrelated query every frame.
  double query_turn = 0.31;
  // Each recall names the tokens the previous recall delivered or named
  // (a front end that keeps its recalled KV between frames) and receives
  // only the others; false: every recall delivers its whole set.
  bool held_tokens = true;
  uint64_t seed = 1;
  std::function<void(const std::string&)> progress;  // Phase messages.
};

// One step: N cameras for CamerasOptions::seconds.
struct CameraStep {
  int cameras = 0;
  uint64_t frames = 0;       // Appended and recalled, all cameras.
  double frames_per_s = 0;   // Achieved, all cameras.
  double end_lag_ms = 0;     // Worst camera's lateness at its last frame.
  double lag_growth_ms = 0;  // Worst camera's backlog growth (below).
  // Recall: with its shared-memory delivery, each camera's first delivery
  // (its arena's pages mapped and faulted in) apart: first_delivery_ms, the
  // slowest camera's.
  Latency append_ms, recall_ms;
  Latency select_ms;  // The engine's selection alone (RecallTiming).
  double first_delivery_ms = 0;
  double delivered_mib = 0;  // Mean per recall.
  double set_mib = 0;        // The recalled tokens' bytes, mean per recall.
  double server_cpu = 0;     // Cores busy (server_pid known).
  // What the server wrote to disk during the step over the frames' bytes
  // (server_pid known): RocksDB's WAL, blob and table files, records
  // included. Flushes of the history's memtables fall in it and the step's
  // last memtables' flushes after it.
  double disk_bytes_per_frame_byte = 0;
  double client_cpu = 0;  // Cores the cameras (this process) kept busy.
  // The history appended before the step: frames per camera (the most of
  // any camera), its time, and whether every camera's stream had a block
  // out of RAM by then (false: the step may not show the steady state).
  uint64_t history_frames = 0;
  double history_s = 0;
  bool history_full = false;
  // Blocks the cameras' streams moved up to RAM after recalls and down out
  // of it during the step.
  uint64_t promotions = 0, demotions = 0;
  bool kept_up = false;
  std::string why;  // Why not, when not kept up.
};

struct CamerasReport {
  std::string cpu;
  std::string rocksdb_crc32c;  // storage/rocks_crc32c.h
  std::string cold_precision, ingest_precision;
  double query_turn = 0;
  bool held_tokens = false;
  uint64_t frame_bytes = 0;
  double fps = 0;
  double camera_mb_per_s = 0;  // frame_bytes x fps, MB/s.
  // What the storage reference's puts wrote to disk per frame byte (each
  // byte to the WAL and to a blob file: ~2).
  double storage_disk_bytes_per_frame_byte = 0;
  // RocksDB alone (the server's store options, WAL on): puts of the same
  // frames from as many threads as cores, and the cameras that rate
  // carries.
  double storage_put_mb_per_s = 0;
  double storage_bound_cameras = 0;
  std::vector<CameraStep> steps;
  int kept_up = 0;  // The largest N kept up (0: not even one).
};

absl::StatusOr<CamerasReport> RunCamerasBench(const CamerasOptions& o);
std::string CamerasJson(const CamerasReport& r);
std::string CamerasText(const CamerasReport& r);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_CAMERAS_H_

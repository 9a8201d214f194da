// `kvmem eval`: runs the video workload through every policy side by side
// (same stream, same resident budget) against an exact-attention oracle and
// reports quality, memory and latency. See eval_policies.h for the policies.
//
// Oracle: for each query, per indexed layer and KV head, exact softmax
// attention over every token appended so far: p_i = softmax(q . k_i /
// sqrt(head_dim)), output o = sum p_i v_i. A policy attends to a subset S
// (sinks + window + what it recalled); its output is the same softmax
// restricted to S: sum_S p_i v_i / sum_S p_i.
//
// Metrics per policy (each averaged over layers and heads):
//   mass_recalled       mean over queries of sum_S p_i.
//   cold_mass_recalled  of the oracle mass outside the window and the sinks
//                       (the "cold" mass), the share S holds, pooled over
//                       queries: sum_q cold_hit / sum_q cold_total.
//   output_cosine, output_rel_error  of the restricted output vs the oracle.
//   reid_success        over probes whose earlier appearances all lie outside
//                       the window: S contains at least one of their tokens.
//   useless_hit_rate    recalled blocks receiving under 1 % of the mass.
//   injected tokens, resident and stored bytes, selection latency.
#ifndef KVMEM_CLIENT_EVAL_H_
#define KVMEM_CLIENT_EVAL_H_

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/eval_policies.h"
#include "client/video_workload.h"

namespace kvmem {

struct EvalOptions {
  VideoWorkloadOptions workload;
  uint32_t window = 2048;  // W, tokens.
  // R as fractions of W; the run sweeps all of them (one pass, one oracle).
  std::vector<double> recall_fractions = {0.1, 0.2, 0.3, 0.5};
  double primary_fraction = 0.3;  // The configuration the summary reports.
  // Extra windows swept at the primary fraction (besides `window`).
  std::vector<uint32_t> extra_windows;
  uint32_t frames_per_block = 4;
  uint32_t top_k = 16;
  // kvmem's configured policy.
  bool shot_segments = true;
  uint32_t groups_per_block = 8;       // Token groups per block (1: none).
  std::string index_factory = "Flat";  // kvmem's index kind.
  float track_weight = 0;
  float scene_weight = 0;
  float iou_weight = 0;
  uint32_t rebuild_every_blocks = 32;
  uint64_t warm_budget_bytes = 16ull << 20;
  uint32_t prefetch_blocks = 2;
  // Where kvmem runs: empty = in process (RocksDB in data_dir, or a temp dir
  // when empty); otherwise a kvmem-server target.
  std::string server;
  std::string data_dir;
  std::string out_dir;             // Empty: no files.
  bool record_kvmem_sets = false;  // Keep kvmem's recall sets (tests).
  // Called after each frame of the workload with (frames done, frames in
  // all); may be empty.
  std::function<void(int, int)> on_frame;
};

struct PolicySummary {
  std::string name;
  uint64_t queries = 0;
  double mass_recalled = 0;
  double cold_mass_recalled = 0;
  double cold_mass_recalled_frame = 0;  // Frame queries only.
  double cold_mass_recalled_probe = 0;  // Probe queries only.
  double output_cosine = 0;
  double output_rel_error = 0;
  double reid_success = 0;
  uint64_t reid_probes = 0;
  double useless_hit_rate = 0;
  uint64_t recalled_units = 0;
  double injected_tokens_mean = 0;
  uint64_t resident_bytes_peak = 0;
  uint64_t stored_bytes_peak = 0;
  double recall_p50_us = 0, recall_p99_us = 0, recall_p999_us = 0;
  // Latency spikes: 10-second buckets of video whose p99 exceeds 3x the
  // median bucket's p99, out of latency_buckets.
  uint32_t latency_spike_buckets = 0, latency_buckets = 0;
  uint64_t degraded_blocks = 0;
};

struct ConfigSummary {
  uint32_t window = 0;
  uint32_t recall = 0;
  double fraction = 0;
  std::vector<PolicySummary> policies;
  uint64_t kvmem_rebuilds = 0;  // Summed over cameras.
  uint64_t kvmem_blocks = 0;
};

// One query's outcome under one policy and configuration.
struct QueryRow {
  uint32_t camera = 0;
  uint64_t frame = 0;
  QueryKind kind = QueryKind::kFrame;
  uint16_t config = 0, policy = 0;
  float mass = 0, cold_total = 0, cold_hit = 0;
  float cosine = 0, rel_error = 0;
  uint32_t injected = 0;
  float latency_us = 0;
  int8_t reid = -1;  // -1: not a counted probe; 0 missed; 1 found.
  uint32_t units = 0, useless = 0;  // Recalled blocks; those under 1 %.
  uint32_t degraded = 0;            // Recalled blocks held as int8.
};

// Memory of the primary configuration after a frame, summed over cameras,
// per policy (in EvalResult::policy_names order).
struct MemorySample {
  uint64_t frame = 0;
  std::vector<uint64_t> resident, stored;
};

struct EvalResult {
  std::vector<std::string> policy_names;
  std::vector<QueryRow> rows;
  std::vector<MemorySample> memory;

  std::vector<ConfigSummary> configs;
  size_t primary = 0;  // Index of the primary configuration.
  uint64_t frames = 0, tokens = 0, frame_queries = 0, probe_queries = 0;
  uint64_t shots = 0, walks = 0;
  double rebuild_periods = 0;  // Primary kvmem: rebuilds per camera.
  double seconds = 0;
  std::string kvmem_path;  // "in-process" or the server target.
  std::vector<std::string> files;
  std::vector<std::string> notes;  // Targets missed, skipped plots.
  // With record_kvmem_sets: per query of the primary config, in run order,
  // the token spans kvmem recalled.
  std::vector<std::vector<Span>> kvmem_sets;
};

absl::StatusOr<EvalResult> RunEval(const EvalOptions& options);

// The q-quantile (0..1) of values (nearest rank); 0 when empty.
double Percentile(std::vector<float> values, double q);

// Writes CSVs, plots (through gnuplot when installed) and report.md into
// options.out_dir; appends the paths to result->files.
absl::Status WriteEvalReport(const EvalOptions& options, EvalResult* result);

std::string EvalJson(const EvalOptions& options, const EvalResult& result);
std::string EvalTable(const EvalResult& result);  // Markdown table.

// Exposed for tests: the oracle's attention for one query over `tokens`
// tokens of `cam`, per head [layer*kv_heads + head][token], and the output
// per head [head][head_dim].
void OracleAttention(const CameraTokens& cam, uint64_t tokens,
                     const std::vector<float>& q, uint32_t heads,
                     uint32_t head_dim, std::vector<std::vector<float>>* probs,
                     std::vector<std::vector<double>>* outputs);

}  // namespace kvmem

#endif  // KVMEM_CLIENT_EVAL_H_

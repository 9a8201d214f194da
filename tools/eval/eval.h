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
//   gated_*             kvmem's output when the front end attends to the
//                       window and to each recalled block apart and mixes
//                       them with kvmem's estimates: (1 - G) o_window +
//                       G sum_b gate_b o_b, G = RecallResponse.recalled_mass
//                       (see eval.cc); beside the joint softmax above.
//   budget / window violations  recall sets over the budget, or holding
//                       tokens of the sinks or the hot window.
// With grouped-query heads (query_heads_per_kv > 1) the oracle attends with
// every query head and the metrics average over query heads.
//
// Reference policies bound what any selection could do at the same budget:
//   oracle_tokens        the R cold tokens of most true attention mass.
//   exact_keys_per_head  the R cold tokens of most estimated mass, from the
//                        per-head softmax of the query kvmem receives (the
//                        mean of each group's query heads) against the exact
//                        keys: what a perfect index of every token could do.
#ifndef KVMEM_TOOLS_EVAL_EVAL_H_
#define KVMEM_TOOLS_EVAL_EVAL_H_

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/eval/eval_policies.h"
#include "tools/eval/video_workload.h"

namespace kvmem {

// How one kvmem policy opens its stream and queries it. Zero and empty
// fields are left unset in the StreamConfig: the stream's defaults apply,
// as for a newcomer who sends only geometry, window and budget.
struct KvmemKnobs {
  int segment_mode = 0;  // 0: default; 1 FIXED; 2 SHOT.
  uint32_t frames_per_block = 0;
  uint32_t groups_per_block = 0;
  std::string index_factory;
  uint32_t top_k = 0;  // Sent in each request; 0: the stream's default.
  int score = 0;       // 0: default; 1 MASS; 2 SUMMED.
  std::string scorer;  // RecallPolicy.scorer; empty: the default.
  float track_weight = 0, scene_weight = 0, iou_weight = 0;
  uint32_t rebuild_every_blocks = 0;
  uint64_t warm_budget_bytes = 0;
  uint32_t prefetch_blocks = 0;
  // The front end sends the log-sum-exp of each query over its sinks and
  // window (RecallRequest.window_lse); else kvmem estimates it.
  bool window_lse = true;
  // With grouped-query attention, one query vector per query head (what
  // the front end attends with); else each group's mean.
  bool query_heads = true;
  // A recall set per KV head (RecallRequest.per_head) instead of one set.
  bool per_head = false;
  // RecallPolicy.identity_share; negative: unset (the default).
  float identity_share = -1.0f;
  // tier_policy.ingest_precision (kvmem.v1.ColdPrecision's value; 0: the
  // default, full). With int8 or int4 the kvmem policy's lossy output
  // errors read every token as the stream writes it (each row quantised at
  // ingest) instead of as a compressed cold tier would (per block).
  int ingest_precision = 0;
};

// kvmem before per-head scoring, as this evaluation ran it: summed logits,
// shot blocks of at most 4 frames, 8 token groups, top_k 16, FAISS Flat,
// tier moves (16 MiB warm, prefetch 2, rebuilds every 32 blocks).
KvmemKnobs SummedKnobs();
// The knobs of a named variant of `base`: kvmem_summed (SummedKnobs),
// kvmem_no_lse (no window log-sum-exp sent), kvmem_blocks (no token
// groups), kvmem_groups (scorer mass_groups: whole token groups, no token
// stage), kvmem_group_mean (each GQA group's mean query, one vector),
// kvmem_mean_query (one vector, the query's mean, and no window log-sum-exp:
// the simplest front end), kvmem_per_head (a set per KV head),
// kvmem_attention_only (identity share
// 0: attention mass alone), kvmem_identity_only (identity share 1: the
// identity channel first, attention only for what it leaves).
absl::StatusOr<KvmemKnobs> KvmemVariant(const std::string& name,
                                        const KvmemKnobs& base);

struct EvalOptions {
  VideoWorkloadOptions workload;
  // A workload to replay instead of the synthetic video of `workload` (a
  // recorded trace: trace_workload.h); `workload` then holds its options()
  // and trace_dir where it came from (for the report).
  std::shared_ptr<const WorkloadSource> source;
  std::string trace_dir;
  uint32_t window = 2048;  // W, tokens.
  // R as fractions of W; the run sweeps all of them (one pass, one oracle).
  std::vector<double> recall_fractions = {0.1, 0.2, 0.3, 0.5};
  double primary_fraction = 0.3;  // The configuration the summary reports.
  // Extra windows swept at the primary fraction (besides `window`).
  std::vector<uint32_t> extra_windows;
  // The baselines' grid blocks and mean_key_topk's k.
  uint32_t frames_per_block = 4;
  uint32_t top_k = 16;
  // The `kvmem` policy; and variants run beside it, each its own stream.
  KvmemKnobs kvmem;
  std::vector<std::pair<std::string, KvmemKnobs>> kvmem_variants = {
      {"kvmem_summed", SummedKnobs()}};
  // The reference policies oracle_tokens and exact_keys_per_head.
  bool references = true;
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
  // Its KV bytes (injected tokens x bytes per token): what a front end
  // moves per query for the recalled tokens.
  double recalled_bytes_mean = 0;
  uint64_t resident_bytes_peak = 0;
  uint64_t stored_bytes_peak = 0;
  double recall_p50_us = 0, recall_p99_us = 0, recall_p999_us = 0;
  // Latency spikes: 10-second buckets of video whose p99 exceeds 3x the
  // median bucket's p99, out of latency_buckets.
  uint32_t latency_spike_buckets = 0, latency_buckets = 0;
  uint64_t degraded_blocks = 0;
  // kvmem policies: the output with gates (see the top of this file),
  // and the sets' tokens against the budget.
  double gated_output_cosine = 0, gated_output_rel_error = 0;
  // output_rel_error and gated_output_rel_error with every recalled token
  // read from an int8 or int4 cold tier (its blocks quantised as
  // tier_policy.cold_precision INT8 or INT4 stores them).
  double int8_output_rel_error = 0, int8_gated_output_rel_error = 0;
  double int4_output_rel_error = 0, int4_gated_output_rel_error = 0;
  double budget_used = 0;  // Mean tokens recalled / R.
  uint64_t budget_violations = 0, window_violations = 0;
  double estimated_mass = 0;  // Mean RecallResponse.recalled_mass.
  // kvmem: mean tokens per recall by the channel that chose them
  // (RecallResponse.channels; per KV head with per-head sets).
  double query_tokens_mean = 0, track_tokens_mean = 0;
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
  float gated_cosine = 0, gated_rel_error = 0;  // With gates (kvmem).
  // The same relative errors with the recalled tokens read from an int8 or
  // int4 cold tier (tier_policy.cold_precision INT8, INT4).
  float int8_rel_error = 0, int8_gated_rel_error = 0;
  float int4_rel_error = 0, int4_gated_rel_error = 0;
  float estimated_mass = 0;
  uint8_t violations = 0;  // Bit 0: over the budget; bit 1: in the window.
  float query_tokens = 0, track_tokens = 0;  // kvmem: by channel.
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
  // How the int8 / int4 output errors quantise the recalled tokens:
  // "cold_precision" (per block at demotion) or "ingest_precision" (per row,
  // every frame as written).
  std::string lossy_form = "cold_precision";
  std::vector<std::string> files;
  std::vector<std::string> notes;  // Targets missed, skipped plots.
  // Shared or per-head recall sets, at the oracle (primary configuration):
  // the cold mass of the R cold tokens of most attention averaged over query
  // heads (one set for every head, as kvmem returns) against each query
  // head's own R best (a set per head), pooled over queries.
  double oracle_shared_cold_mass = 0, oracle_per_head_cold_mass = 0;
  // With record_kvmem_sets: per query of the primary config, in run order,
  // the token spans kvmem recalled.
  std::vector<std::vector<Span>> kvmem_sets;
};

absl::StatusOr<EvalResult> RunEval(const EvalOptions& options);

// Writes CSVs, plots (through gnuplot when installed) and report.md into
// options.out_dir; appends the paths to result->files.
absl::Status WriteEvalReport(const EvalOptions& options, EvalResult* result);

std::string EvalJson(const EvalOptions& options, const EvalResult& result);
std::string EvalTable(const EvalResult& result);  // Markdown table.

// Exposed for tests: the oracle's attention for one query over `tokens`
// tokens of `cam`, per head [layer*kv_heads + head][token], and the output
// per head [head][head_dim].
// q_heads[j] is query head j of every KV head, [kv_head][head_dim] (kv
// heads = layers x kv_heads of the stream); probs and outputs are per query
// head, index kv_head * q_heads.size() + j.
void OracleAttention(const CameraTokens& cam, uint64_t tokens,
                     const std::vector<std::vector<float>>& q_heads,
                     uint32_t kv_heads, uint32_t head_dim,
                     std::vector<std::vector<float>>* probs,
                     std::vector<std::vector<double>>* outputs);

// --- The generalisation matrix (`kvmem eval --matrix`) ---
// Workload variants that each change one property of a base workload
// (heads, identities, geometry, RoPE, frame size, gaps, query sharpness),
// plus one that changes them all; each runs every policy at R = 30 % of W.
struct MatrixCell {
  std::string name;
  std::string change;  // What differs from the base, in words.
  EvalOptions options;
};
std::vector<MatrixCell> MatrixCells(const EvalOptions& base);

struct MatrixResult {
  std::vector<std::string> cells, changes;
  std::vector<ConfigSummary> summaries;  // Per cell, at the primary budget.
  std::vector<double> seconds;           // Per cell.
  double total_seconds = 0;
};
// Runs the cells one after the other; on_cell(i, n) after each.
absl::StatusOr<MatrixResult> RunEvalMatrix(
    const std::vector<MatrixCell>& cells,
    const std::function<void(int, int)>& on_cell);
std::string MatrixTable(const MatrixResult& m);
// Every cell's `policies` (as the default run's JSON) and a `summary` per
// cell: kvmem against the references and the goals.
std::string MatrixJson(const MatrixResult& m);
// matrix.md, matrix.json, matrix.csv and (through gnuplot) matrix.png in
// out_dir; the paths written go to *files.
absl::Status WriteMatrixReport(const std::string& out_dir,
                               const MatrixResult& m,
                               std::vector<std::string>* files);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_EVAL_H_

// kvmem eval: the evaluation harness (see tools/eval/eval.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"
#include "tools/common/server_process.h"
#include "tools/common/terminal.h"
#include "tools/eval/eval.h"
#include "tools/eval/trace_workload.h"
#include "tools/eval/video_workload.h"

// Knobs only eval has. Flags shared with demo (--cameras, --frames, --seed,
// --layers, --kv_heads, --head_dim, --tokens_per_frame, --hot_window_tokens,
// --frames_per_block, --warm_budget_bytes, --data_dir, --top_k, --places) keep
// eval's own defaults unless given on the command line.
ABSL_FLAG(std::string, out, "",
          "eval: output directory (CSV, PNG, report.md).");
ABSL_FLAG(std::string, via, "inproc",
          "eval: where kvmem runs: inproc (engine linked in, RocksDB in a "
          "temp dir or --data_dir) or grpc (a kvmem-server: --addr, or one "
          "started on a unix socket).");
ABSL_FLAG(std::string, trace, "",
          "eval: replay the recorded trace in this directory (one stream; "
          "docs/traces.md) instead of the synthetic video.");
ABSL_FLAG(std::string, write_trace, "",
          "eval: write camera 0 of the synthetic video (the workload flags) "
          "as a trace in this directory, then exit.");
ABSL_FLAG(std::string, recall_fractions, "0.1,0.2,0.3,0.5",
          "eval: recall budgets R swept, as fractions of the window W.");
ABSL_FLAG(double, recall_fraction, 0.3,
          "eval: R/W of the configuration the summary reports (the "
          "article's 10-30 %).");
ABSL_FLAG(std::string, sweep_windows, "",
          "eval: extra windows W (tokens, comma-separated) swept at "
          "--recall_fraction.");
ABSL_FLAG(double, fps, 3, "eval: frames per second of the video.");
ABSL_FLAG(uint32_t, sink_tokens, 4, "eval: attention-sink tokens at start.");
ABSL_FLAG(uint32_t, places_per_camera, 5, "eval: places each camera sees.");
ABSL_FLAG(uint32_t, objects, 24, "eval: objects with identities.");
ABSL_FLAG(uint32_t, object_tokens, 4, "eval: tokens an object covers.");
ABSL_FLAG(uint32_t, max_objects_per_frame, 4, "eval: objects in view at once.");
ABSL_FLAG(double, gap_min_s, 5, "eval: shortest absence of an object (s).");
ABSL_FLAG(double, gap_max_s, 240, "eval: longest absence of an object (s).");
ABSL_FLAG(double, visit_min_s, 3, "eval: shortest visit of an object (s).");
ABSL_FLAG(double, visit_max_s, 25, "eval: longest visit of an object (s).");
ABSL_FLAG(double, shot_min_s, 3, "eval: shortest shot (s).");
ABSL_FLAG(double, shot_max_s, 25, "eval: longest shot (s).");
ABSL_FLAG(double, walk_probability, 0.5,
          "eval: chance an object's next visit is on another camera.");
ABSL_FLAG(double, occlusion_probability, 0.03,
          "eval: chance a visible object is hidden in a frame.");
ABSL_FLAG(double, frame_noise, 0.08,
          "eval: frame-to-frame change of a token's latent.");
ABSL_FLAG(double, sink_pull, 0.35,
          "eval: share of each query's latent toward the attention sinks.");
ABSL_FLAG(uint32_t, scene_dim, 32, "eval: scene embedding dimension.");
ABSL_FLAG(uint32_t, latent_dim, 0,
          "eval: latent dimension (0: head_dim); at least 1 + places + "
          "objects.");
ABSL_FLAG(double, rope_base, 1e6, "eval: RoPE base (Qwen2-VL: 1e6).");
ABSL_FLAG(double, low_freq_bias, 2.0,
          "eval: how much more key energy low RoPE frequencies carry.");
ABSL_FLAG(double, query_scale, 24,
          "eval: logit of a query against its own token's key.");
ABSL_FLAG(uint32_t, query_every, 1, "eval: frames between frame queries.");
ABSL_FLAG(uint32_t, query_heads_per_kv, 1,
          "eval: query heads per KV head (grouped-query attention); each "
          "reads its own token of the frame.");
ABSL_FLAG(double, head_subspace, 1.0,
          "eval: share of the latent each KV head sees (1: heads alike).");
ABSL_FLAG(double, sharp_head_fraction, 1.0,
          "eval: share of query heads at --query_scale; the rest at "
          "--diffuse_scale times it.");
ABSL_FLAG(double, diffuse_scale, 1.0, "eval: logit scale of diffuse heads.");
ABSL_FLAG(double, lookalike, 0,
          "eval: cosine between identities of one object class (0: "
          "orthogonal).");
ABSL_FLAG(uint32_t, frame_query_tokens, 0,
          "eval: whole-frame queries: each frame query sends this many of "
          "the frame's query tokens (re-entry frames are probes); 0: one "
          "token per query head.");
ABSL_FLAG(double, appearance_change, 0,
          "eval: weight of a random per-visit change of each object part "
          "(0: objects look the same on every visit).");
ABSL_FLAG(uint32_t, textures, 0,
          "eval: recurring textures (each shown by single patches of many "
          "frames; with --texture_tokens).");
ABSL_FLAG(uint32_t, texture_tokens, 0,
          "eval: patches of every frame that show a recurring texture.");
ABSL_FLAG(std::string, gaps, "loguniform",
          "eval: re-entry gap distribution: loguniform, uniform or pareto.");
ABSL_FLAG(std::string, matrix_cells, "",
          "eval: with --matrix, only these cells (comma-separated names; "
          "empty: all).");
ABSL_FLAG(bool, matrix, false,
          "eval: run the generalisation matrix (workload variants that each "
          "change one property) instead of one workload; --frames and "
          "--cameras size every cell.");
// The kvmem policy: unset knobs leave the stream's defaults.
ABSL_FLAG(double, track_weight, 0, "eval: kvmem recall_policy.track_weight.");
ABSL_FLAG(double, identity_share, -1,
          "eval: kvmem recall_policy.identity_share (negative: unset, the "
          "default).");
ABSL_FLAG(double, scene_weight, 0, "eval: kvmem recall_policy.scene_weight.");
ABSL_FLAG(double, iou_weight, 0, "eval: kvmem recall_policy.iou_weight.");
ABSL_FLAG(uint32_t, rebuild_every_blocks, 0,
          "eval: kvmem tier_policy.rebuild_every_blocks (0: default).");
ABSL_FLAG(uint32_t, groups_per_block, 0,
          "eval: kvmem index_policy.groups_per_block (0: default).");
ABSL_FLAG(std::string, index_factory, "",
          "eval: kvmem index_policy.index_factory (empty: default; Flat, "
          "Progressive, or a FAISS description such as HNSW32).");
ABSL_FLAG(std::string, score, "",
          "eval: kvmem recall_policy.score: mass or summed (empty: default).");
ABSL_FLAG(bool, fixed_blocks, false,
          "eval: kvmem segments fixed blocks (the default).");
ABSL_FLAG(bool, shot_blocks, false,
          "eval: kvmem blocks follow shots (at most --frames_per_block "
          "frames).");
ABSL_FLAG(bool, no_window_lse, false,
          "eval: the kvmem policy does not send its window's log-sum-exp "
          "(kvmem estimates it).");
ABSL_DECLARE_FLAG(std::string, ingest_precision);  // cli_bench.cc
ABSL_FLAG(std::string, kvmem_variants,
          "kvmem_summed,kvmem_no_lse,kvmem_per_head,kvmem_groups,"
          "kvmem_attention_only,kvmem_mean_query",
          "eval: kvmem variants run beside kvmem, comma-separated: "
          "kvmem_summed (before per-head scoring), kvmem_no_lse (no window "
          "log-sum-exp sent), kvmem_blocks (no token groups), kvmem_groups "
          "(whole token groups: scorer mass_groups, no token stage), "
          "kvmem_group_mean (each GQA group's mean query, not one vector "
          "per query head), kvmem_mean_query (one vector, the query's "
          "mean, no window log-sum-exp), kvmem_per_head (a recall set per "
          "KV head), "
          "kvmem_attention_only (identity share 0: attention mass alone), "
          "kvmem_identity_only (identity share 1).");

ABSL_DECLARE_FLAG(int, cameras);
ABSL_DECLARE_FLAG(int, frames);
ABSL_DECLARE_FLAG(int, places);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(uint32_t, layers);
ABSL_DECLARE_FLAG(uint32_t, kv_heads);
ABSL_DECLARE_FLAG(uint32_t, head_dim);
ABSL_DECLARE_FLAG(uint32_t, tokens_per_frame);
ABSL_DECLARE_FLAG(uint32_t, hot_window_tokens);
ABSL_DECLARE_FLAG(uint32_t, frames_per_block);
ABSL_DECLARE_FLAG(uint64_t, warm_budget_bytes);
ABSL_DECLARE_FLAG(std::string, data_dir);
ABSL_DECLARE_FLAG(uint32_t, top_k);

namespace kvmem {
namespace {

bool ParseList(const std::string& text, std::vector<double>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    double v;
    if (!absl::SimpleAtod(part, &v)) return false;
    out->push_back(v);
  }
  return true;
}

// The generalisation matrix: each cell at --frames (default 600) per
// camera; the table (or --json) on stdout, matrix.md and matrix.json in
// --out.
int RunMatrix(EvalOptions o) {
  if (!absl::GetFlag(FLAGS_via).empty() &&
      absl::GetFlag(FLAGS_via) != "inproc") {
    std::fprintf(stderr, "kvmem eval: --matrix runs in process\n");
    return 2;
  }
  o.workload.frames =
      static_cast<uint32_t>(std::max(2, FlagOr(FLAGS_frames, "frames", 600)));
  const std::string out_dir = o.out_dir;
  std::vector<MatrixCell> cells = MatrixCells(o);
  const std::string only = absl::GetFlag(FLAGS_matrix_cells);
  if (!only.empty()) {
    std::vector<MatrixCell> chosen;
    for (absl::string_view name : absl::StrSplit(only, ',')) {
      auto it =
          std::find_if(cells.begin(), cells.end(),
                       [&](const MatrixCell& c) { return c.name == name; });
      if (it == cells.end()) {
        std::string names;
        for (const MatrixCell& c : cells) absl::StrAppend(&names, " ", c.name);
        std::fprintf(stderr,
                     "kvmem eval: --matrix_cells names \"%s\"; the cells "
                     "are:%s\n",
                     std::string(name).c_str(), names.c_str());
        return 2;
      }
      chosen.push_back(*it);
    }
    cells = std::move(chosen);
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<MatrixResult> m =
      RunEvalMatrix(cells, [&](int done, int total) {
        std::fprintf(
            stderr, "kvmem eval: matrix cell %d/%d, %.0f s\n", done, total,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count());
      });
  if (!m.ok()) {
    std::fprintf(stderr, "kvmem eval: %s\n", m.status().ToString().c_str());
    return m.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::vector<std::string> files;
  if (!out_dir.empty()) {
    if (absl::Status s = WriteMatrixReport(out_dir, *m, &files); !s.ok()) {
      std::fprintf(stderr, "kvmem eval: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << MatrixJson(*m);
  } else {
    std::cout << MatrixTable(*m);
    for (const auto& f : files) std::printf("wrote %s\n", f.c_str());
  }
  return 0;
}

}  // namespace

// The workload's flags into *w; 0, or 2 after a message for a bad flag.
int WorkloadFromFlags(VideoWorkloadOptions* wp) {
  VideoWorkloadOptions& w = *wp;
  w.cameras = static_cast<uint32_t>(std::max(
      0, FlagOr(FLAGS_cameras, "cameras", static_cast<int>(w.cameras))));
  w.frames = static_cast<uint32_t>(
      std::max(0, FlagOr(FLAGS_frames, "frames", static_cast<int>(w.frames))));
  w.seed = FlagOr(FLAGS_seed, "seed", w.seed);
  w.layers = FlagOr(FLAGS_layers, "layers", w.layers);
  w.kv_heads = FlagOr(FLAGS_kv_heads, "kv_heads", w.kv_heads);
  w.head_dim = FlagOr(FLAGS_head_dim, "head_dim", w.head_dim);
  w.tokens_per_frame =
      FlagOr(FLAGS_tokens_per_frame, "tokens_per_frame", w.tokens_per_frame);
  w.fps = absl::GetFlag(FLAGS_fps);
  w.sink_tokens = absl::GetFlag(FLAGS_sink_tokens);
  w.places = static_cast<uint32_t>(
      std::max(0, FlagOr(FLAGS_places, "places", static_cast<int>(w.places))));
  w.places_per_camera = FlagOr(FLAGS_places_per_camera, "places_per_camera",
                               std::min(w.places_per_camera, w.places));
  w.objects = absl::GetFlag(FLAGS_objects);
  w.object_tokens = absl::GetFlag(FLAGS_object_tokens);
  w.max_objects_per_frame = absl::GetFlag(FLAGS_max_objects_per_frame);
  w.gap_min_s = absl::GetFlag(FLAGS_gap_min_s);
  w.gap_max_s = absl::GetFlag(FLAGS_gap_max_s);
  w.visit_min_s = absl::GetFlag(FLAGS_visit_min_s);
  w.visit_max_s = absl::GetFlag(FLAGS_visit_max_s);
  w.shot_min_s = absl::GetFlag(FLAGS_shot_min_s);
  w.shot_max_s = absl::GetFlag(FLAGS_shot_max_s);
  w.walk_probability = absl::GetFlag(FLAGS_walk_probability);
  w.occlusion_probability = absl::GetFlag(FLAGS_occlusion_probability);
  w.frame_noise = static_cast<float>(absl::GetFlag(FLAGS_frame_noise));
  w.sink_pull = static_cast<float>(absl::GetFlag(FLAGS_sink_pull));
  w.scene_dim = absl::GetFlag(FLAGS_scene_dim);
  if (absl::GetFlag(FLAGS_latent_dim) > 0) {
    w.latent_dim = absl::GetFlag(FLAGS_latent_dim);
  }
  w.rope_base = absl::GetFlag(FLAGS_rope_base);
  w.low_freq_bias = static_cast<float>(absl::GetFlag(FLAGS_low_freq_bias));
  w.query_scale = static_cast<float>(absl::GetFlag(FLAGS_query_scale));
  w.query_every = absl::GetFlag(FLAGS_query_every);
  w.query_heads_per_kv = absl::GetFlag(FLAGS_query_heads_per_kv);
  w.head_subspace = static_cast<float>(absl::GetFlag(FLAGS_head_subspace));
  w.sharp_head_fraction =
      static_cast<float>(absl::GetFlag(FLAGS_sharp_head_fraction));
  w.diffuse_scale = static_cast<float>(absl::GetFlag(FLAGS_diffuse_scale));
  w.lookalike = static_cast<float>(absl::GetFlag(FLAGS_lookalike));
  w.frame_query_tokens = absl::GetFlag(FLAGS_frame_query_tokens);
  w.appearance_change =
      static_cast<float>(absl::GetFlag(FLAGS_appearance_change));
  w.textures = absl::GetFlag(FLAGS_textures);
  w.texture_tokens = absl::GetFlag(FLAGS_texture_tokens);
  const std::string gaps = absl::GetFlag(FLAGS_gaps);
  if (gaps == "uniform") {
    w.gaps = VideoWorkloadOptions::Gaps::kUniform;
  } else if (gaps == "pareto") {
    w.gaps = VideoWorkloadOptions::Gaps::kPareto;
  } else if (gaps != "loguniform") {
    std::fprintf(stderr,
                 "kvmem eval: --gaps must be loguniform, uniform or pareto, "
                 "not %s\n",
                 gaps.c_str());
    return 2;
  }
  return 0;
}

// The evaluation's and kvmem's flags into *o; 0, or 2 after a message.
int EvalOptionsFromFlags(EvalOptions* op) {
  EvalOptions& o = *op;
  o.window = FlagOr(FLAGS_hot_window_tokens, "hot_window_tokens", o.window);
  o.frames_per_block =
      FlagOr(FLAGS_frames_per_block, "frames_per_block", o.frames_per_block);
  o.kvmem.warm_budget_bytes =
      FlagOr(FLAGS_warm_budget_bytes, "warm_budget_bytes", uint64_t{0});
  o.top_k = FlagOr(FLAGS_top_k, "top_k", o.top_k);
  o.data_dir = FlagOr(FLAGS_data_dir, "data_dir", std::string());
  o.primary_fraction = absl::GetFlag(FLAGS_recall_fraction);
  o.recall_fractions.clear();
  std::vector<double> windows;
  if (!ParseList(absl::GetFlag(FLAGS_recall_fractions), &o.recall_fractions) ||
      !ParseList(absl::GetFlag(FLAGS_sweep_windows), &windows)) {
    std::fprintf(stderr,
                 "kvmem eval: --recall_fractions and --sweep_windows take "
                 "comma-separated numbers\n");
    return 2;
  }
  for (double x : windows) o.extra_windows.push_back(static_cast<uint32_t>(x));
  KvmemKnobs& k = o.kvmem;
  k.track_weight = static_cast<float>(absl::GetFlag(FLAGS_track_weight));
  k.identity_share = static_cast<float>(absl::GetFlag(FLAGS_identity_share));
  k.scene_weight = static_cast<float>(absl::GetFlag(FLAGS_scene_weight));
  k.iou_weight = static_cast<float>(absl::GetFlag(FLAGS_iou_weight));
  k.rebuild_every_blocks = absl::GetFlag(FLAGS_rebuild_every_blocks);
  if (absl::GetFlag(FLAGS_fixed_blocks)) k.segment_mode = 1;
  if (absl::GetFlag(FLAGS_shot_blocks)) k.segment_mode = 2;
  k.frames_per_block =
      FlagOr(FLAGS_frames_per_block, "frames_per_block", uint32_t{0});
  k.groups_per_block = absl::GetFlag(FLAGS_groups_per_block);
  k.index_factory = absl::GetFlag(FLAGS_index_factory);
  const std::string score = absl::GetFlag(FLAGS_score);
  if (score == "mass" || score == "summed") {
    k.score = score == "mass" ? 1 : 2;
  } else if (!score.empty()) {
    std::fprintf(stderr, "kvmem eval: --score must be mass or summed\n");
    return 2;
  }
  k.window_lse = !absl::GetFlag(FLAGS_no_window_lse);
  const std::string ingest = absl::GetFlag(FLAGS_ingest_precision);
  k.ingest_precision = ColdPrecisionOf(ingest);  // bench's names
  if (k.ingest_precision == v1::COLD_PRECISION_UNSPECIFIED) {
    std::fprintf(stderr,
                 "kvmem eval: --ingest_precision is \"%s\"; use full, int8 or "
                 "int4\n",
                 ingest.c_str());
    return 2;
  }
  o.kvmem_variants.clear();
  for (absl::string_view name : absl::StrSplit(
           absl::GetFlag(FLAGS_kvmem_variants), ',', absl::SkipEmpty())) {
    absl::StatusOr<KvmemKnobs> v = KvmemVariant(std::string(name), k);
    if (!v.ok()) {
      std::fprintf(stderr, "kvmem eval: %s\n", v.status().ToString().c_str());
      return 2;
    }
    o.kvmem_variants.emplace_back(std::string(name), *v);
  }
  o.out_dir = absl::GetFlag(FLAGS_out);

  return 0;
}

// --write_trace: camera 0 of the synthetic video as a trace; --trace: the
// trace as the workload (o->source, o->workload its options).
int TraceFromFlags(EvalOptions* o, bool* done) {
  const std::string write = absl::GetFlag(FLAGS_write_trace);
  const std::string read = absl::GetFlag(FLAGS_trace);
  if (!read.empty() && (!write.empty() || absl::GetFlag(FLAGS_matrix))) {
    std::fprintf(stderr,
                 "kvmem eval: --trace replays one recorded stream; it does not "
                 "go with --write_trace or --matrix (whose cells vary the "
                 "synthetic video)\n");
    return 2;
  }
  if (!write.empty()) {
    const std::string bad = CheckVideoWorkloadOptions(o->workload);
    if (!bad.empty()) {
      std::fprintf(stderr, "kvmem eval: %s\n", bad.c_str());
      return 2;
    }
    const VideoWorkload w(o->workload);
    const absl::Status s =
        WriteTrace(w, 0, write,
                   {{"source", "kvmem eval --write_trace"},
                    {"seed", std::to_string(o->workload.seed)}});
    if (!s.ok()) {
      std::fprintf(stderr, "kvmem eval: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("wrote a trace of %u frames (camera 0) to %s\n",
                o->workload.frames, write.c_str());
    *done = true;
    return 0;
  }
  if (read.empty()) return 0;
  auto t = OpenTraceWorkload(read);
  if (!t.ok()) {
    std::fprintf(stderr, "kvmem eval: %s\n", t.status().ToString().c_str());
    return t.status().code() == absl::StatusCode::kNotFound ? 1 : 2;
  }
  o->source = std::move(*t);
  o->workload = o->source->options();
  o->trace_dir = read;
  return 0;
}

int RunEval(const std::vector<std::string>&) {
  EvalOptions o;
  if (int rc = WorkloadFromFlags(&o.workload); rc != 0) return rc;
  bool done = false;
  if (int rc = TraceFromFlags(&o, &done); rc != 0 || done) return rc;
  if (int rc = EvalOptionsFromFlags(&o); rc != 0) return rc;
  const std::string via = absl::GetFlag(FLAGS_via);
  // A server this command starts is stopped and its data removed on every
  // way out.
  std::unique_ptr<ScratchServer> server;
  if (via == "grpc") {
    o.server = absl::GetFlag(FLAGS_addr);
    if (o.server.empty()) {
      std::string error;
      server = ScratchServer::Start(
          absl::StrCat("/tmp/kvmem-eval-server-", ::getpid()), {}, &error);
      if (server == nullptr) {
        std::fprintf(stderr, "kvmem eval: %s\n", error.c_str());
        return 1;
      }
      o.server = server->target();
    }
  } else if (via != "inproc") {
    std::fprintf(stderr, "kvmem eval: --via must be inproc or grpc, not %s\n",
                 via.c_str());
    return 2;
  }

  if (absl::GetFlag(FLAGS_matrix)) return RunMatrix(o);

  // A progress bar on a terminal; elsewhere a line every 5 %.
  std::optional<ProgressBar> bar;
  int last_step = -1;
  const auto t0 = std::chrono::steady_clock::now();
  o.on_frame = [&](int done, int total) {
    if (ProgressEnabled()) {
      if (!bar) bar.emplace("kvmem eval", total, "frames");
      bar->Set(done);
      return;
    }
    const int step = 20 * done / std::max(1, total);
    if (step == last_step) return;
    last_step = step;
    std::fprintf(
        stderr, "kvmem eval: frame %d/%d (%d%%), %.0f s\n", done, total,
        100 * done / std::max(1, total),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
  };
  absl::StatusOr<EvalResult> r = RunEval(o);
  bar.reset();
  if (!r.ok()) {
    std::fprintf(stderr, "kvmem eval: %s\n", r.status().ToString().c_str());
    return r.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!o.out_dir.empty()) {
    absl::Status s = WriteEvalReport(o, &*r);
    if (!s.ok()) {
      std::fprintf(stderr, "kvmem eval: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << EvalJson(o, *r);
  } else {
    std::cout << EvalTable(*r);
    std::printf(
        "\n%d frames x %d cameras, %d frame queries, %d probes, "
        "%.1f index rebuild periods per camera, %.1f s\n",
        static_cast<int>(r->frames), o.workload.cameras,
        static_cast<int>(r->frame_queries), static_cast<int>(r->probe_queries),
        r->rebuild_periods, r->seconds);
    for (const auto& f : r->files) std::printf("wrote %s\n", f.c_str());
    for (const auto& n : r->notes) std::printf("note: %s\n", n.c_str());
  }
  return 0;
}

}  // namespace kvmem

// Output of `kvmem eval`: JSON summary, markdown table and report, CSVs and
// gnuplot plots.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/percentile.h"
#include "tools/common/json_writer.h"
#include "tools/eval/eval.h"

namespace kvmem {
namespace {

const ConfigSummary& Primary(const EvalResult& r) {
  return r.configs[r.primary];
}

const PolicySummary* Find(const ConfigSummary& c, const std::string& name) {
  for (const auto& p : c.policies)
    if (p.name == name) return &p;
  return nullptr;
}

struct Target {
  std::string name;
  bool met;
  std::string detail;
};

std::vector<Target> Targets(const EvalResult& r) {
  const ConfigSummary& c = Primary(r);
  const PolicySummary* k = Find(c, "kvmem");
  const PolicySummary* m = Find(c, "mean_key_topk");
  const PolicySummary* s = Find(c, "streaming_llm");
  const PolicySummary* l = Find(c, "window_lru");
  std::vector<Target> t;
  t.push_back({"kvmem reid_success >= 0.95", k->reid_success >= 0.95,
               absl::StrFormat("%.3f over %d probes", k->reid_success,
                               k->reid_probes)});
  t.push_back({"kvmem cold_mass_recalled >= 0.5", k->cold_mass_recalled >= 0.5,
               absl::StrFormat("%.3f", k->cold_mass_recalled)});
  t.push_back(
      {"kvmem cold_mass_recalled >= 2x mean_key_topk",
       k->cold_mass_recalled >= 2 * m->cold_mass_recalled,
       absl::StrFormat("%.3f vs %.3f (%.2fx)", k->cold_mass_recalled,
                       m->cold_mass_recalled,
                       m->cold_mass_recalled > 0
                           ? k->cold_mass_recalled / m->cold_mass_recalled
                           : 0.0)});
  for (const PolicySummary* b : {s, l}) {
    t.push_back(
        {absl::StrCat("kvmem beats ", b->name,
                      " on reid_success and cold_mass_recalled"),
         k->reid_success > b->reid_success &&
             k->cold_mass_recalled > b->cold_mass_recalled,
         absl::StrFormat("reid %.3f vs %.3f, cold %.3f vs %.3f",
                         k->reid_success, b->reid_success,
                         k->cold_mass_recalled, b->cold_mass_recalled)});
  }
  return t;
}

std::string MiB(uint64_t b) { return absl::StrFormat("%.1f", b / 1048576.0); }

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  return static_cast<bool>(f);
}

}  // namespace

std::string EvalTable(const EvalResult& r) {
  const ConfigSummary& c = Primary(r);
  std::string s =
      absl::StrFormat("W = %d tokens, R = %d tokens (%.0f %% of W)\n\n",
                      c.window, c.recall, 100 * c.fraction);
  s += "| policy | mass recalled | cold mass recalled (frame / probe) | "
       "output cosine | output rel. error (gated) | reid success | useless "
       "hits | injected tokens | resident peak MiB | stored peak MiB | recall "
       "p50 / p99 / p999 us |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : c.policies) {
    const std::string gated =
        p.gated_output_cosine > 0
            ? absl::StrFormat(" (%.3f)", p.gated_output_rel_error)
            : "";
    absl::StrAppendFormat(
        &s,
        "| %s | %.3f | **%.3f** (%.3f / %.3f) | %.4f | %.3f%s | **%.3f** "
        "(%d probes) | %.3f | %.0f | %s | %s | %.0f / %.0f / %.0f |\n",
        p.name, p.mass_recalled, p.cold_mass_recalled,
        p.cold_mass_recalled_frame, p.cold_mass_recalled_probe, p.output_cosine,
        p.output_rel_error, gated, p.reid_success, p.reid_probes,
        p.useless_hit_rate, p.injected_tokens_mean, MiB(p.resident_bytes_peak),
        MiB(p.stored_bytes_peak), p.recall_p50_us, p.recall_p99_us,
        p.recall_p999_us);
  }
  if (r.oracle_shared_cold_mass > 0) {
    absl::StrAppendFormat(
        &s,
        "\nAt the oracle, one set of R tokens shared by every head holds %.3f "
        "of the cold mass; a set of R tokens per query head, %.3f.\n",
        r.oracle_shared_cold_mass, r.oracle_per_head_cold_mass);
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  for (const auto& p : c.policies) {
    if (p.name != "kvmem") continue;
    absl::StrAppendFormat(
        &s,
        "\nkvmem's recalled tokens read from a compressed cold tier "
        "(tier_policy.%s; %s): output rel. error (gated) at full precision "
        "%.4f (%.4f), int8 %.4f "
        "(%.4f) = %.3fx (%.3fx), int4 %.4f (%.4f) = %.3fx (%.3fx).\n",
        r.lossy_form,
        r.lossy_form == "cold_precision"
            ? "the same sets, so the same cold mass"
            : "every row quantised as written; the sets are this run's",
        p.output_rel_error, p.gated_output_rel_error, p.int8_output_rel_error,
        p.int8_gated_output_rel_error,
        ratio(p.int8_output_rel_error, p.output_rel_error),
        ratio(p.int8_gated_output_rel_error, p.gated_output_rel_error),
        p.int4_output_rel_error, p.int4_gated_output_rel_error,
        ratio(p.int4_output_rel_error, p.output_rel_error),
        ratio(p.int4_gated_output_rel_error, p.gated_output_rel_error));
  }
  return s;
}

namespace {

// One policy's summary.
void PolicyJson(const PolicySummary& p, JsonWriter* w) {
  w->Object();
  w->Key("mass_recalled").Num(p.mass_recalled, 4);
  w->Key("cold_mass_recalled").Num(p.cold_mass_recalled, 4);
  w->Key("cold_mass_recalled_frame").Num(p.cold_mass_recalled_frame, 4);
  w->Key("cold_mass_recalled_probe").Num(p.cold_mass_recalled_probe, 4);
  w->Key("output_cosine").Num(p.output_cosine, 5);
  w->Key("output_rel_error").Num(p.output_rel_error, 4);
  w->Key("reid_success").Num(p.reid_success, 4);
  w->Key("reid_probes").UInt(p.reid_probes);
  w->Key("useless_hit_rate").Num(p.useless_hit_rate, 4);
  w->Key("injected_tokens_mean").Num(p.injected_tokens_mean, 1);
  w->Key("recalled_bytes_mean").Num(p.recalled_bytes_mean, 0);
  w->Key("resident_bytes_peak").UInt(p.resident_bytes_peak);
  w->Key("stored_bytes_peak").UInt(p.stored_bytes_peak);
  w->Key("recall_p50_us").Num(p.recall_p50_us, 1);
  w->Key("recall_p99_us").Num(p.recall_p99_us, 1);
  w->Key("recall_p999_us").Num(p.recall_p999_us, 1);
  w->Key("queries").UInt(p.queries);
  w->Key("degraded_blocks_recalled").UInt(p.degraded_blocks);
  w->Key("latency_spike_buckets").UInt(p.latency_spike_buckets);
  w->Key("latency_buckets").UInt(p.latency_buckets);
  w->Key("gated_output_cosine").Num(p.gated_output_cosine, 5);
  w->Key("gated_output_rel_error").Num(p.gated_output_rel_error, 4);
  w->Key("int8_output_rel_error").Num(p.int8_output_rel_error, 4);
  w->Key("int8_gated_output_rel_error").Num(p.int8_gated_output_rel_error, 4);
  w->Key("int4_output_rel_error").Num(p.int4_output_rel_error, 4);
  w->Key("int4_gated_output_rel_error").Num(p.int4_gated_output_rel_error, 4);
  w->Key("estimated_mass").Num(p.estimated_mass, 4);
  w->Key("budget_used").Num(p.budget_used, 3);
  w->Key("query_tokens_mean").Num(p.query_tokens_mean, 1);
  w->Key("track_tokens_mean").Num(p.track_tokens_mean, 1);
  w->Key("budget_violations").UInt(p.budget_violations);
  w->Key("window_violations").UInt(p.window_violations);
  w->EndObject();
}

void WorkloadJson(const EvalOptions& o, const EvalResult& r, JsonWriter* w) {
  const VideoWorkloadOptions& v = o.workload;
  w->Key("workload").Object();
  if (!o.trace_dir.empty()) w->Key("trace").Str(o.trace_dir);
  w->Key("seed").UInt(v.seed);
  w->Key("cameras").UInt(v.cameras);
  w->Key("frames").UInt(v.frames);
  w->Key("fps").Num(v.fps);
  w->Key("tokens_per_frame").UInt(v.tokens_per_frame);
  w->Key("layers").UInt(v.layers);
  w->Key("kv_heads").UInt(v.kv_heads);
  w->Key("head_dim").UInt(v.head_dim);
  w->Key("tokens").UInt(r.tokens);
  w->Key("video_seconds").Num(v.frames / v.fps, 1);
  w->Key("shots").UInt(r.shots);
  w->Key("walks").UInt(r.walks);
  w->Key("frame_queries").UInt(r.frame_queries);
  w->Key("probe_queries").UInt(r.probe_queries);
  w->EndObject();
}

}  // namespace

std::string EvalJson(const EvalOptions& o, const EvalResult& r) {
  const ConfigSummary& c = Primary(r);
  JsonWriter w;
  w.Object(/*multiline=*/true);
  WorkloadJson(o, r, &w);
  w.Key("window_tokens").UInt(c.window);
  w.Key("recall_tokens").UInt(c.recall);
  w.Key("recall_fraction").Num(c.fraction);
  w.Key("kvmem_path").Str(r.kvmem_path);
  w.Key("lossy_form").Str(r.lossy_form);
  w.Key("kvmem_blocks").UInt(c.kvmem_blocks);
  w.Key("index_rebuilds").UInt(c.kvmem_rebuilds);
  w.Key("rebuild_periods_per_camera").Num(r.rebuild_periods, 1);
  w.Key("seconds").Num(r.seconds, 1);
  w.Key("oracle_shared_cold_mass").Num(r.oracle_shared_cold_mass, 4);
  w.Key("oracle_per_head_cold_mass").Num(r.oracle_per_head_cold_mass, 4);
  w.Key("policies").Object(/*multiline=*/true);
  for (const PolicySummary& p : c.policies) {
    w.Key(p.name);
    PolicyJson(p, &w);
  }
  w.EndObject();
  w.Key("sweep").Array(/*multiline=*/true);
  for (const ConfigSummary& x : r.configs) {
    w.Object();
    w.Key("window_tokens").UInt(x.window);
    w.Key("recall_tokens").UInt(x.recall);
    w.Key("recall_fraction").Num(x.fraction);
    w.Key("policies").Object();
    for (const PolicySummary& p : x.policies) {
      w.Key(p.name).Object();
      w.Key("mass_recalled").Num(p.mass_recalled, 4);
      w.Key("cold_mass_recalled").Num(p.cold_mass_recalled, 4);
      w.Key("reid_success").Num(p.reid_success, 4);
      w.EndObject();
    }
    w.EndObject().EndObject();
  }
  w.EndArray();
  w.Key("targets").Array(/*multiline=*/true);
  for (const auto& t : Targets(r)) {
    w.Object();
    w.Key("target").Str(t.name);
    w.Key("met").Bool(t.met);
    w.Key("value").Str(t.detail);
    w.EndObject();
  }
  w.EndArray();
  w.Key("files").Array();
  for (const std::string& f : r.files) w.Str(f);
  w.EndArray();
  w.Key("notes").Array();
  for (const std::string& n : r.notes) w.Str(n);
  w.EndArray();
  w.EndObject();
  return w.Take();
}

absl::Status WriteEvalReport(const EvalOptions& o, EvalResult* r) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out ", o.out_dir, ": cannot create directory: ", ec.message()));
  }
  const double fps = o.workload.fps;
  const auto& names = r->policy_names;
  auto path = [&](const std::string& f) {
    return (fs::path(o.out_dir) / f).string();
  };
  auto emit = [&](const std::string& f, const std::string& text) {
    if (!WriteFile(path(f), text)) {
      return absl::InternalError(absl::StrCat("cannot write ", path(f)));
    }
    r->files.push_back(path(f));
    return absl::OkStatus();
  };

  // summary.csv: every configuration and policy.
  std::string csv =
      "window_tokens,recall_tokens,recall_fraction,policy,mass_recalled,"
      "cold_mass_recalled,cold_mass_recalled_frame,cold_mass_recalled_probe,"
      "output_cosine,output_rel_error,reid_success,reid_probes,"
      "useless_hit_rate,injected_tokens_mean,resident_bytes_peak,"
      "stored_bytes_peak,recall_p50_us,recall_p99_us,recall_p999_us\n";
  for (const auto& c : r->configs) {
    for (const auto& p : c.policies) {
      absl::StrAppendFormat(
          &csv,
          "%d,%d,%g,%s,%.5f,%.5f,%.5f,%.5f,%.6f,%.5f,%.5f,%d,%.5f,%.1f,%d,%d,%."
          "1f,%.1f,%.1f\n",
          c.window, c.recall, c.fraction, p.name, p.mass_recalled,
          p.cold_mass_recalled, p.cold_mass_recalled_frame,
          p.cold_mass_recalled_probe, p.output_cosine, p.output_rel_error,
          p.reid_success, p.reid_probes, p.useless_hit_rate,
          p.injected_tokens_mean, p.resident_bytes_peak, p.stored_bytes_peak,
          p.recall_p50_us, p.recall_p99_us, p.recall_p999_us);
    }
  }
  absl::Status s = emit("summary.csv", csv);
  if (!s.ok()) return s;

  // queries.csv: one row per query, configuration and policy.
  csv =
      "camera,frame,kind,window_tokens,recall_tokens,policy,mass,cold_total,"
      "cold_hit,cosine,rel_error,injected_tokens,units,useless_units,"
      "latency_us,reid\n";
  for (const QueryRow& q : r->rows) {
    const ConfigSummary& c = r->configs[q.config];
    absl::StrAppendFormat(
        &csv, "%d,%d,%s,%d,%d,%s,%.5f,%.5f,%.5f,%.5f,%.5f,%d,%d,%d,%.1f,%d\n",
        q.camera, q.frame, q.kind == QueryKind::kProbe ? "probe" : "frame",
        c.window, c.recall, names[q.policy], q.mass, q.cold_total, q.cold_hit,
        q.cosine, q.rel_error, q.injected, q.units, q.useless, q.latency_us,
        q.reid);
  }
  if (!(s = emit("queries.csv", csv)).ok()) return s;

  // memory.csv: resident and stored bytes per policy after every frame.
  csv = "frame,seconds";
  for (const auto& n : names) absl::StrAppend(&csv, ",", n, "_resident_bytes");
  for (const auto& n : names) absl::StrAppend(&csv, ",", n, "_stored_bytes");
  csv += "\n";
  for (const MemorySample& m : r->memory) {
    absl::StrAppendFormat(&csv, "%d,%.3f", m.frame, (m.frame + 1) / fps);
    for (uint64_t b : m.resident) absl::StrAppend(&csv, ",", b);
    for (uint64_t b : m.stored) absl::StrAppend(&csv, ",", b);
    csv += "\n";
  }
  if (!(s = emit("memory.csv", csv)).ok()) return s;

  // latency.csv and cold_mass.csv: per 10 s of video, primary configuration.
  const uint64_t bucket =
      std::max<uint64_t>(1, static_cast<uint64_t>(10 * fps));
  std::map<uint64_t, std::vector<std::vector<float>>> lat;
  std::map<uint64_t, std::vector<std::pair<double, double>>> cold;
  for (const QueryRow& q : r->rows) {
    if (q.config != r->primary) continue;
    const uint64_t b = q.frame / bucket;
    auto& l = lat[b];
    auto& cm = cold[b];
    l.resize(names.size());
    cm.resize(names.size());
    l[q.policy].push_back(q.latency_us);
    cm[q.policy].first += q.cold_hit;
    cm[q.policy].second += q.cold_total;
  }
  csv = "seconds";
  for (const auto& n : names)
    absl::StrAppend(&csv, ",", n, "_p50_us,", n, "_p99_us,", n, "_p999_us");
  csv += "\n";
  for (auto& [b, per] : lat) {
    absl::StrAppendFormat(&csv, "%.1f", (b + 1) * bucket / fps);
    for (auto& v : per) {
      absl::StrAppendFormat(&csv, ",%.1f,%.1f,%.1f", Percentile(v, 0.5),
                            Percentile(v, 0.99), Percentile(v, 0.999));
    }
    csv += "\n";
  }
  if (!(s = emit("latency.csv", csv)).ok()) return s;
  csv = "seconds";
  for (const auto& n : names) absl::StrAppend(&csv, ",", n);
  csv += "\n";
  for (auto& [b, per] : cold) {
    absl::StrAppendFormat(&csv, "%.1f", (b + 1) * bucket / fps);
    for (auto& [hit, total] : per)
      absl::StrAppendFormat(&csv, ",%.4f", total > 0 ? hit / total : 0.0);
    csv += "\n";
  }
  if (!(s = emit("cold_mass.csv", csv)).ok()) return s;

  // sweep.csv: cold mass against the resident budget, per policy.
  csv = "window_tokens,recall_tokens,recall_fraction,resident_mib";
  for (const auto& n : names) absl::StrAppend(&csv, ",", n);
  csv += "\n";
  std::vector<const ConfigSummary*> sweep;
  for (const auto& c : r->configs) sweep.push_back(&c);
  std::sort(sweep.begin(), sweep.end(), [](auto* a, auto* b) {
    return a->window + a->recall < b->window + b->recall;
  });
  const double bpt = static_cast<double>(o.workload.layers) * 2 *
                     o.workload.kv_heads * o.workload.head_dim * 2;
  for (const ConfigSummary* c : sweep) {
    absl::StrAppendFormat(
        &csv, "%d,%d,%g,%.3f", c->window, c->recall, c->fraction,
        (c->window + c->recall) * bpt * o.workload.cameras / 1048576.0);
    for (const auto& p : c->policies)
      absl::StrAppendFormat(&csv, ",%.4f", p.cold_mass_recalled);
    csv += "\n";
  }
  if (!(s = emit("sweep.csv", csv)).ok()) return s;

  // Plots through gnuplot (deploy/bootstrap.sh installs gnuplot-nox).
  std::string gp =
      "set terminal pngcairo size 1000,600 font 'sans,11' noenhanced\n"
      "set datafile separator ','\nset key outside right\nset grid\n";
  const size_t np = names.size();
  auto series = [&](const std::string& file, size_t first_col, size_t stride,
                    const std::string& scale) {
    std::string cmd;
    for (size_t i = 0; i < np; ++i) {
      absl::StrAppendFormat(
          &cmd, "%s'%s' using 2:($%d%s) with lines lw 2 lt %d title '%s'",
          i ? ", " : "plot ", file, first_col + i * stride, scale, i + 1,
          names[i]);
    }
    return cmd + "\n";
  };
  gp +=
      "set output 'memory_vs_time.png'\nset title 'Accelerator-resident KV "
      "(all cameras) vs time'\nset xlabel 'video time (s)'\nset ylabel "
      "'MiB'\nset logscale y\n";
  gp += series("memory.csv", 3, 1, "/1048576.0");
  gp +=
      "set output 'stored_vs_time.png'\nset title 'KV kept anywhere (RAM + "
      "disk) vs time'\n";
  gp += series("memory.csv", 3 + np, 1, "/1048576.0");
  gp +=
      "set output 'latency_vs_time.png'\nset title 'Recall (selection) "
      "latency p99 per 10 s of video, primary configuration'\nset ylabel "
      "'us'\n";
  {
    std::string cmd;
    for (size_t i = 1; i < np; ++i) {  // full selects nothing.
      absl::StrAppendFormat(
          &cmd,
          "%s'latency.csv' using 1:%d with linespoints lt %d title '%s p99'",
          i > 1 ? ", " : "plot ", 2 + 3 * i + 1, i + 1, names[i]);
    }
    gp += cmd + "\n";
  }
  gp +=
      "unset logscale y\nset output 'mass_vs_budget.png'\nset title 'Cold "
      "attention mass recalled vs resident budget (W + R)'\nset xlabel "
      "'resident KV budget, all cameras (MiB)'\nset ylabel 'cold mass "
      "recalled'\nset yrange [0:1.05]\n";
  {
    std::string cmd;
    for (size_t i = 0; i < np; ++i) {
      absl::StrAppendFormat(
          &cmd,
          "%s'sweep.csv' using 4:%d with linespoints lw 2 lt %d title '%s'",
          i ? ", " : "plot ", 5 + i, i + 1, names[i]);
    }
    gp += cmd + "\n";
  }
  gp +=
      "set output 'cold_mass_vs_time.png'\nset title 'Cold mass recalled per "
      "10 s of video'\nset xlabel 'video time (s)'\n";
  {
    std::string cmd;
    for (size_t i = 0; i < np; ++i) {
      absl::StrAppendFormat(
          &cmd, "%s'cold_mass.csv' using 1:%d with lines lw 2 lt %d title '%s'",
          i ? ", " : "plot ", 2 + i, i + 1, names[i]);
    }
    gp += cmd + "\n";
  }
  if (!(s = emit("plots.gp", gp)).ok()) return s;
  const std::string cmd =
      absl::StrCat("cd '", o.out_dir, "' && gnuplot plots.gp 2>gnuplot.log");
  const bool have_gnuplot =
      std::system("command -v gnuplot >/dev/null 2>&1") == 0;
  if (have_gnuplot && std::system(cmd.c_str()) == 0) {
    for (const char* png :
         {"memory_vs_time.png", "stored_vs_time.png", "latency_vs_time.png",
          "mass_vs_budget.png", "cold_mass_vs_time.png"}) {
      r->files.push_back(path(png));
    }
  } else {
    r->notes.push_back(have_gnuplot
                           ? "gnuplot failed; see gnuplot.log"
                           : "gnuplot not installed (deploy/bootstrap.sh "
                             "installs gnuplot-nox): no PNG plots");
  }

  // report.md
  const ConfigSummary& c = Primary(*r);
  const VideoWorkloadOptions& w = o.workload;
  std::string md = "# kvmem eval report\n\n";
  if (!o.trace_dir.empty()) {
    absl::StrAppendFormat(&md, "Replayed trace: `%s` (one stream).\n\n",
                          o.trace_dir);
  }
  absl::StrAppendFormat(
      &md,
      "Workload: %d cameras x %d frames at %g fps (%.0f s of video each), %d "
      "tokens per frame (%d tokens in all), %d shots, %d walks between "
      "cameras; %d frame queries and %d probes. Geometry: %d layers x %d KV "
      "heads x %d head_dim, fp16 (%.0f KiB of KV per token). kvmem ran %s; "
      "%d blocks, %d index rebuilds (%.1f rebuild periods per camera). Run "
      "took %.1f s.\n\n",
      w.cameras, w.frames, w.fps, w.frames / w.fps, w.tokens_per_frame,
      r->tokens, r->shots, r->walks, r->frame_queries, r->probe_queries,
      w.layers, w.kv_heads, w.head_dim, bpt / 1024, r->kvmem_path,
      c.kvmem_blocks, c.kvmem_rebuilds, r->rebuild_periods, r->seconds);
  md += EvalTable(*r);
  md += "\n## Targets\n\n";
  for (const Target& t : Targets(*r)) {
    absl::StrAppendFormat(&md, "- [%s] %s: %s\n", t.met ? "x" : " ", t.name,
                          t.detail);
  }
  md +=
      "\n## Latency spikes\n\n10-second buckets of video whose selection "
      "p99 is over 3x the median bucket's p99 (see latency_vs_time.png):\n\n";
  for (const auto& p : c.policies) {
    if (p.name == "full") continue;
    absl::StrAppendFormat(&md, "- %s: %d of %d\n", p.name,
                          p.latency_spike_buckets, p.latency_buckets);
  }
  md += "\n## Sweep (cold mass recalled)\n\n| W | R | ";
  md += absl::StrJoin(names, " | ") + " |\n|---|---|";
  for (size_t i = 0; i < np; ++i) md += "---|";
  md += "\n";
  for (const ConfigSummary* x : sweep) {
    absl::StrAppendFormat(&md, "| %d | %d |", x->window, x->recall);
    for (const auto& p : x->policies)
      absl::StrAppendFormat(&md, " %.3f |", p.cold_mass_recalled);
    md += "\n";
  }
  md +=
      "\n## Plots\n\n![memory](memory_vs_time.png)\n\n"
      "![mass vs budget](mass_vs_budget.png)\n\n"
      "![latency](latency_vs_time.png)\n\n"
      "![cold mass over time](cold_mass_vs_time.png)\n\n"
      "![stored](stored_vs_time.png)\n";
  if (!r->notes.empty()) {
    md += "\n## Notes\n\n";
    for (const auto& n : r->notes) md += "- " + n + "\n";
  }
  return emit("report.md", md);
}

}  // namespace kvmem

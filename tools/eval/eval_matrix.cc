// `kvmem eval --matrix`: the generalisation matrix (eval.h). Each cell is the
// base workload with one property changed, so a cell that fails names the
// property that breaks recall.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/common/json_writer.h"
#include "tools/eval/eval.h"

namespace kvmem {
namespace {

const PolicySummary* Find(const ConfigSummary& c, const std::string& name) {
  for (const auto& p : c.policies)
    if (p.name == name) return &p;
  return nullptr;
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The kvmem variant with the most cold mass (kvmem itself included).
const PolicySummary* BestKvmem(const ConfigSummary& c) {
  const PolicySummary* best = nullptr;
  for (const auto& p : c.policies) {
    // Per-head sets need another kind of front end: not a configuration.
    if (p.name.rfind("kvmem", 0) != 0 || p.name == "kvmem_per_head") continue;
    if (best == nullptr || p.cold_mass_recalled > best->cold_mass_recalled) {
      best = &p;
    }
  }
  return best;
}

// The policies a cell's row and summary read; ok() when all are there.
struct CellView {
  const PolicySummary *kvmem, *best, *exact, *oracle, *mean_key;
  // kvmem's channel settings and the simplest front end (may be absent).
  const PolicySummary *attention_only, *identity_only, *mean_query;
  bool ok() const { return kvmem && best && exact && oracle && mean_key; }
};
CellView View(const ConfigSummary& c) {
  return {Find(c, "kvmem"),
          BestKvmem(c),
          Find(c, "exact_keys_per_head"),
          Find(c, "oracle_tokens"),
          Find(c, "mean_key_topk"),
          Find(c, "kvmem_attention_only"),
          Find(c, "kvmem_identity_only"),
          Find(c, "kvmem_mean_query")};
}

// The re-ID a cell holds kvmem to: 0.95 where exact_keys_per_head (a
// perfect index with the mean query) reaches it, else that reference's
// minus 0.05.
double ReidGoal(const CellView& v) {
  return v.exact->reid_success >= 0.95 ? 0.95 : v.exact->reid_success - 0.05;
}

// "cold / re-ID" of a policy, or "-".
std::string Pair(const PolicySummary* p) {
  return p == nullptr ? std::string("-")
                      : absl::StrFormat("%.3f / %.3f", p->cold_mass_recalled,
                                        p->reid_success);
}

}  // namespace

std::vector<MatrixCell> MatrixCells(const EvalOptions& base) {
  std::vector<MatrixCell> cells;
  // Every cell also runs kvmem's channel settings (the mass-vs-re-ID plot)
  // and the simplest front end (the mean query alone).
  std::vector<std::pair<std::string, KvmemKnobs>> variants =
      base.kvmem_variants;
  for (const char* v :
       {"kvmem_attention_only", "kvmem_identity_only", "kvmem_mean_query"}) {
    if (std::none_of(variants.begin(), variants.end(),
                     [&](const auto& x) { return x.first == v; })) {
      variants.emplace_back(v, *KvmemVariant(v, base.kvmem));
    }
  }
  auto add = [&](const std::string& name, const std::string& change,
                 const std::function<void(VideoWorkloadOptions*)>& edit) {
    MatrixCell c{name, change, base};
    c.options.kvmem_variants = variants;
    edit(&c.options.workload);
    c.options.recall_fractions = {base.primary_fraction};
    c.options.extra_windows.clear();
    c.options.out_dir.clear();
    // Grouped-query cells also run kvmem with each group's mean query.
    if (c.options.workload.query_heads_per_kv > 1) {
      KvmemKnobs mean = base.kvmem;
      mean.query_heads = false;
      c.options.kvmem_variants.emplace_back("kvmem_group_mean", mean);
    }
    cells.push_back(std::move(c));
  };
  using W = VideoWorkloadOptions;
  add("base", "the default workload (heads alike, orthogonal identities)",
      [](W*) {});
  add("sharp_diffuse_heads",
      "a quarter of the heads sharp, the rest at 1/4 of the logit scale",
      [](W* w) {
        w->sharp_head_fraction = 0.25f;
        w->diffuse_scale = 0.25f;
      });
  add("head_subspaces", "each KV head sees half of the latent",
      [](W* w) { w->head_subspace = 0.5f; });
  add("lookalikes", "identities of a class at cosine 0.6",
      [](W* w) { w->lookalike = 0.6f; });
  add("gqa_4x32", "4 KV heads x 32 dims, 4 query heads per KV head", [](W* w) {
    w->kv_heads = 4;
    w->head_dim = 32;
    w->query_heads_per_kv = 4;
  });
  add("gqa_8x128", "8 KV heads x 128 dims, 2 query heads per KV head",
      [](W* w) {
        w->kv_heads = 8;
        w->head_dim = 128;
        w->query_heads_per_kv = 2;
      });
  add("rope_1e4", "RoPE base 1e4", [](W* w) { w->rope_base = 1e4; });
  add("rope_5e5", "RoPE base 5e5", [](W* w) { w->rope_base = 5e5; });
  add("frame_24", "24 tokens per frame",
      [](W* w) { w->tokens_per_frame = 24; });
  add("frame_128", "128 tokens per frame",
      [](W* w) { w->tokens_per_frame = 128; });
  add("gaps_uniform", "re-entry gaps uniform in [5, 240] s",
      [](W* w) { w->gaps = W::Gaps::kUniform; });
  add("gaps_pareto", "re-entry gaps Pareto (alpha 1.1) from 5 s, cap 240 s",
      [](W* w) { w->gaps = W::Gaps::kPareto; });
  add("query_sharp", "query logit scale 48", [](W* w) { w->query_scale = 48; });
  add("query_soft", "query logit scale 12", [](W* w) { w->query_scale = 12; });
  add("peaked_tokens",
      "16 recurring textures on 4 patches of every frame; half of the frame "
      "queries read one (attention spread over many frames, peaked on one "
      "token of each)",
      [](W* w) {
        w->textures = 16;
        w->texture_tokens = 4;
      });
  // Whole-frame cells query every 3rd frame (and every re-entry): the
  // oracle attends with each of the frame's tokens.
  add("whole_frame",
      "each query is the frame's 32 tokens (a probe: the frame where the "
      "object re-enters), every 3rd frame",
      [](W* w) {
        w->frame_query_tokens = 32;
        w->query_every = 3;
      });
  add("lookalike_attention",
      "whole-frame queries of 16 tokens; identities of a class at cosine 0.9 "
      "and each object's look changing per visit (1.2): single tokens match "
      "look-alikes, the object as a whole matches itself",
      [](W* w) {
        w->frame_query_tokens = 16;
        w->query_every = 3;
        w->lookalike = 0.9f;
        w->appearance_change = 1.2f;
      });
  add("whole_frame_128",
      "128 tokens per frame, each query all 128 (reduced to 16 "
      "representatives), every 4th frame, 300 frames",
      [](W* w) {
        w->tokens_per_frame = 128;
        w->frame_query_tokens = 128;
        w->query_every = 4;
        w->frames = std::min<uint32_t>(w->frames, 300);
      });
  add("all_at_once",
      "2 KV heads x 32 dims, 4 query heads each, head subspaces, sharp and "
      "diffuse heads, look-alikes, Pareto gaps, RoPE 5e5",
      [](W* w) {
        w->kv_heads = 2;
        w->head_dim = 32;
        w->query_heads_per_kv = 4;
        w->head_subspace = 0.5f;
        w->sharp_head_fraction = 0.25f;
        w->diffuse_scale = 0.25f;
        w->lookalike = 0.6f;
        w->gaps = W::Gaps::kPareto;
        w->rope_base = 5e5;
      });
  return cells;
}

absl::StatusOr<MatrixResult> RunEvalMatrix(
    const std::vector<MatrixCell>& cells,
    const std::function<void(int, int)>& on_cell) {
  MatrixResult m;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < cells.size(); ++i) {
    absl::StatusOr<EvalResult> r = RunEval(cells[i].options);
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("matrix cell ", cells[i].name, ": ",
                                       r.status().message()));
    }
    m.cells.push_back(cells[i].name);
    m.changes.push_back(cells[i].change);
    m.summaries.push_back(r->configs[r->primary]);
    m.seconds.push_back(r->seconds);
    if (on_cell)
      on_cell(static_cast<int>(i + 1), static_cast<int>(cells.size()));
  }
  m.total_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return m;
}

std::string MatrixTable(const MatrixResult& m) {
  std::string s = absl::StrFormat(
      "Cold mass recalled at R = %.0f %% of W; goals: kvmem >= 0.9 x "
      "oracle_tokens, re-ID >= 0.95 where exact_keys_per_head reaches it "
      "(else >= its re-ID - 0.05), the mean-query client within 0.05 of the "
      "best configuration, no violations.\n\n",
      m.summaries.empty() ? 0.0 : 100 * m.summaries[0].fraction);
  s += "| cell | kvmem | kvmem / oracle | oracle_tokens | exact_keys_per_head "
       "| mean_key_topk | best kvmem config | kvmem re-ID | exact re-ID | "
       "attention only | identity only | mean-query client | identity "
       "tokens (query / track) | budget used | violations | p99 us | s |\n";
  s +=
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < m.cells.size(); ++i) {
    const CellView v = View(m.summaries[i]);
    if (!v.ok()) continue;
    const PolicySummary *k = v.kvmem, *best = v.best, *e = v.exact,
                        *o = v.oracle, *mk = v.mean_key;
    absl::StrAppendFormat(
        &s,
        "| %s | **%.3f** | %.2f | %.3f | %.3f | %.3f | %s %.3f | **%.3f** (%d) "
        "| %.3f | %s | %s | %s | %.0f / %.0f | %.2f | %d | %.0f | %.0f |\n",
        m.cells[i], k->cold_mass_recalled,
        Ratio(k->cold_mass_recalled, o->cold_mass_recalled),
        o->cold_mass_recalled, e->cold_mass_recalled, mk->cold_mass_recalled,
        best->name, best->cold_mass_recalled, k->reid_success, k->reid_probes,
        e->reid_success, Pair(v.attention_only), Pair(v.identity_only),
        Pair(v.mean_query), k->query_tokens_mean, k->track_tokens_mean,
        k->budget_used, k->budget_violations + k->window_violations,
        k->recall_p99_us, m.seconds[i]);
  }
  s += "\nkvmem's output error with its recalled tokens read from a cold "
       "tier at full precision, int8 and int4 (tier_policy.cold_precision; "
       "the sets are the same, so is the cold mass), plain (gated):\n\n"
       "| cell | full | int8 | int8 / full | int4 | int4 / full |\n"
       "|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < m.cells.size(); ++i) {
    const CellView v = View(m.summaries[i]);
    if (!v.ok()) continue;
    const PolicySummary* k = v.kvmem;
    absl::StrAppendFormat(
        &s,
        "| %s | %.4f (%.4f) | %.4f (%.4f) | %.3f (%.3f) | %.4f (%.4f) | %.3f "
        "(%.3f) |\n",
        m.cells[i], k->output_rel_error, k->gated_output_rel_error,
        k->int8_output_rel_error, k->int8_gated_output_rel_error,
        Ratio(k->int8_output_rel_error, k->output_rel_error),
        Ratio(k->int8_gated_output_rel_error, k->gated_output_rel_error),
        k->int4_output_rel_error, k->int4_gated_output_rel_error,
        Ratio(k->int4_output_rel_error, k->output_rel_error),
        Ratio(k->int4_gated_output_rel_error, k->gated_output_rel_error));
  }
  absl::StrAppendFormat(&s, "\n%d cells in %.0f s\n", m.cells.size(),
                        m.total_seconds);
  return s;
}

std::string MatrixJson(const MatrixResult& m) {
  JsonWriter w;
  w.Object(/*multiline=*/true);
  w.Key("summary").Array(/*multiline=*/true);
  for (size_t i = 0; i < m.cells.size(); ++i) {
    const CellView v = View(m.summaries[i]);
    if (!v.ok()) continue;
    const PolicySummary *k = v.kvmem, *best = v.best, *e = v.exact,
                        *mk = v.mean_key;
    const double vs_exact = Ratio(k->cold_mass_recalled, e->cold_mass_recalled);
    const double vs_mean = Ratio(k->cold_mass_recalled, mk->cold_mass_recalled);
    w.Object();
    w.Key("cell").Str(m.cells[i]);
    w.Key("kvmem_cold_mass_recalled").Num(k->cold_mass_recalled, 4);
    w.Key("kvmem_vs_exact_keys_per_head").Num(vs_exact, 3);
    w.Key("kvmem_vs_mean_key_topk").Num(vs_mean, 3);
    w.Key("kvmem_reid_success").Num(k->reid_success, 4);
    w.Key("best_kvmem").Str(best->name);
    w.Key("best_kvmem_cold_mass_recalled").Num(best->cold_mass_recalled, 4);
    const double vs_oracle =
        Ratio(k->cold_mass_recalled, v.oracle->cold_mass_recalled);
    w.Key("kvmem_vs_oracle_tokens").Num(vs_oracle, 3);
    w.Key("reid_goal").Num(ReidGoal(v), 3);
    w.Key("exact_keys_per_head_reid").Num(e->reid_success, 4);
    w.Key("violations").UInt(k->budget_violations + k->window_violations);
    w.Key("met_vs_oracle").Bool(vs_oracle >= 0.9);
    w.Key("met_vs_mean_key").Bool(vs_mean >= 2);
    w.Key("met_reid").Bool(k->reid_success >= ReidGoal(v) - 1e-9);
    w.Key("met_defaults_within_5_points")
        .Bool(best->cold_mass_recalled - k->cold_mass_recalled <= 0.05);
    if (v.mean_query != nullptr) {
      w.Key("mean_query_cold_mass_recalled")
          .Num(v.mean_query->cold_mass_recalled, 4);
      w.Key("met_mean_query_within_5_points")
          .Bool(best->cold_mass_recalled - v.mean_query->cold_mass_recalled <=
                0.05);
      // Its own ceiling: a perfect index of every token with that query.
      w.Key("met_mean_query_within_5_points_of_exact_keys")
          .Bool(e->cold_mass_recalled - v.mean_query->cold_mass_recalled <=
                0.05);
    }
    w.EndObject();
  }
  w.EndArray();
  w.Key("matrix").Array(/*multiline=*/true);
  for (size_t i = 0; i < m.cells.size(); ++i) {
    const ConfigSummary& c = m.summaries[i];
    w.Object();
    w.Key("cell").Str(m.cells[i]);
    w.Key("change").Str(m.changes[i]);
    w.Key("window_tokens").UInt(c.window);
    w.Key("recall_tokens").UInt(c.recall);
    w.Key("seconds").Num(m.seconds[i], 1);
    w.Key("policies").Object();
    for (const PolicySummary& x : c.policies) {
      w.Key(x.name).Object();
      w.Key("cold_mass_recalled").Num(x.cold_mass_recalled, 4);
      w.Key("reid_success").Num(x.reid_success, 4);
      w.Key("reid_probes").UInt(x.reid_probes);
      w.Key("output_cosine").Num(x.output_cosine, 5);
      w.Key("output_rel_error").Num(x.output_rel_error, 4);
      w.Key("gated_output_cosine").Num(x.gated_output_cosine, 5);
      w.Key("gated_output_rel_error").Num(x.gated_output_rel_error, 4);
      w.Key("int8_output_rel_error").Num(x.int8_output_rel_error, 4);
      w.Key("int8_gated_output_rel_error")
          .Num(x.int8_gated_output_rel_error, 4);
      w.Key("int4_output_rel_error").Num(x.int4_output_rel_error, 4);
      w.Key("int4_gated_output_rel_error")
          .Num(x.int4_gated_output_rel_error, 4);
      w.Key("useless_hit_rate").Num(x.useless_hit_rate, 4);
      w.Key("injected_tokens_mean").Num(x.injected_tokens_mean, 1);
      w.Key("budget_used").Num(x.budget_used, 3);
      w.Key("budget_violations").UInt(x.budget_violations);
      w.Key("window_violations").UInt(x.window_violations);
      w.Key("recall_p50_us").Num(x.recall_p50_us, 1);
      w.Key("recall_p99_us").Num(x.recall_p99_us, 1);
      w.Key("query_tokens_mean").Num(x.query_tokens_mean, 1);
      w.Key("track_tokens_mean").Num(x.track_tokens_mean, 1);
      w.EndObject();
    }
    w.EndObject().EndObject();
  }
  w.EndArray();
  w.Key("seconds").Num(m.total_seconds, 1);
  w.EndObject();
  return w.Take();
}

absl::Status WriteMatrixReport(const std::string& out_dir,
                               const MatrixResult& m,
                               std::vector<std::string>* files) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  const std::filesystem::path dir(out_dir);
  // matrix.csv: cold mass and re-ID of every policy in every cell.
  std::string csv = "cell,policy,cold_mass_recalled,reid_success\n";
  for (size_t i = 0; i < m.cells.size(); ++i) {
    for (const PolicySummary& p : m.summaries[i].policies) {
      absl::StrAppendFormat(&csv, "%s,%s,%.4f,%.4f\n", m.cells[i], p.name,
                            p.cold_mass_recalled, p.reid_success);
    }
  }
  // matrix.png: cold mass per cell of the baseline, kvmem, its previous
  // form and the two references.
  const char* shown[] = {"mean_key_topk", "kvmem_summed", "kvmem",
                         "exact_keys_per_head", "oracle_tokens"};
  std::string dat = "cell";
  for (const char* n : shown) absl::StrAppend(&dat, " ", n);
  dat += "\n";
  for (size_t i = 0; i < m.cells.size(); ++i) {
    dat += m.cells[i];
    for (const char* n : shown) {
      const PolicySummary* p = Find(m.summaries[i], n);
      absl::StrAppendFormat(&dat, " %.4f", p ? p->cold_mass_recalled : 0.0);
    }
    dat += "\n";
  }
  std::string gp =
      "set terminal pngcairo size 1400,600 font 'sans,11' noenhanced\n"
      "set output 'matrix.png'\nset title 'Cold attention mass recalled at "
      "R = 30 % of W, per workload variant'\nset style data histograms\n"
      "set style histogram clustered gap 1\nset style fill solid 0.8\n"
      "set key outside right\nset grid y\nset yrange [0:1]\n"
      "set xtics rotate by -30\nset ylabel 'cold mass recalled'\n"
      "plot for [i=2:6] 'matrix.dat' using i:xtic(1) title columnheader\n";
  // matrix_reid.png: per cell, cold mass against re-ID of kvmem's channel
  // settings, the mean-query client and the references.
  const std::pair<const char*, const char*> points[] = {
      {"kvmem_attention_only", "attention"}, {"kvmem", "default"},
      {"kvmem_identity_only", "identity"},   {"kvmem_mean_query", "mean-q"},
      {"exact_keys_per_head", "exact"},      {"oracle_tokens", "oracle"}};
  std::string reid_dat;
  for (size_t i = 0; i < m.cells.size(); ++i) {
    absl::StrAppendFormat(&reid_dat, "# %s\n", m.cells[i]);
    for (const auto& [name, label] : points) {
      const PolicySummary* p = Find(m.summaries[i], name);
      if (p == nullptr) {  // Every block has each point, in order.
        absl::StrAppendFormat(&reid_dat, "%s nan nan\n", label);
        continue;
      }
      absl::StrAppendFormat(&reid_dat, "%s %.4f %.4f\n", label,
                            p->cold_mass_recalled, p->reid_success);
    }
    reid_dat += "\n\n";
  }
  const size_t cols = 5, rows = (m.cells.size() + cols - 1) / cols;
  std::string reid_gp = absl::StrFormat(
      "set terminal pngcairo size 1800,%d font 'sans,9' noenhanced\n"
      "set output 'matrix_reid.png'\n"
      "set multiplot layout %d,%d title 'cold mass recalled (x) against "
      "re-ID (y), R = 30 %% of W: kvmem with attention only, default (both "
      "channels), identity only; the mean-query client; the references'\n"
      "set yrange [-0.05:1.1]\nset grid\nset offsets 0.02,0.02,0,0\n"
      "names = 'attention default identity mean-query exact oracle'\n",
      static_cast<int>(330 * rows), static_cast<int>(rows),
      static_cast<int>(cols));
  for (size_t i = 0; i < m.cells.size(); ++i) {
    absl::StrAppendFormat(
        &reid_gp,
        "set title '%s'\n%s\nplot for [k=0:5] 'matrix_reid.dat' index %d "
        "every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title "
        "word(names, k+1)\n",
        m.cells[i], i == 0 ? "set key bottom left font 'sans,8'" : "unset key",
        static_cast<int>(i));
  }
  reid_gp += "unset multiplot\n";
  for (const auto& [name, text] :
       {std::pair<std::string, std::string>{"matrix.md", MatrixTable(m)},
        {"matrix.json", MatrixJson(m)},
        {"matrix.csv", csv},
        {"matrix.dat", dat},
        {"matrix.gp", gp},
        {"matrix_reid.dat", reid_dat},
        {"matrix_reid.gp", reid_gp}}) {
    std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) {
      return absl::InternalError(
          absl::StrCat("cannot write ", (dir / name).string()));
    }
    files->push_back((dir / name).string());
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    for (const char* plot : {"matrix", "matrix_reid"}) {
      const std::string cmd = absl::StrCat("cd '", out_dir, "' && gnuplot ",
                                           plot, ".gp 2>>gnuplot-matrix.log");
      if (std::system(cmd.c_str()) == 0) {
        files->push_back((dir / absl::StrCat(plot, ".png")).string());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvmem

#include "client/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/dot.h"

namespace kvmem {
namespace {

// The baselines, in report order; kvmem and its variants follow, then the
// reference policies.
constexpr const char* kBaselines[] = {"full", "streaming_llm", "window_lru",
                                      "h2o", "mean_key_topk"};

v1::StreamConfig KvmemConfig(const KvmemKnobs& k, const VideoWorkloadOptions& w,
                             uint32_t window, uint32_t recall) {
  v1::StreamConfig c;
  auto* g = c.mutable_geometry();
  g->set_layers(w.layers);
  g->set_kv_heads(w.kv_heads);
  g->set_head_dim(w.head_dim);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(w.tokens_per_frame);
  c.set_hot_window_tokens(window);
  c.mutable_recall_defaults()->set_max_tokens(std::max<uint32_t>(1, recall));
  // Everything else only where the knobs set it: the stream's defaults.
  c.mutable_block_policy()->set_mode(static_cast<v1::SegmentMode>(k.segment_mode));
  c.mutable_block_policy()->set_frames_per_block(k.frames_per_block);
  c.mutable_index_policy()->set_groups_per_block(k.groups_per_block);
  c.mutable_index_policy()->set_index_factory(k.index_factory);
  auto* t = c.mutable_tier_policy();
  t->set_warm_budget_bytes(k.warm_budget_bytes);
  t->set_prefetch_blocks(k.prefetch_blocks);
  if (k.prefetch_blocks > 0) {
    // Room to stage the prefetched blocks: prefetch_blocks of the largest.
    const uint32_t frames = k.frames_per_block > 0 ? k.frames_per_block : 32;
    t->set_stage_budget_bytes(static_cast<uint64_t>(k.prefetch_blocks) *
                              frames * w.tokens_per_frame * w.layers * 2 *
                              w.kv_heads * w.head_dim * 2);
  }
  t->set_rebuild_every_blocks(k.rebuild_every_blocks);
  auto* r = c.mutable_recall_policy();
  r->set_track_weight(k.track_weight);
  r->set_scene_weight(k.scene_weight);
  r->set_iou_weight(k.iou_weight);
  r->set_score(static_cast<v1::ScoreMode>(k.score));
  return c;
}

struct Config {
  PolicyBudget budget;
  double fraction = 0;
  // [camera][policy]
  std::vector<std::vector<std::unique_ptr<EvalPolicy>>> policies;
  std::vector<std::vector<std::string>> kvmem_ids;  // [kvmem policy][camera]
};

double Sum(const std::vector<double>& prefix, uint64_t b, uint64_t e) {
  return e > b ? prefix[e] - prefix[b] : 0.0;
}

bool Intersects(const std::vector<Span>& a,
                const std::vector<std::pair<uint64_t, uint64_t>>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].end <= b[j].first) {
      ++i;
    } else if (b[j].second <= a[i].begin) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

// Cosine and relative error of y against ref.
void Compare(const std::vector<double>& y, const std::vector<double>& ref,
             double* cosine, double* rel_error) {
  double dot = 0, ny = 0, nr = 0, diff = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    dot += y[j] * ref[j];
    ny += y[j] * y[j];
    nr += ref[j] * ref[j];
    diff += (y[j] - ref[j]) * (y[j] - ref[j]);
  }
  *cosine = dot / std::max(std::sqrt(ny * nr), 1e-30);
  *rel_error = std::sqrt(diff) / std::max(std::sqrt(nr), 1e-30);
}

}  // namespace

KvmemKnobs SummedKnobs() {
  KvmemKnobs k;
  k.segment_mode = 2;
  k.frames_per_block = 4;
  k.groups_per_block = 8;
  k.index_factory = "Flat";
  k.top_k = 16;
  k.score = 2;
  k.rebuild_every_blocks = 32;
  k.warm_budget_bytes = 16ull << 20;
  k.prefetch_blocks = 2;
  k.window_lse = false;
  k.query_heads = false;
  return k;
}

absl::StatusOr<KvmemKnobs> KvmemVariant(const std::string& name,
                                        const KvmemKnobs& base) {
  KvmemKnobs k = base;
  if (name == "kvmem_summed") {
    k = SummedKnobs();
  } else if (name == "kvmem_no_lse") {
    k.window_lse = false;
  } else if (name == "kvmem_blocks") {
    k.groups_per_block = 1;
  } else if (name == "kvmem_group_mean") {
    k.query_heads = false;
  } else if (name == "kvmem_per_head") {
    k.per_head = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown kvmem variant \"", name,
        "\"; use kvmem_summed, kvmem_no_lse, kvmem_blocks, kvmem_group_mean "
        "or kvmem_per_head"));
  }
  return k;
}

double Percentile(std::vector<float> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

void OracleAttention(const CameraTokens& cam, uint64_t tokens,
                     const std::vector<std::vector<float>>& q_heads,
                     uint32_t kv_heads, uint32_t head_dim,
                     std::vector<std::vector<float>>* probs,
                     std::vector<std::vector<double>>* outputs) {
  const size_t d = head_dim, per = cam.per_token, g = q_heads.size();
  const float inv = 1.0f / std::sqrt(static_cast<float>(d));
  probs->resize(kv_heads * g);
  outputs->assign(kv_heads * g, std::vector<double>(d, 0.0));
  std::vector<float> acc(d);
  for (uint32_t h = 0; h < kv_heads; ++h) {
    for (size_t j = 0; j < g; ++j) {
      const size_t qh = h * g + j;
      std::vector<float>& p = (*probs)[qh];
      p.resize(tokens);
      const float* q = q_heads[j].data() + h * d;
      float mx = -INFINITY;
      for (uint64_t i = 0; i < tokens; ++i) {
        p[i] = Dot(q, cam.keys.data() + i * per + h * d, d) * inv;
        mx = std::max(mx, p[i]);
      }
      double sum = 0;
      for (uint64_t i = 0; i < tokens; ++i) {
        p[i] = std::exp(p[i] - mx);
        sum += p[i];
      }
      const float norm = static_cast<float>(1.0 / sum);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (uint64_t i = 0; i < tokens; ++i) {
        p[i] *= norm;
        Axpy(p[i], cam.values.data() + i * per + h * d, acc.data(), d);
      }
      for (size_t k = 0; k < d; ++k) (*outputs)[qh][k] = acc[k];
    }
  }
}

namespace {

// One query's oracle, shared by every configuration and policy.
struct QueryTruth {
  uint32_t query_heads = 0, group = 1, head_dim = 0;
  std::vector<std::vector<float>> probs;   // [query head][token]
  std::vector<std::vector<double>> outs;   // [query head][head_dim]
  std::vector<double> pbar, prefix;        // Mean over query heads.
  // Sinks + window of the current window size, per query head.
  std::vector<double> base_mass;
  std::vector<std::vector<double>> base_out;
};

// The attention output (per query head) of attending to the sinks, the
// window and `recalled` jointly; and the gated mix of the window's and each
// recalled block's own attention (kvmem's gates), when the selection has
// gates.
void ScoreOutputs(const QueryTruth& t, const CameraTokens& cam,
                  const Selection& sel, QueryRow* row) {
  const size_t d = t.head_dim;
  std::vector<float> acc(d);
  std::vector<double> y(d);
  const bool gated = sel.estimated_mass >= 0 && !sel.unit_gates.empty();
  const double G = std::clamp<double>(sel.estimated_mass, 0.0, 1.0);
  double mass = 0, cos_sum = 0, rel_sum = 0, gcos = 0, grel = 0;
  for (uint32_t qh = 0; qh < t.query_heads; ++qh) {
    const std::vector<double>& ref = t.outs[qh];
    const std::vector<float>& p = t.probs[qh];
    const size_t kvh = qh / t.group;
    const float* values = cam.values.data() + kvh * d;
    const std::vector<Span>& recalled =
        sel.head_recalled.empty() ? sel.recalled : sel.head_recalled[kvh];
    auto attend = [&](const std::vector<Span>& spans, double* m) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      *m = 0;
      for (const Span& sp : spans) {
        for (uint64_t i = sp.begin; i < sp.end; ++i) {
          *m += p[i];
          Axpy(p[i], values + i * cam.per_token, acc.data(), d);
        }
      }
    };
    double m = 1.0;
    if (sel.everything) {
      y = ref;
    } else {
      attend(recalled, &m);
      m += t.base_mass[qh];
      for (size_t j = 0; j < d; ++j) {
        y[j] = (t.base_out[qh][j] + acc[j]) / std::max(m, 1e-30);
      }
    }
    mass += m;
    double c, r;
    Compare(y, ref, &c, &r);
    cos_sum += c;
    rel_sum += r;
    if (gated) {
      // (1 - G) o_window + G sum_b gate_b o_b
      for (size_t j = 0; j < d; ++j) {
        y[j] = (1 - G) * t.base_out[qh][j] / std::max(t.base_mass[qh], 1e-30);
      }
      for (size_t b = 0; b < sel.unit_spans.size(); ++b) {
        double mb;
        attend(sel.unit_spans[b], &mb);
        if (mb <= 0) continue;
        const double k = G * sel.unit_gates[b] / mb;
        for (size_t j = 0; j < d; ++j) y[j] += k * acc[j];
      }
      Compare(y, ref, &c, &r);
      gcos += c;
      grel += r;
    }
  }
  row->mass = static_cast<float>(mass / t.query_heads);
  row->cosine = static_cast<float>(cos_sum / t.query_heads);
  row->rel_error = static_cast<float>(rel_sum / t.query_heads);
  if (gated) {
    row->gated_cosine = static_cast<float>(gcos / t.query_heads);
    row->gated_rel_error = static_cast<float>(grel / t.query_heads);
    row->estimated_mass = sel.estimated_mass;
  }
}

// The cold mass the best shared set of R tokens holds (by mean attention
// over query heads) and the best set per query head (each head's own R),
// both averaged over query heads, added to *per_head and *shared; the cold
// mass in all to *pool.
void OracleSets(const QueryTruth& t, uint64_t n, const PolicyBudget& b,
                uint64_t sink_tokens, double* per_head, double* shared,
                double* pool) {
  const uint64_t lo = std::min<uint64_t>(sink_tokens, n);
  const uint64_t hi = std::max(lo, b.WindowStart(n));
  if (hi <= lo) return;
  *pool += t.prefix[hi] - t.prefix[lo];
  const size_t r = std::min<uint64_t>(b.recall, hi - lo);
  std::vector<double> v;
  auto top_sum = [&](const auto& score) {
    v.assign(score.begin() + lo, score.begin() + hi);
    std::nth_element(v.begin(), v.begin() + (r - 1), v.end(),
                     std::greater<double>());
    return std::accumulate(v.begin(), v.begin() + r, 0.0);
  };
  if (r == 0) return;
  *shared += top_sum(t.pbar);
  double heads = 0;
  for (const auto& p : t.probs) heads += top_sum(p);
  *per_head += heads / t.probs.size();
}

// Summary of one configuration's policy over its rows.
PolicySummary Summarize(const EvalResult& result, size_t ci, size_t pi,
                        double fps, uint32_t recall) {
  PolicySummary ps;
  ps.name = result.policy_names[pi];
  double cold_hit[2] = {0, 0}, cold_total[2] = {0, 0};
  uint64_t reid_ok = 0, units = 0, useless = 0, injected = 0, gated = 0;
  std::vector<float> lat;
  std::map<uint64_t, std::vector<float>> buckets;  // 10 s of video each.
  const uint64_t bucket_frames =
      std::max<uint64_t>(1, static_cast<uint64_t>(10 * fps));
  for (const QueryRow& r : result.rows) {
    if (r.config != ci || r.policy != pi) continue;
    ++ps.queries;
    ps.mass_recalled += r.mass;
    ps.output_cosine += r.cosine;
    ps.output_rel_error += r.rel_error;
    const int k = r.kind == QueryKind::kProbe ? 1 : 0;
    cold_hit[k] += r.cold_hit;
    cold_total[k] += r.cold_total;
    if (r.reid >= 0) {
      ++ps.reid_probes;
      reid_ok += r.reid;
    }
    units += r.units;
    useless += r.useless;
    ps.degraded_blocks += r.degraded;
    injected += r.injected;
    if (r.estimated_mass > 0 || r.gated_cosine != 0) {
      ++gated;
      ps.gated_output_cosine += r.gated_cosine;
      ps.gated_output_rel_error += r.gated_rel_error;
      ps.estimated_mass += r.estimated_mass;
    }
    ps.budget_violations += r.violations & 1;
    ps.window_violations += (r.violations >> 1) & 1;
    lat.push_back(r.latency_us);
    buckets[r.frame / bucket_frames].push_back(r.latency_us);
  }
  std::vector<float> bucket_p99;
  for (auto& [b, v] : buckets) bucket_p99.push_back(Percentile(v, 0.99));
  const double median_p99 = Percentile(bucket_p99, 0.5);
  ps.latency_buckets = static_cast<uint32_t>(bucket_p99.size());
  for (float p99 : bucket_p99) {
    ps.latency_spike_buckets += median_p99 > 0 && p99 > 3 * median_p99;
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  const double nq = std::max<uint64_t>(1, ps.queries);
  ps.mass_recalled /= nq;
  ps.output_cosine /= nq;
  ps.output_rel_error /= nq;
  ps.gated_output_cosine = ratio(ps.gated_output_cosine, gated);
  ps.gated_output_rel_error = ratio(ps.gated_output_rel_error, gated);
  ps.estimated_mass = ratio(ps.estimated_mass, gated);
  ps.cold_mass_recalled =
      ratio(cold_hit[0] + cold_hit[1], cold_total[0] + cold_total[1]);
  ps.cold_mass_recalled_frame = ratio(cold_hit[0], cold_total[0]);
  ps.cold_mass_recalled_probe = ratio(cold_hit[1], cold_total[1]);
  ps.reid_success = ratio(reid_ok, ps.reid_probes);
  ps.recalled_units = units;
  ps.useless_hit_rate = ratio(useless, units);
  ps.injected_tokens_mean = injected / nq;
  ps.budget_used = ratio(ps.injected_tokens_mean, recall);
  ps.recall_p50_us = Percentile(lat, 0.50);
  ps.recall_p99_us = Percentile(lat, 0.99);
  ps.recall_p999_us = Percentile(lat, 0.999);
  return ps;
}

}  // namespace

absl::StatusOr<EvalResult> RunEval(const EvalOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string bad = CheckVideoWorkloadOptions(o.workload);
  if (!bad.empty()) return absl::InvalidArgumentError(bad);
  if (o.window < 1) return absl::InvalidArgumentError("--window must be >= 1");
  if (o.frames_per_block < 1 || o.top_k < 1) {
    return absl::InvalidArgumentError("--frames_per_block and --top_k >= 1");
  }
  std::vector<double> fractions = o.recall_fractions;
  if (std::find(fractions.begin(), fractions.end(), o.primary_fraction) ==
      fractions.end()) {
    fractions.push_back(o.primary_fraction);
  }
  for (double f : fractions) {
    if (!(f > 0 && f <= 4)) {
      return absl::InvalidArgumentError(
          absl::StrCat("recall fraction ", f, " must be in (0, 4]"));
    }
  }
  const VideoWorkload wl(o.workload);
  const VideoWorkloadOptions& w = o.workload;
  const uint32_t kv_heads = w.layers * w.kv_heads;
  const uint32_t group = w.query_heads_per_kv;
  const uint32_t cams = w.cameras;

  // The kvmem side: one stream per camera, configuration and kvmem policy.
  std::unique_ptr<KvmemBackend> backend;
  std::string temp_dir;
  EvalResult result;
  if (o.server.empty()) {
    std::string dir = o.data_dir;
    if (dir.empty()) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / "kvmem-eval-XXXXXX")
              .string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        return absl::InternalError("cannot create a temp directory");
      }
      dir = temp_dir = tmpl;
    }
    auto b = OpenInProcessBackend(dir);
    if (!b.ok()) return b.status();
    backend = std::move(*b);
    result.kvmem_path = "in-process";
  } else {
    auto b = OpenGrpcBackend(o.server);
    if (!b.ok()) return b.status();
    backend = std::move(*b);
    result.kvmem_path = o.server;
  }
  struct Cleanup {
    std::unique_ptr<KvmemBackend>* backend;
    std::string dir;
    ~Cleanup() {
      backend->reset();
      if (!dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    }
  } cleanup{&backend, temp_dir};

  std::vector<std::pair<std::string, KvmemKnobs>> kvmems = {{"kvmem", o.kvmem}};
  kvmems.insert(kvmems.end(), o.kvmem_variants.begin(), o.kvmem_variants.end());
  for (const char* n : kBaselines) result.policy_names.push_back(n);
  for (const auto& [name, k] : kvmems) result.policy_names.push_back(name);
  if (o.references) {
    result.policy_names.push_back("oracle_tokens");
    result.policy_names.push_back("exact_keys_per_head");
  }
  const size_t num_policies = result.policy_names.size();
  const size_t first_kvmem = std::size(kBaselines);

  std::vector<Config> configs;
  auto add_config = [&](uint32_t window, double fraction) -> absl::Status {
    Config c;
    c.fraction = fraction;
    c.budget.window = window;
    c.budget.recall = static_cast<uint32_t>(std::lround(fraction * window));
    c.budget.block_tokens = o.frames_per_block * w.tokens_per_frame;
    c.budget.top_k = o.top_k;
    c.budget.bytes_per_token = wl.bytes_per_token();
    const size_t ci = configs.size();
    c.kvmem_ids.resize(kvmems.size());
    for (uint32_t cam = 0; cam < cams; ++cam) {
      std::vector<std::unique_ptr<EvalPolicy>> ps;
      ps.push_back(MakeFullPolicy(c.budget));
      ps.push_back(MakeStreamingLlmPolicy(c.budget));
      ps.push_back(MakeWindowLruPolicy(c.budget));
      ps.push_back(MakeH2oPolicy(c.budget));
      ps.push_back(MakeMeanKeyTopkPolicy(c.budget));
      for (size_t ki = 0; ki < kvmems.size(); ++ki) {
        const auto& [name, knobs] = kvmems[ki];
        const std::string id =
            absl::StrFormat("eval-w%u-r%u-cam%u-%u-%s", window, c.budget.recall,
                            cam, static_cast<unsigned>(ci), name);
        KvmemRequestOptions req;
        req.top_k = knobs.top_k;
        req.send_budget = ki != 0;  // kvmem: the stream's default budget.
        req.window_lse = knobs.window_lse;
        req.query_heads = knobs.query_heads;
        req.per_head = knobs.per_head;
        req.head_dim = w.head_dim;
        req.kv_heads = w.kv_heads;
        auto k = MakeKvmemPolicy(name, c.budget, backend.get(), id,
                                 KvmemConfig(knobs, w, window, c.budget.recall),
                                 req);
        if (!k.ok()) return k.status();
        ps.push_back(std::move(*k));
        c.kvmem_ids[ki].push_back(id);
      }
      if (o.references) {
        ps.push_back(MakeOracleTokensPolicy(c.budget));
        ps.push_back(MakeExactKeysPerHeadPolicy(c.budget, w.head_dim));
      }
      c.policies.push_back(std::move(ps));
    }
    configs.push_back(std::move(c));
    return absl::OkStatus();
  };
  for (double f : fractions) {
    absl::Status s = add_config(o.window, f);
    if (!s.ok()) return s;
    if (f == o.primary_fraction) result.primary = configs.size() - 1;
  }
  for (uint32_t extra : o.extra_windows) {
    if (extra == o.window) continue;
    absl::Status s = add_config(extra, o.primary_fraction);
    if (!s.ok()) return s;
  }

  std::vector<CameraTokens> cam(cams);
  for (auto& c : cam) {
    c.sink_tokens = w.sink_tokens;
    c.per_token = kv_heads * w.head_dim;
  }
  // Per config and policy: peaks.
  std::vector<std::vector<uint64_t>> resident_peak(
      configs.size(), std::vector<uint64_t>(num_policies, 0));
  auto stored_peak = resident_peak;
  double per_head_hit = 0, shared_hit = 0, cold_pool = 0;
  QueryTruth t;
  t.query_heads = kv_heads * group;
  t.group = group;
  t.head_dim = w.head_dim;
  t.base_mass.resize(t.query_heads);
  t.base_out.resize(t.query_heads);
  std::vector<float> keys, values, acc(w.head_dim);

  for (uint64_t f = 0; f < w.frames; ++f) {
    for (uint32_t c = 0; c < cams; ++c) {
      const WorkloadFrame frame = wl.Frame(c, f);
      wl.FrameKV(frame, &keys, &values);
      CameraTokens& ct = cam[c];
      ct.keys.insert(ct.keys.end(), keys.begin(), keys.end());
      ct.values.insert(ct.values.end(), values.begin(), values.end());
      ct.tokens += frame.frame.header.token_count();
      for (auto& cfg : configs) {
        for (auto& p : cfg.policies[c]) {
          absl::Status s = p->OnFrame(frame, ct);
          if (!s.ok()) {
            return absl::Status(s.code(), absl::StrCat(p->name(), " at frame ",
                                                       f, ": ", s.message()));
          }
        }
      }
      for (const WorkloadQuery& q : wl.Queries(c, f, frame)) {
        (q.kind == QueryKind::kProbe ? result.probe_queries
                                     : result.frame_queries)++;
        const uint64_t n = ct.tokens;
        OracleAttention(ct, n, q.q_heads, kv_heads, w.head_dim, &t.probs,
                        &t.outs);
        t.pbar.assign(n, 0.0);
        for (const auto& p : t.probs)
          for (uint64_t i = 0; i < n; ++i) t.pbar[i] += p[i];
        t.prefix.assign(n + 1, 0.0);
        for (uint64_t i = 0; i < n; ++i) {
          t.pbar[i] /= t.query_heads;
          t.prefix[i + 1] = t.prefix[i] + t.pbar[i];
        }
        QueryOracle oracle;
        oracle.attention = &t.pbar;
        OracleSets(t, n, configs[result.primary].budget, ct.sink_tokens,
                   &per_head_hit, &shared_hit, &cold_pool);
        uint32_t base_window = UINT32_MAX;
        for (size_t ci = 0; ci < configs.size(); ++ci) {
          Config& cfg = configs[ci];
          const uint64_t ws = cfg.budget.WindowStart(n);
          const uint64_t sinks = std::min<uint64_t>(ct.sink_tokens, n);
          if (cfg.budget.window != base_window) {
            // The sinks and the window, which every bounded policy holds.
            base_window = cfg.budget.window;
            for (uint32_t qh = 0; qh < t.query_heads; ++qh) {
              double mass = 0;
              std::fill(acc.begin(), acc.end(), 0.0f);
              const float* v = ct.values.data() + (qh / group) * w.head_dim;
              auto add = [&](uint64_t i) {
                const float pi = t.probs[qh][i];
                mass += pi;
                Axpy(pi, v + i * ct.per_token, acc.data(), w.head_dim);
              };
              for (uint64_t i = 0; i < sinks; ++i) add(i);
              for (uint64_t i = std::max(ws, sinks); i < n; ++i) add(i);
              t.base_mass[qh] = mass;
              t.base_out[qh].assign(acc.begin(), acc.end());
            }
          }
          const double cold_total = Sum(t.prefix, sinks, std::max(ws, sinks));
          for (size_t pi = 0; pi < num_policies; ++pi) {
            EvalPolicy& pol = *cfg.policies[c][pi];
            Selection sel;
            const auto s0 = std::chrono::steady_clock::now();
            absl::Status s = pol.Select(q, ct, oracle, &sel);
            const float us = std::chrono::duration<float, std::micro>(
                                 std::chrono::steady_clock::now() - s0)
                                 .count();
            if (!s.ok()) {
              return absl::Status(
                  s.code(), absl::StrCat(pol.name(), " recall at frame ", f,
                                         ": ", s.message()));
            }
            QueryRow row;
            row.camera = c;
            row.frame = f;
            row.kind = q.kind;
            row.config = static_cast<uint16_t>(ci);
            row.policy = static_cast<uint16_t>(pi);
            // The oracle-fed references' time is not a selection's.
            const bool timed = pi != 0 && pi < first_kvmem + kvmems.size();
            row.latency_us = !timed ? 0.0f : sel.latency_us >= 0 ? sel.latency_us : us;
            row.cold_total = static_cast<float>(cold_total);
            double hit = 0;
            if (sel.head_recalled.empty()) {
              for (const Span& sp : sel.recalled) {
                hit += Sum(t.prefix, sp.begin, sp.end);
                row.injected += static_cast<uint32_t>(sp.size());
              }
            } else {  // Each query head reads its KV head's own set.
              uint64_t tokens = 0;
              for (uint32_t qh = 0; qh < t.query_heads; ++qh) {
                for (const Span& sp : sel.head_recalled[qh / group]) {
                  for (uint64_t i = sp.begin; i < sp.end; ++i) {
                    hit += t.probs[qh][i];
                  }
                }
              }
              hit /= t.query_heads;
              for (const auto& set : sel.head_recalled) {
                for (const Span& sp : set) tokens += sp.size();
              }
              row.injected =
                  static_cast<uint32_t>(tokens / sel.head_recalled.size());
            }
            row.cold_hit = static_cast<float>(hit);
            ScoreOutputs(t, ct, sel, &row);
            row.violations = sel.violations;
            if (q.kind == QueryKind::kProbe && !q.earlier.empty() &&
                q.earlier.back().second <= ws) {
              row.reid = Intersects(sel.recalled, q.earlier) ? 1 : 0;
            }
            // Useless hits: recalled blocks with under 1 % of the mass.
            std::vector<Span> units = sel.units;
            if (units.empty() && !sel.everything) units = sel.recalled;
            if (sel.everything) {  // full: every grid block outside.
              for (uint64_t b = sinks; b < ws; b += cfg.budget.block_tokens) {
                units.push_back(
                    {b, std::min<uint64_t>(ws, b + cfg.budget.block_tokens)});
              }
            }
            uint32_t useless = 0;
            for (const Span& u : units) {
              useless += Sum(t.prefix, std::max(u.begin, sinks),
                             std::min(u.end, n)) < 0.01;
            }
            row.units = static_cast<uint32_t>(units.size());
            row.degraded = sel.degraded_blocks;
            row.useless = useless;
            result.rows.push_back(row);
            pol.Observe(sel, t.pbar, row.mass, ct);
            if (pi == first_kvmem && ci == result.primary &&
                o.record_kvmem_sets) {
              result.kvmem_sets.push_back(sel.recalled);
            }
          }
        }
      }
    }
    // Memory after this frame, summed over cameras.
    MemorySample ms;
    ms.frame = f;
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      for (size_t pi = 0; pi < num_policies; ++pi) {
        uint64_t res = 0, sto = 0;
        for (uint32_t c = 0; c < cams; ++c) {
          res += configs[ci].policies[c][pi]->ResidentTokens(cam[c]) *
                 wl.bytes_per_token();
          sto += configs[ci].policies[c][pi]->StoredBytes(cam[c]);
        }
        resident_peak[ci][pi] = std::max(resident_peak[ci][pi], res);
        stored_peak[ci][pi] = std::max(stored_peak[ci][pi], sto);
        if (ci == result.primary) {
          ms.resident.push_back(res);
          ms.stored.push_back(sto);
        }
      }
    }
    result.memory.push_back(std::move(ms));
    if (o.on_frame) o.on_frame(f + 1, w.frames);
  }
  backend->Settle();

  for (size_t ci = 0; ci < configs.size(); ++ci) {
    ConfigSummary cs;
    cs.window = configs[ci].budget.window;
    cs.recall = configs[ci].budget.recall;
    cs.fraction = configs[ci].fraction;
    for (const std::string& id : configs[ci].kvmem_ids[0]) {
      v1::StreamStats st;
      absl::Status s = backend->Stats(id, &st);
      if (!s.ok()) return s;
      cs.kvmem_rebuilds += st.policy().rebuilds();
      cs.kvmem_blocks += st.sealed_blocks();
    }
    for (size_t pi = 0; pi < num_policies; ++pi) {
      PolicySummary ps = Summarize(result, ci, pi, w.fps, cs.recall);
      ps.resident_bytes_peak = resident_peak[ci][pi];
      ps.stored_bytes_peak = stored_peak[ci][pi];
      cs.policies.push_back(ps);
    }
    result.configs.push_back(std::move(cs));
  }
  if (cold_pool > 0) {
    result.oracle_shared_cold_mass = shared_hit / cold_pool;
    result.oracle_per_head_cold_mass = per_head_hit / cold_pool;
  }
  result.frames = w.frames;
  for (const auto& c : cam) result.tokens += c.tokens;
  for (uint32_t c = 0; c < cams; ++c) result.shots += wl.shots(c);
  result.walks = wl.walks();
  result.rebuild_periods =
      static_cast<double>(result.configs[result.primary].kvmem_rebuilds) / cams;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return result;
}

}  // namespace kvmem

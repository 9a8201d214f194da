#include "client/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/dot.h"

namespace kvmem {
namespace {

constexpr const char* kPolicies[] = {"full", "streaming_llm", "window_lru",
                                     "h2o",  "mean_key_topk", "kvmem"};
constexpr size_t kNumPolicies = sizeof(kPolicies) / sizeof(kPolicies[0]);
constexpr size_t kKvmem = kNumPolicies - 1;

v1::StreamConfig KvmemConfig(const EvalOptions& o, uint32_t window,
                             uint32_t recall) {
  const VideoWorkloadOptions& w = o.workload;
  v1::StreamConfig c;
  auto* g = c.mutable_geometry();
  g->set_layers(w.layers);
  g->set_kv_heads(w.kv_heads);
  g->set_head_dim(w.head_dim);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(w.tokens_per_frame);
  c.set_hot_window_tokens(window);
  c.mutable_block_policy()->set_mode(o.shot_segments ? v1::SEGMENT_MODE_SHOT
                                                     : v1::SEGMENT_MODE_FIXED);
  c.mutable_block_policy()->set_frames_per_block(o.frames_per_block);
  c.mutable_index_policy()->set_groups_per_block(o.groups_per_block);
  c.mutable_index_policy()->set_index_factory(o.index_factory);
  c.mutable_recall_defaults()->set_top_k(o.top_k);
  c.mutable_recall_defaults()->set_max_tokens(std::max<uint32_t>(1, recall));
  auto* t = c.mutable_tier_policy();
  t->set_replacement(v1::REPLACEMENT_POLICY_HEAT);
  t->set_warm_budget_bytes(o.warm_budget_bytes);
  t->set_prefetch_blocks(o.prefetch_blocks);
  // Room to stage the prefetched blocks: prefetch_blocks of the largest.
  t->set_stage_budget_bytes(static_cast<uint64_t>(o.prefetch_blocks) *
                            o.frames_per_block * w.tokens_per_frame * w.layers *
                            2 * w.kv_heads * w.head_dim * 2);
  t->set_rebuild_every_blocks(o.rebuild_every_blocks);
  auto* r = c.mutable_recall_policy();
  r->set_track_weight(o.track_weight);
  r->set_scene_weight(o.scene_weight);
  r->set_iou_weight(o.iou_weight);
  return c;
}

struct Config {
  PolicyBudget budget;
  double fraction = 0;
  // [camera][policy]
  std::vector<std::vector<std::unique_ptr<EvalPolicy>>> policies;
  std::vector<std::string> kvmem_ids;  // Per camera.
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

}  // namespace

double Percentile(std::vector<float> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

void OracleAttention(const CameraTokens& cam, uint64_t tokens,
                     const std::vector<float>& q, uint32_t heads,
                     uint32_t head_dim, std::vector<std::vector<float>>* probs,
                     std::vector<std::vector<double>>* outputs) {
  const size_t d = head_dim, per = cam.per_token;
  const float inv = 1.0f / std::sqrt(static_cast<float>(d));
  probs->resize(heads);
  outputs->assign(heads, std::vector<double>(d, 0.0));
  std::vector<float> acc(d);
  for (uint32_t h = 0; h < heads; ++h) {
    std::vector<float>& p = (*probs)[h];
    p.resize(tokens);
    const float* qh = q.data() + h * d;
    float mx = -INFINITY;
    for (uint64_t i = 0; i < tokens; ++i) {
      p[i] = Dot(qh, cam.keys.data() + i * per + h * d, d) * inv;
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
    for (size_t j = 0; j < d; ++j) (*outputs)[h][j] = acc[j];
  }
}

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
  const uint32_t heads = w.layers * w.kv_heads;
  const uint32_t cams = w.cameras;

  // The kvmem side: one stream per camera and configuration.
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
    for (uint32_t cam = 0; cam < cams; ++cam) {
      std::vector<std::unique_ptr<EvalPolicy>> ps;
      ps.push_back(MakeFullPolicy(c.budget));
      ps.push_back(MakeStreamingLlmPolicy(c.budget));
      ps.push_back(MakeWindowLruPolicy(c.budget));
      ps.push_back(MakeH2oPolicy(c.budget));
      ps.push_back(MakeMeanKeyTopkPolicy(c.budget));
      const std::string id =
          absl::StrFormat("eval-w%u-r%u-cam%u-%u", window, c.budget.recall, cam,
                          static_cast<unsigned>(ci));
      auto k = MakeKvmemPolicy(c.budget, backend.get(), id,
                               KvmemConfig(o, window, c.budget.recall));
      if (!k.ok()) return k.status();
      ps.push_back(std::move(*k));
      c.kvmem_ids.push_back(id);
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
  for (const char* n : kPolicies) result.policy_names.push_back(n);

  std::vector<CameraTokens> cam(cams);
  for (auto& c : cam) {
    c.sink_tokens = w.sink_tokens;
    c.per_token = heads * w.head_dim;
  }
  // Per config and policy: peaks.
  std::vector<std::vector<uint64_t>> resident_peak(
      configs.size(), std::vector<uint64_t>(kNumPolicies, 0));
  auto stored_peak = resident_peak;
  std::vector<std::vector<float>> probs;
  std::vector<std::vector<double>> outs;
  std::vector<double> pbar, prefix;
  std::vector<float> keys, values, acc(w.head_dim);
  std::vector<double> base_mass(heads);
  std::vector<std::vector<double>> base_out(heads);

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
        OracleAttention(ct, n, q.q, heads, w.head_dim, &probs, &outs);
        pbar.assign(n, 0.0);
        for (const auto& p : probs)
          for (uint64_t i = 0; i < n; ++i) pbar[i] += p[i];
        prefix.assign(n + 1, 0.0);
        for (uint64_t i = 0; i < n; ++i) {
          pbar[i] /= heads;
          prefix[i + 1] = prefix[i] + pbar[i];
        }
        uint32_t base_window = UINT32_MAX;
        for (size_t ci = 0; ci < configs.size(); ++ci) {
          Config& cfg = configs[ci];
          const uint64_t ws = cfg.budget.WindowStart(n);
          const uint64_t sinks = std::min<uint64_t>(ct.sink_tokens, n);
          if (cfg.budget.window != base_window) {
            // The sinks and the window, which every bounded policy holds.
            base_window = cfg.budget.window;
            for (uint32_t h = 0; h < heads; ++h) {
              double mass = 0;
              std::fill(acc.begin(), acc.end(), 0.0f);
              auto add = [&](uint64_t i) {
                const float pi = probs[h][i];
                mass += pi;
                Axpy(pi, ct.values.data() + i * ct.per_token + h * w.head_dim,
                     acc.data(), w.head_dim);
              };
              for (uint64_t i = 0; i < sinks; ++i) add(i);
              for (uint64_t i = std::max(ws, sinks); i < n; ++i) add(i);
              base_mass[h] = mass;
              base_out[h].assign(acc.begin(), acc.end());
            }
          }
          const double cold_total = Sum(prefix, sinks, std::max(ws, sinks));
          for (size_t pi = 0; pi < kNumPolicies; ++pi) {
            EvalPolicy& pol = *cfg.policies[c][pi];
            Selection sel;
            const auto s0 = std::chrono::steady_clock::now();
            absl::Status s = pol.Select(q, ct, &sel);
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
            row.latency_us = pi == 0 ? 0.0f : us;
            row.cold_total = static_cast<float>(cold_total);
            double hit = 0;
            for (const Span& sp : sel.recalled) {
              hit += Sum(prefix, sp.begin, sp.end);
              row.injected += static_cast<uint32_t>(sp.size());
            }
            row.cold_hit = static_cast<float>(hit);
            double mass = 0, cos_sum = 0, rel_sum = 0;
            for (uint32_t h = 0; h < heads; ++h) {
              const std::vector<double>& ref = outs[h];
              double m = 1.0;
              std::vector<double> y = ref;
              if (!sel.everything) {
                m = base_mass[h];
                std::fill(acc.begin(), acc.end(), 0.0f);
                for (const Span& sp : sel.recalled) {
                  for (uint64_t i = sp.begin; i < sp.end; ++i) {
                    const float p = probs[h][i];
                    m += p;
                    Axpy(p,
                         ct.values.data() + i * ct.per_token + h * w.head_dim,
                         acc.data(), w.head_dim);
                  }
                }
                for (size_t j = 0; j < w.head_dim; ++j) {
                  y[j] = (base_out[h][j] + acc[j]) / std::max(m, 1e-30);
                }
              }
              mass += m;
              double dot = 0, ny = 0, nr = 0, diff = 0;
              for (size_t j = 0; j < w.head_dim; ++j) {
                dot += y[j] * ref[j];
                ny += y[j] * y[j];
                nr += ref[j] * ref[j];
                diff += (y[j] - ref[j]) * (y[j] - ref[j]);
              }
              cos_sum += dot / std::max(std::sqrt(ny * nr), 1e-30);
              rel_sum += std::sqrt(diff) / std::max(std::sqrt(nr), 1e-30);
            }
            row.mass = static_cast<float>(mass / heads);
            row.cosine = static_cast<float>(cos_sum / heads);
            row.rel_error = static_cast<float>(rel_sum / heads);
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
              useless += Sum(prefix, std::max(u.begin, sinks),
                             std::min(u.end, n)) < 0.01;
            }
            row.units = static_cast<uint32_t>(units.size());
            row.degraded = sel.degraded_blocks;
            row.useless = useless;
            result.rows.push_back(row);
            pol.Observe(sel, pbar, row.mass, ct);
            if (pi == kKvmem && ci == result.primary && o.record_kvmem_sets) {
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
      for (size_t pi = 0; pi < kNumPolicies; ++pi) {
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
    for (const std::string& id : configs[ci].kvmem_ids) {
      v1::StreamStats st;
      absl::Status s = backend->Stats(id, &st);
      if (!s.ok()) return s;
      cs.kvmem_rebuilds += st.policy().rebuilds();
      cs.kvmem_blocks += st.sealed_blocks();
    }
    for (size_t pi = 0; pi < kNumPolicies; ++pi) {
      PolicySummary ps;
      ps.name = kPolicies[pi];
      double cold_hit[2] = {0, 0}, cold_total[2] = {0, 0};
      uint64_t reid_ok = 0, units = 0, useless = 0, injected = 0;
      std::vector<float> lat;
      std::map<uint64_t, std::vector<float>> buckets;  // 10 s of video each.
      const uint64_t bucket_frames =
          std::max<uint64_t>(1, static_cast<uint64_t>(10 * w.fps));
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
      const double nq = std::max<uint64_t>(1, ps.queries);
      ps.mass_recalled /= nq;
      ps.output_cosine /= nq;
      ps.output_rel_error /= nq;
      auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      ps.cold_mass_recalled =
          ratio(cold_hit[0] + cold_hit[1], cold_total[0] + cold_total[1]);
      ps.cold_mass_recalled_frame = ratio(cold_hit[0], cold_total[0]);
      ps.cold_mass_recalled_probe = ratio(cold_hit[1], cold_total[1]);
      ps.reid_success = ratio(reid_ok, ps.reid_probes);
      ps.recalled_units = units;
      ps.useless_hit_rate = ratio(useless, units);
      ps.injected_tokens_mean = injected / nq;
      ps.resident_bytes_peak = resident_peak[ci][pi];
      ps.stored_bytes_peak = stored_peak[ci][pi];
      ps.recall_p50_us = Percentile(lat, 0.50);
      ps.recall_p99_us = Percentile(lat, 0.99);
      ps.recall_p999_us = Percentile(lat, 0.999);
      cs.policies.push_back(ps);
    }
    result.configs.push_back(std::move(cs));
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

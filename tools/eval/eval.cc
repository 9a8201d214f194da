#include "tools/eval/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/index/dot.h"
#include "tools/eval/eval_metrics.h"

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
  c.mutable_block_policy()->set_mode(
      static_cast<v1::SegmentMode>(k.segment_mode));
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
            row.latency_us = !timed                ? 0.0f
                             : sel.latency_us >= 0 ? sel.latency_us
                                                   : us;
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

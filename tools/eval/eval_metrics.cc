#include "tools/eval/eval_metrics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "base/percentile.h"
#include "engine/index/dot.h"

namespace kvmem {
namespace {

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

double Sum(const std::vector<double>& prefix, uint64_t b, uint64_t e) {
  return e > b ? prefix[e] - prefix[b] : 0.0;
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

struct OutputErrors {
  double mass = 0, cosine = 0, rel = 0, gated_cosine = 0, gated_rel = 0;
};

// Output errors of a selection, summed over query heads. Recalled tokens are
// read from `cam`, or with `int8` as the int8 tier returns them: their
// values from it, and their attention weights p_i * exp((q . k~_i - q .
// k_i) / sqrt(d)), i.e. the logits of their int8 keys under the full
// softmax's normaliser (the sinks and the window stay exact).
OutputErrors Outputs(const QueryTruth& t, const CameraTokens& cam,
                     const CameraTokens* int8, const Selection& sel) {
  const size_t d = t.head_dim;
  const double inv = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> acc(d);
  std::vector<double> y(d);
  const bool gated = sel.estimated_mass >= 0 && !sel.unit_gates.empty();
  const double G = std::clamp<double>(sel.estimated_mass, 0.0, 1.0);
  OutputErrors out;
  for (uint32_t qh = 0; qh < t.query_heads; ++qh) {
    const std::vector<double>& ref = t.outs[qh];
    const std::vector<float>& p = t.probs[qh];
    const size_t kvh = qh / t.group;
    const CameraTokens& read = int8 != nullptr ? *int8 : cam;
    const float* values = read.values.data() + kvh * d;
    const float* q =
        int8 != nullptr ? (*t.q_heads)[qh % t.group].data() + kvh * d : nullptr;
    const std::vector<Span>& recalled =
        sel.head_recalled.empty() ? sel.recalled : sel.head_recalled[kvh];
    auto attend = [&](const std::vector<Span>& spans, double* m) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      *m = 0;
      for (const Span& sp : spans) {
        for (uint64_t i = sp.begin; i < sp.end; ++i) {
          float w = p[i];
          if (q != nullptr) {
            const size_t at = i * cam.per_token + kvh * d;
            const double shift = Dot(q, int8->keys.data() + at, d) -
                                 Dot(q, cam.keys.data() + at, d);
            w = static_cast<float>(w * std::exp(shift * inv));
          }
          *m += w;
          Axpy(w, values + i * cam.per_token, acc.data(), d);
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
    out.mass += m;
    double c, r;
    Compare(y, ref, &c, &r);
    out.cosine += c;
    out.rel += r;
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
      out.gated_cosine += c;
      out.gated_rel += r;
    }
  }
  return out;
}

}  // namespace

void ScoreOutputs(const QueryTruth& t, const CameraTokens& cam,
                  const CameraTokens* int8, const CameraTokens* int4,
                  const Selection& sel, QueryRow* row) {
  const OutputErrors e = Outputs(t, cam, nullptr, sel);
  const double n = t.query_heads;
  row->mass = static_cast<float>(e.mass / n);
  row->cosine = static_cast<float>(e.cosine / n);
  row->rel_error = static_cast<float>(e.rel / n);
  const bool gated = sel.estimated_mass >= 0 && !sel.unit_gates.empty();
  if (gated) {
    row->gated_cosine = static_cast<float>(e.gated_cosine / n);
    row->gated_rel_error = static_cast<float>(e.gated_rel / n);
    row->estimated_mass = sel.estimated_mass;
  }
  auto lossy = [&](const CameraTokens* tier, float* rel, float* gated_rel) {
    if (tier != nullptr && t.q_heads != nullptr && !sel.everything) {
      const OutputErrors q = Outputs(t, cam, tier, sel);
      *rel = static_cast<float>(q.rel / n);
      *gated_rel = static_cast<float>(q.gated_rel / n);
    } else {
      *rel = row->rel_error;
      *gated_rel = row->gated_rel_error;
    }
  };
  lossy(int8, &row->int8_rel_error, &row->int8_gated_rel_error);
  lossy(int4, &row->int4_rel_error, &row->int4_gated_rel_error);
}

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
    ps.int8_output_rel_error += r.int8_rel_error;
    ps.int4_output_rel_error += r.int4_rel_error;
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
      ps.int8_gated_output_rel_error += r.int8_gated_rel_error;
      ps.int4_gated_output_rel_error += r.int4_gated_rel_error;
      ps.estimated_mass += r.estimated_mass;
    }
    ps.query_tokens_mean += r.query_tokens;
    ps.track_tokens_mean += r.track_tokens;
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
  ps.int8_output_rel_error /= nq;
  ps.int4_output_rel_error /= nq;
  ps.query_tokens_mean /= nq;
  ps.track_tokens_mean /= nq;
  ps.gated_output_cosine = ratio(ps.gated_output_cosine, gated);
  ps.gated_output_rel_error = ratio(ps.gated_output_rel_error, gated);
  ps.int8_gated_output_rel_error = ratio(ps.int8_gated_output_rel_error, gated);
  ps.int4_gated_output_rel_error = ratio(ps.int4_gated_output_rel_error, gated);
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

}  // namespace kvmem

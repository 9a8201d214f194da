// The video workload's queries (video_workload.h): frame queries and
// re-identification probes, per query head.
#include <random>

#include "tools/eval/video_workload.h"
#include "tools/eval/video_workload_internal.h"

namespace kvmem {

using namespace video_internal;  // NOLINT: the workload's own internals.

std::vector<WorkloadQuery> VideoWorkload::Queries(
    uint32_t camera, uint64_t f, const WorkloadFrame& frame) const {
  const Impl& m = *impl_;
  const size_t L = latent_dim(), d = o_.head_dim, T = o_.tokens_per_frame;
  const uint64_t position = (f + 1) * T;
  std::mt19937_64 rng(Seed(o_.seed, kQuery, camera, f));
  const uint32_t g = o_.query_heads_per_kv;
  // Query head j of every KV head reads latent xs[j] (pulled toward the
  // sinks) at its own logit scale; q is the mean over each group.
  auto make_q = [&](std::vector<std::vector<float>> xs, WorkloadQuery* q) {
    q->q_heads.clear();
    for (uint32_t j = 0; j < g; ++j) {
      std::vector<float>& x = xs[j];
      for (auto& e : x) e *= 1.0f - o_.sink_pull;
      AddScaled(&x, m.sink, o_.sink_pull);
      Normalize(&x);
      std::vector<float> qj;
      qj.reserve(summary_dim());
      for (size_t lh = 0; lh < m.a.size(); ++lh) {
        const std::vector<float>& a = m.a[lh];
        const float scale =
            m.qscale[lh * g + j] * std::sqrt(static_cast<float>(d));
        std::vector<float> y(d, 0.0f);
        for (size_t r = 0; r < d; ++r) {
          for (size_t c = 0; c < L; ++c) y[r] += a[r * L + c] * x[c];
          y[r] *= scale;
        }
        Rope(y.data(), d, static_cast<double>(position), m.theta);
        qj.insert(qj.end(), y.begin(), y.end());
      }
      q->q_heads.push_back(std::move(qj));
    }
    q->q.assign(summary_dim(), 0.0f);
    for (const auto& qj : q->q_heads) AddScaled(&q->q, qj, 1.0f / g);
  };
  std::vector<WorkloadQuery> out;
  if (f % o_.query_every == 0) {
    // A frame query: a random token of the frame, re-derived from its key's
    // latent (its key without RoPE is not kept, so rebuild from the frame's
    // content: the place or object the token shows).
    // With grouped-query heads, each query head of a group reads its own
    // random token.
    std::uniform_int_distribution<size_t> slot(0, T - 1);
    std::vector<std::vector<float>> xs;
    for (uint32_t j = 0; j < g; ++j) {
      const size_t s = slot(rng);
      std::vector<float> x;
      const int ob = frame.token_object[s];
      if (ob >= 0) {
        x = m.object[ob];
        for (auto& e : x) e *= 0.85f;
        AddScaled(&x, m.part[(T - 1 - s) % o_.object_tokens], 0.3f);
      } else if (ob == -2) {
        x = m.sink;
      } else {
        x = m.place[frame.place];
        for (auto& e : x) e *= 0.85f;
        AddScaled(&x, m.patch[s], 0.35f);
      }
      Normalize(&x);
      xs.push_back(std::move(x));
    }
    WorkloadQuery q;
    q.kind = QueryKind::kFrame;
    q.frame = f;
    q.position = position;
    make_q(std::move(xs), &q);
    q.signals = frame.frame.header.signals();
    out.push_back(std::move(q));
  }
  // Probes: an object enters this camera again after an earlier visit here.
  for (uint32_t ob = 0; ob < o_.objects; ++ob) {
    const auto& vs = m.visits[ob];
    for (size_t i = 0; i < vs.size(); ++i) {
      if (vs[i].camera != camera || vs[i].begin != f) continue;
      WorkloadQuery q;
      for (size_t j = 0; j < i; ++j) {
        if (vs[j].camera != camera) continue;
        // Its token positions: the object's slots in each frame of the visit
        // where it was in view.
        for (uint64_t g = vs[j].begin; g < vs[j].end; ++g) {
          const auto in = InView(o_, m.visits, camera, g);
          for (size_t k = 0; k < in.size(); ++k) {
            if (in[k].first != static_cast<int>(ob)) continue;
            const uint64_t hi = g * T + T - k * o_.object_tokens;
            q.earlier.emplace_back(hi - o_.object_tokens, hi);
          }
        }
      }
      if (q.earlier.empty()) continue;
      q.kind = QueryKind::kProbe;
      q.frame = f;
      q.position = position;
      q.object = static_cast<int>(ob);
      make_q(std::vector<std::vector<float>>(g, m.object[ob]), &q);
      for (const auto& det : frame.frame.header.signals().detections()) {
        if (det.track_id() == ob + 1u) *q.signals.add_detections() = det;
      }
      out.push_back(std::move(q));
    }
  }
  return out;
}

}  // namespace kvmem

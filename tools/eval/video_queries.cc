// The video workload's queries (video_workload.h): frame queries and
// re-identification probes, per query head.
#include <random>

#include "tools/eval/video_workload.h"
#include "tools/eval/video_workload_internal.h"

namespace kvmem {

using namespace video_internal;  // NOLINT: the workload's own internals.

void VideoWorkload::Impl::QueryHeads(const VideoWorkloadOptions& o, size_t L,
                                     size_t summary_dim, uint64_t position,
                                     std::vector<std::vector<float>> xs,
                                     WorkloadQuery* q) const {
  // Query head j of every KV head reads latent xs[j] (pulled toward the
  // sinks) at its own logit scale; q is the mean over each group.
  const size_t d = o.head_dim;
  const uint32_t g = o.query_heads_per_kv;
  q->q_heads.clear();
  for (uint32_t j = 0; j < g; ++j) {
    std::vector<float>& x = xs[j];
    for (auto& e : x) e *= 1.0f - o.sink_pull;
    AddScaled(&x, sink, o.sink_pull);
    Normalize(&x);
    std::vector<float> qj;
    qj.reserve(summary_dim);
    for (size_t lh = 0; lh < a.size(); ++lh) {
      const std::vector<float>& ah = a[lh];
      const float scale = qscale[lh * g + j] * std::sqrt(static_cast<float>(d));
      std::vector<float> y(d, 0.0f);
      for (size_t r = 0; r < d; ++r) {
        for (size_t c = 0; c < L; ++c) y[r] += ah[r * L + c] * x[c];
        y[r] *= scale;
      }
      Rope(y.data(), d, static_cast<double>(position), theta);
      qj.insert(qj.end(), y.begin(), y.end());
    }
    q->q_heads.push_back(std::move(qj));
  }
  q->q.assign(summary_dim, 0.0f);
  for (const auto& qj : q->q_heads) AddScaled(&q->q, qj, 1.0f / g);
}

std::vector<float> VideoWorkload::Impl::TokenLatent(
    const VideoWorkloadOptions& o, const WorkloadFrame& frame, size_t s) const {
  // Its key without RoPE is not kept: rebuild from the frame's content, the
  // place or object the token shows.
  const size_t T = o.tokens_per_frame;
  std::vector<float> x;
  const int ob = frame.token_object[s];
  if (ob >= 0) {
    x = object[ob];
    for (auto& e : x) e *= 0.85f;
    AddScaled(&x, part[(T - 1 - s) % o.object_tokens], 0.3f);
  } else if (ob == -2) {
    x = sink;
  } else {
    x = place[frame.place];
    for (auto& e : x) e *= 0.85f;
    AddScaled(&x, patch[s], 0.35f);
  }
  Normalize(&x);
  return x;
}

void VideoWorkload::Impl::Probes(const VideoWorkloadOptions& o, size_t L,
                                 size_t summary_dim, uint32_t camera,
                                 uint64_t f, const WorkloadFrame& frame,
                                 std::vector<WorkloadQuery>* out) const {
  // Probes: an object enters this camera again after an earlier visit here.
  const size_t T = o.tokens_per_frame;
  const uint64_t position = (f + 1) * T;
  for (uint32_t ob = 0; ob < o.objects; ++ob) {
    const auto& vs = visits[ob];
    for (size_t i = 0; i < vs.size(); ++i) {
      if (vs[i].camera != camera || vs[i].begin != f) continue;
      WorkloadQuery q;
      for (size_t j = 0; j < i; ++j) {
        if (vs[j].camera != camera) continue;
        // Its token positions: the object's slots in each frame of the visit
        // where it was in view.
        for (uint64_t g = vs[j].begin; g < vs[j].end; ++g) {
          const auto in = InView(o, visits, camera, g);
          for (size_t k = 0; k < in.size(); ++k) {
            if (in[k].first != static_cast<int>(ob)) continue;
            const uint64_t hi = g * T + T - k * o.object_tokens;
            q.earlier.emplace_back(hi - o.object_tokens, hi);
          }
        }
      }
      if (q.earlier.empty()) continue;
      q.kind = QueryKind::kProbe;
      q.frame = f;
      q.position = position;
      q.object = static_cast<int>(ob);
      QueryHeads(
          o, L, summary_dim, position,
          std::vector<std::vector<float>>(o.query_heads_per_kv, object[ob]),
          &q);
      for (const auto& det : frame.frame.header.signals().detections()) {
        if (det.track_id() == ob + 1u) *q.signals.add_detections() = det;
      }
      out->push_back(std::move(q));
    }
  }
}

std::vector<WorkloadQuery> VideoWorkload::Queries(
    uint32_t camera, uint64_t f, const WorkloadFrame& frame) const {
  const Impl& m = *impl_;
  const size_t L = latent_dim(), T = o_.tokens_per_frame;
  const uint64_t position = (f + 1) * T;
  std::mt19937_64 rng(Seed(o_.seed, kQuery, camera, f));
  std::vector<WorkloadQuery> out;
  if (f % o_.query_every == 0) {
    // A frame query: a random token of the frame, re-derived from its
    // latent. With grouped-query heads, each query head of a group reads its
    // own random token.
    std::uniform_int_distribution<size_t> slot(0, T - 1);
    std::vector<std::vector<float>> xs;
    for (uint32_t j = 0; j < o_.query_heads_per_kv; ++j) {
      xs.push_back(m.TokenLatent(o_, frame, slot(rng)));
    }
    WorkloadQuery q;
    q.kind = QueryKind::kFrame;
    q.frame = f;
    q.position = position;
    m.QueryHeads(o_, L, summary_dim(), position, std::move(xs), &q);
    q.signals = frame.frame.header.signals();
    out.push_back(std::move(q));
  }
  m.Probes(o_, L, summary_dim(), camera, f, frame, &out);
  return out;
}

}  // namespace kvmem

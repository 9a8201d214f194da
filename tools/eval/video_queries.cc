// The video workload's queries (video_workload.h): frame queries and
// re-identification probes, per query head.
#include <algorithm>
#include <random>

#include "tools/eval/video_workload.h"
#include "tools/eval/video_workload_internal.h"

namespace kvmem {

using namespace video_internal;  // NOLINT: the workload's own internals.

void VideoWorkload::Impl::QueryHeads(const VideoWorkloadOptions& o, size_t L,
                                     size_t summary_dim, uint64_t position,
                                     std::vector<std::vector<float>> xs,
                                     WorkloadQuery* q) const {
  // Vector v is query head v % g of every KV head, reading latent xs[v]
  // (pulled toward the sinks) at that head's logit scale; q is the mean
  // over all of them.
  const size_t d = o.head_dim;
  const uint32_t g = o.query_heads_per_kv;
  q->q_heads.clear();
  for (size_t v = 0; v < xs.size(); ++v) {
    const size_t j = v % g;
    std::vector<float>& x = xs[v];
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
  q->q = MeanQueryVector(q->q_heads, summary_dim);
}

std::vector<float> VideoWorkload::Impl::TokenLatent(
    const VideoWorkloadOptions& o, const WorkloadFrame& frame, size_t s) const {
  // Its key without RoPE is not kept: rebuild from the frame's content, the
  // place or object the token shows.
  const size_t T = o.tokens_per_frame;
  std::vector<float> x;
  const int ob = frame.token_object[s];
  if (ob >= 0) {
    const uint32_t j = static_cast<uint32_t>((T - 1 - s) % o.object_tokens);
    x = object[ob];
    for (auto& e : x) e *= 0.85f;
    AddScaled(&x, part[j], 0.3f);
    if (o.appearance_change > 0) {
      AddScaled(&x, Appearance(o, x.size(), ob, frame.token_visit[s], j),
                o.appearance_change);
    }
  } else if (frame.token_texture[s] >= 0) {
    x = texture[frame.token_texture[s]];
    AddScaled(&x, patch[s], 0.25f);
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

std::vector<std::pair<uint64_t, uint64_t>> VideoWorkload::Impl::Earlier(
    const VideoWorkloadOptions& o, uint32_t camera, uint32_t ob,
    size_t i) const {
  const size_t T = o.tokens_per_frame;
  const auto& vs = visits[ob];
  std::vector<std::pair<uint64_t, uint64_t>> earlier;
  for (size_t j = 0; j < i; ++j) {
    if (vs[j].camera != camera) continue;
    // Its token positions: the object's slots in each frame of the visit
    // where it was in view.
    for (uint64_t g = vs[j].begin; g < vs[j].end; ++g) {
      const auto in = InView(o, visits, camera, g);
      for (size_t k = 0; k < in.size(); ++k) {
        if (in[k].first != static_cast<int>(ob)) continue;
        const uint64_t hi = g * T + T - k * o.object_tokens;
        earlier.emplace_back(hi - o.object_tokens, hi);
      }
    }
  }
  return earlier;
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
      q.earlier = Earlier(o, camera, ob, i);
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

void VideoWorkload::Impl::FrameQuery(const VideoWorkloadOptions& o, size_t L,
                                     size_t summary_dim, uint32_t camera,
                                     uint64_t f, const WorkloadFrame& frame,
                                     std::vector<WorkloadQuery>* out) const {
  const size_t T = o.tokens_per_frame;
  WorkloadQuery q;
  q.kind = QueryKind::kFrame;
  q.frame = f;
  q.position = (f + 1) * T;
  // The first object re-entering this camera at f makes it a probe.
  for (uint32_t ob = 0; ob < o.objects && q.kind == QueryKind::kFrame; ++ob) {
    const auto& vs = visits[ob];
    for (size_t i = 0; i < vs.size(); ++i) {
      if (vs[i].camera != camera || vs[i].begin != f) continue;
      // Only an object in view (at most max_objects_per_frame are).
      if (std::find(frame.token_object.begin(), frame.token_object.end(),
                    static_cast<int>(ob)) == frame.token_object.end()) {
        continue;
      }
      q.earlier = Earlier(o, camera, ob, i);
      if (q.earlier.empty()) continue;
      q.kind = QueryKind::kProbe;
      q.object = static_cast<int>(ob);
      break;
    }
  }
  if (q.kind == QueryKind::kFrame && f % o.query_every != 0) return;
  // The tokens read: a probe's object first, then random others.
  std::vector<size_t> slots, rest;
  for (size_t s = 0; s < T; ++s) {
    (q.object >= 0 && frame.token_object[s] == q.object ? slots : rest)
        .push_back(s);
  }
  std::mt19937_64 rng(Seed(o.seed, kQuery, camera, f));
  std::shuffle(rest.begin(), rest.end(), rng);
  slots.insert(slots.end(), rest.begin(), rest.end());
  slots.resize(o.frame_query_tokens);
  std::vector<std::vector<float>> xs;
  for (size_t s : slots) {
    for (uint32_t j = 0; j < o.query_heads_per_kv; ++j) {
      xs.push_back(TokenLatent(o, frame, s));
    }
  }
  QueryHeads(o, L, summary_dim, q.position, std::move(xs), &q);
  q.signals = frame.frame.header.signals();
  out->push_back(std::move(q));
}

std::vector<WorkloadQuery> VideoWorkload::Queries(
    uint32_t camera, uint64_t f, const WorkloadFrame& frame) const {
  const Impl& m = *impl_;
  const size_t L = latent_dim(), T = o_.tokens_per_frame;
  const uint64_t position = (f + 1) * T;
  std::vector<WorkloadQuery> out;
  if (o_.frame_query_tokens > 0) {
    m.FrameQuery(o_, L, summary_dim(), camera, f, frame, &out);
    return out;
  }
  std::mt19937_64 rng(Seed(o_.seed, kQuery, camera, f));
  if (f % o_.query_every == 0) {
    // A frame query: a random token of the frame, re-derived from its
    // latent. With grouped-query heads, each query head of a group reads its
    // own random token; with recurring textures, half of the frame queries
    // read a texture patch.
    std::uniform_int_distribution<size_t> slot(0, T - 1);
    std::vector<size_t> textured;
    for (size_t s = 0; s < T; ++s) {
      if (frame.token_texture[s] >= 0) textured.push_back(s);
    }
    std::vector<std::vector<float>> xs;
    for (uint32_t j = 0; j < o_.query_heads_per_kv; ++j) {
      size_t s = slot(rng);
      if (!textured.empty() && (rng() & 1))
        s = textured[rng() % textured.size()];
      xs.push_back(m.TokenLatent(o_, frame, s));
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

#include "tools/eval/video_workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/codec/dtype.h"
#include "engine/index/dot.h"
#include "tools/eval/video_workload_internal.h"

namespace kvmem {

using namespace video_internal;  // NOLINT: this file's own internals.

namespace {

// `count` orthonormal vectors of length n: Gram-Schmidt on gen(0), gen(1)...
template <typename Gen>
std::vector<std::vector<float>> Orthonormal(size_t n, uint32_t count, Gen gen) {
  std::vector<std::vector<float>> basis;
  for (uint32_t i = 0; i < count; ++i) {
    std::vector<float> v = gen(i);
    for (const auto& u : basis) {
      double dot = 0;
      for (size_t j = 0; j < n; ++j) dot += static_cast<double>(u[j]) * v[j];
      AddScaled(&v, u, static_cast<float>(-dot));
    }
    Normalize(&v);
    basis.push_back(std::move(v));
  }
  return basis;
}

// The rows of a (rows x n) restricted to a random rank-dimensional subspace
// of R^n, rescaled by sqrt(n / rank) so their norms stay about the same.
std::vector<float> ProjectRows(const std::vector<float>& a, size_t rows,
                               size_t n, size_t rank, uint64_t seed) {
  const auto u = Orthonormal(n, static_cast<uint32_t>(rank), [&](uint32_t i) {
    return Gaussian(SplitMix64(seed + i), n, 1.0f);
  });
  const float gain = static_cast<float>(std::sqrt(double(n) / rank));
  std::vector<float> out(rows * n, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = a.data() + r * n;
    float* dst = out.data() + r * n;
    for (const auto& uk : u) {
      const float c = gain * Dot(row, uk.data(), n);
      for (size_t j = 0; j < n; ++j) dst[j] += c * uk[j];
    }
  }
  return out;
}

}  // namespace

namespace video_internal {

std::vector<std::pair<int, const Visit*>> InView(
    const VideoWorkloadOptions& o,
    const std::vector<std::vector<Visit>>& visits, uint32_t camera,
    uint64_t f) {
  std::vector<std::pair<int, const Visit*>> in;
  for (uint32_t ob = 0; ob < visits.size(); ++ob) {
    for (const Visit& v : visits[ob]) {
      if (v.camera != camera || f < v.begin || f >= v.end) continue;
      std::mt19937_64 rng(Seed(o.seed, kOcclude, ob, f, camera));
      const bool edge = f == v.begin;  // Never occluded as it enters.
      if (edge || std::uniform_real_distribution<double>(0, 1)(rng) >=
                      o.occlusion_probability) {
        in.emplace_back(ob, &v);
      }
    }
  }
  std::sort(in.begin(), in.end(), [](const auto& x, const auto& y) {
    return x.second->begin != y.second->begin
               ? x.second->begin < y.second->begin
               : x.first < y.first;
  });
  if (in.size() > o.max_objects_per_frame) in.resize(o.max_objects_per_frame);
  return in;
}

void Rope(float* y, size_t d, double position,
          const std::vector<double>& theta) {
  for (size_t i = 0; i < d / 2; ++i) {
    const double ang = position * theta[i];
    const float cs = static_cast<float>(std::cos(ang));
    const float sn = static_cast<float>(std::sin(ang));
    const float a0 = y[2 * i], a1 = y[2 * i + 1];
    y[2 * i] = a0 * cs - a1 * sn;
    y[2 * i + 1] = a0 * sn + a1 * cs;
  }
}

}  // namespace video_internal

namespace {
// Orthonormal latent directions the workload needs: the sink, the places,
// the objects and, with look-alike identities, one per object class.
uint32_t EntityDirections(const VideoWorkloadOptions& o) {
  return 1 + o.places + o.objects + (o.lookalike > 0 ? o.object_classes : 0) +
         o.textures;
}

// The next absence of an object, in seconds.
double DrawGap(const VideoWorkloadOptions& o, std::mt19937_64& rng) {
  using Gaps = VideoWorkloadOptions::Gaps;
  if (o.gaps == Gaps::kUniform) {
    return std::uniform_real_distribution<double>(o.gap_min_s,
                                                  o.gap_max_s)(rng);
  }
  if (o.gaps == Gaps::kPareto) {
    // Inverse CDF of Pareto(scale gap_min_s, shape alpha), capped.
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::min(o.gap_max_s,
                    o.gap_min_s / std::pow(1 - u, 1 / o.gap_pareto_alpha));
  }
  return LogUniform(rng, o.gap_min_s, o.gap_max_s);
}

// The detection of object ob at frame f of its visit v: a box drifting
// across the view during the visit.
void AddDetection(uint64_t seed, int ob, const Visit& v, uint64_t f,
                  v1::Detection* det) {
  std::mt19937_64 box_rng(Seed(seed, kBox, ob, v.serial));
  std::uniform_real_distribution<float> u(0.05f, 0.6f);
  const float x0 = u(box_rng), y0 = u(box_rng);
  const float w = 0.1f + 0.25f * (u(box_rng) - 0.05f);
  const float drift =
      0.3f * static_cast<float>(f - v.begin) /
      static_cast<float>(std::max<uint64_t>(1, v.end - v.begin));
  det->set_track_id(static_cast<uint64_t>(ob) + 1);
  det->set_class_id(static_cast<uint32_t>(ob % 3));
  det->set_x_min(std::min(x0 + drift, 1.0f - w));
  det->set_y_min(y0);
  det->set_x_max(std::min(x0 + drift, 1.0f - w) + w);
  det->set_y_max(std::min(1.0f, y0 + w * 1.5f));
  det->set_score(0.9f);
}
}  // namespace

uint32_t VideoWorkload::latent_dim() const {
  return o_.latent_dim != 0 ? o_.latent_dim
                            : std::max(o_.head_dim, EntityDirections(o_));
}

std::string CheckVideoWorkloadOptions(const VideoWorkloadOptions& o) {
  if (o.cameras < 1 || o.cameras > 64) return "--cameras must be in [1, 64]";
  if (o.frames < 2) return "--frames must be at least 2";
  if (!(o.fps > 0)) return "--fps must be > 0";
  if (o.head_dim < 2 || o.head_dim % 2 != 0)
    return "--head_dim must be even and >= 2";
  if (o.layers < 1 || o.kv_heads < 1) return "--layers and --kv_heads >= 1";
  if (o.tokens_per_frame < 1 || o.tokens_per_frame > 4096)
    return "--tokens_per_frame must be in [1, 4096]";
  if (o.sink_tokens > o.tokens_per_frame)
    return "--sink_tokens must be at most --tokens_per_frame";
  if (o.object_tokens < 1 ||
      static_cast<uint64_t>(o.object_tokens) * o.max_objects_per_frame >
          o.tokens_per_frame - o.sink_tokens) {
    return "--object_tokens * --max_objects_per_frame must fit in a frame "
           "beside the sinks";
  }
  if (o.places < 1 || o.places_per_camera < 1 ||
      o.places_per_camera > o.places) {
    return "--places_per_camera must be in [1, --places]";
  }
  const uint32_t entities = EntityDirections(o);
  if (o.latent_dim != 0 && entities > o.latent_dim) {
    return absl::StrCat("1 + --places + --objects",
                        o.lookalike > 0 ? " + --object_classes" : "",
                        o.textures > 0 ? " + --textures" : "", " (", entities,
                        ") must be at most --latent_dim (", o.latent_dim, ")");
  }
  if (o.query_heads_per_kv < 1 || o.query_heads_per_kv > 64) {
    return "--query_heads_per_kv must be in [1, 64]";
  }
  if (!(o.head_subspace > 0 && o.head_subspace <= 1)) {
    return "--head_subspace must be in (0, 1]";
  }
  if (!(o.sharp_head_fraction >= 0 && o.sharp_head_fraction <= 1)) {
    return "--sharp_head_fraction must be in [0, 1]";
  }
  if (!(o.diffuse_scale > 0 && std::isfinite(o.diffuse_scale))) {
    return "--diffuse_scale must be > 0";
  }
  if (!(o.lookalike >= 0 && o.lookalike < 1) || o.object_classes < 1) {
    return "--lookalike must be in [0, 1) and --object_classes >= 1";
  }
  if (!(o.gap_pareto_alpha > 0 && std::isfinite(o.gap_pareto_alpha))) {
    return "--gap_pareto_alpha must be > 0";
  }
  if (!(o.shot_min_s > 0 && o.shot_max_s >= o.shot_min_s && o.visit_min_s > 0 &&
        o.visit_max_s >= o.visit_min_s && o.gap_min_s > 0 &&
        o.gap_max_s >= o.gap_min_s)) {
    return "shot/visit/gap durations need 0 < min <= max";
  }
  if (!(o.rope_base > 1)) return "--rope_base must be > 1";
  if (!(o.query_scale > 0)) return "--query_scale must be > 0";
  if (!(o.sink_pull >= 0 && o.sink_pull < 1)) return "--sink_pull in [0, 1)";
  if (o.query_every < 1) return "--query_every must be >= 1";
  if (o.scene_dim < 1) return "--scene_dim must be >= 1";
  if (!(o.walk_probability >= 0 && o.walk_probability <= 1 &&
        o.occlusion_probability >= 0 && o.occlusion_probability <= 1)) {
    return "--walk_probability and --occlusion_probability must be in [0, 1]";
  }
  if (!(o.frame_noise >= 0 && std::isfinite(o.frame_noise))) {
    return "--frame_noise must be >= 0";
  }
  if (!std::isfinite(o.low_freq_bias)) return "--low_freq_bias must be finite";
  if (o.frame_query_tokens > o.tokens_per_frame) {
    return "--frame_query_tokens must be at most --tokens_per_frame";
  }
  if (static_cast<uint64_t>(o.query_heads_per_kv) *
          std::max<uint32_t>(1, o.frame_query_tokens) >
      1024) {
    return "--frame_query_tokens x --query_heads_per_kv must be at most 1024";
  }
  if (o.frame_query_tokens > 0 && o.frame_query_tokens < o.object_tokens) {
    return "--frame_query_tokens must be 0 or at least --object_tokens";
  }
  if (!(o.appearance_change >= 0 && std::isfinite(o.appearance_change))) {
    return "--appearance_change must be >= 0";
  }
  if ((o.textures == 0) != (o.texture_tokens == 0)) {
    return "--textures and --texture_tokens are both 0 or both > 0";
  }
  if (static_cast<uint64_t>(o.texture_tokens) +
          static_cast<uint64_t>(o.object_tokens) * o.max_objects_per_frame >
      o.tokens_per_frame - o.sink_tokens) {
    return "--texture_tokens + --object_tokens * --max_objects_per_frame "
           "must fit in a frame beside the sinks";
  }
  return "";
}

VideoWorkload::VideoWorkload(const VideoWorkloadOptions& options)
    : o_(options), impl_(std::make_unique<Impl>()) {
  impl_->BuildEntities(o_, latent_dim());
  impl_->BuildProjections(o_, latent_dim());
  impl_->BuildQueryHeads(o_, latent_dim());
  impl_->BuildShots(o_);
  impl_->BuildVisits(o_);
}

void VideoWorkload::Impl::BuildEntities(const VideoWorkloadOptions& o,
                                        size_t L) {
  // Orthonormal entity directions: the first columns of a random orthogonal
  // matrix (Gram-Schmidt on Gaussian vectors).
  const std::vector<std::vector<float>> basis = Orthonormal(
      L, EntityDirections(o),
      [&](uint32_t i) { return Gaussian(Seed(o.seed, kBasis, i), L, 1.0f); });
  sink = basis[0];
  place.assign(basis.begin() + 1, basis.begin() + 1 + o.places);
  object.assign(basis.begin() + 1 + o.places,
                basis.begin() + 1 + o.places + o.objects);
  const size_t classes = o.lookalike > 0 ? o.object_classes : 0;
  texture.assign(
      basis.begin() + 1 + o.places + o.objects + classes,
      basis.begin() + 1 + o.places + o.objects + classes + o.textures);
  if (o.lookalike > 0) {
    // Objects of a class share a prototype: cosine `lookalike` between them.
    const auto* proto = &basis[1 + o.places + o.objects];
    for (uint32_t ob = 0; ob < o.objects; ++ob) {
      for (auto& e : object[ob]) e *= std::sqrt(1 - o.lookalike);
      AddScaled(&object[ob], proto[ob % o.object_classes],
                std::sqrt(o.lookalike));
    }
  }
  for (uint32_t s = 0; s < o.tokens_per_frame; ++s) {
    patch.push_back(Gaussian(Seed(o.seed, kPatch, 0, s), L, 1.0f));
    Normalize(&patch.back());
  }
  for (uint32_t j = 0; j < o.object_tokens; ++j) {
    part.push_back(Gaussian(Seed(o.seed, kPatch, 1, j), L, 1.0f));
    Normalize(&part.back());
  }
}

void VideoWorkload::Impl::BuildProjections(const VideoWorkloadOptions& o,
                                           size_t L) {
  const size_t d = o.head_dim;
  // Low-frequency pairs (large i) get more of each row's energy; the gains
  // are normalised to mean square 1.
  const size_t pairs = d / 2;
  std::vector<float> gain(pairs);
  double sq = 0;
  for (size_t i = 0; i < pairs; ++i) {
    const double x = pairs > 1 ? static_cast<double>(i) / (pairs - 1) : 0.5;
    gain[i] = static_cast<float>(std::exp(o.low_freq_bias * (x - 0.5)));
    sq += gain[i] * gain[i];
  }
  for (auto& g : gain) g /= static_cast<float>(std::sqrt(sq / pairs));
  for (size_t i = 0; i < pairs; ++i) {
    theta.push_back(std::pow(o.rope_base, -2.0 * i / d));
  }
  // Entries of variance 1/head_dim keep |A x| ~ |x|, so a query of scale s
  // against its own token's key has a logit of about s whatever the shapes.
  const size_t heads = static_cast<size_t>(o.layers) * o.kv_heads;
  const float sigma = static_cast<float>(1 / std::sqrt(d));
  const size_t rank = std::max<size_t>(
      1, static_cast<size_t>(std::lround(o.head_subspace * L)));
  for (size_t lh = 0; lh < heads; ++lh) {
    std::vector<float> ah =
        Gaussian(Seed(o.seed, kProject, 0, lh), d * L, sigma);
    if (rank < L) {  // This head sees a random subspace of the latent.
      ah = ProjectRows(ah, d, L, rank, Seed(o.seed, kProject, 2, lh));
    }
    for (size_t r = 0; r < d; ++r)
      for (size_t c = 0; c < L; ++c) ah[r * L + c] *= gain[r / 2];
    a.push_back(std::move(ah));
    b.push_back(Gaussian(Seed(o.seed, kProject, 1, lh), d * L, sigma));
  }
}

void VideoWorkload::Impl::BuildQueryHeads(const VideoWorkloadOptions& o,
                                          size_t L) {
  const size_t heads = static_cast<size_t>(o.layers) * o.kv_heads;
  // Query heads: a seeded sharp_head_fraction of them are sharp.
  const size_t qheads = heads * o.query_heads_per_kv;
  std::vector<size_t> order(qheads);
  for (size_t i = 0; i < qheads; ++i) order[i] = i;
  std::mt19937_64 head_rng(Seed(o.seed, kProject, 3));
  std::shuffle(order.begin(), order.end(), head_rng);
  const size_t sharp = static_cast<size_t>(
      std::lround(o.sharp_head_fraction * static_cast<double>(qheads)));
  qscale.assign(qheads, o.query_scale * o.diffuse_scale);
  for (size_t i = 0; i < sharp; ++i) qscale[order[i]] = o.query_scale;
  scene_proj = Gaussian(Seed(o.seed, kScene, 0), o.scene_dim * L, 1.0f);
}

void VideoWorkload::Impl::BuildShots(const VideoWorkloadOptions& o) {
  // Shots per camera: each camera cuts among its own places, revisiting them.
  shots.resize(o.cameras);
  places.resize(o.cameras);
  for (uint32_t c = 0; c < o.cameras; ++c) {
    std::mt19937_64 rng(Seed(o.seed, kShots, c));
    std::vector<uint32_t> all(o.places);
    for (uint32_t p = 0; p < o.places; ++p) all[p] = p;
    std::shuffle(all.begin(), all.end(), rng);
    places[c].assign(all.begin(), all.begin() + o.places_per_camera);
    std::uniform_int_distribution<uint32_t> pick(0, o.places_per_camera - 1);
    uint64_t f = 0;
    int64_t last = -1;
    while (f < o.frames) {
      uint32_t p = places[c][pick(rng)];
      if (o.places_per_camera > 1) {
        while (static_cast<int64_t>(p) == last) p = places[c][pick(rng)];
      }
      shots[c].push_back({f, p});
      last = p;
      f += std::max<uint64_t>(
          1, static_cast<uint64_t>(LogUniform(rng, o.shot_min_s, o.shot_max_s) *
                                   o.fps));
    }
  }
}

void VideoWorkload::Impl::BuildVisits(const VideoWorkloadOptions& o) {
  // One global schedule of object visits: gap, visit, gap, visit...; the
  // next visit stays on the camera or walks to another one.
  visits.resize(o.objects);
  for (uint32_t ob = 0; ob < o.objects; ++ob) {
    std::mt19937_64 rng(Seed(o.seed, kVisits, ob));
    std::uniform_real_distribution<double> u(0, 1);
    std::uniform_int_distribution<uint32_t> cam(0, o.cameras - 1);
    uint32_t c = cam(rng);
    double t = u(rng) * o.gap_max_s * 0.5;
    for (uint32_t serial = 0;; ++serial) {
      const uint64_t begin = static_cast<uint64_t>(t * o.fps);
      if (begin >= o.frames) break;
      const double len = LogUniform(rng, o.visit_min_s, o.visit_max_s);
      const uint64_t end = std::min<uint64_t>(
          o.frames, begin + std::max<uint64_t>(1, len * o.fps));
      visits[ob].push_back({c, begin, end, serial});
      const bool walk = o.cameras > 1 && u(rng) < o.walk_probability;
      if (walk) {
        uint32_t next = cam(rng);
        while (next == c) next = cam(rng);
        c = next;
        ++walks;
        t = static_cast<double>(end) / o.fps + o.gap_min_s;  // Walking over.
      } else {
        t = static_cast<double>(end) / o.fps + DrawGap(o, rng);
      }
    }
  }
}

std::vector<float> VideoWorkload::Impl::Appearance(
    const VideoWorkloadOptions& o, size_t L, int ob, uint32_t serial,
    uint32_t j) const {
  std::vector<float> v = Gaussian(
      Seed(o.seed, kAppearance, static_cast<uint64_t>(ob), serial, j), L, 1.0f);
  Normalize(&v);
  return v;
}

VideoWorkload::~VideoWorkload() = default;

uint64_t VideoWorkload::shots(uint32_t camera) const {
  return impl_->shots[camera].size();
}
uint64_t VideoWorkload::walks() const { return impl_->walks; }

void VideoWorkload::Impl::EncodeKV(const VideoWorkloadOptions& o, size_t L,
                                   const std::vector<std::vector<float>>& x,
                                   uint64_t pos0, std::string* payload) const {
  const size_t d = o.head_dim, T = x.size();
  const size_t slice = static_cast<size_t>(o.kv_heads) * T * d;
  payload->resize(static_cast<size_t>(o.layers) * 2 * slice * 2);
  std::vector<float> buf(slice);
  auto* dst = reinterpret_cast<uint8_t*>(payload->data());
  for (uint32_t l = 0; l < o.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < o.kv_heads; ++h) {
        const std::vector<float>& p =
            kv == 0 ? a[l * o.kv_heads + h] : b[l * o.kv_heads + h];
        for (size_t t = 0; t < T; ++t) {
          float* y = buf.data() + (h * T + t) * d;
          for (size_t r = 0; r < d; ++r) y[r] = Dot(&p[r * L], x[t].data(), L);
          if (kv == 0) {  // RoPE at the token's absolute position.
            Rope(y, d, static_cast<double>(pos0 + t), theta);
          }
        }
      }
      EncodeFromFloat(buf.data(), buf.size(), DType::kFp16, dst);
      dst += buf.size() * 2;
    }
  }
}

std::vector<float> VideoWorkload::Impl::Scene(
    const VideoWorkloadOptions& o, size_t L, uint32_t shot_place,
    const std::vector<float>& shot_vec) const {
  // Scene embedding: the place seen through a fixed projection, plus a
  // little per-shot lighting.
  std::vector<float> scene(o.scene_dim, 0.0f);
  for (size_t r = 0; r < o.scene_dim; ++r) {
    for (size_t c = 0; c < L; ++c)
      scene[r] +=
          scene_proj[r * L + c] *
          (place[shot_place][c] + 0.1f * shot_vec[c] / std::sqrt(float(L)));
  }
  Normalize(&scene);
  return scene;
}

WorkloadFrame VideoWorkload::Frame(uint32_t camera, uint64_t f) const {
  const Impl& m = *impl_;
  const size_t L = latent_dim(), T = o_.tokens_per_frame;
  WorkloadFrame out;
  uint64_t shot_serial = 0;
  const Shot& shot = m.ShotAt(camera, f, &shot_serial);
  out.place = shot.place;
  out.shot = shot_serial;
  out.token_object.assign(T, -1);
  out.token_visit.assign(T, 0);
  out.token_texture.assign(T, -1);
  const auto in_view = InView(o_, m.visits, camera, f);

  // Token latents.
  std::vector<std::vector<float>> x(T);
  const std::vector<float> shot_vec =
      Gaussian(Seed(o_.seed, kShotVec, camera, shot_serial), L, 1.0f);
  std::mt19937_64 noise_rng(Seed(o_.seed, kNoise, camera, f));
  std::normal_distribution<float> noise(0.0f,
                                        o_.frame_noise / std::sqrt(float(L)));
  for (size_t s = 0; s < T; ++s) {
    x[s] = m.place[shot.place];
    for (auto& v : x[s]) v *= 0.85f;
    AddScaled(&x[s], m.patch[s], 0.35f);
    AddScaled(&x[s], shot_vec, 0.2f / std::sqrt(float(L)));
  }
  if (o_.textures > 0) {
    // Recurring textures on random background patches (objects take the
    // last slots, the sinks the first of frame 0).
    std::mt19937_64 rng(Seed(o_.seed, kTexture, camera, f));
    std::vector<uint32_t> slots;
    const size_t objects_from =
        T - static_cast<size_t>(o_.object_tokens) * o_.max_objects_per_frame;
    for (size_t s = o_.sink_tokens; s < objects_from; ++s) {
      slots.push_back(static_cast<uint32_t>(s));
    }
    std::shuffle(slots.begin(), slots.end(), rng);
    std::uniform_int_distribution<uint32_t> pick(0, o_.textures - 1);
    for (uint32_t k = 0; k < o_.texture_tokens; ++k) {
      const uint32_t s = slots[k], tex = pick(rng);
      x[s] = m.texture[tex];
      AddScaled(&x[s], m.patch[s], 0.25f);
      out.token_texture[s] = static_cast<int>(tex);
    }
  }
  v1::FrameSignals* sig = out.frame.header.mutable_signals();
  for (size_t k = 0; k < in_view.size(); ++k) {
    const int ob = in_view[k].first;
    const Visit& v = *in_view[k].second;
    const std::vector<float> visit_vec =
        Gaussian(Seed(o_.seed, kVisitVec, ob, v.serial), L, 1.0f);
    for (uint32_t j = 0; j < o_.object_tokens; ++j) {
      const size_t s = T - 1 - (k * o_.object_tokens + j);
      x[s] = m.object[ob];
      for (auto& e : x[s]) e *= 0.85f;
      AddScaled(&x[s], m.part[j], 0.3f);
      AddScaled(&x[s], visit_vec, 0.3f / std::sqrt(float(L)));
      if (o_.appearance_change > 0) {
        AddScaled(&x[s], m.Appearance(o_, L, ob, v.serial, j),
                  o_.appearance_change);
      }
      out.token_object[s] = ob;
      out.token_visit[s] = v.serial;
      out.token_texture[s] = -1;
    }
    AddDetection(o_.seed, ob, v, f, sig->add_detections());
  }
  if (f == 0) {
    for (size_t s = 0; s < o_.sink_tokens; ++s) {
      x[s] = m.sink;
      out.token_object[s] = -2;
    }
  }
  for (auto& t : x) {
    for (auto& e : t) e += noise(noise_rng);
    Normalize(&t);
  }
  for (float e : m.Scene(o_, L, shot.place, shot_vec)) {
    sig->add_scene_embedding(e);
  }

  // KV: layer-major, K then V, [kv_heads][tokens][head_dim], fp16.
  const uint64_t pos0 = f * T;
  OutgoingFrame& fr = out.frame;
  fr.header.set_frame_index(f);
  fr.header.set_timestamp_us(static_cast<int64_t>(f * 1e6 / o_.fps));
  fr.header.set_first_token_position(pos0);
  fr.header.set_token_count(static_cast<uint32_t>(T));
  m.EncodeKV(o_, L, x, pos0, &fr.payload);
  fr.header.set_payload_bytes(fr.payload.size());
  return out;
}

}  // namespace kvmem

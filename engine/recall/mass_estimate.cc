#include "engine/recall/mass_estimate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"
#include "engine/recall/fast_exp.h"

namespace kvmem {
namespace {

constexpr float kNone = -std::numeric_limits<float>::infinity();

}  // namespace

MassEstimate EstimateMass(const MassInputs& in) {
  const size_t n = in.n, H = in.heads, J = in.scans.size();
  MassEstimate est;
  est.heads = in.heads;
  est.vectors = static_cast<uint32_t>(J);
  est.weight = VectorWeights(in.weight, J);
  est.log_norm.assign(J * H, kNone);
  est.density.assign(in.ranges.size(), std::vector<float>(n, 0.0f));
  est.slack.assign(n, 0.0f);
  // An additive mask (-inf where nothing is counted), so the per-head
  // loops have no branches.
  struct Scratch {
    std::vector<float> e, mask;
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  std::vector<float>& e = scratch.e;
  std::vector<float>& mask = scratch.mask;
  e.resize(n);
  mask.resize(n);
  for (size_t c = 0; c < n; ++c) mask[c] = in.counted[c] > 0 ? 0.0f : kNone;
  // The ranges each head is in, so per-head ranges cost heads, not heads^2.
  std::vector<std::vector<uint32_t>> ranges_of(H);
  for (uint32_t r = 0; r < in.ranges.size(); ++r) {
    for (uint32_t h = in.ranges[r].first; h < in.ranges[r].second; ++h) {
      ranges_of[h].push_back(r);
    }
  }
  const ExpKernelInfo& kernel = ActiveExpKernel();
  for (size_t j = 0; j < J; ++j) {
    const SegmentScan& scan = *in.scans[j];
    for (size_t h = 0; h < H; ++h) {
      const float* dots = scan.dots.data() + h * n;
      const float window = in.window_lse[j * H + h];
      // The head's largest term, so the exps cannot overflow.
      float mx =
          kernel.max_scaled(dots, mask.data(), in.logit_scale, n, window);
      if (mx == kNone) mx = 0;  // Nothing counted: mass 0.
      const float sum =
          std::exp(window - mx) +
          kernel.exp_dot(dots, in.logit_scale, mx, in.counted, e.data(), n);
      if (!(sum > 0)) continue;
      est.log_norm[j * H + h] = mx + std::log(sum);
      for (uint32_t r : ranges_of[h]) {
        const auto [h0, h1] = in.ranges[r];
        Axpy(est.weight[j] / (sum * static_cast<float>(h1 - h0)), e.data(),
             est.density[r].data(), n);
      }
    }
    if (!scan.bound.empty()) {  // slack holds the largest bound, in logits.
      for (size_t c = 0; c < n; ++c) {
        est.slack[c] = std::max(est.slack[c], scan.bound[c] * in.logit_scale);
      }
    }
  }
  ExpInPlace(est.slack.data(), n);
  return est;
}

void CandidateDensities(const MassEstimate& est, const float* dots, size_t m,
                        uint32_t h0, uint32_t h1, float logit_scale,
                        float* out) {
  const size_t H = est.heads, J = est.vectors, w = h1 - h0;
  struct Scratch {
    std::vector<float> z;
  };
  std::vector<float>& z = ThreadScratch<Scratch>().z;
  z.resize(m * J * w);
  for (size_t c = 0; c < m; ++c) {
    for (size_t j = 0; j < J; ++j) {
      const float* d = dots + (c * J + j) * H;
      const float* norm = est.log_norm.data() + j * H;
      float* zc = z.data() + (c * J + j) * w;
      // A head with nothing counted has log_norm -inf: its exp is 0.
      for (size_t h = h0; h < h1; ++h) {
        zc[h - h0] = norm[h] == kNone ? kNone : d[h] * logit_scale - norm[h];
      }
    }
  }
  ExpInPlace(z.data(), z.size());
  const float k = 1.0f / static_cast<float>(w);
  const float uniform = 1.0f / static_cast<float>(J);
  for (size_t c = 0; c < m; ++c) {
    double acc = 0;
    for (size_t j = 0; j < J; ++j) {
      double head_sum = 0;
      for (size_t i = 0; i < w; ++i) head_sum += z[(c * J + j) * w + i];
      acc += (est.weight.empty() ? uniform : est.weight[j]) * head_sum;
    }
    out[c] = static_cast<float>(acc) * k;
  }
}

void MeanVectorDensities(const MassEstimate& mean_est, const float* dots,
                         size_t m, uint32_t vectors, const float* weight,
                         uint32_t h0, uint32_t h1, float logit_scale,
                         float* out) {
  const size_t H = mean_est.heads, J = vectors, w = h1 - h0;
  struct Scratch {
    std::vector<float> z;
  };
  std::vector<float>& z = ThreadScratch<Scratch>().z;
  z.resize(m * w);
  const float* norm = mean_est.log_norm.data();
  for (size_t c = 0; c < m; ++c) {
    for (size_t h = h0; h < h1; ++h) {
      float dot = 0;
      for (size_t j = 0; j < J; ++j)
        dot += weight[j] * dots[(c * J + j) * H + h];
      z[c * w + h - h0] =
          norm[h] == kNone ? kNone : dot * logit_scale - norm[h];
    }
  }
  ExpInPlace(z.data(), z.size());
  const float k = 1.0f / static_cast<float>(w);
  for (size_t c = 0; c < m; ++c) {
    double acc = 0;
    for (size_t i = 0; i < w; ++i) acc += z[c * w + i];
    out[c] = static_cast<float>(acc) * k;
  }
}

std::vector<float> VectorWeights(const std::vector<float>& weight,
                                 size_t vectors) {
  if (weight.size() == vectors) return weight;
  return std::vector<float>(vectors, 1.0f / static_cast<float>(vectors));
}

}  // namespace kvmem

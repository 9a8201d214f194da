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

namespace {

// -L_jh over heads [h0, h1) for each vector (-inf where nothing was counted:
// its exp is 0), so a logit's term is exp(dot * scale + neg).
void NegatedNorms(const MassEstimate& est, size_t J, uint32_t h0, uint32_t h1,
                  std::vector<float>* neg) {
  const size_t w = h1 - h0;
  neg->resize(J * w);
  for (size_t j = 0; j < J; ++j) {
    for (size_t h = h0; h < h1; ++h) {
      const float n = est.log_norm[j * est.heads + h];
      (*neg)[j * w + h - h0] = n == kNone ? kNone : -n;
    }
  }
}

}  // namespace

void CandidateDensities(const MassEstimate& est, const float* dots, size_t m,
                        uint32_t h0, uint32_t h1, float logit_scale,
                        float* out) {
  const size_t H = est.heads, J = est.vectors, w = h1 - h0;
  struct Scratch {
    std::vector<float> z, neg, coef;
  };
  Scratch& s = ThreadScratch<Scratch>();
  NegatedNorms(est, J, h0, h1, &s.neg);
  // Each vector's weight over the range's heads.
  s.coef.resize(J);
  for (size_t j = 0; j < J; ++j) {
    s.coef[j] =
        (est.weight.empty() ? 1.0f / static_cast<float>(J) : est.weight[j]) /
        static_cast<float>(w);
  }
  s.z.resize(m * J * w);
  for (size_t c = 0; c < m; ++c) {
    for (size_t j = 0; j < J; ++j) {
      const float* d = dots + (c * J + j) * H + h0;
      const float* neg = s.neg.data() + j * w;
      float* zc = s.z.data() + (c * J + j) * w;
      for (size_t i = 0; i < w; ++i) zc[i] = d[i] * logit_scale + neg[i];
    }
  }
  ExpInPlace(s.z.data(), s.z.size());
  for (size_t c = 0; c < m; ++c) {
    float acc = 0;
    for (size_t j = 0; j < J; ++j) {
      const float* zc = s.z.data() + (c * J + j) * w;
      float sum = 0;
      for (size_t i = 0; i < w; ++i) sum += zc[i];
      acc += s.coef[j] * sum;
    }
    out[c] = acc;
  }
}

void MeanVectorDensities(const MassEstimate& mean_est, const float* dots,
                         size_t m, uint32_t vectors, const float* weight,
                         uint32_t h0, uint32_t h1, float logit_scale,
                         float* out) {
  const size_t H = mean_est.heads, J = vectors, w = h1 - h0;
  struct Scratch {
    std::vector<float> z, neg;
  };
  Scratch& s = ThreadScratch<Scratch>();
  NegatedNorms(mean_est, 1, h0, h1, &s.neg);
  s.z.assign(m * w, 0.0f);
  for (size_t c = 0; c < m; ++c) {
    float* zc = s.z.data() + c * w;
    for (size_t j = 0; j < J; ++j) {
      const float* d = dots + (c * J + j) * H + h0;
      const float k = weight[j] * logit_scale;
      for (size_t i = 0; i < w; ++i) zc[i] += k * d[i];
    }
    for (size_t i = 0; i < w; ++i) zc[i] += s.neg[i];
  }
  ExpInPlace(s.z.data(), s.z.size());
  const float k = 1.0f / static_cast<float>(w);
  for (size_t c = 0; c < m; ++c) {
    float acc = 0;
    for (size_t i = 0; i < w; ++i) acc += s.z[c * w + i];
    out[c] = acc * k;
  }
}

std::vector<float> VectorWeights(const std::vector<float>& weight,
                                 size_t vectors) {
  if (weight.size() == vectors) return weight;
  return std::vector<float>(vectors, 1.0f / static_cast<float>(vectors));
}

}  // namespace kvmem

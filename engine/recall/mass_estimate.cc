#include "engine/recall/mass_estimate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"
#include "engine/recall/fast_exp.h"
#include "engine/recall/fast_exp_poly.h"

namespace kvmem {
namespace {

constexpr float kNone = -std::numeric_limits<float>::infinity();
// The floats of exps EstimateMass keeps at once (256 KiB: within L2).
constexpr size_t kExpBatchFloats = size_t{64} << 10;

// The slack factors from the largest bounds in logits, in place: exp of
// each, exactly 1 without bounds (no scan carried any).
void SlackFactors(bool bounded, float* slack, size_t n,
                  std::vector<uint8_t>* past_scratch) {
  if (!bounded) {  // Exact scans: every factor is exp(0).
    std::fill(slack, slack + n, 1.0f);
    return;
  }
  // A bound past exp's saturation (fast_exp_poly.h's kHigh) would make a
  // factor smaller than the bound it stands for: such slack is the largest
  // float instead, an upper bound that still holds. Counted first (a loop
  // that vectorises): there are seldom any.
  uint32_t past_count = 0;
  for (size_t c = 0; c < n; ++c) past_count += slack[c] > fast_exp::kHigh;
  if (past_count == 0) {
    ExpInPlace(slack, n);
    return;
  }
  past_scratch->resize(n);
  // A raw pointer: a one-byte store may alias anything, so through the
  // vector every row reloaded its data pointer.
  uint8_t* past = past_scratch->data();
  for (size_t c = 0; c < n; ++c) past[c] = slack[c] > fast_exp::kHigh;
  ExpInPlace(slack, n);
  for (size_t c = 0; c < n; ++c) {
    if (past[c]) slack[c] = std::numeric_limits<float>::max();
  }
}

}  // namespace

MassEstimate EstimateMass(const MassInputs& in) {
  MassEstimate est;
  EstimateMass(in, &est);
  return est;
}

void EstimateMass(const MassInputs& in, MassEstimate* out) {
  const size_t n = in.n, H = in.heads, J = in.scans.size();
  MassEstimate& est = *out;  // Its buffers are reused.
  est.heads = in.heads;
  est.vectors = static_cast<uint32_t>(J);
  est.weight = VectorWeights(in.weight, J);
  est.log_norm.assign(J * H, kNone);
  est.density.resize(in.ranges.size());
  for (std::vector<float>& d : est.density) d.assign(n, 0.0f);
  est.slack.assign(n, 0.0f);
  // An additive mask (-inf where nothing is counted), so the per-head
  // loops have no branches. A batch of heads' exps is kept (e: [head in
  // batch][candidate]) so each range's densities take them in one pass
  // (AxpyRows), in head order as one Axpy per head would.
  const size_t batch = std::clamp<size_t>(
      kExpBatchFloats / std::max<size_t>(n, 1), 1, std::max<size_t>(H, 1));
  struct Scratch {
    std::vector<float> e, mask, alpha;
    std::vector<const float*> rows;
    std::vector<uint8_t> past;  // Slack past exp's saturation.
  };
  Scratch& scratch = ThreadScratch<Scratch>();
  std::vector<float>& e = scratch.e;
  std::vector<float>& mask = scratch.mask;
  e.resize(batch * n);
  mask.resize(n);
  for (size_t c = 0; c < n; ++c) mask[c] = in.counted[c] > 0 ? 0.0f : kNone;
  const ExpKernelInfo& kernel = ActiveExpKernel();
  std::vector<float> sums(H);
  bool bounded = false;  // Some scan carries bounds.
  for (size_t j = 0; j < J; ++j) {
    const SegmentScan& scan = *in.scans[j];
    for (size_t b0 = 0; b0 < H; b0 += batch) {
      const size_t b1 = std::min(H, b0 + batch);
      for (size_t h = b0; h < b1; ++h) {
        const float* dots = scan.dots.data() + h * n;
        const float window = in.window_lse[j * H + h];
        // The head's largest term, so the exps cannot overflow.
        float mx =
            kernel.max_scaled(dots, mask.data(), in.logit_scale, n, window);
        if (mx == kNone) mx = 0;  // Nothing counted: mass 0.
        sums[h] = std::exp(window - mx) +
                  kernel.exp_dot(dots, in.logit_scale, mx, in.counted,
                                 e.data() + (h - b0) * n, n);
        if (sums[h] > 0) est.log_norm[j * H + h] = mx + std::log(sums[h]);
      }
      for (uint32_t r = 0; r < in.ranges.size(); ++r) {
        const auto [h0, h1] = in.ranges[r];
        scratch.alpha.clear();
        scratch.rows.clear();
        for (size_t h = std::max<size_t>(h0, b0); h < std::min<size_t>(h1, b1);
             ++h) {
          if (!(sums[h] > 0)) continue;
          scratch.alpha.push_back(est.weight[j] /
                                  (sums[h] * static_cast<float>(h1 - h0)));
          scratch.rows.push_back(e.data() + (h - b0) * n);
        }
        AxpyRows(scratch.alpha.data(), scratch.rows.data(), scratch.rows.size(),
                 est.density[r].data(), n);
      }
    }
    if (!scan.bound.empty()) {  // slack holds the largest bound, in logits.
      bounded = true;
      float* most = est.slack.data();
      const float* bound = scan.bound.data();
      for (size_t c = 0; c < n; ++c) {
        most[c] = std::max(most[c], bound[c] * in.logit_scale);
      }
    }
  }
  SlackFactors(bounded, est.slack.data(), n, &scratch.past);
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

void PrepareDensityTerms(const MassEstimate& est, uint32_t h0, uint32_t h1,
                         float logit_scale, const MassEstimate* mean_est,
                         const float* weight, DensityTerms* out) {
  const size_t J = est.vectors, w = h1 - h0;
  out->heads = est.heads;
  out->vectors = est.vectors;
  out->h0 = h0;
  out->w = static_cast<uint32_t>(w);
  out->logit_scale = logit_scale;
  NegatedNorms(est, J, h0, h1, &out->neg);
  // Each vector's weight over the range's heads.
  out->coef.resize(J);
  for (size_t j = 0; j < J; ++j) {
    out->coef[j] =
        (est.weight.empty() ? 1.0f / static_cast<float>(J) : est.weight[j]) /
        static_cast<float>(w);
  }
  out->mean_k.clear();
  out->mean_neg.clear();
  if (mean_est != nullptr && weight != nullptr) {
    NegatedNorms(*mean_est, 1, h0, h1, &out->mean_neg);
    out->mean_k.resize(J);
    for (size_t j = 0; j < J; ++j) out->mean_k[j] = weight[j] * logit_scale;
  }
}

void TermDensities(const DensityTerms& t, const float* dots, size_t m,
                   float* out, float* mean_out) {
  DensityArgs a;
  a.dots = dots + t.h0;
  a.m = m;
  a.stride = t.heads;
  a.vectors = t.vectors;
  a.w = t.w;
  a.scale = t.logit_scale;
  a.neg = t.neg.data();
  a.coef = t.coef.data();
  if (!t.mean_k.empty() && mean_out != nullptr) {
    a.mean_k = t.mean_k.data();
    a.mean_neg = t.mean_neg.data();
    a.mean_out = mean_out;
  }
  a.out = out;
  ActiveExpKernel().densities(a);
}

void CandidateDensities(const MassEstimate& est, const float* dots, size_t m,
                        uint32_t h0, uint32_t h1, float logit_scale,
                        float* out) {
  DensityTerms& t = ThreadScratch<DensityTerms>();
  PrepareDensityTerms(est, h0, h1, logit_scale, nullptr, nullptr, &t);
  TermDensities(t, dots, m, out, nullptr);
}

std::vector<float> VectorWeights(const std::vector<float>& weight,
                                 size_t vectors) {
  if (weight.size() == vectors) return weight;
  return std::vector<float>(vectors, 1.0f / static_cast<float>(vectors));
}

}  // namespace kvmem

// The per-head attention-mass estimate against a direct computation of its
// formula (engine/recall/mass_estimate.h), its bounds, and the SIMD pieces it
// runs on (engine/recall/fast_exp.h, the int8 segment kernel) against their
// scalar definitions, on every kernel this CPU can run.
#include "engine/recall/mass_estimate.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>

#include "engine/index/int8_kernels.h"
#include "engine/index/progressive_search.h"
#include "engine/recall/fast_exp.h"
#include "engine/recall/mass_rows.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

constexpr float kNone = -std::numeric_limits<float>::infinity();

struct Problem {
  uint32_t heads = 0;
  float scale = 0;
  std::vector<float> counted;
  std::vector<CandidateRole> role;
  std::vector<SegmentScan> scans;
  std::vector<float> window;  // [vector][head]
};

Problem RandomProblem(std::mt19937_64& rng, size_t n, uint32_t heads,
                      uint32_t vectors) {
  Problem p;
  p.heads = heads;
  p.scale = 0.125f;
  std::normal_distribution<float> g(0.0f, 20.0f);
  std::uniform_int_distribution<int> tokens(1, 16), role(0, 5);
  for (size_t c = 0; c < n; ++c) {
    const int r = role(rng);
    p.role.push_back(r == 0   ? CandidateRole::kIgnore
                     : r == 1 ? CandidateRole::kWindow
                              : CandidateRole::kRecall);
    p.counted.push_back(p.role.back() == CandidateRole::kIgnore
                            ? 0.0f
                            : static_cast<float>(tokens(rng)));
  }
  for (uint32_t j = 0; j < vectors; ++j) {
    SegmentScan s;
    s.segments = heads;
    for (size_t c = 0; c < n * heads; ++c) s.dots.push_back(g(rng));
    p.scans.push_back(std::move(s));
    for (uint32_t h = 0; h < heads; ++h) {
      p.window.push_back(h == 1 ? kNone : g(rng) * p.scale + 3);
    }
  }
  return p;
}

MassInputs Inputs(const Problem& p,
                  std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  MassInputs in;
  in.heads = p.heads;
  in.logit_scale = p.scale;
  in.n = p.counted.size();
  in.counted = p.counted.data();
  for (const SegmentScan& s : p.scans) in.scans.push_back(&s);
  in.window_lse = p.window.data();
  in.ranges = std::move(ranges);
  return in;
}

// The formula, in double: L_jh = ln(exp(W_jh) + sum_c counted_c
// exp(z_jch)), density_c = mean over j and h in range of exp(z_jch - L_jh).
std::vector<double> ReferenceDensity(const Problem& p, uint32_t h0,
                                     uint32_t h1) {
  const size_t n = p.counted.size(), H = p.heads;
  std::vector<double> d(n, 0.0);
  for (size_t j = 0; j < p.scans.size(); ++j) {
    for (size_t h = h0; h < h1; ++h) {
      double sum = std::exp(double(p.window[j * H + h]));
      for (size_t c = 0; c < n; ++c) {
        sum += p.counted[c] *
               std::exp(double(p.scans[j].dots[h * n + c]) * p.scale);
      }
      for (size_t c = 0; c < n; ++c) {
        d[c] += std::exp(double(p.scans[j].dots[h * n + c]) * p.scale) / sum /
                (p.scans.size() * (h1 - h0));
      }
    }
  }
  return d;
}

TEST(MassEstimateTest, EqualsTheFormulaComputedDirectly) {
  std::mt19937_64 rng(11);
  for (uint32_t vectors : {1u, 3u}) {
    for (size_t n : {1u, 7u, 40u, 333u}) {
      const Problem p = RandomProblem(rng, n, 6, vectors);
      // One set over all heads, and per "layer" of 3 KV heads.
      const MassEstimate est =
          EstimateMass(Inputs(p, {{0, 6}, {0, 3}, {3, 6}}));
      ASSERT_EQ(est.density.size(), 3u);
      const std::pair<uint32_t, uint32_t> ranges[] = {{0, 6}, {0, 3}, {3, 6}};
      for (size_t r = 0; r < 3; ++r) {
        const std::vector<double> want =
            ReferenceDensity(p, ranges[r].first, ranges[r].second);
        for (size_t c = 0; c < n; ++c) {
          EXPECT_NEAR(est.density[r][c], want[c], 2e-5 * want[c] + 1e-30)
              << "n " << n << " vectors " << vectors << " range " << r
              << " candidate " << c;
        }
      }
      // Exact dots: no slack.
      for (float s : est.slack) EXPECT_EQ(s, 1.0f);
      // Recallable candidates' mass plus the window's is at most 1 per
      // head: the estimate is a share of attention.
      double total = 0;
      for (size_t c = 0; c < n; ++c) total += est.density[0][c] * p.counted[c];
      EXPECT_LE(total, 1.0 + 1e-5);
    }
  }
}

TEST(MassEstimateTest, ManyVectorsAverageTheirOwnEstimates) {
  // The documented aggregation over query vectors: the mean of each
  // vector's estimate, each with its own normaliser.
  std::mt19937_64 rng(12);
  const Problem all = RandomProblem(rng, 50, 4, 3);
  const MassEstimate est = EstimateMass(Inputs(all, {{0, 4}}));
  std::vector<double> mean(50, 0.0);
  for (size_t j = 0; j < 3; ++j) {
    Problem one = all;
    one.scans = {all.scans[j]};
    one.window.assign(all.window.begin() + j * 4,
                      all.window.begin() + j * 4 + 4);
    const MassEstimate e1 = EstimateMass(Inputs(one, {{0, 4}}));
    for (size_t c = 0; c < 50; ++c) mean[c] += e1.density[0][c] / 3;
  }
  for (size_t c = 0; c < 50; ++c) {
    EXPECT_NEAR(est.density[0][c], mean[c], 1e-5 * mean[c] + 1e-30);
  }
}

TEST(MassEstimateTest, NothingCountedGivesZeroNotNaN) {
  std::mt19937_64 rng(13);
  Problem p = RandomProblem(rng, 5, 2, 1);
  for (auto& c : p.counted) c = 0;
  p.window.assign(2, kNone);
  const MassEstimate est = EstimateMass(Inputs(p, {{0, 2}}));
  for (float d : est.density[0]) EXPECT_EQ(d, 0.0f);
  for (float l : est.log_norm) EXPECT_EQ(l, kNone);
  const std::vector<float> dots(2, 1.0f);
  float d = -1;
  CandidateDensities(est, dots.data(), 1, 0, 2, p.scale, &d);
  EXPECT_EQ(d, 0.0f);
}

TEST(MassEstimateTest, CandidateDensitiesMatchTheScanEstimate) {
  std::mt19937_64 rng(14);
  const Problem p = RandomProblem(rng, 30, 4, 2);
  const MassEstimate est = EstimateMass(Inputs(p, {{0, 4}, {1, 3}}));
  // Candidate c's dots laid out [vector][head], as the stream rescores.
  std::vector<float> dots;
  for (size_t c = 0; c < 30; ++c)
    for (size_t j = 0; j < 2; ++j)
      for (size_t h = 0; h < 4; ++h)
        dots.push_back(p.scans[j].dots[h * 30 + c]);
  for (auto [r, h0, h1] :
       {std::tuple<int, uint32_t, uint32_t>{0, 0, 4}, {1, 1, 3}}) {
    std::vector<float> got(30);
    CandidateDensities(est, dots.data(), 30, h0, h1, p.scale, got.data());
    for (size_t c = 0; c < 30; ++c) {
      EXPECT_NEAR(got[c], est.density[r][c], 1e-5 * est.density[r][c]);
    }
  }
}

TEST(MassEstimateTest, SlackBoundsTheExactDensity) {
  // Dots known within a bound: the exact density (with the scan's
  // normaliser) lies within [density / slack, density * slack].
  std::mt19937_64 rng(15);
  const Problem exact = RandomProblem(rng, 60, 3, 2);
  Problem approx = exact;
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& s : approx.scans) {
    s.bound.assign(60, 0.0f);
    for (size_t c = 0; c < 60; ++c) {
      const float b = 4.0f * (u(rng) + 1);
      s.bound[c] = b;
      for (size_t h = 0; h < 3; ++h) s.dots[h * 60 + c] += b * u(rng);
    }
  }
  const MassEstimate est = EstimateMass(Inputs(approx, {{0, 3}}));
  std::vector<float> dots;
  for (size_t c = 0; c < 60; ++c)
    for (size_t j = 0; j < 2; ++j)
      for (size_t h = 0; h < 3; ++h)
        dots.push_back(exact.scans[j].dots[h * 60 + c]);
  std::vector<float> truth(60);
  CandidateDensities(est, dots.data(), 60, 0, 3, exact.scale, truth.data());
  for (size_t c = 0; c < 60; ++c) {
    const float d = est.density[0][c], s = est.slack[c];
    EXPECT_GT(s, 1.0f);
    EXPECT_GE(truth[c], d / s * (1 - 1e-5f)) << c;
    EXPECT_LE(truth[c], d * s * (1 + 1e-5f)) << c;
  }
}

TEST(MassEstimateTest, SlackPastExpsSaturationIsTheLargestFloat) {
  // A bound whose logit is past the exp's saturation (64) must not become
  // a factor smaller than it: the largest float stands for it; the others
  // are their exps.
  std::mt19937_64 rng(16);
  Problem p = RandomProblem(rng, 40, 2, 1);
  p.scans[0].bound.assign(40, 2.0f);
  p.scans[0].bound[7] = 70.0f / p.scale;
  p.scans[0].bound[30] = 1e6f;
  const MassEstimate est = EstimateMass(Inputs(p, {{0, 2}}));
  for (size_t c = 0; c < 40; ++c) {
    if (c == 7 || c == 30) {
      EXPECT_EQ(est.slack[c], std::numeric_limits<float>::max()) << c;
    } else {
      EXPECT_NEAR(est.slack[c], std::exp(2.0f * p.scale), 1e-6f) << c;
    }
  }
  // Without a bound past it, the same factors.
  p.scans[0].bound[7] = p.scans[0].bound[30] = 2.0f;
  const MassEstimate low = EstimateMass(Inputs(p, {{0, 2}}));
  EXPECT_EQ(low.slack[7], est.slack[0]);
}

TEST(MassEstimateTest, AnEstimateIntoUsedBuffersIsAFreshOne) {
  // A recall's rows keep their estimate's buffers: a larger estimate with
  // more ranges and bounds before must leave nothing behind.
  std::mt19937_64 rng(17);
  Problem big = RandomProblem(rng, 90, 4, 3);
  for (auto& s : big.scans) s.bound.assign(90, 3.0f);
  Problem small = RandomProblem(rng, 25, 4, 2);
  for (auto& s : small.scans) s.bound.assign(25, 1.0f);  // Below big's.
  small.window[2] = kNone;  // A head with nothing but the candidates.
  MassEstimate used;
  EstimateMass(Inputs(big, {{0, 4}, {0, 2}, {2, 4}}), &used);
  EstimateMass(Inputs(small, {{1, 3}}), &used);
  const MassEstimate fresh = EstimateMass(Inputs(small, {{1, 3}}));
  EXPECT_EQ(used.heads, fresh.heads);
  EXPECT_EQ(used.vectors, fresh.vectors);
  EXPECT_EQ(used.weight, fresh.weight);
  EXPECT_EQ(used.log_norm, fresh.log_norm);
  EXPECT_EQ(used.density, fresh.density);
  EXPECT_EQ(used.slack, fresh.slack);
}

TEST(FastExpTest, EveryKernelAgreesWithExp) {
  std::vector<float> x;
  for (float v = -100; v <= 95; v += 0.37f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -87.3f, -87.4f, 63.9f, 64.0f, 64.1f,
                  88.0f, 88.7f, 200.0f, kNone}) {
    x.push_back(v);
  }
  const auto& kernels = AvailableExpKernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.back().name, "scalar");
  for (const ExpKernelInfo& k : kernels) {
    std::vector<float> y = x;
    k.fn(y.data(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double want =
          x[i] < -87.3f ? 0.0 : std::exp(double(std::min(x[i], 64.0f)));
      EXPECT_NEAR(y[i], want, 3e-7 * want) << k.name << " x=" << x[i];
    }
  }
}

TEST(FastExpTest, FusedKernelsMatchTheirScalarDefinitions) {
  std::mt19937_64 rng(16);
  std::normal_distribution<float> g(0.0f, 10.0f);
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 100u, 1003u}) {
    std::vector<float> x(n), w(n), mask(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = g(rng);
      w[i] = std::fabs(g(rng));
      mask[i] = i % 5 == 0 ? kNone : 0.0f;
    }
    const float scale = 0.3f, shift = 5.0f;
    double want_sum = 0;
    std::vector<double> want(n);
    float want_max = -50;
    for (size_t i = 0; i < n; ++i) {
      want[i] = std::exp(double(x[i]) * scale - shift);
      want_sum += w[i] * want[i];
      want_max = std::max(want_max, x[i] * scale + mask[i]);
    }
    for (const ExpKernelInfo& k : AvailableExpKernels()) {
      std::vector<float> out(n, -1);
      const float sum =
          k.exp_dot(x.data(), scale, shift, w.data(), out.data(), n);
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum + 1e-30)
          << k.name << " n " << n;
      // The argument x * scale - shift is rounded to float first (once
      // with FMA, twice without): about 1e-6 relative at |argument| ~ 10.
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(out[i], want[i], 2e-6 * want[i] + 1e-37) << k.name;
      }
      EXPECT_EQ(k.max_scaled(x.data(), mask.data(), scale, n, -50), want_max)
          << k.name << " n " << n;
    }
  }
}

// "avx512" gives the avx2 kernel's floats exactly (fast_exp.h): the same
// exps lane by lane and the sums in the same order, at every length's tail.
TEST(FastExpTest, Avx512KernelGivesTheAvx2KernelsFloats) {
  const ExpKernelInfo *wide = nullptr, *avx2 = nullptr;
  for (const ExpKernelInfo& k : AvailableExpKernels()) {
    if (k.name == "avx512") wide = &k;
    if (k.name == "avx2") avx2 = &k;
  }
  if (wide == nullptr || avx2 == nullptr) {
    GTEST_SKIP() << "this CPU lacks AVX-512 F (exp kernel "
                 << ActiveExpKernel().name << ")";
  }
  std::mt19937_64 rng(19);
  std::normal_distribution<float> g(0.0f, 30.0f);
  for (size_t n : {0u, 1u, 8u, 15u, 16u, 17u, 24u, 31u, 100u, 1003u}) {
    std::vector<float> x(n), w(n), mask(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = i % 11 == 4 ? kNone : g(rng);
      w[i] = std::fabs(g(rng));
      mask[i] = i % 5 == 0 ? kNone : 0.0f;
    }
    std::vector<float> a = x, b = x;
    wide->fn(a.data(), n);
    avx2->fn(b.data(), n);
    EXPECT_EQ(a, b) << "exp, n " << n;
    std::vector<float> ea(n), eb(n);
    EXPECT_EQ(wide->exp_dot(x.data(), 0.7f, 3.0f, w.data(), ea.data(), n),
              avx2->exp_dot(x.data(), 0.7f, 3.0f, w.data(), eb.data(), n))
        << "n " << n;
    EXPECT_EQ(ea, eb) << "exp_dot's exps, n " << n;
    EXPECT_EQ(wide->max_scaled(x.data(), mask.data(), 0.3f, n, -1e30f),
              avx2->max_scaled(x.data(), mask.data(), 0.3f, n, -1e30f))
        << "n " << n;
  }
}

// Rows a recall cannot return (a block sealed in the window: its units
// join the end of the scan with weight 0) change no bit of the estimate:
// every kernel gives each element the same exp whatever follows it, and
// zero-weight elements appended leave the sum as it was. Before, the AVX
// kernels' scalar tail moved into lanes as n grew, and a near tie flipped.
TEST(FastExpTest, ElementsAppendedWithWeightZeroChangeNoBit) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.0f, 20.0f);
  for (const ExpKernelInfo& k : AvailableExpKernels()) {
    for (size_t n = 0; n <= 40; ++n) {
      std::vector<float> x(n + 19), w(n + 19, 0.0f);
      for (size_t i = 0; i < x.size(); ++i) x[i] = g(rng);
      for (size_t i = 0; i < n; ++i) w[i] = std::fabs(g(rng));
      std::vector<float> base(n);
      const float sum =
          k.exp_dot(x.data(), 0.3f, 2.0f, w.data(), base.data(), n);
      std::vector<float> in_place(x.begin(), x.begin() + n);
      k.fn(in_place.data(), n);
      for (size_t extra = 1; extra <= 19; ++extra) {
        std::vector<float> out(n + extra);
        EXPECT_EQ(
            k.exp_dot(x.data(), 0.3f, 2.0f, w.data(), out.data(), n + extra),
            sum)
            << k.name << " n " << n << " + " << extra;
        EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + n), base)
            << k.name << " n " << n << " + " << extra;
        std::vector<float> y(x.begin(), x.begin() + n + extra);
        k.fn(y.data(), y.size());
        EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + n), in_place)
            << k.name << " n " << n << " + " << extra;
      }
    }
  }
}

// The fused per-token densities (fast_exp.h's DensityArgs) against the
// formula in double, on every kernel: head ranges of 8 and 16 (AVX2's
// lanes), 3 and 1 (the scalar path), with -inf normalisers (nothing
// counted) and with and without the mean vector.
TEST(FastExpTest, DensityKernelsMatchTheFormula) {
  std::mt19937_64 rng(18);
  std::normal_distribution<float> g(0.0f, 4.0f);
  for (uint32_t w : {8u, 16u, 3u, 1u}) {
    const uint32_t vectors = 3, stride = w + 2, h0 = 1;
    const size_t m = 13;
    std::vector<float> dots(m * vectors * stride), neg(vectors * w),
        coef(vectors), mean_k(vectors), mean_neg(w);
    for (float& d : dots) d = g(rng);
    for (size_t k = 0; k < neg.size(); ++k) {
      neg[k] = k % 7 == 3 ? kNone : -std::fabs(g(rng)) - 3;
    }
    for (uint32_t j = 0; j < vectors; ++j) {
      coef[j] = (j + 1.0f) / (6.0f * w);
      mean_k[j] = 0.125f * (j + 1.0f) / 6.0f;
    }
    for (float& n : mean_neg) n = -std::fabs(g(rng)) - 2;
    const float scale = 0.125f;
    std::vector<double> want(m, 0.0), want_mean(m, 0.0);
    for (size_t c = 0; c < m; ++c) {
      for (uint32_t i = 0; i < w; ++i) {
        double zm = 0;
        for (uint32_t j = 0; j < vectors; ++j) {
          const double d = dots[(c * vectors + j) * stride + h0 + i];
          want[c] += coef[j] * std::exp(d * scale + neg[j * w + i]);
          zm += mean_k[j] * d;
        }
        want_mean[c] += std::exp(zm + mean_neg[i]) / w;
      }
    }
    for (const ExpKernelInfo& k : AvailableExpKernels()) {
      for (bool mean : {false, true}) {
        std::vector<float> out(m, -1), mean_out(m, -1);
        DensityArgs a;
        a.dots = dots.data() + h0;
        a.m = m;
        a.stride = stride;
        a.vectors = vectors;
        a.w = w;
        a.scale = scale;
        a.neg = neg.data();
        a.coef = coef.data();
        if (mean) {
          a.mean_k = mean_k.data();
          a.mean_neg = mean_neg.data();
          a.mean_out = mean_out.data();
        }
        a.out = out.data();
        k.densities(a);
        for (size_t c = 0; c < m; ++c) {
          EXPECT_NEAR(out[c], want[c], 1e-5 * want[c] + 1e-30)
              << k.name << " w " << w << " candidate " << c;
          if (mean) {
            EXPECT_NEAR(mean_out[c], want_mean[c], 1e-5 * want_mean[c])
                << k.name << " w " << w << " candidate " << c;
          } else {
            EXPECT_EQ(mean_out[c], -1.0f) << "mean_out untouched";
          }
        }
      }
    }
  }
}

TEST(SegmentScanTest, EveryKernelGivesTheSameSegmentSums) {
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int> code(0, 255), hd(-63, 63), ld(-32, 32);
  const size_t nblocks = 5, seg_groups = 3, segments = 4;
  const size_t groups = seg_groups * segments;
  std::vector<uint8_t> packed(nblocks * groups * 4 * kInt8Lanes);
  for (auto& c : packed) c = static_cast<uint8_t>(code(rng));
  std::vector<int8_t> hi(groups * 4), lo(groups * 4);
  for (size_t j = 0; j < hi.size(); ++j) {
    hi[j] = static_cast<int8_t>(hd(rng));
    lo[j] = static_cast<int8_t>(ld(rng));
  }
  for (bool two_terms : {false, true}) {
    std::vector<int32_t> want(nblocks * segments * kInt8Lanes, 0);
    for (size_t b = 0; b < nblocks; ++b)
      for (size_t g = 0; g < groups; ++g)
        for (size_t l = 0; l < kInt8Lanes; ++l)
          for (size_t j = 0; j < 4; ++j) {
            const int d =
                two_terms ? 64 * hi[g * 4 + j] + lo[g * 4 + j] : hi[g * 4 + j];
            want[(b * segments + g / seg_groups) * kInt8Lanes + l] +=
                packed[((b * groups + g) * kInt8Lanes + l) * 4 + j] * d;
          }
    for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
      std::vector<int32_t> got(want.size(), -1);
      k.segments(packed.data(), nblocks, seg_groups, segments, hi.data(),
                 two_terms ? lo.data() : nullptr, got.data());
      EXPECT_EQ(got, want) << k.name << (two_terms ? " two terms" : "");
    }
  }
}

TEST(SegmentScanTest, ScoresLieWithinTheirBoundsOnEveryKernel) {
  // Per-head scans of the progressive index: every segment's score within
  // its vector's bound of the exact inner product, on every kernel; head
  // dims that are not a multiple of 4 scan exactly in fp32.
  std::mt19937_64 rng(18);
  const std::string best = ActiveInt8Kernel().name;
  for (const uint32_t head_dim : {6u, 32u, 64u}) {
    const uint32_t heads = 5, dim = heads * head_dim;
    ProgressiveIndex index(dim, 0, head_dim);
    std::vector<std::vector<float>> vecs;
    for (uint64_t i = 0; i < 203; ++i) {
      vecs.push_back(testing::RandomQuery(rng, dim));
      // Heads of different scales.
      for (uint32_t h = 0; h < heads; ++h)
        for (uint32_t k = 0; k < head_dim; ++k)
          vecs.back()[h * head_dim + k] *= float(1 << h);
      index.Add(i, vecs.back().data());
    }
    for (uint64_t i = 0; i < 203; i += 10) ASSERT_TRUE(index.Remove(i));
    const std::vector<float> q = testing::RandomQuery(rng, dim);
    for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
      ASSERT_TRUE(SelectInt8Kernel(k.name));
      SegmentScan scan;
      index.ScanSegments(q.data(), &scan);
      const size_t n = scan.ids.size();
      ASSERT_EQ(n, 203u - 21u);
      ASSERT_EQ(scan.dots.size(), n * heads);
      EXPECT_EQ(scan.bound.empty(), head_dim % 4 != 0) << head_dim;
      for (size_t r = 0; r < n; ++r) {
        const std::vector<float>& v = vecs[scan.ids[r]];
        for (uint32_t h = 0; h < heads; ++h) {
          double exact = 0;
          for (uint32_t k2 = 0; k2 < head_dim; ++k2) {
            exact += double(q[h * head_dim + k2]) * v[h * head_dim + k2];
          }
          const double err = std::fabs(scan.dots[h * n + r] - exact);
          if (scan.bound.empty()) {
            EXPECT_LT(err, 1e-3 * (1 + std::fabs(exact))) << head_dim;
          } else {
            EXPECT_LE(err, scan.bound[r] * (1 + 1e-5))
                << k.name << " head_dim " << head_dim << " head " << h;
          }
        }
      }
      // ScanMode::kRank: no bounds, a one-term query (7 bits). Its error
      // from the two roundings: q = t d + f with |f| <= sqrt(hd) t / 2, t =
      // max|q_h| / 63; v = s c + e with |e_h| <= sqrt(hd) s / 2, s = max|v|
      // / 127 (the whole vector's); |q.v - t s d.c| <= |q||e| + |f||v| +
      // |f||e|, plus float rounding.
      SegmentScan rank;
      index.ScanSegments(q.data(), &rank, ScanMode::kRank);
      ASSERT_EQ(rank.ids, scan.ids);
      EXPECT_TRUE(rank.bound.empty());
      EXPECT_EQ(rank.exact, head_dim % 4 != 0);
      double sum_err = 0, sum_scale = 0;
      for (size_t r = 0; r < n; ++r) {
        const std::vector<float>& v = vecs[scan.ids[r]];
        double vmax = 0;
        for (float x : v) vmax = std::max(vmax, double(std::fabs(x)));
        for (uint32_t h = 0; h < heads; ++h) {
          double exact = 0, qn = 0, vn = 0, qmax = 0;
          for (uint32_t k2 = 0; k2 < head_dim; ++k2) {
            const double a = q[h * head_dim + k2], b = v[h * head_dim + k2];
            exact += a * b;
            qn += a * a;
            vn += b * b;
            qmax = std::max(qmax, std::fabs(a));
          }
          qn = std::sqrt(qn);
          vn = std::sqrt(vn);
          const double root = std::sqrt(double(head_dim));
          const double f = root * qmax / 63 / 2, e = root * vmax / 127 / 2;
          const double err = std::fabs(rank.dots[h * n + r] - exact);
          EXPECT_LE(err, qn * e + f * vn + f * e + 1e-4 * (qn * vn + 1e-6))
              << k.name << " head_dim " << head_dim << " head " << h;
          sum_err += err;
          sum_scale += qn * vn;
        }
      }
      // Typically far inside that: about a percent of |q_h| |v_h|.
      if (head_dim % 4 == 0) {
        EXPECT_LT(sum_err / sum_scale, 0.02) << k.name;
      }
      // Several queries in one call: each the scan of its own call.
      std::vector<float> three = q;
      for (int j = 0; j < 2; ++j) {
        const std::vector<float> more = testing::RandomQuery(rng, dim);
        three.insert(three.end(), more.begin(), more.end());
      }
      for (ScanMode mode : {ScanMode::kProof, ScanMode::kRank}) {
        std::vector<SegmentScan> batch(3);
        index.ScanSegments(three.data(), 3, batch.data(), mode);
        for (size_t j = 0; j < 3; ++j) {
          SegmentScan one;
          index.ScanSegments(three.data() + j * dim, &one, mode);
          EXPECT_EQ(batch[j].ids, one.ids);
          EXPECT_EQ(batch[j].dots, one.dots) << k.name << " query " << j;
          EXPECT_EQ(batch[j].bound, one.bound) << k.name << " query " << j;
          EXPECT_EQ(batch[j].exact, one.exact);
        }
      }
    }
  }
  ASSERT_TRUE(SelectInt8Kernel(best));
}

// A scan of many vectors over many rows runs in chunks of blocks (each
// chunk's raw sums made dots at once): every chunk's rows land where they
// belong, within their bounds of the exact dots, on every kernel, and each
// vector's scan is its own call's.
TEST(SegmentScanTest, ChunkedScansOfManyRowsStayWithinTheirBounds) {
  std::mt19937_64 rng(25);
  const uint32_t heads = 8, head_dim = 64, dim = heads * head_dim;
  ProgressiveIndex index(dim, 0, head_dim);
  std::vector<std::vector<float>> vecs;
  for (uint64_t i = 0; i < 3001; ++i) {
    vecs.push_back(testing::RandomQuery(rng, dim));
    index.Add(i, vecs.back().data());
  }
  const size_t vectors = 9;
  std::vector<float> queries;
  for (size_t j = 0; j < vectors; ++j) {
    const std::vector<float> q = testing::RandomQuery(rng, dim);
    queries.insert(queries.end(), q.begin(), q.end());
  }
  const std::string best = ActiveInt8Kernel().name;
  for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
    ASSERT_TRUE(SelectInt8Kernel(k.name));
    std::vector<SegmentScan> batch(vectors);
    index.ScanSegments(queries.data(), vectors, batch.data(), ScanMode::kProof);
    for (size_t j = 0; j < vectors; ++j) {
      const SegmentScan& scan = batch[j];
      const size_t n = scan.ids.size();
      ASSERT_EQ(n, 3001u);
      for (size_t r = 0; r < n; ++r) {
        const std::vector<float>& v = vecs[scan.ids[r]];
        for (uint32_t h = 0; h < heads; ++h) {
          double exact = 0;
          for (uint32_t d = 0; d < head_dim; ++d) {
            exact += double(queries[j * dim + h * head_dim + d]) *
                     v[h * head_dim + d];
          }
          ASSERT_LE(std::fabs(scan.dots[h * n + r] - exact),
                    scan.bound[r] * (1 + 1e-5))
              << k.name << " vector " << j << " row " << r << " head " << h;
        }
      }
    }
    for (ScanMode mode : {ScanMode::kProof, ScanMode::kRank}) {
      index.ScanSegments(queries.data(), vectors, batch.data(), mode);
      for (size_t j = 0; j < vectors; j += 4) {
        SegmentScan one;
        index.ScanSegments(queries.data() + j * dim, &one, mode);
        EXPECT_EQ(batch[j].dots, one.dots) << k.name << " vector " << j;
        EXPECT_EQ(batch[j].bound, one.bound) << k.name << " vector " << j;
      }
    }
  }
  ASSERT_TRUE(SelectInt8Kernel(best));
}

// ColdMass (SSE2 where there is SSE2) is its scalar definition's double,
// bit for bit: any length (the tail of fewer than four rows), densities
// negative, zero, subnormal, infinite or NaN, recallable flags 0, 1, -1,
// 0.5 and NaN (only > 0 counts), token counts up to 2^32 - 1.
TEST(MassRowsTest, ColdMassIsTheScalarSumBitForBit) {
  std::mt19937_64 rng(41);
  // The finite ones first: with `nonfinite` false only those, so that long
  // rows are compared bit for bit rather than as NaN.
  const float special[] = {0.0f,
                           -0.0f,
                           1e-42f,
                           -3.5f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  const float flags[] = {0.0f, 1.0f, -1.0f, 0.5f,
                         std::numeric_limits<float>::quiet_NaN()};
  const uint32_t counts[] = {0u, 1u, 7u, 1u << 24, 1u << 31, 0xffffffffu};
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{5},
                   size_t{37}, size_t{10007}}) {
    for (int special_share : {0, 1, 8}) {  // In 8ths of the rows.
      for (bool nonfinite : {false, true}) {
        const size_t specials = nonfinite ? std::size(special) : 5;
        std::vector<float> density(n), recallable(n);
        std::vector<uint32_t> tokens(n);
        for (size_t i = 0; i < n; ++i) {
          density[i] = static_cast<int>(rng() % 8) < special_share
                           ? special[rng() % specials]
                           : u(rng) * 1e-3f;
          recallable[i] = flags[rng() % std::size(flags)];
          tokens[i] = rng() % 4 == 0 ? counts[rng() % std::size(counts)]
                                     : static_cast<uint32_t>(rng() % 64);
        }
        const double want =
            ColdMassScalar(density.data(), recallable.data(), tokens.data(), n);
        const double got =
            ColdMass(density.data(), recallable.data(), tokens.data(), n);
        if (std::isnan(want)) {
          EXPECT_TRUE(nonfinite) << n << " " << special_share;
          EXPECT_TRUE(std::isnan(got)) << n << " " << special_share;
        } else {
          EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0)
              << n << " " << special_share << ": " << want << " vs " << got;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvmem

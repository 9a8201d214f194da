// Token codes (engine/index/token_codes.h): the int4 encoding against its
// definition, every kernel this CPU can run against the scalar one (the same
// floats: the integer sums are exact), the dot's error within its stated
// bound, and how well code dots rank tokens against exact dots on random
// data.
#include "engine/index/token_codes.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

std::vector<float> Random(std::mt19937_64& rng, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double ExactDot(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

TEST(TokenCodesTest, EncodingFollowsItsDefinition) {
  for (uint32_t hd : {8u, 40u, 64u, 96u, 128u}) {
    std::mt19937_64 rng(hd);
    const TokenCodeShape shape{3, hd};
    EXPECT_EQ(shape.bytes_per_token(),
              3 * (4 + 32 * static_cast<size_t>((hd + 63) / 64)));
    const size_t n = 5;
    std::vector<float> keys = Random(rng, n * 3 * hd);
    std::fill_n(keys.begin() + 3 * hd, hd, 0.0f);  // Token 1, segment 0: 0.
    const std::string codes = EncodeTokenCodes(shape, keys.data(), n);
    ASSERT_EQ(codes.size(), n * shape.bytes_per_token());
    std::vector<float> back(3 * hd);
    for (size_t t = 0; t < n; ++t) {
      DecodeTokenCodes(shape, codes, t, back.data());
      for (uint32_t s = 0; s < 3; ++s) {
        const float* x = keys.data() + (t * 3 + s) * hd;
        float peak = 0;
        for (uint32_t i = 0; i < hd; ++i)
          peak = std::max(peak, std::fabs(x[i]));
        const float scale = peak / 7.0f;
        for (uint32_t i = 0; i < hd; ++i) {
          // round(x / scale) * scale: within half a step, exact at the peak.
          const float want = scale * std::round(x[i] / scale);
          EXPECT_NEAR(back[s * hd + i], peak > 0 ? want : 0.0f,
                      1e-5f * peak + 1e-30f)
              << "hd " << hd << " token " << t << " segment " << s;
          EXPECT_LE(std::fabs(back[s * hd + i] - x[i]), scale / 2 + 1e-5f);
        }
      }
    }
  }
}

// The codes round x / scale half away from zero, as lround does (the
// encoder writes the rounding out so it vectorises): with a peak of 7 the
// scale is 1, so each decoded value is the code itself; ties, values a float
// step below a tie, and both signs.
TEST(TokenCodesTest, RoundsHalfAwayFromZeroAsLround) {
  const std::vector<float> values = {
      0.5f,       -0.5f,  1.5f,       -2.5f,      0.49999997f, -0.49999997f,
      6.5f,       -6.5f,  3.4999998f, -7.0f,      0.0f,        -0.0f,
      2.5000002f, 1e-30f, -4.5f,      5.4999995f, -1.5000001f, 0.50000006f};
  // 16 dims (two runs of 8) and 19 (a 3-element tail after them), the peak
  // of 7 first so the scale is 1.
  for (const uint32_t hd : {16u, 19u}) {
    std::vector<float> x(hd);
    x[0] = 7.0f;
    for (uint32_t i = 1; i < hd; ++i) x[i] = values[(i - 1) % values.size()];
    const TokenCodeShape shape{1, hd};
    const std::string codes = EncodeTokenCodes(shape, x.data(), 1);
    std::vector<float> back(hd);
    DecodeTokenCodes(shape, codes, 0, back.data());
    for (uint32_t i = 0; i < hd; ++i) {
      EXPECT_EQ(back[i], static_cast<float>(std::lround(x[i])))
          << "hd " << hd << ", x = " << x[i];
    }
  }
  // Random rows at many scales: every code is the definition's,
  // clamp(lround(x * (1 / (peak / 7)))), bit for bit after decoding.
  std::mt19937_64 rng(41);
  for (const uint32_t hd : {64u, 128u, 100u}) {
    const TokenCodeShape shape{4, hd};
    std::vector<float> keys = Random(rng, 4 * hd, 0.01f + rng() % 1000);
    const std::string codes = EncodeTokenCodes(shape, keys.data(), 1);
    std::vector<float> back(4 * hd);
    DecodeTokenCodes(shape, codes, 0, back.data());
    for (uint32_t s = 0; s < 4; ++s) {
      const float* x = keys.data() + s * hd;
      float peak = 0;
      for (uint32_t i = 0; i < hd; ++i) peak = std::max(peak, std::fabs(x[i]));
      const float scale = peak / 7.0f, inv = 1.0f / scale;
      for (uint32_t i = 0; i < hd; ++i) {
        const long c = std::clamp(std::lround(x[i] * inv), -7L, 7L);
        EXPECT_EQ(back[s * hd + i], scale * static_cast<float>(c))
            << "hd " << hd << " segment " << s << " dim " << i;
      }
    }
  }
}

// The prepared query (int8 rows, scale, sum) is the scalar definition's on
// every path this CPU runs: random rows of several widths and scales, and
// halves (peak 127 makes the scale 1, so x * (1 / scale) is x).
TEST(TokenCodesTest, PreparedQueryIsTheScalarDefinitions) {
  std::mt19937_64 rng(17);
  for (const uint32_t hd : {8u, 19u, 64u, 100u, 128u}) {
    const TokenCodeShape shape{5, hd};
    for (float sd : {1e-3f, 1.0f, 300.0f}) {
      const uint32_t vectors = 3;
      std::vector<float> query = Random(rng, size_t{vectors} * 5 * hd, sd);
      for (uint32_t i = 0; i < hd; ++i) query[i] = 0.0f;  // A zero row.
      for (uint32_t i = 0; i < hd; ++i)
        query[hd + i] = std::tanh(query[hd + i]);
      query[hd] = 127.0f;  // Row 1: peak 127, so its scale is 1.
      const float halves[] = {0.5f, -0.5f, 2.5f, -2.5f, 126.5f, -126.5f};
      for (uint32_t i = 1; i < 7 && i < hd; ++i) query[hd + i] = halves[i - 1];
      TokenQuery a, b;
      PrepareTokenQuery(shape, query.data(), vectors, &a);
      PrepareTokenQueryScalar(shape, query.data(), vectors, &b);
      SCOPED_TRACE(testing::Message() << "hd " << hd << " sd " << sd);
      EXPECT_EQ(a.q, b.q);
      EXPECT_EQ(a.scale, b.scale);
      EXPECT_EQ(a.sum, b.sum);
      ASSERT_EQ(b.scale[1], 1.0f);
      const size_t row = size_t{shape.chunks()} * 64;
      for (uint32_t i = 1; i < 7 && i < hd; ++i) {
        EXPECT_EQ(b.q[row + i], std::lround(halves[i - 1]));
      }
    }
  }
}

// Codes at the extremes: every code 15 or 1 against a query of +-127 (the
// largest pair sums vpmaddubsw adds), beside random ones. head_dim 300 (5
// chunks) takes the AVX2 kernel's path that scores vector by vector.
TEST(TokenCodesTest, EveryKernelReturnsTheScalarFloats) {
  const auto& kernels = AvailableTokenKernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.back().name, "scalar");
  const TokenKernelInfo& scalar = kernels.back();
  for (uint32_t hd : {8u, 40u, 64u, 128u, 200u, 300u}) {
    std::mt19937_64 rng(100 + hd);
    // 20 segments: runs of 8 and the rest, from any first segment.
    const uint32_t segments = 20, vectors = 3;
    const TokenCodeShape shape{segments, hd};
    const size_t n = 37;
    std::vector<float> keys = Random(rng, n * segments * hd);
    for (uint32_t i = 0; i < segments * hd; ++i) {
      keys[i] = (i % 2 ? 1.0f : -1.0f);  // Token 0: codes 15 and 1.
    }
    const std::string codes = EncodeTokenCodes(shape, keys.data(), n);
    std::vector<float> query = Random(rng, vectors * segments * hd, 3.0f);
    for (uint32_t i = 0; i < segments * hd; ++i) {
      query[i] = (i % 2 ? 5.0f : -5.0f);  // Vector 0: +-127 after scaling.
    }
    TokenQuery q;
    PrepareTokenQuery(shape, query.data(), vectors, &q);
    // And one vector alone (the kernels' single-vector path).
    TokenQuery one;
    PrepareTokenQuery(shape, query.data() + segments * hd, 1, &one);
    const auto* records = reinterpret_cast<const uint8_t*>(codes.data());
    for (const TokenKernelInfo& k : kernels) {
      std::vector<float> want(n * segments), got(n * segments);
      scalar.dots(shape, one, records, n, 0, segments, want.data());
      k.dots(shape, one, records, n, 0, segments, got.data());
      EXPECT_EQ(got, want) << k.name << " hd " << hd << " one vector";
    }
    for (const auto& [s0, s1] : {std::pair<uint32_t, uint32_t>{0, segments},
                                 std::pair<uint32_t, uint32_t>{3, 19},
                                 std::pair<uint32_t, uint32_t>{1, 3}}) {
      std::vector<float> want(n * vectors * segments, -1.0f);
      scalar.dots(shape, q, records, n, s0, s1, want.data());
      for (const TokenKernelInfo& k : kernels) {
        std::vector<float> got(want.size(), -1.0f);
        k.dots(shape, q, records, n, s0, s1, got.data());
        EXPECT_EQ(got, want)
            << k.name << " hd " << hd << " [" << s0 << ", " << s1 << ")";
      }
      // Entries outside [s0, s1) are left alone.
      for (size_t r = 0; r < n * vectors; ++r) {
        for (uint32_t s = 0; s < segments; ++s) {
          if (s < s0 || s >= s1) {
            EXPECT_EQ(want[r * segments + s], -1.0f);
          }
        }
      }
    }
  }
}

// |code dot - exact dot| <= s_key / 2 * |q|_1 + t / 2 * |key|_1 +
// (s_key / 2) * (t / 2) * hd: each side's rounding and their product.
TEST(TokenCodesTest, DotErrorIsWithinItsBound) {
  const uint32_t hd = 64, segments = 2, vectors = 2;
  const TokenCodeShape shape{segments, hd};
  std::mt19937_64 rng(5);
  const size_t n = 200;
  const std::vector<float> keys = Random(rng, n * segments * hd);
  const std::vector<float> query = Random(rng, vectors * segments * hd, 2.0f);
  const std::string codes = EncodeTokenCodes(shape, keys.data(), n);
  TokenQuery q;
  PrepareTokenQuery(shape, query.data(), vectors, &q);
  std::vector<float> dots(n * vectors * segments);
  ActiveTokenKernel().dots(shape, q,
                           reinterpret_cast<const uint8_t*>(codes.data()), n, 0,
                           segments, dots.data());
  double worst = 0;
  for (size_t t = 0; t < n; ++t) {
    for (uint32_t j = 0; j < vectors; ++j) {
      for (uint32_t s = 0; s < segments; ++s) {
        const float* k = keys.data() + (t * segments + s) * hd;
        const float* x = query.data() + (j * segments + s) * hd;
        double kpeak = 0, qpeak = 0, k1 = 0, q1 = 0;
        for (uint32_t i = 0; i < hd; ++i) {
          kpeak = std::max(kpeak, double(std::fabs(k[i])));
          qpeak = std::max(qpeak, double(std::fabs(x[i])));
          k1 += std::fabs(k[i]);
          q1 += std::fabs(x[i]);
        }
        const double sk = kpeak / 7 / 2, tq = qpeak / 127 / 2;
        const double bound = sk * q1 + tq * k1 + sk * tq * hd + 1e-4;
        const double err = std::fabs(dots[(t * vectors + j) * segments + s] -
                                     ExactDot(k, x, hd));
        EXPECT_LE(err, bound) << "token " << t;
        worst = std::max(worst, err / bound);
      }
    }
  }
  std::printf("token codes: worst dot error %.2f of its bound\n", worst);
}

// Ranking: 512 tokens, a head's query; the top 32 by code dots against the
// top 32 by exact dots. Tokens share one direction (the query's) at random
// strengths plus noise, as keys that attention separates do. Documented
// tolerance: at least 0.85 of the exact top 32 on average over 20 queries,
// and the code-ranked top 32 hold at least 0.97 of the exact top 32's
// softmax mass.
TEST(TokenCodesTest, CodeDotsRankTokensAsExactDotsDo) {
  const uint32_t hd = 64, segments = 1;
  const TokenCodeShape shape{segments, hd};
  const size_t n = 512, k = 32;
  std::mt19937_64 rng(11);
  double overlap = 0, mass_share = 0;
  const int trials = 20;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<float> dir = Random(rng, hd);
    const double norm = std::sqrt(ExactDot(dir.data(), dir.data(), hd));
    for (float& x : dir) x = static_cast<float>(x / norm);
    std::vector<float> keys = Random(rng, n * hd);
    std::uniform_real_distribution<float> strength(-2.0f, 4.0f);
    for (size_t t = 0; t < n; ++t) {
      const float a = strength(rng);
      for (uint32_t i = 0; i < hd; ++i) keys[t * hd + i] += a * dir[i];
    }
    std::vector<float> query(hd);
    for (uint32_t i = 0; i < hd; ++i) query[i] = 8.0f * dir[i];
    const std::string codes = EncodeTokenCodes(shape, keys.data(), n);
    TokenQuery q;
    PrepareTokenQuery(shape, query.data(), 1, &q);
    std::vector<float> approx(n);
    ActiveTokenKernel().dots(shape, q,
                             reinterpret_cast<const uint8_t*>(codes.data()), n,
                             0, 1, approx.data());
    std::vector<double> exact(n);
    for (size_t t = 0; t < n; ++t) {
      exact[t] = ExactDot(keys.data() + t * hd, query.data(), hd);
    }
    auto top = [&](auto& v) {
      std::vector<size_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](size_t a, size_t b) { return v[a] > v[b]; });
      return std::vector<size_t>(idx.begin(), idx.begin() + k);
    };
    const auto by_exact = top(exact), by_code = top(approx);
    const std::set<size_t> want(by_exact.begin(), by_exact.end());
    size_t hit = 0;
    for (size_t t : by_code) hit += want.count(t);
    overlap += double(hit) / k;
    const double scale = 1.0 / std::sqrt(double(hd));
    double m_exact = 0, m_code = 0;
    for (size_t t : by_exact) m_exact += std::exp(exact[t] * scale);
    for (size_t t : by_code) m_code += std::exp(exact[t] * scale);
    mass_share += m_code / m_exact;
  }
  overlap /= trials;
  mass_share /= trials;
  std::printf("token codes: top-%zu overlap %.3f, mass share %.4f\n", k,
              overlap, mass_share);
  EXPECT_GE(overlap, 0.85);
  EXPECT_GE(mass_share, 0.97);
}

}  // namespace
}  // namespace kvmem

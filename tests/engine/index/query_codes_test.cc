// The int8 scan's query as integers (engine/index/query_codes.h): the kernel
// this CPU runs against the scalar definition (the same integers and unit,
// the norms equal to rounding), halves rounded away from zero as lround
// does, and the definition's own properties (d = 64 hi + lo, |lo| <= 32).
#include "engine/index/query_codes.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

struct Coded {
  QueryCode c;
  std::vector<int8_t> hi, lo;
};

Coded Code(const std::vector<float>& q, bool two_terms, bool scalar) {
  Coded out;
  out.hi.assign(q.size(), 99);
  out.lo.assign(q.size(), 99);
  out.c = scalar ? QuantizeQueryScalar(q.data(), q.size(), two_terms,
                                       out.hi.data(), out.lo.data())
                 : QuantizeQuery(q.data(), q.size(), two_terms, out.hi.data(),
                                 out.lo.data());
  return out;
}

void ExpectSame(const std::vector<float>& q, bool two_terms) {
  const Coded s = Code(q, two_terms, true), k = Code(q, two_terms, false);
  EXPECT_EQ(s.c.t, k.c.t);
  EXPECT_EQ(s.c.offset, k.c.offset);
  EXPECT_EQ(s.hi, k.hi);
  if (two_terms) {
    EXPECT_EQ(s.lo, k.lo);
  }
  EXPECT_NEAR(s.c.residual, k.c.residual, 1e-6 * s.c.residual + 1e-30);
  EXPECT_NEAR(s.c.norm, k.c.norm, 1e-6 * s.c.norm + 1e-30);
  // The definition itself.
  const int top = two_terms ? 63 * 64 : 63;
  double r2 = 0, q2 = 0;
  int32_t sum = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    const int d = two_terms ? 64 * s.hi[i] + s.lo[i] : s.hi[i];
    ASSERT_LE(std::abs(d), top);
    if (two_terms) {
      ASSERT_LE(std::abs(s.lo[i]), 32);
    }
    sum += d;
    r2 += std::pow(double(q[i]) - double(s.c.t) * d, 2);
    q2 += double(q[i]) * q[i];
  }
  EXPECT_EQ(s.c.offset, 128 * sum);
  EXPECT_GE(double(s.c.residual), std::sqrt(r2));
  EXPECT_GE(double(s.c.norm), std::sqrt(q2));
}

TEST(QueryCodesTest, KernelReturnsTheScalarIntegers) {
  std::printf("query code kernel: %s\n", QueryCodeKernel());
  std::mt19937_64 rng(5);
  for (size_t n : {1u, 3u, 7u, 8u, 9u, 31u, 64u, 128u, 515u, 4096u, 32768u}) {
    for (float sd : {1e-3f, 1.0f, 40.0f}) {
      std::normal_distribution<float> d(0, sd);
      std::vector<float> q(n);
      for (float& x : q) x = d(rng);
      for (bool two : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << "n " << n << " sd " << sd << " two_terms " << two);
        ExpectSame(q, two);
      }
    }
  }
  // All zero: unit 0, codes 0.
  const std::vector<float> zero(20, 0.0f);
  const Coded z = Code(zero, true, false);
  EXPECT_EQ(z.c.t, 0.0f);
  EXPECT_EQ(z.c.offset, 0);
  EXPECT_EQ(z.hi, std::vector<int8_t>(20, 0));
  EXPECT_EQ(z.lo, std::vector<int8_t>(20, 0));
}

TEST(QueryCodesTest, HalvesRoundAwayFromZero) {
  // max|q| = top makes the unit exactly 1, so q / t is q: halves are ties.
  for (bool two : {false, true}) {
    const float top = two ? 4032.0f : 63.0f;
    std::vector<float> q = {top,    2.5f,  -2.5f,  0.5f,        -0.5f,
                            1.5f,   -1.5f, 31.5f,  -31.5f,      32.0f,
                            -32.0f, 95.5f, -96.5f, 0.49999997f, -0.49999997f,
                            7.0f,   -top};
    if (!two) {
      for (float& x : q) x = std::fmod(x, 63.0f);
      q[0] = top;
    }
    const Coded s = Code(q, two, true);
    ASSERT_EQ(s.c.t, 1.0f);
    for (size_t i = 0; i < q.size(); ++i) {
      const int d = two ? 64 * s.hi[i] + s.lo[i] : s.hi[i];
      EXPECT_EQ(d, std::lround(q[i])) << q[i];
      if (two) {
        EXPECT_EQ(s.hi[i], std::lround(d / 64.0)) << q[i];
      }
    }
    ExpectSame(q, two);
  }
}

TEST(QueryCodesTest, StoredCodesAreTheScalarDefinitions) {
  std::mt19937_64 rng(8);
  for (size_t n : {1u, 7u, 8u, 13u, 64u, 512u, 1001u}) {
    for (float sd : {1e-30f, 1e-3f, 1.0f, 1e4f}) {
      std::normal_distribution<float> d(0, sd);
      std::vector<float> x(n);
      for (float& v : x) v = d(rng);
      if (n > 3) x[1] = 0.0f;
      for (int levels : {7, 127}) {
        SCOPED_TRACE(testing::Message()
                     << "n " << n << " sd " << sd << " levels " << levels);
        std::vector<int8_t> a(n, 99), b(n, 99);
        const float sa = SymmetricCodes(x.data(), n, levels, a.data());
        const float sb = SymmetricCodesScalar(x.data(), n, levels, b.data());
        EXPECT_EQ(sa, sb);
        EXPECT_EQ(a, b);
        double r2 = 0, c2 = 0, r2d = 0, c2d = 0;
        AddCodeNorms(x.data(), a.data(), sa, n, &r2, &c2);
        for (size_t i = 0; i < n; ++i) {
          r2d += std::pow(double(x[i]) - double(sa) * a[i], 2);
          c2d += double(a[i]) * a[i];
          ASSERT_LE(std::abs(int{a[i]}), levels);
        }
        EXPECT_NEAR(r2, r2d, 1e-12 * r2d + 1e-300);
        EXPECT_NEAR(c2, c2d, 1e-12 * c2d);
      }
    }
  }
  // Halves: peak = levels makes the scale 1.
  const std::vector<float> x = {127.0f, 2.5f,    -2.5f,       0.5f,  -0.5f,
                                126.5f, -126.5f, 3.49999976f, -7.5f, 1.5f};
  std::vector<int8_t> a(x.size());
  ASSERT_EQ(SymmetricCodes(x.data(), x.size(), 127, a.data()), 1.0f);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(a[i], std::lround(x[i]));
}

}  // namespace
}  // namespace kvmem

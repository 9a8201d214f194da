// DotMany against Dot: the same floats, bit for bit, for every pair of rows
// and columns, at lengths with and without a tail past the last 8 and
// across DotMany's chunks, and column counts with and without a remainder
// past groups of 4 (each of DotMany's paths). Whichever clone this CPU runs
// (AVX2 + FMA or the baseline) runs for both.
#include "engine/index/dot.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(DotTest, DotManyEqualsDotBitForBit) {
  std::mt19937_64 rng(17);
  std::normal_distribution<float> x(0.0f, 1.0f);
  for (size_t n : {1u, 7u, 8u, 61u, 64u, 1024u, 1031u, 3000u, 32768u}) {
    for (size_t k : {1u, 3u, 4u, 9u, 32u}) {
      const size_t m = n > 4096 ? 5 : 13;
      std::vector<float> rows(m * n), cols(k * n), out(m * k, -1.0f);
      for (float& v : rows) v = x(rng);
      for (float& v : cols) v = x(rng);
      DotMany(rows.data(), m, cols.data(), k, n, out.data());
      for (size_t i = 0; i < m; ++i) {
        for (size_t c = 0; c < k; ++c) {
          const float want = Dot(rows.data() + i * n, cols.data() + c * n, n);
          // Bits, not values: the clustering's ties must fall alike.
          EXPECT_EQ(std::memcmp(&out[i * k + c], &want, sizeof(float)), 0)
              << "n " << n << " k " << k << " row " << i << " col " << c << ": "
              << out[i * k + c] << " vs " << want;
        }
      }
    }
  }
}

// The mass estimate's densities must not move when it adds its heads in
// one pass: AxpyRows is the Axpy sequence, bit for bit, at every tail.
TEST(DotTest, AxpyRowsEqualsAxpyRowByRowBitForBit) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> x(0.0f, 1.0f);
  for (size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 100u, 3856u}) {
    for (size_t rows : {0u, 1u, 3u, 8u}) {
      std::vector<float> data(rows * n), alpha(rows), y(n);
      for (float& v : data) v = x(rng);
      for (float& v : alpha) v = x(rng);
      for (float& v : y) v = x(rng);
      std::vector<const float*> ptr(rows);
      for (size_t r = 0; r < rows; ++r) ptr[r] = data.data() + r * n;
      std::vector<float> want = y;
      for (size_t r = 0; r < rows; ++r) Axpy(alpha[r], ptr[r], want.data(), n);
      AxpyRows(alpha.data(), ptr.data(), rows, y.data(), n);
      // memcmp of no bytes still needs non-null pointers (UBSan).
      EXPECT_TRUE(n == 0 ||
                  std::memcmp(y.data(), want.data(), n * sizeof(float)) == 0)
          << "n " << n << " rows " << rows;
    }
  }
}

// The seal's token groups (the fold, the centres, the group sums) must
// group the tokens as the scalar loops did: each kernel's clone (the one
// this CPU runs) gives the loop's bits at every tail, over values from
// tiny to large.
TEST(DotTest, SealKernelsEqualTheirScalarLoopsBitForBit) {
  std::mt19937_64 rng(29);
  std::normal_distribution<float> x(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-30, 30);
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 31u, 33u, 100u, 2048u, 4099u}) {
    std::vector<float> a(n), sign(n), y(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = std::ldexp(x(rng), exp(rng));
      sign[i] = (rng() & 1) != 0 ? 1.0f : -1.0f;
      y[i] = x(rng);
    }
    const float d = 3.7f;
    std::vector<float> want_signed = y, want_divided = y;
    std::vector<double> acc(n), want_acc(n);
    for (size_t i = 0; i < n; ++i) {
      acc[i] = want_acc[i] = std::ldexp(double(x(rng)), exp(rng));
    }
    for (size_t i = 0; i < n; ++i) {
      want_signed[i] += sign[i] * a[i];
      want_divided[i] += a[i] / d;
      want_acc[i] += static_cast<double>(a[i]);
    }
    std::vector<float> want_quotient(n), got_quotient(n);
    for (size_t i = 0; i < n; ++i) {
      want_quotient[i] = static_cast<float>(want_acc[i] / 7.0);
    }
    DivideToFloat(want_acc.data(), 7.0, got_quotient.data(), n);
    std::vector<float> got_signed = y, got_divided = y;
    AddSigned(a.data(), sign.data(), got_signed.data(), n);
    AddDivided(a.data(), d, got_divided.data(), n);
    AddAsDouble(a.data(), acc.data(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::memcmp(&got_signed[i], &want_signed[i], 4), 0)
          << "AddSigned n " << n << " i " << i;
      EXPECT_EQ(std::memcmp(&got_divided[i], &want_divided[i], 4), 0)
          << "AddDivided n " << n << " i " << i;
      EXPECT_EQ(std::memcmp(&acc[i], &want_acc[i], 8), 0)
          << "AddAsDouble n " << n << " i " << i;
      EXPECT_EQ(std::memcmp(&got_quotient[i], &want_quotient[i], 4), 0)
          << "DivideToFloat n " << n << " i " << i;
    }
  }
}

TEST(DotTest, DotManyOfNothing) {
  std::vector<float> out(3, -1.0f);
  const std::vector<float> rows(3 * 0), cols(0);
  DotMany(rows.data(), 3, cols.data(), 1, 0, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
  DotMany(rows.data(), 0, cols.data(), 0, 0, out.data());  // Nothing written.
  EXPECT_EQ(out[0], 0.0f);
}

}  // namespace
}  // namespace kvmem

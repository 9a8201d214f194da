#include "engine/index/dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvmem {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVMEM_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define KVMEM_CLONES
#endif

// Eight partial sums let the compiler vectorise without -ffast-math.
KVMEM_CLONES float Dot(const float* a, const float* b, size_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t u = 0; u < 8; ++u) part[u] += a[i + u] * b[i + u];
  }
  float s = ((part[0] + part[1]) + (part[2] + part[3])) +
            ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Eight partial maxima, as Dot's sums (max is exact in any order).
KVMEM_CLONES float MaxAbs(const float* x, size_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t u = 0; u < 8; ++u) {
      part[u] = std::max(part[u], std::fabs(x[i + u]));
    }
  }
  float m = 0;
  for (float v : part) m = std::max(m, v);
  for (; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

namespace {

// Dimensions per chunk of DotMany: a chunk of 32 columns is 128 KiB.
constexpr size_t kDotChunk = 1024;

// Eight floats as one value (GCC's vector extension): each clone computes
// it with its own instructions, lane by lane as Dot's eight partial sums
// (multiply then add, or fused where Dot's clone fuses them too).
typedef float V8 __attribute__((vector_size(32)));
// Load8 and Store8 are inlined into each clone; the baseline clones warn
// that a 32-byte vector return would change the ABI of a call they never
// make.
#pragma GCC diagnostic push  // GCC and clang both read it.
#pragma GCC diagnostic ignored "-Wpsabi"

inline V8 Load8(const float* p) {
  V8 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store8(float* p, V8 v) { __builtin_memcpy(p, &v, sizeof(v)); }

// Adds the pairs' products over dimensions [d0, d1) (a multiple of 8 apart)
// to the eight partial sums of row r with columns c0..c0+3 (acc: 32 floats,
// 8 per column), in Dot's order.
KVMEM_CLONES void DotFour(const float* __restrict r, const float* __restrict c0,
                          size_t n, size_t d0, size_t d1,
                          float* __restrict acc) {
  const float* c1 = c0 + n;
  const float* c2 = c1 + n;
  const float* c3 = c2 + n;
  V8 p0 = Load8(acc), p1 = Load8(acc + 8), p2 = Load8(acc + 16),
     p3 = Load8(acc + 24);
  for (size_t d = d0; d < d1; d += 8) {
    const V8 x = Load8(r + d);
    p0 += x * Load8(c0 + d);
    p1 += x * Load8(c1 + d);
    p2 += x * Load8(c2 + d);
    p3 += x * Load8(c3 + d);
  }
  Store8(acc, p0);
  Store8(acc + 8, p1);
  Store8(acc + 16, p2);
  Store8(acc + 24, p3);
}

// The same for rows r0 and r0 + n at once (acc0, acc1: their 32 floats):
// each column's load serves both rows, six loads for eight products where
// DotFour makes five for four (the k-means' distances were bound by them).
KVMEM_CLONES void DotFourTwoRows(const float* __restrict r0,
                                 const float* __restrict c0, size_t n,
                                 size_t d0, size_t d1, float* __restrict acc0,
                                 float* __restrict acc1) {
  const float* r1 = r0 + n;
  const float* c1 = c0 + n;
  const float* c2 = c1 + n;
  const float* c3 = c2 + n;
  V8 p0 = Load8(acc0), p1 = Load8(acc0 + 8), p2 = Load8(acc0 + 16),
     p3 = Load8(acc0 + 24);
  V8 q0 = Load8(acc1), q1 = Load8(acc1 + 8), q2 = Load8(acc1 + 16),
     q3 = Load8(acc1 + 24);
  for (size_t d = d0; d < d1; d += 8) {
    const V8 x = Load8(r0 + d), z = Load8(r1 + d);
    V8 y = Load8(c0 + d);
    p0 += x * y;
    q0 += z * y;
    y = Load8(c1 + d);
    p1 += x * y;
    q1 += z * y;
    y = Load8(c2 + d);
    p2 += x * y;
    q2 += z * y;
    y = Load8(c3 + d);
    p3 += x * y;
    q3 += z * y;
  }
  Store8(acc0, p0);
  Store8(acc0 + 8, p1);
  Store8(acc0 + 16, p2);
  Store8(acc0 + 24, p3);
  Store8(acc1, q0);
  Store8(acc1 + 8, q1);
  Store8(acc1 + 16, q2);
  Store8(acc1 + 24, q3);
}

// The same for rows r0..r0+3 (n apart) with one column: acc for row q at
// acc + q * stride.
KVMEM_CLONES void DotFourRows(const float* __restrict r0,
                              const float* __restrict c, size_t n, size_t d0,
                              size_t d1, float* __restrict acc, size_t stride) {
  const float* r1 = r0 + n;
  const float* r2 = r1 + n;
  const float* r3 = r2 + n;
  V8 p0 = Load8(acc), p1 = Load8(acc + stride), p2 = Load8(acc + 2 * stride),
     p3 = Load8(acc + 3 * stride);
  for (size_t d = d0; d < d1; d += 8) {
    const V8 y = Load8(c + d);
    p0 += Load8(r0 + d) * y;
    p1 += Load8(r1 + d) * y;
    p2 += Load8(r2 + d) * y;
    p3 += Load8(r3 + d) * y;
  }
  Store8(acc, p0);
  Store8(acc + stride, p1);
  Store8(acc + 2 * stride, p2);
  Store8(acc + 3 * stride, p3);
}

// The same for one column.
KVMEM_CLONES void DotOne(const float* __restrict r, const float* __restrict c,
                         size_t d0, size_t d1, float* __restrict acc) {
  V8 p = Load8(acc);
  for (size_t d = d0; d < d1; d += 8) p += Load8(r + d) * Load8(c + d);
  Store8(acc, p);
}

#pragma GCC diagnostic pop

}  // namespace

KVMEM_CLONES void DotMany(const float* rows, size_t m, const float* cols,
                          size_t k, size_t n, float* out) {
  const size_t whole = n / 8 * 8;
  std::vector<float> acc(m * k * 8, 0.0f);
  for (size_t d0 = 0; d0 < whole; d0 += kDotChunk) {
    const size_t d1 = std::min(whole, d0 + kDotChunk);
    // Columns four at a time against each row; the columns left over
    // (all of them when k < 4) against rows four at a time: four
    // independent sums in flight either way.
    const size_t k4 = k / 4 * 4;
    size_t i = 0;
    for (; k4 > 0 && i + 2 <= m; i += 2) {
      const float* r = rows + i * n;
      float* a = acc.data() + i * k * 8;
      for (size_t c = 0; c < k4; c += 4) {
        DotFourTwoRows(r, cols + c * n, n, d0, d1, a + c * 8, a + (k + c) * 8);
      }
    }
    for (; i < m; ++i) {
      const float* r = rows + i * n;
      float* a = acc.data() + i * k * 8;
      for (size_t c = 0; c < k4; c += 4) {
        DotFour(r, cols + c * n, n, d0, d1, a + c * 8);
      }
    }
    for (size_t c = k4; c < k; ++c) {
      size_t i = 0;
      for (; i + 4 <= m; i += 4) {
        DotFourRows(rows + i * n, cols + c * n, n, d0, d1,
                    acc.data() + (i * k + c) * 8, k * 8);
      }
      for (; i < m; ++i) {
        DotOne(rows + i * n, cols + c * n, d0, d1,
               acc.data() + (i * k + c) * 8);
      }
    }
  }
  for (size_t i = 0; i < m; ++i) {
    for (size_t c = 0; c < k; ++c) {
      const float* part = acc.data() + (i * k + c) * 8;
      float s = ((part[0] + part[1]) + (part[2] + part[3])) +
                ((part[4] + part[5]) + (part[6] + part[7]));
      const float* a = rows + i * n;
      const float* b = cols + c * n;
      for (size_t j = whole; j < n; ++j) s += a[j] * b[j];
      out[i * k + c] = s;
    }
  }
}

KVMEM_CLONES int32_t DotInt8(const int8_t* a, const int8_t* b, size_t n) {
  int32_t s = 0;  // Integer sums reassociate freely: this vectorises.
  for (size_t i = 0; i < n; ++i)
    s += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return s;
}

KVMEM_CLONES void Axpy(float alpha, const float* __restrict x,
                       float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

KVMEM_CLONES void AddSigned(const float* __restrict x,
                            const float* __restrict sign, float* __restrict y,
                            size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += sign[i] * x[i];
}

KVMEM_CLONES void AddDivided(const float* __restrict x, float d,
                             float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i] / d;
}

KVMEM_CLONES void AddAsDouble(const float* __restrict x, double* __restrict acc,
                              size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += static_cast<double>(x[i]);
}

KVMEM_CLONES void DivideToFloat(const double* __restrict x, double d,
                                float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] / d);
}

namespace {

#if defined(__x86_64__)
// Axpy's clones multiply, then add (none contracts to FMA: the "avx2" clone
// has no FMA, the default no AVX), so eight lanes that multiply, then add,
// give their bits. Four registers of y go through every row.
__attribute__((target("avx2"))) void AxpyRowsAvx2(const float* alpha,
                                                  const float* const* x,
                                                  size_t rows, float* y,
                                                  size_t n) {
  size_t i0 = 0;
  for (; i0 + 32 <= n; i0 += 32) {
    __m256 a0 = _mm256_loadu_ps(y + i0), a1 = _mm256_loadu_ps(y + i0 + 8),
           a2 = _mm256_loadu_ps(y + i0 + 16), a3 = _mm256_loadu_ps(y + i0 + 24);
    for (size_t r = 0; r < rows; ++r) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
      const float* xr = x[r] + i0;
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(a, _mm256_loadu_ps(xr)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(a, _mm256_loadu_ps(xr + 8)));
      a2 = _mm256_add_ps(a2, _mm256_mul_ps(a, _mm256_loadu_ps(xr + 16)));
      a3 = _mm256_add_ps(a3, _mm256_mul_ps(a, _mm256_loadu_ps(xr + 24)));
    }
    _mm256_storeu_ps(y + i0, a0);
    _mm256_storeu_ps(y + i0 + 8, a1);
    _mm256_storeu_ps(y + i0 + 16, a2);
    _mm256_storeu_ps(y + i0 + 24, a3);
  }
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = i0; i < n; ++i) y[i] += alpha[r] * x[r][i];
  }
}
#endif

}  // namespace

void AxpyRows(const float* alpha, const float* const* x, size_t rows, float* y,
              size_t n) {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  if (avx2) return AxpyRowsAvx2(alpha, x, rows, y, n);
#endif
  for (size_t r = 0; r < rows; ++r) Axpy(alpha[r], x[r], y, n);
}

}  // namespace kvmem

#include "engine/index/query_codes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/index/avx2_round.h"
#include "engine/index/dot.h"
#include "engine/index/int8_kernels.h"

namespace kvmem {
namespace {

int Top(bool two_terms) { return two_terms ? 63 * kQueryHiWeight : 63; }

// The query's integer sum and, in double, |q - t d|^2 and |q|^2.
struct Sums {
  int32_t d = 0;
  double r2 = 0, q2 = 0;
};

// The definition for one element: writes hi (and lo with two_terms), adds
// to *sums.
inline void Element(float x, float t, int top, bool two_terms, int8_t* hi,
                    int8_t* lo, Sums* sums) {
  const int d =
      t > 0 ? std::clamp(static_cast<int>(std::lround(x / t)), -top, top) : 0;
  if (two_terms) {
    // d = 64 hi + lo with lo in [-32, 32] and so |hi| <= 63.
    const int h = static_cast<int>(std::lround(d / double(kQueryHiWeight)));
    *hi = static_cast<int8_t>(h);
    *lo = static_cast<int8_t>(d - kQueryHiWeight * h);
  } else {
    *hi = static_cast<int8_t>(d);
  }
  sums->d += d;
  const double e = double(x) - double(t) * d;
  sums->r2 += e * e;
  sums->q2 += double(x) * x;
}

QueryCode Finish(float t, const Sums& s) {
  QueryCode c;
  c.t = t;
  c.offset = 128 * s.d;
  c.residual = static_cast<float>(std::sqrt(s.r2) * (1 + 1e-6));
  c.norm = static_cast<float>(std::sqrt(s.q2) * (1 + 1e-6));
  return c;
}

#if defined(__x86_64__)
// The scalar loop 8 floats at a time (Avx2RoundHalfAway is lround);
// hi = lround(d / 64) is ((|d| + 32) >> 6) with d's sign. The norms sum in
// four double lanes (another order than the scalar loop's: equal to
// rounding, far inside the 1e-6 they are rounded up by).
__attribute__((target("avx2"))) QueryCode Avx2Quantize(const float* q, size_t n,
                                                       bool two_terms,
                                                       int8_t* hi, int8_t* lo) {
  const float mx = MaxAbs(q, n);
  const int top = Top(two_terms);
  const float t = mx / static_cast<float>(top);
  if (!(t > 0)) return QuantizeQueryScalar(q, n, two_terms, hi, lo);
  const __m256 vt = _mm256_set1_ps(t);
  const __m256 vtop = _mm256_set1_ps(static_cast<float>(top));
  const __m256 neg_top = _mm256_set1_ps(-static_cast<float>(top));
  const __m256d vtd = _mm256_set1_pd(double(t));
  __m256i vsum = _mm256_setzero_si256();
  __m256d r2v = _mm256_setzero_pd(), q2v = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(q + i);
    const __m256 r = _mm256_min_ps(
        _mm256_max_ps(Avx2RoundHalfAway(_mm256_div_ps(x, vt)), neg_top), vtop);
    const __m256i d = _mm256_cvttps_epi32(r);
    vsum = _mm256_add_epi32(vsum, d);
    __m256i h = d;
    if (two_terms) {
      h = _mm256_sign_epi32(
          _mm256_srai_epi32(
              _mm256_add_epi32(_mm256_abs_epi32(d), _mm256_set1_epi32(32)), 6),
          d);
      Avx2StoreInt8(_mm256_sub_epi32(d, _mm256_slli_epi32(h, 6)), lo + i);
    }
    Avx2StoreInt8(h, hi + i);
    for (int half_i = 0; half_i < 2; ++half_i) {
      const __m256d xd =
          _mm256_cvtps_pd(half_i == 0 ? _mm256_castps256_ps128(x)
                                      : _mm256_extractf128_ps(x, 1));
      const __m256d dd =
          _mm256_cvtepi32_pd(half_i == 0 ? _mm256_castsi256_si128(d)
                                         : _mm256_extracti128_si256(d, 1));
      const __m256d e = _mm256_sub_pd(xd, _mm256_mul_pd(vtd, dd));
      r2v = _mm256_add_pd(r2v, _mm256_mul_pd(e, e));
      q2v = _mm256_add_pd(q2v, _mm256_mul_pd(xd, xd));
    }
  }
  alignas(32) int32_t sums[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), vsum);
  Sums total;
  for (int32_t v : sums) total.d += v;
  alignas(32) double r2l[4], q2l[4];
  _mm256_store_pd(r2l, r2v);
  _mm256_store_pd(q2l, q2v);
  total.r2 = (r2l[0] + r2l[1]) + (r2l[2] + r2l[3]);
  total.q2 = (q2l[0] + q2l[1]) + (q2l[2] + q2l[3]);
  for (; i < n; ++i) {
    Element(q[i], t, top, two_terms, hi + i, two_terms ? lo + i : nullptr,
            &total);
  }
  return Finish(t, total);
}

__attribute__((target("avx2"))) size_t Avx2SymmetricCodes(const float* x,
                                                          size_t n, float s,
                                                          int levels,
                                                          int8_t* out) {
  const __m256 vs = _mm256_set1_ps(s);
  const __m256 top = _mm256_set1_ps(static_cast<float>(levels));
  const __m256 bottom = _mm256_set1_ps(-static_cast<float>(levels));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r =
        Avx2RoundHalfAway(_mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    Avx2StoreInt8(
        _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, bottom), top)),
        out + i);
  }
  return i;
}

__attribute__((target("avx2"))) size_t Avx2CodeNorms(const float* x,
                                                     const int8_t* c, float s,
                                                     size_t n, double* r2,
                                                     double* c2) {
  const __m256d vs = _mm256_set1_pd(double(s));
  __m256d r = _mm256_setzero_pd(), q = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    int32_t four;
    std::memcpy(&four, c + i, 4);
    const __m256d cd =
        _mm256_cvtepi32_pd(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
    const __m256d e = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)),
                                    _mm256_mul_pd(vs, cd));
    r = _mm256_add_pd(r, _mm256_mul_pd(e, e));
    q = _mm256_add_pd(q, _mm256_mul_pd(cd, cd));
  }
  alignas(32) double rl[4], ql[4];
  _mm256_store_pd(rl, r);
  _mm256_store_pd(ql, q);
  *r2 += (rl[0] + rl[1]) + (rl[2] + rl[3]);
  *c2 += (ql[0] + ql[1]) + (ql[2] + ql[3]);
  return i;
}
#endif

bool CpuHasAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

}  // namespace

float SymmetricCodesScalar(const float* x, size_t n, int levels, int8_t* out) {
  const float s = MaxAbs(x, n) / static_cast<float>(levels);
  for (size_t i = 0; i < n; ++i) {
    const int v = s > 0 ? static_cast<int>(std::lround(x[i] / s)) : 0;
    out[i] = static_cast<int8_t>(std::clamp(v, -levels, levels));
  }
  return s;
}

float SymmetricCodes(const float* x, size_t n, int levels, int8_t* out) {
  const float s = MaxAbs(x, n) / static_cast<float>(levels);
  size_t i = 0;
#if defined(__x86_64__)
  if (CpuHasAvx2() && s > 0) i = Avx2SymmetricCodes(x, n, s, levels, out);
#endif
  for (; i < n; ++i) {
    const int v = s > 0 ? static_cast<int>(std::lround(x[i] / s)) : 0;
    out[i] = static_cast<int8_t>(std::clamp(v, -levels, levels));
  }
  return s;
}

void AddCodeNorms(const float* x, const int8_t* c, float s, size_t n,
                  double* r2, double* c2) {
  size_t i = 0;
#if defined(__x86_64__)
  if (CpuHasAvx2()) i = Avx2CodeNorms(x, c, s, n, r2, c2);
#endif
  for (; i < n; ++i) {
    const double e = double(x[i]) - double(s) * c[i];
    *r2 += e * e;
    *c2 += double(c[i]) * c[i];
  }
}

QueryCode QuantizeQueryScalar(const float* q, size_t n, bool two_terms,
                              int8_t* hi, int8_t* lo) {
  const float mx = MaxAbs(q, n);
  const int top = Top(two_terms);
  const float t = mx / static_cast<float>(top);
  Sums total;
  for (size_t i = 0; i < n; ++i) {
    Element(q[i], t, top, two_terms, hi + i, two_terms ? lo + i : nullptr,
            &total);
  }
  return Finish(t, total);
}

QueryCode QuantizeQuery(const float* q, size_t n, bool two_terms, int8_t* hi,
                        int8_t* lo) {
#if defined(__x86_64__)
  if (CpuHasAvx2()) return Avx2Quantize(q, n, two_terms, hi, lo);
#endif
  return QuantizeQueryScalar(q, n, two_terms, hi, lo);
}

const char* QueryCodeKernel() { return CpuHasAvx2() ? "avx2" : "scalar"; }

}  // namespace kvmem

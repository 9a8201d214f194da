#include "engine/recall/fast_exp.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/recall/fast_exp_poly.h"
#if defined(__x86_64__)
#include "engine/recall/fast_exp_lanes.h"
#endif

namespace kvmem {
namespace {

using namespace fast_exp;  // NOLINT: the polynomial's constants.

float ExpOne(float v) {
  if (!(v >= kLow)) return 0.0f;
  if (v > kHigh) v = kHigh;
  const float k = std::floor(v * kLog2e + 0.5f);
  const float r = (v - k * kLn2Hi) - k * kLn2Lo;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

void ScalarExp(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = ExpOne(x[i]);
}

float ScalarExpDot(const float* x, float scale, float shift,
                   const float* weight, float* out, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = ExpOne(x[i] * scale - shift);
    sum += static_cast<double>(weight[i]) * out[i];
  }
  return static_cast<float>(sum);
}

float ScalarMaxScaled(const float* x, const float* mask, float scale, size_t n,
                      float init) {
  float m = init;
  for (size_t i = 0; i < n; ++i) m = std::max(m, x[i] * scale + mask[i]);
  return m;
}

// The definition the AVX2 form follows (FMA rounds once where this rounds
// twice). acc and zm: w floats of scratch each.
void ScalarDensities(const DensityArgs& a) {
  constexpr size_t kMaxLanes = 64;
  float acc[kMaxLanes], zm[kMaxLanes];
  for (size_t c = 0; c < a.m; ++c) {
    float total = 0, mean_total = 0;
    // Heads in runs of kMaxLanes (ranges are rarely wider than 64).
    for (uint32_t i0 = 0; i0 < a.w; i0 += kMaxLanes) {
      const uint32_t n = std::min<uint32_t>(kMaxLanes, a.w - i0);
      for (uint32_t i = 0; i < n; ++i) acc[i] = zm[i] = 0;
      for (uint32_t j = 0; j < a.vectors; ++j) {
        const float* d = a.dots + (c * a.vectors + j) * a.stride + i0;
        const float* neg = a.neg + size_t{j} * a.w + i0;
        for (uint32_t i = 0; i < n; ++i) {
          acc[i] += a.coef[j] * ExpOne(d[i] * a.scale + neg[i]);
          if (a.mean_k != nullptr) zm[i] += a.mean_k[j] * d[i];
        }
      }
      for (uint32_t i = 0; i < n; ++i) total += acc[i];
      if (a.mean_k != nullptr) {
        for (uint32_t i = 0; i < n; ++i) {
          mean_total += ExpOne(zm[i] + a.mean_neg[i0 + i]);
        }
      }
    }
    a.out[c] = total;
    if (a.mean_k != nullptr) {
      a.mean_out[c] = mean_total * (1.0f / static_cast<float>(a.w));
    }
  }
}

#if defined(__x86_64__)
// The last n < 8 elements of an array as one vector, padded with 0 (and
// weight 0): each element's exp is Exp8's and lands in lane i % 8 whatever
// n is, so an element's value and a sum's order never depend on how many
// elements follow (zero-weight rows appended to a scan, e.g. the units of a
// block sealed in the window, change no bit of the others' results).
struct Tail8 {
  alignas(32) float xs[8] = {}, ws[8] = {};
  size_t n;
  Tail8(const float* x, const float* w, size_t count) : n(count) {
    std::memcpy(xs, x, n * sizeof(float));
    if (w != nullptr) std::memcpy(ws, w, n * sizeof(float));
  }
  __attribute__((target("avx2,fma"))) __m256 x() const {
    return _mm256_load_ps(xs);
  }
  __attribute__((target("avx2,fma"))) __m256 weight() const {
    return _mm256_load_ps(ws);
  }
  __attribute__((target("avx2,fma"))) void Store(__m256 v, float* dst) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::memcpy(dst, tmp, n * sizeof(float));
  }
};

// The avx2 ExpDot from element i on, its 8 partial sums in acc so far:
// the avx2 kernel from 0, the avx512 kernel's tail (in the same order).
__attribute__((target("avx2,fma"))) inline float Avx2ExpDotFrom(
    __m256 acc, const float* x, float scale, float shift, const float* weight,
    float* out, size_t i, size_t n) {
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_fmsub_ps(_mm256_loadu_ps(x + i), s, b));
    _mm256_storeu_ps(out + i, e);
    acc = _mm256_fmadd_ps(e, _mm256_loadu_ps(weight + i), acc);
  }
  if (i < n) {  // The tail in lanes too, padded with weight 0 (see Tail8).
    Tail8 t(x + i, weight + i, n - i);
    const __m256 e = Exp8(_mm256_fmsub_ps(t.x(), s, b));
    t.Store(e, out + i);
    acc = _mm256_fmadd_ps(e, t.weight(), acc);
  }
  alignas(32) float part[8];
  _mm256_store_ps(part, acc);
  double sum = 0;
  for (float v : part) sum += v;
  return static_cast<float>(sum);
}

__attribute__((target("avx2,fma"))) float Avx2ExpDot(const float* x,
                                                     float scale, float shift,
                                                     const float* weight,
                                                     float* out, size_t n) {
  return Avx2ExpDotFrom(_mm256_setzero_ps(), x, scale, shift, weight, out, 0,
                        n);
}

__attribute__((target("avx2,fma"))) float Avx2MaxScaled(const float* x,
                                                        const float* mask,
                                                        float scale, size_t n,
                                                        float init) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256 m = _mm256_set1_ps(init);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    m = _mm256_max_ps(m, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), s,
                                         _mm256_loadu_ps(mask + i)));
  }
  alignas(32) float part[8];
  _mm256_store_ps(part, m);
  float r = init;
  for (float v : part) r = std::max(r, v);
  for (; i < n; ++i) r = std::max(r, x[i] * scale + mask[i]);
  return r;
}

// Lane i of each 8-head run: the scalar form's acc[i] / zm[i].
__attribute__((target("avx2,fma"))) void Avx2Densities(const DensityArgs& a) {
  if (a.w % 8 != 0) return ScalarDensities(a);
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (size_t c = 0; c < a.m; ++c) {
    float total = 0, mean_total = 0;
    for (uint32_t i0 = 0; i0 < a.w; i0 += 8) {
      __m256 acc = _mm256_setzero_ps(), zm = _mm256_setzero_ps();
      for (uint32_t j = 0; j < a.vectors; ++j) {
        const __m256 d =
            _mm256_loadu_ps(a.dots + (c * a.vectors + j) * a.stride + i0);
        const __m256 e = Exp8(_mm256_fmadd_ps(
            d, scale, _mm256_loadu_ps(a.neg + size_t{j} * a.w + i0)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a.coef[j]), e, acc);
        if (a.mean_k != nullptr) {
          zm = _mm256_fmadd_ps(_mm256_set1_ps(a.mean_k[j]), d, zm);
        }
      }
      alignas(32) float part[8];
      _mm256_store_ps(part, acc);
      for (float v : part) total += v;
      if (a.mean_k != nullptr) {
        _mm256_store_ps(
            part, Exp8(_mm256_add_ps(zm, _mm256_loadu_ps(a.mean_neg + i0))));
        for (float v : part) mean_total += v;
      }
    }
    a.out[c] = total;
    if (a.mean_k != nullptr) {
      a.mean_out[c] = mean_total * (1.0f / static_cast<float>(a.w));
    }
  }
}

__attribute__((target("avx2,fma"))) void Avx2Exp(float* x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, Exp8(_mm256_loadu_ps(x + i)));
  }
  if (i < n) {
    Tail8 t(x + i, nullptr, n - i);
    t.Store(Exp8(t.x()), x + i);
  }
}

// "avx512": Exp8's floats 16 lanes at a time (fast_exp_lanes.h), and the
// avx2 kernel's sums in its order (each 16 lanes' products go into its 8
// partial sums low half first), so it gives the avx2 kernel's results bit
// for bit, only faster. Its densities are the avx2 kernel's.
#define KVMEM_AVX512_TARGET "avx2,fma,avx512f"
// GCC 12's unmasked AVX-512 intrinsics pass an _mm512_undefined_* source,
// which -W(maybe-)uninitialized reports once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target(KVMEM_AVX512_TARGET))) inline __m256 High8(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

__attribute__((target(KVMEM_AVX512_TARGET))) void Avx512Exp(float* x,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(x + i, Exp16(_mm512_loadu_ps(x + i)));
  }
  Avx2Exp(x + i, n - i);
}

__attribute__((target(KVMEM_AVX512_TARGET))) float Avx512ExpDot(
    const float* x, float scale, float shift, const float* weight, float* out,
    size_t n) {
  const __m512 s = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Exp16(_mm512_fmsub_ps(_mm512_loadu_ps(x + i), s, b));
    _mm512_storeu_ps(out + i, e);
    acc = _mm256_fmadd_ps(_mm512_castps512_ps256(e),
                          _mm256_loadu_ps(weight + i), acc);
    acc = _mm256_fmadd_ps(High8(e), _mm256_loadu_ps(weight + i + 8), acc);
  }
  return Avx2ExpDotFrom(acc, x, scale, shift, weight, out, i, n);
}

__attribute__((target(KVMEM_AVX512_TARGET))) float Avx512MaxScaled(
    const float* x, const float* mask, float scale, size_t n, float init) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(init);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m = _mm512_max_ps(m, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), s,
                                         _mm512_loadu_ps(mask + i)));
  }
  // Max is exact in any order: the rest by the avx2 kernel.
  return Avx2MaxScaled(x + i, mask + i, scale, n - i, _mm512_reduce_max_ps(m));
}
#pragma GCC diagnostic pop
#undef KVMEM_AVX512_TARGET
#endif

std::vector<ExpKernelInfo> Detect() {
  std::vector<ExpKernelInfo> k;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("avx512f")) {
    k.push_back({"avx512", &Avx512Exp, &Avx512ExpDot, &Avx512MaxScaled,
                 &Avx2Densities});
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    k.push_back(
        {"avx2", &Avx2Exp, &Avx2ExpDot, &Avx2MaxScaled, &Avx2Densities});
  }
#endif
  k.push_back({"scalar", &ScalarExp, &ScalarExpDot, &ScalarMaxScaled,
               &ScalarDensities});
  return k;
}

}  // namespace

const std::vector<ExpKernelInfo>& AvailableExpKernels() {
  static const std::vector<ExpKernelInfo> kernels = Detect();
  return kernels;
}

const ExpKernelInfo& ActiveExpKernel() { return AvailableExpKernels().front(); }

void ExpInPlace(float* x, size_t n) { ActiveExpKernel().fn(x, n); }

}  // namespace kvmem

#include "engine/index/int8_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "engine/index/int8_vnni.h"

namespace kvmem {
namespace {

void ScalarKernel(const uint8_t* packed, size_t nblocks, size_t groups,
                  const int8_t* hi, const int8_t* lo, int32_t* out) {
  for (size_t b = 0; b < nblocks; ++b) {
    int32_t acc[kInt8Lanes] = {};
    const uint8_t* p = packed + b * groups * 4 * kInt8Lanes;
    for (size_t g = 0; g < groups; ++g, p += 4 * kInt8Lanes) {
      int32_t d[4];
      for (int j = 0; j < 4; ++j) {
        d[j] = lo == nullptr ? hi[g * 4 + j]
                             : kQueryHiWeight * hi[g * 4 + j] + lo[g * 4 + j];
      }
      for (size_t l = 0; l < kInt8Lanes; ++l) {
        const uint8_t* c = p + l * 4;
        acc[l] += c[0] * d[0] + c[1] * d[1] + c[2] * d[2] + c[3] * d[3];
      }
    }
    for (size_t l = 0; l < kInt8Lanes; ++l) out[b * kInt8Lanes + l] = acc[l];
  }
}

void ScalarSegmentKernel(const uint8_t* packed, size_t nblocks,
                         size_t seg_groups, size_t segments, const int8_t* hi,
                         const int8_t* lo, int32_t* out) {
  const size_t groups = seg_groups * segments;
  for (size_t b = 0; b < nblocks; ++b) {
    for (size_t s = 0; s < segments; ++s) {
      ScalarKernel(packed + (b * groups + s * seg_groups) * 4 * kInt8Lanes, 1,
                   seg_groups, hi + s * seg_groups * 4,
                   lo == nullptr ? nullptr : lo + s * seg_groups * 4,
                   out + (b * segments + s) * kInt8Lanes);
    }
  }
}

// One segment kernel call per query (the kernels but VNNI's).
template <Int8SegmentKernel kSegments>
void MultiByQuery(const uint8_t* packed, size_t nblocks, size_t seg_groups,
                  size_t segments, size_t vectors, const int8_t* const* hi,
                  const int8_t* const* lo, int32_t* const* out) {
  for (size_t j = 0; j < vectors; ++j) {
    kSegments(packed, nblocks, seg_groups, segments, hi[j],
              lo == nullptr ? nullptr : lo[j], out[j]);
  }
}

#if defined(__x86_64__)
// One group of 4 dimensions of 8 vectors: (c + 128) . d as 8 int32 sums of
// 16-bit pair sums weighted by w (pairs of u8 x s7 products cannot
// saturate: 2 * 255 * 63 < 32767).
__attribute__((target("avx2"))) inline __m256i GroupDot(__m256i c,
                                                        const int8_t* d,
                                                        __m256i w) {
  int32_t q;
  __builtin_memcpy(&q, d, 4);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(c, _mm256_set1_epi32(q)), w);
}

// The 8 lanes' sums over groups [g0, g1) of one packed block.
template <bool kTwoTerms>
__attribute__((target("avx2"))) inline __m256i GroupRun(const uint8_t* p,
                                                        size_t g0, size_t g1,
                                                        const int8_t* hi,
                                                        const int8_t* lo) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i whi = kTwoTerms ? _mm256_set1_epi16(kQueryHiWeight) : ones;
  // Two accumulators hide the add latency.
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  size_t g = g0;
  for (; g + 2 <= g1; g += 2) {
    const __m256i c0 = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(p + g * 4 * kInt8Lanes));
    const __m256i c1 = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(p + (g + 1) * 4 * kInt8Lanes));
    acc0 = _mm256_add_epi32(acc0, GroupDot(c0, hi + g * 4, whi));
    acc1 = _mm256_add_epi32(acc1, GroupDot(c1, hi + g * 4 + 4, whi));
    if (kTwoTerms) {
      acc0 = _mm256_add_epi32(acc0, GroupDot(c0, lo + g * 4, ones));
      acc1 = _mm256_add_epi32(acc1, GroupDot(c1, lo + g * 4 + 4, ones));
    }
  }
  if (g < g1) {
    const __m256i c0 = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(p + g * 4 * kInt8Lanes));
    acc0 = _mm256_add_epi32(acc0, GroupDot(c0, hi + g * 4, whi));
    if (kTwoTerms) {
      acc0 = _mm256_add_epi32(acc0, GroupDot(c0, lo + g * 4, ones));
    }
  }
  return _mm256_add_epi32(acc0, acc1);
}

template <bool kTwoTerms>
__attribute__((target("avx2"))) void Avx2KernelT(const uint8_t* packed,
                                                 size_t nblocks, size_t groups,
                                                 const int8_t* hi,
                                                 const int8_t* lo,
                                                 int32_t* out) {
  for (size_t b = 0; b < nblocks; ++b) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out + b * kInt8Lanes),
        GroupRun<kTwoTerms>(packed + b * groups * 4 * kInt8Lanes, 0, groups, hi,
                            lo));
  }
}

// The segment form: the same sums, restarted at every segment boundary.
template <bool kTwoTerms>
__attribute__((target("avx2"))) void Avx2SegmentKernelT(
    const uint8_t* packed, size_t nblocks, size_t seg_groups, size_t segments,
    const int8_t* hi, const int8_t* lo, int32_t* out) {
  const size_t groups = seg_groups * segments;
  for (size_t b = 0; b < nblocks; ++b) {
    const uint8_t* p = packed + b * groups * 4 * kInt8Lanes;
    for (size_t s = 0; s < segments; ++s) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + (b * segments + s) * kInt8Lanes),
          GroupRun<kTwoTerms>(p, s * seg_groups, (s + 1) * seg_groups, hi, lo));
    }
  }
}

void Avx2SegmentKernel(const uint8_t* packed, size_t nblocks, size_t seg_groups,
                       size_t segments, const int8_t* hi, const int8_t* lo,
                       int32_t* out) {
  if (lo == nullptr) {
    Avx2SegmentKernelT<false>(packed, nblocks, seg_groups, segments, hi,
                              nullptr, out);
  } else {
    Avx2SegmentKernelT<true>(packed, nblocks, seg_groups, segments, hi, lo,
                             out);
  }
}

void Avx2Kernel(const uint8_t* packed, size_t nblocks, size_t groups,
                const int8_t* hi, const int8_t* lo, int32_t* out) {
  if (lo == nullptr) {
    Avx2KernelT<false>(packed, nblocks, groups, hi, nullptr, out);
  } else {
    Avx2KernelT<true>(packed, nblocks, groups, hi, lo, out);
  }
}

#endif

// The k-th largest pending lower bound (or -inf with fewer than k
// pending); drops pending vectors whose upper bound is below it.
float Prune(uint32_t k, size_t* count, SelectScratch* sc) {
  const size_t n = *count;
  if (n < k) return -std::numeric_limits<float>::infinity();
  sc->tmp.assign(sc->lower.begin(), sc->lower.begin() + n);
  std::nth_element(sc->tmp.begin(), sc->tmp.begin() + (k - 1), sc->tmp.end(),
                   std::greater<float>());
  const float theta = sc->tmp[k - 1];
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (sc->upper[i] < theta) continue;
    sc->row[kept] = sc->row[i];
    sc->lower[kept] = sc->lower[i];
    sc->upper[kept] = sc->upper[i];
    ++kept;
  }
  *count = kept;
  return theta;
}

// Final prune, then the survivors in row order.
float Finish(uint32_t k, size_t count, SelectScratch* sc,
             std::vector<Survivor>* out) {
  const float theta = Prune(k, &count, sc);
  out->clear();
  for (size_t i = 0; i < count; ++i) out->push_back({sc->row[i], sc->upper[i]});
  return theta;
}

void Reserve(size_t n, SelectScratch* sc) {
  if (sc->row.size() < n + 8) {
    sc->row.resize(n + 8);
    sc->lower.resize(n + 8);
    sc->upper.resize(n + 8);
  }
}

constexpr size_t kFirstPrune = 64;

// One vector's bounds; the AVX2 selector computes the same in 8 lanes.
inline void Bounds(const BoundInputs& in, size_t i, float* lo, float* up) {
  const float ts = in.t * in.scale[i];
  const float approx = ts * static_cast<float>(in.raw[i] - in.offset);
  const float bound = (in.qnorm * in.enorm[i] + in.fnorm * in.cnorm[i]) +
                      1e-4f * std::fabs(approx);
  *lo = approx - bound;
  *up = approx + bound;
}

// Writes vector i's bounds at the end of the pending list; keeps them there
// (count grows) when its upper bound reaches theta.
inline void PushBounds(const BoundInputs& in, size_t i, float theta,
                       size_t* count, SelectScratch* sc) {
  float lo, up;
  Bounds(in, i, &lo, &up);
  sc->row[*count] = static_cast<uint32_t>(i);
  sc->lower[*count] = lo;
  sc->upper[*count] = up;
  *count += up >= theta;
}

float ScalarSelect(const BoundInputs& in, uint32_t k, SelectScratch* sc,
                   std::vector<Survivor>* out) {
  Reserve(in.n, sc);
  float theta = -std::numeric_limits<float>::infinity();
  size_t count = 0, limit = std::max<size_t>(kFirstPrune, 4 * k);
  for (size_t i = 0; i < in.n; ++i) {
    PushBounds(in, i, theta, &count, sc);
    if (count >= limit) {
      theta = Prune(k, &count, sc);
      limit = std::max(2 * limit, 2 * count);
    }
  }
  return Finish(k, count, sc, out);
}

#if defined(__x86_64__)
// For each 8-bit mask, the lane indices of its set bits, first.
struct PackTable {
  alignas(32) int32_t idx[256][8];
  PackTable() {
    for (int m = 0; m < 256; ++m) {
      int n = 0;
      for (int l = 0; l < 8; ++l)
        if (m >> l & 1) idx[m][n++] = l;
      while (n < 8) idx[m][n++] = 0;
    }
  }
};
const PackTable kPack;

__attribute__((target("avx2"))) float Avx2Select(const BoundInputs& in,
                                                 uint32_t k, SelectScratch* sc,
                                                 std::vector<Survivor>* out) {
  Reserve(in.n, sc);
  float theta = -std::numeric_limits<float>::infinity();
  size_t count = 0, limit = std::max<size_t>(kFirstPrune, 4 * k);
  const __m256 t = _mm256_set1_ps(in.t), qn = _mm256_set1_ps(in.qnorm);
  const __m256 fn = _mm256_set1_ps(in.fnorm);
  const __m256 slack = _mm256_set1_ps(1e-4f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i offset = _mm256_set1_epi32(in.offset);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  size_t i = 0;
  for (; i + 8 <= in.n; i += 8) {
    const __m256 scale = _mm256_loadu_ps(in.scale + i);
    const __m256 raw = _mm256_cvtepi32_ps(_mm256_sub_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.raw + i)),
        offset));
    const __m256 approx = _mm256_mul_ps(_mm256_mul_ps(t, scale), raw);
    const __m256 bound = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(qn, _mm256_loadu_ps(in.enorm + i)),
                      _mm256_mul_ps(fn, _mm256_loadu_ps(in.cnorm + i))),
        _mm256_mul_ps(slack, _mm256_and_ps(approx, abs_mask)));
    const __m256 up = _mm256_add_ps(approx, bound);
    const int mask = _mm256_movemask_ps(
        _mm256_cmp_ps(up, _mm256_set1_ps(theta), _CMP_GE_OQ));
    // Left-pack the passing lanes onto the pending list; no branch.
    const __m256i perm =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(kPack.idx[mask]));
    const __m256i rows =
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(i)), lanes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sc->row.data() + count),
                        _mm256_permutevar8x32_epi32(rows, perm));
    _mm256_storeu_ps(
        sc->lower.data() + count,
        _mm256_permutevar8x32_ps(_mm256_sub_ps(approx, bound), perm));
    _mm256_storeu_ps(sc->upper.data() + count,
                     _mm256_permutevar8x32_ps(up, perm));
    count += static_cast<size_t>(__builtin_popcount(mask));
    if (count + 8 > limit) {
      theta = Prune(k, &count, sc);
      limit = std::max(2 * limit, 2 * count + 8);
    }
  }
  for (; i < in.n; ++i) {  // The tail, as the scalar selector.
    PushBounds(in, i, theta, &count, sc);
  }
  return Finish(k, count, sc, out);
}
#endif

std::vector<Int8KernelInfo> Detect() {
  std::vector<Int8KernelInfo> k;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni")) {
    k.push_back({"avx512vnni", &VnniKernel, &Avx2Select, &VnniSegmentKernel,
                 &VnniMultiSegmentKernel});
  }
  if (__builtin_cpu_supports("avx2")) {
    k.push_back({"avx2", &Avx2Kernel, &Avx2Select, &Avx2SegmentKernel,
                 &MultiByQuery<Avx2SegmentKernel>});
  }
#endif
  k.push_back({"scalar", &ScalarKernel, &ScalarSelect, &ScalarSegmentKernel,
               &MultiByQuery<ScalarSegmentKernel>});
  return k;
}

std::atomic<const Int8KernelInfo*> active{nullptr};

}  // namespace

const std::vector<Int8KernelInfo>& AvailableInt8Kernels() {
  static const std::vector<Int8KernelInfo> kernels = Detect();
  return kernels;
}

const Int8KernelInfo& ActiveInt8Kernel() {
  const Int8KernelInfo* k = active.load(std::memory_order_acquire);
  return k != nullptr ? *k : AvailableInt8Kernels().front();
}

bool SelectInt8Kernel(const std::string& name) {
  for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
    if (k.name == name) {
      active.store(&k, std::memory_order_release);
      return true;
    }
  }
  return false;
}

}  // namespace kvmem

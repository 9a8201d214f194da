#include "engine/index/int8_vnni.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "base/thread_scratch.h"
#include "engine/index/int8_kernels.h"

namespace kvmem {
namespace {

// AVX-512 VNNI: one vpdpbusd adds 4 u8 x s8 products into each int32 lane
// with no 16-bit step, so a 64-byte load scores two groups of the 8 vectors
// (lanes 0-7 group g, 8-15 group g + 1) and the two query terms accumulate
// apart: raw = 64 * sum(c . hi) + sum(c . lo), the same integer as AVX2's.
// Segments of whole runs of 16 groups (64, 128... dims) keep the query's pair
// broadcasts in registers (VnniRuns); others read them from memory, built
// once per call (BroadcastSegments).
#define KVMEM_VNNI_TARGET "avx2,avx512f,avx512bw,avx512vl,avx512vnni"
// GCC 12's 512-bit insert/extract and permute intrinsics pass an undefined
// register as their unused mask source, which -W(maybe-)uninitialized
// reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// A query term as the kernel reads it: for groups (g, g + 1), 16 int32
// lanes, 8 copies of each group's 4 bytes; a last odd group pairs with 0.
void PairBroadcasts(const int8_t* d, size_t g0, size_t g1,
                    std::vector<int32_t>* out) {
  const size_t at = out->size();
  out->resize(at + (g1 - g0 + 1) / 2 * 16);
  int32_t* w = out->data() + at;
  for (size_t g = g0; g < g1; g += 2, w += 16) {
    int32_t a, b = 0;
    __builtin_memcpy(&a, d + g * 4, 4);
    if (g + 1 < g1) __builtin_memcpy(&b, d + (g + 1) * 4, 4);
    std::fill(w, w + 8, a);
    std::fill(w + 8, w + 16, b);
  }
}

// The 8 lanes' sums over groups [g0, g1) of one packed block; qh / ql: the
// broadcasts of those groups (PairBroadcasts).
template <bool kTwoTerms>
__attribute__((target(KVMEM_VNNI_TARGET))) inline __m256i VnniGroupRun(
    const uint8_t* p, size_t g0, size_t g1, const int32_t* qh,
    const int32_t* ql) {
  __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
  size_t g = g0;
  for (; g + 2 <= g1; g += 2, qh += 16, ql += 16) {
    const __m512i c = _mm512_loadu_si512(p + g * 4 * kInt8Lanes);
    ah = _mm512_dpbusd_epi32(ah, c, _mm512_loadu_si512(qh));
    if (kTwoTerms) al = _mm512_dpbusd_epi32(al, c, _mm512_loadu_si512(ql));
  }
  __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(ah),
                               _mm512_extracti64x4_epi64(ah, 1));
  __m256i l = _mm256_add_epi32(_mm512_castsi512_si256(al),
                               _mm512_extracti64x4_epi64(al, 1));
  if (g < g1) {
    const __m256i c = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(p + g * 4 * kInt8Lanes));
    h = _mm256_dpbusd_epi32(
        h, c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)));
    if (kTwoTerms) {
      l = _mm256_dpbusd_epi32(
          l, c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql)));
    }
  }
  if (!kTwoTerms) return h;
  return _mm256_add_epi32(_mm256_slli_epi32(h, 6), l);
}
static_assert(kQueryHiWeight == 64, "VnniGroupRun shifts by 6");

template <bool kTwoTerms>
__attribute__((target(KVMEM_VNNI_TARGET))) void VnniSegmentKernelT(
    const uint8_t* packed, size_t nblocks, size_t seg_groups, size_t segments,
    const int32_t* qh, const int32_t* ql, int32_t* out) {
  const size_t groups = seg_groups * segments;
  const size_t seg_words = (seg_groups + 1) / 2 * 16;
  for (size_t b = 0; b < nblocks; ++b) {
    const uint8_t* p = packed + b * groups * 4 * kInt8Lanes;
    for (size_t s = 0; s < segments; ++s) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + (b * segments + s) * kInt8Lanes),
          VnniGroupRun<kTwoTerms>(p, s * seg_groups, (s + 1) * seg_groups,
                                  qh + s * seg_words, ql + s * seg_words));
    }
  }
}

// Pairs of groups whose query broadcasts VnniRuns holds in registers: 8
// pairs x 2 terms = 16 of the 32 zmm registers.
constexpr size_t kRunPairs = 8;
constexpr size_t kRunGroups = 2 * kRunPairs;
// Lines of codes per tile of VnniRunKernel (VnniMultiSegmentKernel).
constexpr size_t kRunTileLines = 32;

// For pair k of a run's 16 groups: lanes 0-7 the query's dword of group
// 2k, lanes 8-15 of group 2k + 1 (VnniGroupRun's broadcast, made in a
// register from the run's 64 query bytes).
struct PairIndex {
  alignas(64) int32_t idx[kRunPairs][16];
  PairIndex() {
    for (size_t k = 0; k < kRunPairs; ++k) {
      for (int l = 0; l < 16; ++l) {
        idx[k][l] = static_cast<int32_t>(2 * k + (l < 8 ? 0 : 1));
      }
    }
  }
};
const PairIndex kPairIndex;

// One run of kRunGroups groups from group g0 of blocks [b0, b1) against the
// query's 64 bytes of that run (hi, and lo with two terms), its pair
// broadcasts held in registers across the blocks, so a block's cost is its
// codes' loads and multiply-adds (VnniGroupRun loads two query words per
// code word). Its sums are stored at out + b * stride, or added to what is
// there (`add`: the segment's later runs).
template <bool kTwoTerms>
__attribute__((target(KVMEM_VNNI_TARGET))) void VnniRuns(
    const uint8_t* packed, size_t b0, size_t b1, size_t groups, size_t g0,
    const int8_t* hi, const int8_t* lo, bool add, int32_t* out, size_t stride) {
  __m512i h[kRunPairs], l[kRunPairs];
  const __m512i qh = _mm512_loadu_si512(hi);
  const __m512i ql = kTwoTerms ? _mm512_loadu_si512(lo) : qh;
  for (size_t k = 0; k < kRunPairs; ++k) {
    const __m512i idx = _mm512_load_si512(kPairIndex.idx[k]);
    h[k] = _mm512_permutexvar_epi32(idx, qh);
    l[k] = kTwoTerms ? _mm512_permutexvar_epi32(idx, ql) : h[k];
  }
  for (size_t b = b0; b < b1; ++b) {
    const uint8_t* p = packed + (b * groups + g0) * 4 * kInt8Lanes;
    __m512i ah0 = _mm512_setzero_si512(), ah1 = _mm512_setzero_si512();
    __m512i al0 = _mm512_setzero_si512(), al1 = _mm512_setzero_si512();
    for (size_t k = 0; k < kRunPairs; k += 2) {
      const __m512i c0 = _mm512_loadu_si512(p + k * 64);
      const __m512i c1 = _mm512_loadu_si512(p + (k + 1) * 64);
      ah0 = _mm512_dpbusd_epi32(ah0, c0, h[k]);
      ah1 = _mm512_dpbusd_epi32(ah1, c1, h[k + 1]);
      if (kTwoTerms) {
        al0 = _mm512_dpbusd_epi32(al0, c0, l[k]);
        al1 = _mm512_dpbusd_epi32(al1, c1, l[k + 1]);
      }
    }
    const __m512i ah = _mm512_add_epi32(ah0, ah1);
    __m256i r = _mm256_add_epi32(_mm512_castsi512_si256(ah),
                                 _mm512_extracti64x4_epi64(ah, 1));
    if (kTwoTerms) {
      const __m512i al = _mm512_add_epi32(al0, al1);
      r = _mm256_add_epi32(_mm256_slli_epi32(r, 6),
                           _mm256_add_epi32(_mm512_castsi512_si256(al),
                                            _mm512_extracti64x4_epi64(al, 1)));
    }
    __m256i* o = reinterpret_cast<__m256i*>(out + b * stride);
    if (add) r = _mm256_add_epi32(r, _mm256_loadu_si256(o));
    _mm256_storeu_si256(o, r);
  }
}

// VnniSegmentKernelT's sums for segments of whole runs (seg_groups a
// multiple of kRunGroups: segments of 64, 128... dimensions), for `vectors`
// queries (hi[j], lo[j]; lo null: one term) into out[j]: tile by tile of
// `tile` blocks, segment by segment, query by query, so a tile's codes of
// one segment are read from memory once and from L1 by the other queries.
template <bool kTwoTerms>
__attribute__((target(KVMEM_VNNI_TARGET))) void VnniRunKernel(
    const uint8_t* packed, size_t nblocks, size_t seg_groups, size_t segments,
    size_t vectors, const int8_t* const* hi, const int8_t* const* lo,
    int32_t* const* out, size_t tile) {
  const size_t groups = seg_groups * segments;
  for (size_t b0 = 0; b0 < nblocks; b0 += tile) {
    const size_t b1 = std::min(nblocks, b0 + tile);
    for (size_t s = 0; s < segments; ++s) {
      for (size_t r = 0; r < seg_groups / kRunGroups; ++r) {
        const size_t g0 = s * seg_groups + r * kRunGroups;
        for (size_t j = 0; j < vectors; ++j) {
          VnniRuns<kTwoTerms>(packed, b0, b1, groups, g0, hi[j] + g0 * 4,
                              kTwoTerms ? lo[j] + g0 * 4 : nullptr, r > 0,
                              out[j] + s * kInt8Lanes, segments * kInt8Lanes);
        }
      }
    }
  }
}
#pragma GCC diagnostic pop

// One query's sums for segments that are not whole runs: the query's pair
// broadcasts built in memory (PairBroadcasts), VnniSegmentKernelT over them.
void BroadcastSegments(const uint8_t* packed, size_t nblocks, size_t seg_groups,
                       size_t segments, const int8_t* hi, const int8_t* lo,
                       int32_t* out) {
  struct Scratch {
    std::vector<int32_t> qh, ql;
  };
  Scratch& sc = ThreadScratch<Scratch>();
  sc.qh.clear();
  sc.ql.clear();
  for (size_t s = 0; s < segments; ++s) {
    PairBroadcasts(hi, s * seg_groups, (s + 1) * seg_groups, &sc.qh);
    if (lo != nullptr) {
      PairBroadcasts(lo, s * seg_groups, (s + 1) * seg_groups, &sc.ql);
    }
  }
  if (lo == nullptr) {
    VnniSegmentKernelT<false>(packed, nblocks, seg_groups, segments,
                              sc.qh.data(), sc.qh.data(), out);
  } else {
    VnniSegmentKernelT<true>(packed, nblocks, seg_groups, segments,
                             sc.qh.data(), sc.ql.data(), out);
  }
}

}  // namespace

void VnniMultiSegmentKernel(const uint8_t* packed, size_t nblocks,
                            size_t seg_groups, size_t segments, size_t vectors,
                            const int8_t* const* hi, const int8_t* const* lo,
                            int32_t* const* out) {
  if (seg_groups % kRunGroups != 0) {
    for (size_t j = 0; j < vectors; ++j) {
      BroadcastSegments(packed, nblocks, seg_groups, segments, hi[j],
                        lo == nullptr ? nullptr : lo[j], out[j]);
    }
    return;
  }
  // A tile's codes of one segment lie in blocks 4 KiB or more apart, so in
  // the same few L1 sets: at most kRunTileLines of them.
  const size_t seg_lines = seg_groups * 4 * kInt8Lanes / 64;
  const size_t tile = std::max<size_t>(1, kRunTileLines / seg_lines);
  if (lo == nullptr) {
    VnniRunKernel<false>(packed, nblocks, seg_groups, segments, vectors, hi,
                         nullptr, out, tile);
  } else {
    VnniRunKernel<true>(packed, nblocks, seg_groups, segments, vectors, hi, lo,
                        out, tile);
  }
}

void VnniSegmentKernel(const uint8_t* packed, size_t nblocks, size_t seg_groups,
                       size_t segments, const int8_t* hi, const int8_t* lo,
                       int32_t* out) {
  VnniMultiSegmentKernel(packed, nblocks, seg_groups, segments, 1, &hi,
                         lo == nullptr ? nullptr : &lo, &out);
}

// The whole vector is one segment.
void VnniKernel(const uint8_t* packed, size_t nblocks, size_t groups,
                const int8_t* hi, const int8_t* lo, int32_t* out) {
  VnniSegmentKernel(packed, nblocks, groups, 1, hi, lo, out);
}

}  // namespace kvmem
#endif  // defined(__x86_64__)

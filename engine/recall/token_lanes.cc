#include "engine/recall/token_lanes.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine/recall/fast_exp_lanes.h"

namespace kvmem {
namespace {

constexpr int kCodeZero = 8;  // token_codes.h: code = round(x / s) + 8.
constexpr size_t kLanes = 16;

#if defined(__x86_64__)
#define KVMEM_LANES_TARGET "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
// GCC 12's unmasked AVX-512 intrinsics pass an _mm512_undefined_* source,
// which -Wmaybe-uninitialized reports at -O3 once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

using fast_exp::Exp16;

// a[t] holds token t's 8 dwords; afterwards a[k] holds dword k of tokens
// 0..7.
__attribute__((target(KVMEM_LANES_TARGET))) inline void Transpose8(__m256i* a) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(a[i], a[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(a[i], a[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    a[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    a[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

// The raw sums of 16 tokens (codes at p[k] + at) with every vector's row of
// segment s, chunk by chunk: in chunk c, dword k of a token holds dimensions
// 64c + 4k.. (low nibbles) and 64c + 32 + 4k.. (high), so each vpdpbusd adds
// 4 products to each token's lane.
__attribute__((target(KVMEM_LANES_TARGET))) void LaneSums(
    const TokenCodeShape& shape, const TokenQuery& q, const uint8_t* const* p,
    size_t at, uint32_t s, __m512i* acc) {
  const uint32_t chunks = shape.chunks();
  const size_t row = size_t{chunks} * 64;
  const __m512i mask = _mm512_set1_epi8(15);
  for (uint32_t j = 0; j < q.vectors; ++j) acc[j] = _mm512_setzero_si512();
  for (uint32_t c = 0; c < chunks; ++c) {
    __m256i a[8], b[8];
    for (int k = 0; k < 8; ++k) {
      a[k] = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(p[k] + at + 32 * c));
      b[k] = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(p[8 + k] + at + 32 * c));
    }
    Transpose8(a);
    Transpose8(b);
    __m512i lo[8], hi[8];
    for (int k = 0; k < 8; ++k) {
      const __m512i z =
          _mm512_inserti64x4(_mm512_castsi256_si512(a[k]), b[k], 1);
      lo[k] = _mm512_and_si512(z, mask);
      hi[k] = _mm512_and_si512(_mm512_srli_epi16(z, 4), mask);
    }
    for (uint32_t j = 0; j < q.vectors; ++j) {
      const int8_t* qr =
          q.q.data() + (size_t{j} * shape.segments + s) * row + 64 * size_t{c};
      __m512i x = acc[j], y = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        int32_t ql, qh;
        std::memcpy(&ql, qr + 4 * k, 4);
        std::memcpy(&qh, qr + 32 + 4 * k, 4);
        x = _mm512_dpbusd_epi32(x, lo[k], _mm512_set1_epi32(ql));
        y = _mm512_dpbusd_epi32(y, hi[k], _mm512_set1_epi32(qh));
      }
      acc[j] = _mm512_add_epi32(x, y);
    }
  }
}

__attribute__((target(KVMEM_LANES_TARGET))) void VnniLanes(
    const TokenCodeShape& shape, const TokenQuery& q, const DensityTerms& t,
    const uint8_t* const* rec, size_t n, float* out, float* mean_out) {
  const uint32_t S = shape.segments, V = q.vectors;
  const size_t stride = shape.bytes_per_token();
  const size_t codes_at = size_t{S} * sizeof(float);
  const bool mean = !t.mean_k.empty() && mean_out != nullptr;
  const __m512 scale = _mm512_set1_ps(t.logit_scale);
  const float inv_w = 1.0f / static_cast<float>(t.w);
  const size_t lines = (stride + 63) / 64;
  alignas(64) __m512i acc[kMaxLaneVectors];
  for (size_t t0 = 0; t0 < n; t0 += kLanes) {
    const size_t m = std::min(kLanes, n - t0);
    // A short last group repeats its first token in the spare lanes
    // (valid records; their lanes are not stored).
    const uint8_t* p[kLanes];
    for (size_t k = 0; k < kLanes; ++k) p[k] = rec[t0 + (k < m ? k : 0)];
    // The next 16 records are prefetched a share per head, record by
    // record: issued all at once before the heads (up to 256 KiB of 7B
    // records), the prefetches stalled on the line-fill buffers. Spread,
    // the eval shape's token stage is ~10 % faster and 7B's the same (token
    // by token rather than line by line across them: 7B 5 % slower, two
    // groups ahead: 15 % slower).
    const uint8_t* next[kLanes];
    const size_t ahead =
        t0 + kLanes < n ? std::min(kLanes, n - t0 - kLanes) : 0;
    for (size_t k = 0; k < ahead; ++k) next[k] = rec[t0 + kLanes + k];
    const size_t fetches = ahead * lines;
    // The prefetch cursor: record next[pf_rec], its line pf_line (no
    // division per line: a div per prefetch cost more than the scoring).
    size_t pf_rec = 0, pf_line = 0, issued = 0;
    __m512 total = _mm512_setzero_ps(), mean_total = _mm512_setzero_ps();
    for (uint32_t i = 0; i < t.w; ++i) {
      const uint32_t s = t.h0 + i;
      for (const size_t until = fetches * (i + 1) / t.w; issued < until;
           ++issued) {
        __builtin_prefetch(next[pf_rec] + 64 * pf_line);
        if (++pf_line == lines) {
          pf_line = 0;
          ++pf_rec;
        }
      }
      alignas(64) float key_scale[kLanes];
      for (size_t k = 0; k < kLanes; ++k) {
        std::memcpy(&key_scale[k], p[k] + s * sizeof(float), sizeof(float));
      }
      const __m512 ks = _mm512_load_ps(key_scale);
      LaneSums(shape, q, p, codes_at + s * shape.segment_code_bytes(), s, acc);
      // Per vector, token_codes.cc's Finish and the density kernel's steps.
      __m512 head = _mm512_setzero_ps(), zm = _mm512_setzero_ps();
      for (uint32_t j = 0; j < V; ++j) {
        const size_t qs = size_t{j} * S + s;
        const __m512 f = _mm512_cvtepi32_ps(
            _mm512_sub_epi32(acc[j], _mm512_set1_epi32(kCodeZero * q.sum[qs])));
        const __m512 d =
            _mm512_mul_ps(_mm512_mul_ps(ks, _mm512_set1_ps(q.scale[qs])), f);
        const __m512 e = Exp16(_mm512_fmadd_ps(
            d, scale, _mm512_set1_ps(t.neg[size_t{j} * t.w + i])));
        head = _mm512_fmadd_ps(_mm512_set1_ps(t.coef[j]), e, head);
        if (mean) zm = _mm512_fmadd_ps(_mm512_set1_ps(t.mean_k[j]), d, zm);
      }
      total = _mm512_add_ps(total, head);
      if (mean) {
        mean_total = _mm512_add_ps(
            mean_total,
            Exp16(_mm512_add_ps(zm, _mm512_set1_ps(t.mean_neg[i]))));
      }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << m) - 1);
    _mm512_mask_storeu_ps(out + t0, keep, total);
    if (mean) {
      _mm512_mask_storeu_ps(mean_out + t0, keep,
                            _mm512_mul_ps(mean_total, _mm512_set1_ps(inv_w)));
    }
  }
}

#pragma GCC diagnostic pop

bool CpuHasLanes() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}
#else
bool CpuHasLanes() { return false; }
#endif

std::atomic<bool> lanes_on{true};

}  // namespace

bool LaneTokenDensities(const TokenCodeShape& shape, const TokenQuery& q,
                        const DensityTerms& t, const uint8_t* const* rec,
                        size_t n, float* out, float* mean_out) {
  static const bool cpu = CpuHasLanes();
  if (!cpu || !lanes_on.load(std::memory_order_relaxed) ||
      q.vectors > kMaxLaneVectors || q.vectors != t.vectors || t.w == 0) {
    return false;
  }
#if defined(__x86_64__)
  if (n > 0) VnniLanes(shape, q, t, rec, n, out, mean_out);
  return true;
#else
  return false;
#endif
}

const std::string& LaneTokenKernel() {
  static const std::string on = "avx512vnni", off = "off";
  static const bool cpu = CpuHasLanes();
  return cpu && lanes_on.load(std::memory_order_relaxed) ? on : off;
}

bool SelectLaneTokenKernel(const std::string& name) {
  if (name == "off") {
    lanes_on.store(false);
    return true;
  }
  if (name == "avx512vnni" && CpuHasLanes()) {
    lanes_on.store(true);
    return true;
  }
  return false;
}

}  // namespace kvmem

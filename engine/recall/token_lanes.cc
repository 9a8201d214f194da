#include "engine/recall/token_lanes.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine/recall/fast_exp_lanes.h"

namespace kvmem {
namespace {

constexpr int kCodeZero = 8;  // token_codes.h: code = round(x / s) + 8.

// One group of L pooled tokens: their records (a short last group repeats
// its first token in the spare lanes: valid records, their lanes not
// stored), and the next group's records prefetched a share per head, record
// by record. Issued all at once before the heads (up to 256 KiB of 7B
// records), the prefetches stalled on the line-fill buffers. Spread, the
// eval shape's token stage is ~10 % faster and 7B's the same (token by token
// rather than line by line across them: 7B 5 % slower, two groups ahead:
// 15 % slower).
template <size_t L>
class LaneGroup {
 public:
  LaneGroup(const TokenCodeShape& shape, const uint8_t* const* rec, size_t n,
            size_t t0, uint32_t w)
      : m_(std::min(L, n - t0)),
        lines_((shape.bytes_per_token() + 63) / 64),
        w_(w) {
    for (size_t k = 0; k < L; ++k) p_[k] = rec[t0 + (k < m_ ? k : 0)];
    const size_t ahead = t0 + L < n ? std::min(L, n - t0 - L) : 0;
    for (size_t k = 0; k < ahead; ++k) next_[k] = rec[t0 + L + k];
    fetches_ = ahead * lines_;
  }
  size_t m() const { return m_; }
  const uint8_t* const* records() const { return p_; }
  // Head i's share of the prefetches (the cursor: record next_[rec_], its
  // line line_; no division per line: a div per prefetch cost more than
  // the scoring).
  void Prefetch(uint32_t i) {
    for (const size_t until = fetches_ * (i + 1) / w_; issued_ < until;
         ++issued_) {
      __builtin_prefetch(next_[rec_] + 64 * line_);
      if (++line_ == lines_) {
        line_ = 0;
        ++rec_;
      }
    }
  }
  // The L tokens' key scales of segment s.
  void KeyScales(uint32_t s, float* out) const {
    for (size_t k = 0; k < L; ++k) {
      std::memcpy(&out[k], p_[k] + s * sizeof(float), sizeof(float));
    }
  }

 private:
  const uint8_t* p_[L];
  const uint8_t* next_[L];
  size_t m_, lines_, fetches_ = 0, rec_ = 0, line_ = 0, issued_ = 0;
  uint32_t w_;
};

#if defined(__x86_64__)
#define KVMEM_LANES_TARGET "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
#define KVMEM_LANES8_TARGET "avx2,fma"
// GCC 12's unmasked AVX-512 intrinsics pass an _mm512_undefined_* source,
// which -Wmaybe-uninitialized reports at -O3 once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

using fast_exp::Exp16;
using fast_exp::Exp8;

// a[t] holds token t's 8 dwords; afterwards a[k] holds dword k of tokens
// 0..7.
__attribute__((target("avx2"))) inline void Transpose8(__m256i* a) {
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
  constexpr size_t kLanes = 16;
  const uint32_t S = shape.segments, V = q.vectors;
  const size_t codes_at = size_t{S} * sizeof(float);
  const bool mean = !t.mean_k.empty() && mean_out != nullptr;
  const __m512 scale = _mm512_set1_ps(t.logit_scale);
  const float inv_w = 1.0f / static_cast<float>(t.w);
  alignas(64) __m512i acc[kMaxLaneVectors];
  for (size_t t0 = 0; t0 < n; t0 += kLanes) {
    LaneGroup<kLanes> g(shape, rec, n, t0, t.w);
    __m512 total = _mm512_setzero_ps(), mean_total = _mm512_setzero_ps();
    for (uint32_t i = 0; i < t.w; ++i) {
      const uint32_t s = t.h0 + i;
      g.Prefetch(i);
      alignas(64) float key_scale[kLanes];
      g.KeyScales(s, key_scale);
      const __m512 ks = _mm512_load_ps(key_scale);
      LaneSums(shape, q, g.records(), codes_at + s * shape.segment_code_bytes(),
               s, acc);
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
    const __mmask16 keep = static_cast<__mmask16>((1u << g.m()) - 1);
    _mm512_mask_storeu_ps(out + t0, keep, total);
    if (mean) {
      _mm512_mask_storeu_ps(mean_out + t0, keep,
                            _mm512_mul_ps(mean_total, _mm512_set1_ps(inv_w)));
    }
  }
}

// LaneSums on 8 tokens without VNNI: vpmaddubsw multiplies a token's code
// bytes by the query's and adds pairs into int16, vpmaddwd adds pairs of
// those into the token's int32 lane. A code is at most 15 and a query byte
// at least -128, so a pair is within +-3,840 and the 8 pairs an int16 sums
// (one per dword, k = 0..7) within +-30,720: nothing saturates or wraps, and
// the lanes hold the same integers as LaneSums' and token_codes.cc's.
__attribute__((target(KVMEM_LANES8_TARGET))) void LaneSums8(
    const TokenCodeShape& shape, const TokenQuery& q, const uint8_t* const* p,
    size_t at, uint32_t s, __m256i* acc) {
  const uint32_t chunks = shape.chunks();
  const size_t row = size_t{chunks} * 64;
  const __m256i mask = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (uint32_t j = 0; j < q.vectors; ++j) acc[j] = _mm256_setzero_si256();
  for (uint32_t c = 0; c < chunks; ++c) {
    __m256i a[8];
    for (int k = 0; k < 8; ++k) {
      a[k] = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(p[k] + at + 32 * c));
    }
    Transpose8(a);
    // The low nibbles (dimensions 64c + 4k..), then the high ones (64c +
    // 32 + 4k..), each against its half of the query's row.
    for (int half = 0; half < 2; ++half) {
      __m256i v[8];
      for (int k = 0; k < 8; ++k) {
        v[k] = _mm256_and_si256(half == 0 ? a[k] : _mm256_srli_epi16(a[k], 4),
                                mask);
      }
      for (uint32_t j = 0; j < q.vectors; ++j) {
        const int8_t* qr = q.q.data() + (size_t{j} * shape.segments + s) * row +
                           64 * size_t{c} + 32 * half;
        __m256i x = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
          int32_t qk;
          std::memcpy(&qk, qr + 4 * k, 4);
          x = _mm256_add_epi16(
              x, _mm256_maddubs_epi16(v[k], _mm256_set1_epi32(qk)));
        }
        acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(x, ones));
      }
    }
  }
}

// VnniLanes' steps on 8 tokens at a time with AVX2 and FMA: Exp8 where it
// has Exp16 (the same floats), so the same values bit for bit.
__attribute__((target(KVMEM_LANES8_TARGET))) void Avx2Lanes(
    const TokenCodeShape& shape, const TokenQuery& q, const DensityTerms& t,
    const uint8_t* const* rec, size_t n, float* out, float* mean_out) {
  constexpr size_t kLanes = 8;
  const uint32_t S = shape.segments, V = q.vectors;
  const size_t codes_at = size_t{S} * sizeof(float);
  const bool mean = !t.mean_k.empty() && mean_out != nullptr;
  const __m256 scale = _mm256_set1_ps(t.logit_scale);
  const float inv_w = 1.0f / static_cast<float>(t.w);
  alignas(32) __m256i acc[kMaxLaneVectors];
  for (size_t t0 = 0; t0 < n; t0 += kLanes) {
    LaneGroup<kLanes> g(shape, rec, n, t0, t.w);
    __m256 total = _mm256_setzero_ps(), mean_total = _mm256_setzero_ps();
    for (uint32_t i = 0; i < t.w; ++i) {
      const uint32_t s = t.h0 + i;
      g.Prefetch(i);
      alignas(32) float key_scale[kLanes];
      g.KeyScales(s, key_scale);
      const __m256 ks = _mm256_load_ps(key_scale);
      LaneSums8(shape, q, g.records(),
                codes_at + s * shape.segment_code_bytes(), s, acc);
      __m256 head = _mm256_setzero_ps(), zm = _mm256_setzero_ps();
      for (uint32_t j = 0; j < V; ++j) {
        const size_t qs = size_t{j} * S + s;
        const __m256 f = _mm256_cvtepi32_ps(
            _mm256_sub_epi32(acc[j], _mm256_set1_epi32(kCodeZero * q.sum[qs])));
        const __m256 d =
            _mm256_mul_ps(_mm256_mul_ps(ks, _mm256_set1_ps(q.scale[qs])), f);
        const __m256 e = Exp8(_mm256_fmadd_ps(
            d, scale, _mm256_set1_ps(t.neg[size_t{j} * t.w + i])));
        head = _mm256_fmadd_ps(_mm256_set1_ps(t.coef[j]), e, head);
        if (mean) zm = _mm256_fmadd_ps(_mm256_set1_ps(t.mean_k[j]), d, zm);
      }
      total = _mm256_add_ps(total, head);
      if (mean) {
        mean_total = _mm256_add_ps(
            mean_total, Exp8(_mm256_add_ps(zm, _mm256_set1_ps(t.mean_neg[i]))));
      }
    }
    alignas(32) float lane[kLanes];
    _mm256_store_ps(lane, total);
    std::memcpy(out + t0, lane, g.m() * sizeof(float));
    if (mean) {
      _mm256_store_ps(lane, _mm256_mul_ps(mean_total, _mm256_set1_ps(inv_w)));
      std::memcpy(mean_out + t0, lane, g.m() * sizeof(float));
    }
  }
}

#pragma GCC diagnostic pop

// The kernels this CPU can run: 2 (avx512vnni), 1 (avx2), or 0.
int CpuLanes() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    return 0;
  }
  return __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512vnni")
             ? 2
             : 1;
}
#else
int CpuLanes() { return 0; }
#endif

// The kernels' names, by CpuLanes' numbers.
const std::string& LaneName(int k) {
  static const std::string names[] = {"off", "avx2", "avx512vnni"};
  return names[k];
}

// The kernel on (CpuLanes' numbering): the best the CPU has unless
// SelectLaneTokenKernel chose another.
std::atomic<int>& LanesOn() {
  static std::atomic<int> on{CpuLanes()};
  return on;
}

}  // namespace

bool LaneTokenDensities(const TokenCodeShape& shape, const TokenQuery& q,
                        const DensityTerms& t, const uint8_t* const* rec,
                        size_t n, float* out, float* mean_out) {
  const int on = LanesOn().load(std::memory_order_relaxed);
  if (on == 0 || q.vectors > kMaxLaneVectors || q.vectors != t.vectors ||
      t.w == 0) {
    return false;
  }
#if defined(__x86_64__)
  if (n == 0) return true;
  if (on == 2) {
    VnniLanes(shape, q, t, rec, n, out, mean_out);
  } else {
    Avx2Lanes(shape, q, t, rec, n, out, mean_out);
  }
  return true;
#else
  return false;
#endif
}

const std::string& LaneTokenKernel() {
  return LaneName(LanesOn().load(std::memory_order_relaxed));
}

bool SelectLaneTokenKernel(const std::string& name) {
  for (int k = 0; k <= CpuLanes(); ++k) {
    if (name == LaneName(k)) {
      LanesOn().store(k);
      return true;
    }
  }
  return false;
}

}  // namespace kvmem

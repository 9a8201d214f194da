#include "engine/index/token_codes.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "engine/index/avx2_round.h"
#include "engine/index/dot.h"

namespace kvmem {
namespace {

constexpr int kCodeZero = 8;

// The int4 code of x at scale s (0: every code is zero).
uint8_t Code(float x, float inv) {
  const int c = static_cast<int>(std::lround(x * inv));
  return static_cast<uint8_t>(std::clamp(c, -7, 7) + kCodeZero);
}

// The record's scale of segment s and its codes.
inline float ScaleOf(const uint8_t* record, uint32_t s) {
  float v;
  std::memcpy(&v, record + s * sizeof(float), sizeof(float));
  return v;
}
inline const uint8_t* CodesOf(const TokenCodeShape& shape,
                              const uint8_t* record, uint32_t s) {
  return record + shape.segments * sizeof(float) +
         s * shape.segment_code_bytes();
}

// sum_i code_i * q8_i over one segment's chunks.
int32_t ScalarSegmentSum(const uint8_t* codes, const int8_t* q,
                         uint32_t chunks) {
  int32_t acc = 0;
  for (uint32_t c = 0; c < chunks; ++c, codes += 32, q += 64) {
    for (int i = 0; i < 32; ++i) {
      acc += (codes[i] & 15) * q[i] + (codes[i] >> 4) * q[32 + i];
    }
  }
  return acc;
}

// The one place raw sums become dots: the same float operations in every
// kernel.
inline float Finish(int32_t raw, const TokenQuery& q, size_t qs,
                    float key_scale) {
  return key_scale * q.scale[qs] *
         static_cast<float>(raw - kCodeZero * q.sum[qs]);
}

void ScalarDots(const TokenCodeShape& shape, const TokenQuery& q,
                const uint8_t* records, size_t n, uint32_t s0, uint32_t s1,
                float* out) {
  const size_t stride = shape.bytes_per_token();
  const size_t row = size_t{shape.chunks()} * 64;
  const uint32_t width = shape.segments;
  for (size_t t = 0; t < n; ++t) {
    const uint8_t* rec = records + t * stride;
    for (uint32_t j = 0; j < q.vectors; ++j) {
      float* o = out + (t * q.vectors + j) * width;
      for (uint32_t s = s0; s < s1; ++s) {
        const size_t qs = size_t{j} * shape.segments + s;
        const int32_t raw = ScalarSegmentSum(
            CodesOf(shape, rec, s), q.q.data() + qs * row, shape.chunks());
        o[s] = Finish(raw, q, qs, ScaleOf(rec, s));
      }
    }
  }
}

#if defined(__x86_64__)
// The 8 int32 partial sums of one segment's chunks against one row.
__attribute__((target("avx2"))) inline __m256i Avx2SegmentSum(
    const uint8_t* codes, const int8_t* q, uint32_t chunks) {
  const __m256i mask = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  for (uint32_t c = 0; c < chunks; ++c, codes += 32, q += 64) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
    const __m256i lo = _mm256_and_si256(v, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    const __m256i qlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i qhi =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
    // Pairs of u4 x s8 products: |sum| <= 4 * 15 * 128 < 32767.
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, qlo),
                                           _mm256_maddubs_epi16(hi, qhi));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
  }
  return acc;
}

__attribute__((target("avx2"))) inline int32_t HorizontalSum(__m256i v) {
  __m128i s =
      _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The raw sums of 8 segments' partial sums, lane s = segment s.
__attribute__((target("avx2"))) inline __m256i Reduce8(const __m256i* a) {
  const __m256i h01 = _mm256_hadd_epi32(a[0], a[1]);
  const __m256i h23 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i h45 = _mm256_hadd_epi32(a[4], a[5]);
  const __m256i h67 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i h0123 = _mm256_hadd_epi32(h01, h23);  // 0 1 2 3 | 0 1 2 3
  const __m256i h4567 = _mm256_hadd_epi32(h45, h67);  // 4 5 6 7 | 4 5 6 7
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// Finish on 8 lanes (segments s..s+7 of row qs's vector): the same float
// operations, in the same order.
__attribute__((target("avx2"))) inline void Finish8(__m256i raw,
                                                    const TokenQuery& q,
                                                    size_t qs,
                                                    const uint8_t* rec,
                                                    uint32_t s, float* o) {
  const __m256i sums =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.sum.data() + qs));
  const __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(
      raw, _mm256_mullo_epi32(sums, _mm256_set1_epi32(kCodeZero))));
  const __m256 ks =
      _mm256_loadu_ps(reinterpret_cast<const float*>(rec + s * sizeof(float)));
  const __m256 ts = _mm256_loadu_ps(q.scale.data() + qs);
  _mm256_storeu_ps(o + s, _mm256_mul_ps(_mm256_mul_ps(ks, ts), f));
}

// Several vectors: each block of 8 segments has its codes unpacked once
// (kChunks chunks a segment, known at compile time up to kMaxUnpackChunks)
// and scored against every vector from there.
constexpr uint32_t kMaxUnpackChunks = 4;

template <uint32_t kChunks>
__attribute__((target("avx2"))) void Avx2ManyVectors(
    const TokenCodeShape& shape, const TokenQuery& q, const uint8_t* rec,
    uint32_t s0, uint32_t s1, float* out) {
  constexpr size_t row = size_t{kChunks} * 64;
  const uint32_t width = shape.segments;
  const __m256i mask = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i un[8][2 * kChunks];
  uint32_t s = s0;
  for (; s + 8 <= s1; s += 8) {
    for (int k = 0; k < 8; ++k) {
      const uint8_t* codes = CodesOf(shape, rec, s + k);
      for (uint32_t c = 0; c < kChunks; ++c) {
        const __m256i v = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(codes + 32 * c));
        un[k][2 * c] = _mm256_and_si256(v, mask);
        un[k][2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      }
    }
    for (uint32_t j = 0; j < q.vectors; ++j) {
      const size_t qs = size_t{j} * shape.segments + s;
      __m256i acc[8];
      for (int k = 0; k < 8; ++k) {
        const int8_t* qr = q.q.data() + (qs + k) * row;
        acc[k] = _mm256_setzero_si256();
        for (uint32_t c = 0; c < kChunks; ++c) {
          const __m256i pairs = _mm256_add_epi16(
              _mm256_maddubs_epi16(
                  un[k][2 * c],
                  _mm256_loadu_si256(
                      reinterpret_cast<const __m256i*>(qr + 64 * c))),
              _mm256_maddubs_epi16(
                  un[k][2 * c + 1],
                  _mm256_loadu_si256(
                      reinterpret_cast<const __m256i*>(qr + 64 * c + 32))));
          acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(pairs, ones));
        }
      }
      Finish8(Reduce8(acc), q, qs, rec, s, out + size_t{j} * width);
    }
  }
  for (; s < s1; ++s) {
    for (uint32_t j = 0; j < q.vectors; ++j) {
      const size_t qs = size_t{j} * shape.segments + s;
      const int32_t raw = HorizontalSum(Avx2SegmentSum(
          CodesOf(shape, rec, s), q.q.data() + qs * row, kChunks));
      out[size_t{j} * width + s] = Finish(raw, q, qs, ScaleOf(rec, s));
    }
  }
}

using TokenRecordFn = void (*)(const TokenCodeShape&, const TokenQuery&,
                               const uint8_t*, uint32_t, uint32_t, float*);

// The per-record function of a kernel family for a chunk count (null past
// kMaxUnpackChunks).
template <template <uint32_t> class F>
TokenRecordFn ForChunks(uint32_t chunks) {
  static_assert(kMaxUnpackChunks == 4, "one case per chunk count");
  switch (chunks) {
    case 1:
      return &F<1>::Run;
    case 2:
      return &F<2>::Run;
    case 3:
      return &F<3>::Run;
    case 4:
      return &F<4>::Run;
    default:
      return nullptr;
  }
}

template <uint32_t kChunks>
struct Avx2Many {
  static void Run(const TokenCodeShape& shape, const TokenQuery& q,
                  const uint8_t* rec, uint32_t s0, uint32_t s1, float* out) {
    Avx2ManyVectors<kChunks>(shape, q, rec, s0, s1, out);
  }
};

// Eight segments at a time: their sums reduced together, and Finish's
// float operations, in the same order, on 8 lanes.
__attribute__((target("avx2"))) void Avx2Dots(const TokenCodeShape& shape,
                                              const TokenQuery& q,
                                              const uint8_t* records, size_t n,
                                              uint32_t s0, uint32_t s1,
                                              float* out) {
  const size_t stride = shape.bytes_per_token();
  const size_t row = size_t{shape.chunks()} * 64;
  const uint32_t width = shape.segments;
  const TokenRecordFn many =
      q.vectors > 1 ? ForChunks<Avx2Many>(shape.chunks()) : nullptr;
  for (size_t t = 0; t < n; ++t) {
    const uint8_t* rec = records + t * stride;
    if (t + 1 < n) {
      const char* next = reinterpret_cast<const char*>(rec + stride);
      for (size_t b = 0; b < stride; b += 64) __builtin_prefetch(next + b);
    }
    if (many != nullptr) {
      many(shape, q, rec, s0, s1, out + t * q.vectors * width);
      continue;
    }
    for (uint32_t j = 0; j < q.vectors; ++j) {
      float* o = out + (t * q.vectors + j) * width;
      uint32_t s = s0;
      for (; s + 8 <= s1; s += 8) {
        const size_t qs = size_t{j} * shape.segments + s;
        __m256i acc[8];
        for (int k = 0; k < 8; ++k) {
          acc[k] = Avx2SegmentSum(CodesOf(shape, rec, s + k),
                                  q.q.data() + (qs + k) * row, shape.chunks());
        }
        Finish8(Reduce8(acc), q, qs, rec, s, o);
      }
      for (; s < s1; ++s) {
        const size_t qs = size_t{j} * shape.segments + s;
        const int32_t raw = HorizontalSum(Avx2SegmentSum(
            CodesOf(shape, rec, s), q.q.data() + qs * row, shape.chunks()));
        o[s] = Finish(raw, q, qs, ScaleOf(rec, s));
      }
    }
  }
}
#endif

std::vector<TokenKernelInfo> Detect() {
  std::vector<TokenKernelInfo> k;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) k.push_back({"avx2", &Avx2Dots});
#endif
  k.push_back({"scalar", &ScalarDots});
  return k;
}

std::atomic<const TokenKernelInfo*> active{nullptr};

// One row's int4 codes: row[i] = Code(x[i], inv) for i < hd, kCodeZero
// from there to `padded`. A scalar lround per element was 4-10 % of the
// server's CPU when 7B frames were ingested (docs/benchmarks.md), and GCC at
// -O2 does not vectorise the loop, so AVX2 (where the CPU has it) takes 8 at
// a time: y - trunc(y) is exact in float, so stepping away from zero where
// it is at least 0.5 gives lround's integer for every finite y. (Keys are
// finite: appends are range-checked, FindOutOfRange.)
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint32_t Avx2RowCodes(const float* x,
                                                      uint32_t hd, float inv,
                                                      uint8_t* row) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 lo = _mm256_set1_ps(-7.0f), hi = _mm256_set1_ps(7.0f);
  const __m256i zero_code = _mm256_set1_epi32(kCodeZero);
  uint32_t i = 0;
  for (; i + 8 <= hd; i += 8) {
    const __m256 r = _mm256_min_ps(
        _mm256_max_ps(
            Avx2RoundHalfAway(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv)), lo),
        hi);
    const __m256i c = _mm256_add_epi32(_mm256_cvttps_epi32(r), zero_code);
    const __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c),
                                        _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(row + i),
                     _mm_packus_epi16(c16, c16));
  }
  return i;
}
#endif

void RowCodes(const float* x, uint32_t hd, uint32_t padded, float inv,
              uint8_t* row) {
  uint32_t i = 0;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) i = Avx2RowCodes(x, hd, inv, row);
#endif
  for (; i < hd; ++i) row[i] = Code(x[i], inv);
  for (; i < padded; ++i) row[i] = kCodeZero;
}

// Two codes a byte: chunk c's byte i holds dimension 64c + i (low nibble)
// and 64c + 32 + i (high). Restrict pointers in a function of their own:
// inline, the loop went a byte at a time (GCC would not check the row and
// the record for overlap at -O2), a fifth of a 7B seal's codes.
void PackNibbles(const uint8_t* __restrict row, uint32_t chunks,
                 uint8_t* __restrict codes) {
  for (uint32_t c = 0; c < chunks; ++c) {
    for (uint32_t i = 0; i < 32; ++i) {
      codes[32 * c + i] =
          static_cast<uint8_t>(row[64 * c + i] | (row[64 * c + 32 + i] << 4));
    }
  }
}

}  // namespace

std::string EncodeTokenCodes(const TokenCodeShape& shape, const float* keys,
                             size_t n, const uint32_t* order) {
  const uint32_t hd = shape.head_dim, chunks = shape.chunks();
  std::string out(n * shape.bytes_per_token(), '\0');
  std::vector<uint8_t> row(size_t{chunks} * 64);
  for (size_t t = 0; t < n; ++t) {
    auto* rec =
        reinterpret_cast<uint8_t*>(out.data()) + t * shape.bytes_per_token();
    for (uint32_t s = 0; s < shape.segments; ++s) {
      const size_t r = order != nullptr ? order[t] : t;
      const float* x = keys + (r * shape.segments + s) * hd;
      // Eight partial maxima (MaxAbs; max is exact in any order): one
      // chain of dependent maxima per row was most of a 7B seal's codes.
      const float peak = MaxAbs(x, hd);
      const float scale = peak / 7.0f;
      const float inv = peak > 0 ? 1.0f / scale : 0.0f;
      std::memcpy(rec + s * sizeof(float), &scale, sizeof(float));
      RowCodes(x, hd, static_cast<uint32_t>(row.size()), inv, row.data());
      PackNibbles(row.data(), chunks,
                  rec + shape.segments * sizeof(float) +
                      s * shape.segment_code_bytes());
    }
  }
  return out;
}

void DecodeTokenCodes(const TokenCodeShape& shape, const std::string& codes,
                      size_t t, float* out) {
  const auto* rec = reinterpret_cast<const uint8_t*>(codes.data()) +
                    t * shape.bytes_per_token();
  const uint32_t hd = shape.head_dim;
  for (uint32_t s = 0; s < shape.segments; ++s) {
    const float scale = ScaleOf(rec, s);
    const uint8_t* c = CodesOf(shape, rec, s);
    for (uint32_t i = 0; i < hd; ++i) {
      const uint8_t byte = c[32 * (i / 64) + i % 32];
      const int code = (i % 64) < 32 ? (byte & 15) : (byte >> 4);
      out[s * hd + i] = scale * static_cast<float>(code - kCodeZero);
    }
  }
}

namespace {

// A query row's int8 codes lround(x * inv) (clamped to
// +-127) with their sum, 8 floats at a time where the CPU has AVX2: the same
// steps as Avx2RowCodes. A 7B query is 32,768 floats a vector.
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint32_t Avx2QueryCodes(const float* x,
                                                        uint32_t hd, float inv,
                                                        int8_t* out,
                                                        int32_t* sum) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i vsum = _mm256_setzero_si256();
  uint32_t i = 0;
  for (; i + 8 <= hd; i += 8) {
    const __m256i c = _mm256_cvttps_epi32(_mm256_min_ps(
        _mm256_max_ps(
            Avx2RoundHalfAway(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv)), lo),
        hi));
    vsum = _mm256_add_epi32(vsum, c);
    Avx2StoreInt8(c, out + i);
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vsum);
  for (int32_t v : lanes) *sum += v;
  return i;
}
#endif

void PrepareRows(const TokenCodeShape& shape, const float* query,
                 uint32_t vectors, bool avx2, TokenQuery* out) {
  const uint32_t hd = shape.head_dim;
  const size_t row = size_t{shape.chunks()} * 64;
  const size_t rows = size_t{vectors} * shape.segments;
  out->vectors = vectors;
  out->q.assign(rows * row, 0);
  out->scale.assign(rows, 0.0f);
  out->sum.assign(rows, 0);
  for (size_t r = 0; r < rows; ++r) {
    const float* x = query + r * hd;
    const float peak = MaxAbs(x, hd);
    if (peak == 0) continue;
    const float scale = peak / 127.0f, inv = 1.0f / scale;
    int32_t sum = 0;
    uint32_t i = 0;
#if defined(__x86_64__)
    if (avx2) i = Avx2QueryCodes(x, hd, inv, out->q.data() + r * row, &sum);
#endif
    for (; i < hd; ++i) {
      const int v =
          std::clamp(static_cast<int>(std::lround(x[i] * inv)), -127, 127);
      out->q[r * row + i] = static_cast<int8_t>(v);
      sum += v;
    }
    out->scale[r] = scale;
    out->sum[r] = sum;
  }
}

}  // namespace

void PrepareTokenQuery(const TokenCodeShape& shape, const float* query,
                       uint32_t vectors, TokenQuery* out) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
#else
  constexpr bool avx2 = false;
#endif
  PrepareRows(shape, query, vectors, avx2, out);
}

void PrepareTokenQueryScalar(const TokenCodeShape& shape, const float* query,
                             uint32_t vectors, TokenQuery* out) {
  PrepareRows(shape, query, vectors, false, out);
}

const std::vector<TokenKernelInfo>& AvailableTokenKernels() {
  static const std::vector<TokenKernelInfo> kernels = Detect();
  return kernels;
}

const TokenKernelInfo& ActiveTokenKernel() {
  const TokenKernelInfo* k = active.load(std::memory_order_acquire);
  return k != nullptr ? *k : AvailableTokenKernels().front();
}

bool SelectTokenKernel(const std::string& name) {
  for (const TokenKernelInfo& k : AvailableTokenKernels()) {
    if (k.name == name) {
      active.store(&k, std::memory_order_release);
      return true;
    }
  }
  return false;
}

}  // namespace kvmem

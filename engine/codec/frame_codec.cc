#include "engine/codec/frame_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "engine/codec/dtype.h"
#include "engine/codec/frame_parts.h"

namespace kvmem {
namespace {

// Rows converted to fp32 at a time (a few KiB of floats).
constexpr size_t kChunkValues = 4096;

bool Int4(ColdPrecision p) { return p == ColdPrecision::kInt4; }

uint64_t HeaderBytes(ColdPrecision p) {
  return (Int4(p) ? 2 : 1) * sizeof(float);
}

uint64_t CodeBytes(const Geometry& g, ColdPrecision p) {
  return Int4(p) ? (g.head_dim + 1) / 2 : g.head_dim;
}

// Half away from zero, as the demotion's quantiser rounds.
int32_t RoundAway(float v) {
  return static_cast<int32_t>(v + std::copysign(0.5f, v));
}

// The hot loops use SSE2 (x86-64's baseline: no dispatch), 16 values at a
// time, with the scalar definition for the tail and other CPUs
// (FrameCodecTest.CodesFollowTheScalarDefinition compares them). GCC does not
// vectorise the plain loops: float min, max and clamps stay branches under
// its default -ftrapping-math.
// The longest row: config.geometry.head_dim is at most 4096 (stream_config.cc).
constexpr size_t kMaxRow = 4096;

// Largest |x| and the minimum and maximum of a row.
void RowRange(const float* x, size_t d, float* amax, float* lo, float* hi) {
  size_t i = 0;
  float mn = x[0], mx = x[0];
#if defined(__SSE2__)
  if (d >= 4) {  // SSE2 is x86-64's baseline: no dispatch needed.
    __m128 vmn = _mm_loadu_ps(x), vmx = vmn;
    for (i = 4; i + 4 <= d; i += 4) {
      const __m128 v = _mm_loadu_ps(x + i);
      vmn = _mm_min_ps(vmn, v);
      vmx = _mm_max_ps(vmx, v);
    }
    float a[4], b[4];
    _mm_storeu_ps(a, vmn);
    _mm_storeu_ps(b, vmx);
    mn = std::min(std::min(a[0], a[1]), std::min(a[2], a[3]));
    mx = std::max(std::max(b[0], b[1]), std::max(b[2], b[3]));
  }
#endif
  for (; i < d; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  *lo = mn;
  *hi = mx;
  *amax = std::max(std::fabs(mn), std::fabs(mx));
}

void EncodeInt8Row(const float* x, size_t d, char* out) {
  float m, lo, hi;
  RowRange(x, d, &m, &lo, &hi);
  const float scale = m > 0 ? m / 127.0f : 1.0f;
  const float inv = 1.0f / scale;
  std::memcpy(out, &scale, sizeof(float));
  auto* q = reinterpret_cast<int8_t*>(out + sizeof(float));
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 vinv = _mm_set1_ps(inv), top = _mm_set1_ps(127.0f);
  const __m128 bottom = _mm_set1_ps(-127.0f), half = _mm_set1_ps(0.5f);
  const __m128 sign = _mm_set1_ps(-0.0f);
  for (; i + 16 <= d; i += 16) {
    __m128i w[4];
    for (int k = 0; k < 4; ++k) {
      __m128 v = _mm_mul_ps(_mm_loadu_ps(x + i + 4 * k), vinv);
      v = _mm_max_ps(_mm_min_ps(v, top), bottom);
      // Half away from zero: + copysign(0.5, v), then truncate.
      v = _mm_add_ps(v, _mm_or_ps(half, _mm_and_ps(v, sign)));
      w[k] = _mm_cvttps_epi32(v);
    }
    const __m128i lo16 = _mm_packs_epi32(w[0], w[1]);
    const __m128i hi16 = _mm_packs_epi32(w[2], w[3]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm_packs_epi16(lo16, hi16));
  }
#endif
  for (; i < d; ++i) {
    q[i] =
        static_cast<int8_t>(RoundAway(std::clamp(x[i] * inv, -127.0f, 127.0f)));
  }
}

void EncodeInt4Row(const float* x, size_t d, char* out) {
  float m, lo, hi;
  RowRange(x, d, &m, &lo, &hi);
  const float step = hi > lo ? (hi - lo) / 15.0f : 1.0f;
  const float inv = 1.0f / step;
  std::memcpy(out, &lo, sizeof(float));
  std::memcpy(out + sizeof(float), &step, sizeof(float));
  auto* q = reinterpret_cast<uint8_t*>(out + 2 * sizeof(float));
  uint8_t c[kMaxRow + 1];
  size_t i = 0;
#if defined(__SSE2__)
  const __m128 vlo = _mm_set1_ps(lo), vinv = _mm_set1_ps(inv);
  const __m128 top = _mm_set1_ps(15.0f), half = _mm_set1_ps(0.5f);
  for (; i + 16 <= d; i += 16) {
    __m128i w[4];
    for (int k = 0; k < 4; ++k) {
      const __m128 v =
          _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x + i + 4 * k), vlo), vinv);
      w[k] = _mm_cvttps_epi32(_mm_add_ps(_mm_min_ps(v, top), half));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i),
                     _mm_packus_epi16(_mm_packs_epi32(w[0], w[1]),
                                      _mm_packs_epi32(w[2], w[3])));
  }
#endif
  for (; i < d; ++i) {
    // (x - lo) * inv >= 0: truncation after + 0.5 rounds half up.
    float v = (x[i] - lo) * inv;
    v = v > 15.0f ? 15.0f : v;
    c[i] = static_cast<uint8_t>(static_cast<int32_t>(v + 0.5f));
  }
  if (d % 2 != 0) c[d] = 0;
  for (size_t j = 0; j < (d + 1) / 2; ++j) {
    q[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
  }
}

void DecodeInt8Row(const char* in, size_t d, float* x) {
  float scale;
  std::memcpy(&scale, in, sizeof(float));
  const auto* q = reinterpret_cast<const int8_t*>(in + sizeof(float));
  for (size_t i = 0; i < d; ++i) x[i] = q[i] * scale;
}

void DecodeInt4Row(const char* in, size_t d, float* x) {
  float lo, step;
  std::memcpy(&lo, in, sizeof(float));
  std::memcpy(&step, in + sizeof(float), sizeof(float));
  const auto* q = reinterpret_cast<const uint8_t*>(in + 2 * sizeof(float));
  float pair[kMaxRow + 1];
  const size_t n = (d + 1) / 2;
  for (size_t j = 0; j < n; ++j) {
    pair[2 * j] = lo + (q[j] & 0x0f) * step;
    pair[2 * j + 1] = lo + (q[j] >> 4) * step;
  }
  std::memcpy(x, pair, d * sizeof(float));
}

size_t ChunkRows(const Geometry& g) {
  return std::max<size_t>(1, kChunkValues / std::max(1u, g.head_dim));
}

}  // namespace

bool FramesEncoded(ColdPrecision p) {
  return p == ColdPrecision::kInt8 || p == ColdPrecision::kInt4;
}

uint64_t EncodedRowBytes(const Geometry& g, ColdPrecision p) {
  if (!FramesEncoded(p)) return FrameRowBytes(g);
  return HeaderBytes(p) + CodeBytes(g, p);
}

uint64_t EncodedFrameBytes(const Geometry& g, ColdPrecision p,
                           uint32_t tokens) {
  return uint64_t{g.layers} * 2 * g.kv_heads * tokens * EncodedRowBytes(g, p);
}

void EncodeFrameRows(const Geometry& g, ColdPrecision p, absl::string_view rows,
                     std::string* out) {
  const size_t d = g.head_dim, width = DTypeBytes(g.dtype);
  const size_t n = rows.size() / (d * width), enc = EncodedRowBytes(g, p);
  const size_t chunk = ChunkRows(g);
  out->resize(n * enc);
  thread_local std::vector<float> x;
  x.resize(chunk * d);
  for (size_t r0 = 0; r0 < n; r0 += chunk) {
    const size_t m = std::min(chunk, n - r0);
    DecodeToFloat(
        reinterpret_cast<const uint8_t*>(rows.data()) + r0 * d * width, m * d,
        g.dtype, x.data());
    for (size_t r = 0; r < m; ++r) {
      char* o = out->data() + (r0 + r) * enc;
      if (Int4(p)) {
        EncodeInt4Row(x.data() + r * d, d, o);
      } else {
        EncodeInt8Row(x.data() + r * d, d, o);
      }
    }
  }
}

absl::Status DecodeFrameRows(const Geometry& g, ColdPrecision p,
                             absl::string_view encoded, std::string* out) {
  const size_t d = g.head_dim, width = DTypeBytes(g.dtype);
  const size_t enc = EncodedRowBytes(g, p);
  if (enc == 0 || encoded.size() % enc != 0) {
    return absl::DataLossError(absl::StrCat(
        "a frame record of ", encoded.size(),
        " bytes is not a whole number of ", enc, "-byte encoded rows"));
  }
  const size_t n = encoded.size() / enc, chunk = ChunkRows(g);
  out->resize(n * d * width);
  thread_local std::vector<float> x;
  x.resize(chunk * d);
  for (size_t r0 = 0; r0 < n; r0 += chunk) {
    const size_t m = std::min(chunk, n - r0);
    for (size_t r = 0; r < m; ++r) {
      const char* in = encoded.data() + (r0 + r) * enc;
      if (Int4(p)) {
        DecodeInt4Row(in, d, x.data() + r * d);
      } else {
        DecodeInt8Row(in, d, x.data() + r * d);
      }
    }
    EncodeFromFloat(x.data(), m * d, g.dtype,
                    reinterpret_cast<uint8_t*>(out->data()) + r0 * d * width);
  }
  return absl::OkStatus();
}

absl::Status DecodeStoredFrame(const Geometry& g, ColdPrecision p,
                               std::string* bytes) {
  if (!FramesEncoded(p)) return absl::OkStatus();
  std::string decoded;
  absl::Status s = DecodeFrameRows(g, p, *bytes, &decoded);
  if (s.ok()) bytes->swap(decoded);
  return s;
}

}  // namespace kvmem

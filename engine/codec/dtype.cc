#include "engine/codec/dtype.h"

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

namespace kvmem {
namespace {

float FloatOfBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t BitsOfFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

}  // namespace

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
    case DType::kBf16:
      return 2;
    case DType::kFp32:
      return 4;
    default:
      return 0;
  }
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
      return "unspecified";
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp32:
      return "fp32";
  }
  return "unknown";
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: renormalise into an fp32 normal number.
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return FloatOfBits(bits);
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = BitsOfFloat(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // Overflows to Inf.
  if (abs < 0x38800000u) {
    // Result is subnormal or zero in fp16.
    if (abs < 0x33000000u) return sign;
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float Bf16ToFloat(uint16_t b) {
  return FloatOfBits(static_cast<uint32_t>(b) << 16);
}

uint16_t FloatToBf16(float f) {
  uint32_t bits = BitsOfFloat(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;  // NaN.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

namespace {
uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xffu);
  p[1] = static_cast<uint8_t>(v >> 8);
}
}  // namespace

namespace {
#if defined(__x86_64__)
// F16C converts 8 halves per instruction, exactly (NaNs stay NaN, quieted).
__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint8_t* src,
                                                         size_t n, float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(LoadU16(src + 2 * i));
}

// F16C rounds to nearest even like FloatToHalf, for every finite value and
// infinity, subnormal results included. A NaN it converts keeps its payload
// where FloatToHalf makes it canonical, so a run of 8 holding a NaN goes the
// scalar way: the bits are FloatToHalf's for every input.
__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* src,
                                                         size_t n,
                                                         uint8_t* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (size_t j = i; j < i + 8; ++j)
        StoreU16(dst + 2 * j, FloatToHalf(src[j]));
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) StoreU16(dst + 2 * i, FloatToHalf(src[i]));
}

bool HasF16c() {
  // CPUID leaf 1, ECX: bit 28 AVX, bit 29 F16C (clang 14's
  // __builtin_cpu_supports does not know "f16c").
  static const bool has = [] {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return __builtin_cpu_supports("avx") && (c >> 29 & 1) != 0;
  }();
  return has;
}
#endif
}  // namespace

const char* Fp16Kernel() {
#if defined(__x86_64__)
  if (HasF16c()) return "f16c";
#endif
  return "scalar";
}

void DecodeToFloat(const uint8_t* src, size_t n, DType dtype, float* dst) {
  switch (dtype) {
    case DType::kFp16:
#if defined(__x86_64__)
      if (HasF16c()) {
        HalfToFloatF16c(src, n, dst);
        return;
      }
#endif
      for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(LoadU16(src + 2 * i));
      return;
    case DType::kBf16:
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(src + 2 * i));
      return;
    case DType::kFp32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    default:
      return;
  }
}

namespace {

// The first of n elements of `width` bytes whose magnitude bits (sign
// cleared) exceed `limit`, or -1: chunk by chunk, each chunk's largest
// magnitude first (a reduction without an exit, which vectorises: AVX2
// where the CPU has it), then the chunk that holds one element by element.
// Every element was compared one by one before: 2-8 % of the server's CPU
// when 7B frames were ingested (docs/benchmarks.md, docs/durable-tier.md).
template <typename U>
inline U ChunkMax(const uint8_t* src, size_t m, U mask) {
  U mx = 0;
  for (size_t i = 0; i < m; ++i) {
    U v;
    std::memcpy(&v, src + i * sizeof(U), sizeof(U));  // Little-endian hosts.
    v &= mask;
    mx = v > mx ? v : mx;
  }
  return mx;
}

template <typename U>
inline int64_t FirstAbove(const uint8_t* src, size_t n, U mask, U limit) {
  constexpr size_t kChunk = 512;
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = n - base < kChunk ? n - base : kChunk;
    const uint8_t* p = src + base * sizeof(U);
    if (ChunkMax<U>(p, m, mask) <= limit) continue;
    for (size_t i = 0; i < m; ++i) {
      U v;
      std::memcpy(&v, p + i * sizeof(U), sizeof(U));
      if ((v & mask) > limit) return static_cast<int64_t>(base + i);
    }
  }
  return -1;
}

__attribute__((target_clones("avx2", "default"))) int64_t FirstAbove16(
    const uint8_t* src, size_t n, uint16_t limit) {
  return FirstAbove<uint16_t>(src, n, 0x7fffu, limit);
}

__attribute__((target_clones("avx2", "default"))) int64_t FirstAbove32(
    const uint8_t* src, size_t n, uint32_t limit) {
  return FirstAbove<uint32_t>(src, n, 0x7fffffffu, limit);
}

}  // namespace

int64_t FindOutOfRange(const uint8_t* src, size_t n, DType dtype) {
  // IEEE magnitudes order like their bit patterns without the sign, and
  // Inf and NaN lie above every finite value: one compare per element.
  switch (dtype) {
    case DType::kFp16:
      return FirstAbove16(src, n, 0x7bffu);  // 65504, the largest finite.
    case DType::kBf16:
      return FirstAbove16(src, n, 0x4780u);  // 65536.
    case DType::kFp32:
      return FirstAbove32(src, n, 0x47800000u);  // 65536.
    default:
      return -1;
  }
}

void AccumulateAsFloat(const uint8_t* src, size_t n, DType dtype, double* acc) {
  constexpr size_t kChunk = 256;
  float buf[kChunk];
  const size_t width = DTypeBytes(dtype);
  for (size_t done = 0; done < n; done += kChunk) {
    const size_t m = n - done < kChunk ? n - done : kChunk;
    DecodeToFloat(src + done * width, m, dtype, buf);
    for (size_t i = 0; i < m; ++i) acc[done + i] += buf[i];
  }
}

void EncodeFromFloat(const float* src, size_t n, DType dtype, uint8_t* dst) {
  switch (dtype) {
    case DType::kFp16:
#if defined(__x86_64__)
      if (HasF16c()) {
        FloatToHalfF16c(src, n, dst);
        return;
      }
#endif
      [[fallthrough]];
    case DType::kBf16:
      for (size_t i = 0; i < n; ++i) {
        StoreU16(dst + 2 * i, dtype == DType::kFp16 ? FloatToHalf(src[i])
                                                    : FloatToBf16(src[i]));
      }
      return;
    case DType::kFp32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    default:
      return;
  }
}

}  // namespace kvmem

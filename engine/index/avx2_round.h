// AVX2 steps shared by the code and query quantisers (token_codes.cc,
// query_codes.cc): lround of 8 floats and a store of 8 int32 as int8.
// Callers are compiled for AVX2 (target attribute) and check the CPU.
#ifndef KVMEM_ENGINE_INDEX_AVX2_ROUND_H_
#define KVMEM_ENGINE_INDEX_AVX2_ROUND_H_

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace kvmem {

// lround(y) lane by lane, as floats, for finite |y| < 2^31: y - trunc(y)
// is exact in float, so stepping away from zero where it is at least 0.5
// gives lround's integer.
__attribute__((target("avx2"))) inline __m256 Avx2RoundHalfAway(__m256 y) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
  const __m256 step =
      _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                    _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(y, sign)));
  return _mm256_add_ps(t, step);
}

// Eight int32 in [-128, 127] to out[0..7].
__attribute__((target("avx2"))) inline void Avx2StoreInt8(__m256i v,
                                                          int8_t* out) {
  const __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v),
                                      _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packs_epi16(v16, v16));
}

}  // namespace kvmem
#endif

#endif  // KVMEM_ENGINE_INDEX_AVX2_ROUND_H_

// fast_exp.h's exp on 8 lanes (AVX2 + FMA) and on 16 (AVX-512 F), for the
// kernels that run it (fast_exp.cc, token_lanes.cc). Exp8 is the scalar
// formula's steps lane by lane, with FMA; Exp16 gives Exp8's floats lane by
// lane in fewer steps: 2^k comes from vscalefps (p x 2^k rounds once either
// way), so only the top of the range is clamped; a lane below kLow (or -inf,
// NaN) is zeroed by the mask whatever its steps computed. Include only from
// files built for x86-64.
#ifndef KVMEM_ENGINE_RECALL_FAST_EXP_LANES_H_
#define KVMEM_ENGINE_RECALL_FAST_EXP_LANES_H_

#include <immintrin.h>

#include "engine/recall/fast_exp_poly.h"

namespace kvmem::fast_exp {

__attribute__((target("avx2,fma"))) inline __m256 Exp8(__m256 in) {
  const __m256 low = _mm256_set1_ps(kLow), high = _mm256_set1_ps(kHigh);
  const __m256 keep = _mm256_cmp_ps(in, low, _CMP_GE_OQ);  // -inf, NaN: 0.
  const __m256 v = _mm256_min_ps(_mm256_max_ps(in, low), high);
  const __m256 k = _mm256_floor_ps(
      _mm256_fmadd_ps(v, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  const __m256 r =
      _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo),
                       _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), v));
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
                    _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 in) {
  const __mmask16 keep =
      _mm512_cmp_ps_mask(in, _mm512_set1_ps(kLow), _CMP_GE_OQ);
  const __m512 v = _mm512_min_ps(in, _mm512_set1_ps(kHigh));
  const __m512 k = _mm512_roundscale_ps(
      _mm512_fmadd_ps(v, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r =
      _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo),
                       _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), v));
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                    _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, k);
}

}  // namespace kvmem::fast_exp

#endif  // KVMEM_ENGINE_RECALL_FAST_EXP_LANES_H_

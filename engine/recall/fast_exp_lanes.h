// fast_exp.h's exp on 16 lanes (AVX-512 F), for the kernels that run it
// there (fast_exp.cc's "avx512", token_lanes.cc): lane by lane the same
// floats as fast_exp.cc's Exp8, in fewer steps. 2^k comes from vscalefps
// (p x 2^k rounds once either way), so only the top of the range is clamped;
// a lane below kLow (or -inf, NaN) is zeroed by the mask whatever its steps
// computed. Include only from files built for x86-64.
#ifndef KVMEM_ENGINE_RECALL_FAST_EXP_LANES_H_
#define KVMEM_ENGINE_RECALL_FAST_EXP_LANES_H_

#include <immintrin.h>

#include "engine/recall/fast_exp_poly.h"

namespace kvmem::fast_exp {

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

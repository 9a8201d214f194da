// exp over arrays, for the per-head attention-mass estimate (one exp per
// candidate, KV head and query vector on every recall). Cephes' expf: range
// reduction x = k ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial for e^r,
// 2^k through the exponent bits; within 2 ulp of exp on [-87.3, 64].
// Below -87.3 (and -inf) gives 0; above 64 gives exp(64) (fast_exp_poly.h's
// kHigh: sums of many stay finite). NaN in gives
// an unspecified value: callers pass finite logits or -inf.
//
// Kernels: "avx512" (16 lanes) when the CPU has AVX-512 F, AVX2 and FMA,
// "avx2" (8 lanes with FMA) when it has AVX2 and FMA, and "scalar"
// everywhere; they run the same steps, so they agree to the last bit or two
// (FMA rounds once where scalar rounds twice), and "avx512" gives "avx2"'s
// floats exactly (its sums in avx2's order). Every kernel gives an element
// the same float whatever follows it (the AVX kernels take an array's last
// n % 8 elements in lanes too, padded), and elements appended with weight 0
// leave exp_dot's sum as it was: rows a recall cannot return (a block sealed
// in the window) change no bit of an estimate.
// Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_FAST_EXP_H_
#define KVMEM_ENGINE_RECALL_FAST_EXP_H_

#include <cstddef>
#include <string>
#include <vector>

namespace kvmem {

using ExpKernel = void (*)(float* x, size_t n);
// The per-head step of the attention-mass estimate, fused:
//   out[i] = exp(x[i] * scale - shift),  returns sum_i weight[i] * out[i].
using ExpDotKernel = float (*)(const float* x, float scale, float shift,
                               const float* weight, float* out, size_t n);
// max(init, max_i x[i] * scale + mask[i]) (mask: 0 or -inf).
using MaxScaledKernel = float (*)(const float* x, const float* mask,
                                  float scale, size_t n, float init);

// The per-token step of the attention-mass estimate (mass_estimate.h's
// density, and the identity channel's density for the vectors' weighted
// mean), fused: for each of m candidates c, over the w heads of a range,
//   out[c] = sum_i sum_j coef[j] * exp(d_cji * scale + neg[j * w + i])
//   mean_out[c] = (1 / w) * sum_i exp(sum_j mean_k[j] * d_cji + mean_neg[i])
// with d_cji = dots[(c * vectors + j) * stride + i]; mean_out only with
// mean_k. The sums run over j first (lane i), then over i in order.
struct DensityArgs {
  const float* dots = nullptr;
  size_t m = 0, stride = 0;
  uint32_t vectors = 0, w = 0;
  float scale = 0;
  const float* neg = nullptr;       // [vector][w]: -L_jh, or -inf.
  const float* coef = nullptr;      // [vector]
  const float* mean_k = nullptr;    // [vector], or null.
  const float* mean_neg = nullptr;  // [w]
  float* out = nullptr;
  float* mean_out = nullptr;
};
using DensityKernel = void (*)(const DensityArgs& a);

struct ExpKernelInfo {
  std::string name;
  ExpKernel fn;
  ExpDotKernel exp_dot;
  MaxScaledKernel max_scaled;
  // "avx2" runs ranges of a multiple of 8 heads in lanes, others as scalar.
  DensityKernel densities;
};

// Kernels this CPU can run, best first.
const std::vector<ExpKernelInfo>& AvailableExpKernels();

// x[i] = exp(x[i]) for i < n, on the best kernel this CPU has.
void ExpInPlace(float* x, size_t n);
// The kernel searches use: the best this CPU has.
const ExpKernelInfo& ActiveExpKernel();

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_FAST_EXP_H_

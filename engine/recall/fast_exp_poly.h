// The constants of fast_exp.h's exp (Cephes' expf: x = k ln 2 + r, a
// degree-6 polynomial for e^r, 2^k through the exponent bits), shared by
// every kernel that computes it so that each gives the same floats lane by
// lane (fast_exp.cc, token_lanes.cc).
#ifndef KVMEM_ENGINE_RECALL_FAST_EXP_POLY_H_
#define KVMEM_ENGINE_RECALL_FAST_EXP_POLY_H_

namespace kvmem::fast_exp {

// Above kHigh the exp saturates at exp(kHigh) = 6.2e27: far above any
// density of real attention (a logit 64 nats over the window's whole
// log-sum-exp), and low enough that float sums of 2^24 tokens x 8 heads of
// them stay finite (at exp(88), three of them were inf: an answer's mass,
// gates and shares with keys at fp16's largest).
inline constexpr float kLow = -87.3f, kHigh = 64.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f,
                       kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                       kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

}  // namespace kvmem::fast_exp

#endif  // KVMEM_ENGINE_RECALL_FAST_EXP_POLY_H_

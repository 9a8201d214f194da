// The token stage's densities with tokens in lanes: 16 tokens' codes of one
// segment transposed into registers of 4 dimensions a token (AVX-512 VNNI;
// 8 tokens with AVX2), so each vpdpbusd (AVX2: vpmaddubsw then vpmaddwd)
// adds 4 products to each token's sum with the query's 4 bytes broadcast:
// no per-(token, vector) reduction and no dots array in between, and the
// exps run 16 (8) tokens at a time.
//
// The values are TokenDensities' (engine/recall/token_stage.h) through the
// "avx2" token and exp kernels: the same integer sums, the same float
// operations in the same order (per head: over vectors with FMA, then
// heads in order), bit for bit where the head range is a multiple of 8
// heads (the avx2 density kernel's lanes; other ranges it runs as scalar,
// whose products round twice). tests/engine/recall/token_lanes_test.cc
// checks both.
//
// Where it pays: TokenDensities spends most of a (token, vector) on
// reducing 8 segments' partial sums and finishing them, not on the
// multiplies (docs/benchmarks.md); here those steps are per 16 (8) tokens.
#ifndef KVMEM_ENGINE_RECALL_TOKEN_LANES_H_
#define KVMEM_ENGINE_RECALL_TOKEN_LANES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/index/token_codes.h"
#include "engine/recall/mass_estimate.h"

namespace kvmem {

// The most vectors the kernel takes (a recall reduces more than 16 to 16).
inline constexpr uint32_t kMaxLaneVectors = 64;

// The densities of the n tokens whose records (of `shape`) start at
// rec[k], over the terms' heads [t.h0, t.h0 + t.w), into out[k]; with the
// terms' mean (t.mean_k) and mean_out, also the mean vector's into
// mean_out[k]. False (nothing written) where the kernel is off or absent
// here, or q has more than kMaxLaneVectors vectors: then score them with
// TokenDensities. REQUIRES: t prepared for q's vectors.
bool LaneTokenDensities(const TokenCodeShape& shape, const TokenQuery& q,
                        const DensityTerms& t, const uint8_t* const* rec,
                        size_t n, float* out, float* mean_out);

// The kernel on: "avx512vnni" where the CPU has AVX-512 F/BW/VL and VNNI,
// else "avx2" where it has AVX2 and FMA, else "off".
const std::string& LaneTokenKernel();
// "off" turns the kernel off, "avx2" or "avx512vnni" chooses one the CPU
// has (benchmarks' A/B, KVMEM_TOKEN_LANES); false when unknown or
// unavailable.
bool SelectLaneTokenKernel(const std::string& name);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_TOKEN_LANES_H_

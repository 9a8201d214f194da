// Per-token key codes: the compact form of every token's keys of the indexed
// layers, which token-resolution recall scores (engine/recall/mass_scorer.cc:
// the group bounds prune, the token codes decide).
//
// A token's keys form `segments` rows of head_dim floats, one per indexed
// layer and KV head, in the summary's order ([indexed_layer][kv_head]). Each
// row is quantised to int4 with one float scale: code = round(x / s) + 8 in
// [1, 15], s = max|x| / 7 (0 for an all-zero row). A token's record is
//   float scale[segments]  then  uint8 codes[segments][chunks * 32]
// with chunks = ceil(head_dim / 64): in chunk c, byte i holds dimension
// 64c + i in its low nibble and 64c + 32 + i in its high nibble (dimensions
// past head_dim hold code 8, value 0). A block's codes are its tokens'
// records in append order: bytes_per_token() each, 4 + 32 * ceil(hd / 64)
// per segment (36 for head_dim 64: 4.5 bits per dimension, 0.28 of the fp16
// keys).
//
// Scoring: a query vector's row for segment s is quantised to int8 with its
// own scale (t = max|q| / 127), and
//   dot(q, key) ~= s_key * t * (sum_i code_i * q8_i - 8 * sum_i q8_i)
// The integer sum is exact (u8 x s8 pairs, vpmaddubsw cannot saturate:
// 2 * 15 * 127 < 32767), so every kernel returns the same floats. The error
// against the exact dot is at most s_key / 2 * |q|_1 + t / 2 * |key|_1 (each
// side's rounding) plus their product's share; ranking is what matters, and
// tests/engine/index/token_codes_test.cc measures it on random data.
//
// Kernels: "avx2" (vpmaddubsw + vpmaddwd) where the CPU has it, and
// "scalar" everywhere; chosen at run time like engine/index/int8_kernels.h.
// Both return the same floats (the integer sums are exact in each). An
// AVX-512 VNNI form (vpdpbusd for the five AVX2 steps of each 32 bytes)
// was built and measured on a Zen 5 VM: no faster than AVX2 at 1 or 8
// vectors (kvmem_engine_bench --benchmark_filter=BM_TokenKernel, medians
// within the VM's noise either way): the per-vector reduction of 8 segments
// and the float finish dominate, not the multiplies, so it was not kept.
// The token stage turns the work around instead where the CPU has AVX-512
// VNNI: tokens in lanes, the codes transposed in registers
// (engine/recall/token_lanes.h), the same values.
// Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_INDEX_TOKEN_CODES_H_
#define KVMEM_ENGINE_INDEX_TOKEN_CODES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvmem {

struct TokenCodeShape {
  uint32_t segments = 0;  // Indexed layers x KV heads.
  uint32_t head_dim = 0;
  uint32_t chunks() const { return (head_dim + 63) / 64; }
  size_t segment_code_bytes() const { return size_t{chunks()} * 32; }
  size_t bytes_per_token() const {
    return size_t{segments} * (sizeof(float) + segment_code_bytes());
  }
};

// The codes of n tokens whose keys are keys[token][segment][head_dim];
// with `order` (n row numbers), code t is of row order[t].
std::string EncodeTokenCodes(const TokenCodeShape& shape, const float* keys,
                             size_t n, const uint32_t* order = nullptr);

// Token t's keys as the codes give them back: out[segment][head_dim].
// REQUIRES: codes holds more than t tokens of `shape`.
void DecodeTokenCodes(const TokenCodeShape& shape, const std::string& codes,
                      size_t t, float* out);

// Query vectors prepared for scoring against token codes.
struct TokenQuery {
  uint32_t vectors = 0;
  // [vector][segment][chunks * 64]: the rows in int8, zero-padded.
  std::vector<int8_t> q;
  std::vector<float> scale;  // [vector][segment]: t.
  std::vector<int32_t> sum;  // [vector][segment]: sum of the row's int8.
};

// REQUIRES: query holds `vectors` rows of segments * head_dim floats.
// Each row: scale = max|x| / 127, q = clamp(lround(x * (1 / scale)), +-127).
// PrepareTokenQueryScalar is that definition; PrepareTokenQuery runs it 8
// floats at a time where the CPU has AVX2 (the same integers and scales).
void PrepareTokenQuery(const TokenCodeShape& shape, const float* query,
                       uint32_t vectors, TokenQuery* out);
void PrepareTokenQueryScalar(const TokenCodeShape& shape, const float* query,
                             uint32_t vectors, TokenQuery* out);

// The dots of every prepared vector with each of n token records (at
// `records`, bytes_per_token() apart) over segments [s0, s1), into
//   out[(token * vectors + vector) * segments + s]
// (the layout of CandidateDensities, engine/recall/mass_estimate.h); the
// other segments' entries are left as they are.
using TokenDotsKernel = void (*)(const TokenCodeShape& shape,
                                 const TokenQuery& q, const uint8_t* records,
                                 size_t n, uint32_t s0, uint32_t s1,
                                 float* out);

struct TokenKernelInfo {
  std::string name;
  TokenDotsKernel dots;
};

// Kernels this CPU can run, best first ("avx2" when present, "scalar").
const std::vector<TokenKernelInfo>& AvailableTokenKernels();
// The kernel recall uses: the best available, unless overridden.
const TokenKernelInfo& ActiveTokenKernel();
// Overrides the kernel by name (tests, benchmarks); false when unknown or
// unavailable here.
bool SelectTokenKernel(const std::string& name);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_TOKEN_CODES_H_

// The query of an int8 scan as integers (int8_kernels.h's d = 64 * hi + lo,
// or d = hi alone), with what the scan's bounds need of it.
//
// Per element: d = clamp(lround(q / t), -top, top) with t = max|q| / top
// (top = 63 * 64 with two terms, 63 with one); with two terms
// hi = lround(d / 64) and lo = d - 64 * hi. QuantizeQueryScalar is the
// definition; QuantizeQuery runs it 8 floats at a time where the CPU has
// AVX2 (tests/engine/index/query_codes_test.cc: the same integers, norms
// equal to rounding). A 7B query per head is 32,768 floats, and the scalar
// loop's libm calls and serial sums were ~0.2 ms of a recall.
#ifndef KVMEM_ENGINE_INDEX_QUERY_CODES_H_
#define KVMEM_ENGINE_INDEX_QUERY_CODES_H_

#include <cstddef>
#include <cstdint>

namespace kvmem {

struct QueryCode {
  float t = 0;         // The unit: q ~ t * d.
  int32_t offset = 0;  // 128 * sum_j d_j (the kernels' code offset).
  float residual = 0;  // |q - t d|, rounded up a little (x (1 + 1e-6)).
  float norm = 0;      // |q|, rounded up the same way.
};

// Writes n values to hi (and lo with two_terms).
QueryCode QuantizeQuery(const float* q, size_t n, bool two_terms, int8_t* hi,
                        int8_t* lo);
QueryCode QuantizeQueryScalar(const float* q, size_t n, bool two_terms,
                              int8_t* hi, int8_t* lo);

// Which QuantizeQuery runs here: "avx2" or "scalar".
const char* QueryCodeKernel();

// A stored vector's codes (the index's side): s = max|x| / levels and
// out[i] = clamp(lround(x[i] / s), +-levels), all 0 where s is 0. Returns
// s. SymmetricCodesScalar is the definition; SymmetricCodes runs it 8
// floats at a time where the CPU has AVX2 (the same codes). A camera-hour's
// index rebuild at recovery quantises ~50,000 summaries.
float SymmetricCodes(const float* x, size_t n, int levels, int8_t* out);
float SymmetricCodesScalar(const float* x, size_t n, int levels, int8_t* out);

// Adds sum (x[i] - s c[i])^2 to *r2 and sum c[i]^2 to *c2 over i < n, in
// double (AVX2 where the CPU has it: another order, equal to rounding).
void AddCodeNorms(const float* x, const int8_t* c, float s, size_t n,
                  double* r2, double* c2);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_QUERY_CODES_H_

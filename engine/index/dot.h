// Small float kernels (token-group clustering, the evaluation's oracle and
// workload projections). Built for AVX2 and for the x86-64 baseline, picked
// at load time (GCC target_clones); same results up to rounding order.
#ifndef KVMEM_ENGINE_INDEX_DOT_H_
#define KVMEM_ENGINE_INDEX_DOT_H_

#include <cstddef>
#include <cstdint>

namespace kvmem {

// sum a[i] * b[i]
float Dot(const float* a, const float* b, size_t n);
// max |x[i]| (0 for n = 0); exact.
float MaxAbs(const float* x, size_t n);
// sum a[i] * b[i] over int8 pairs, exact in int32 (n < 2^17).
int32_t DotInt8(const int8_t* a, const int8_t* b, size_t n);
// y[i] += alpha * x[i]; x and y must not overlap.
void Axpy(float alpha, const float* x, float* y, size_t n);
// y[i] += sign[i] * x[i]; y[i] += x[i] / d; acc[i] += double(x[i]): each
// element as the scalar loop computes it (multiply or divide, then add;
// nothing fused), 8 at a time where the CPU has AVX2. Neither input may
// overlap the output. The seal's token groups run them over every key of a
// block (a 7B block's 16.7 M floats; GCC at -O2 left them scalar).
void AddSigned(const float* x, const float* sign, float* y, size_t n);
void AddDivided(const float* x, float d, float* y, size_t n);
void AddAsDouble(const float* x, double* acc, size_t n);
// out[i] = float(x[i] / d), each as the scalar loop (divide, then round).
void DivideToFloat(const double* x, double d, float* out, size_t n);
// Axpy(alpha[r], x[r], y, n) for r = 0, ..., rows - 1, bit for bit, in one
// pass over y (each chunk of y summed through every row in registers): the
// mass estimate adds a vector's 8-64 heads to its densities. The rows must
// not overlap y.
void AxpyRows(const float* alpha, const float* const* x, size_t rows, float* y,
              size_t n);
// out[i * k + c] = Dot(rows + i * n, cols + c * n, n) for i < m, c < k,
// bit for bit (each pair's eight partial sums in Dot's order), computed in
// chunks of the n dimensions so the columns' chunk stays in cache while
// every row passes it: k-means over long keys (a 7B block's 32,768 floats a
// token) read each centre once per row with Dot. `out` must not overlap
// the inputs.
void DotMany(const float* rows, size_t m, const float* cols, size_t k, size_t n,
             float* out);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_DOT_H_

#include "engine/index/dot.h"

namespace kvmem {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVMEM_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define KVMEM_CLONES
#endif

// Eight partial sums let the compiler vectorise without -ffast-math.
KVMEM_CLONES float Dot(const float* a, const float* b, size_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t u = 0; u < 8; ++u) part[u] += a[i + u] * b[i + u];
  }
  float s = ((part[0] + part[1]) + (part[2] + part[3])) +
            ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

KVMEM_CLONES int32_t DotInt8(const int8_t* a, const int8_t* b, size_t n) {
  int32_t s = 0;  // Integer sums reassociate freely: this vectorises.
  for (size_t i = 0; i < n; ++i)
    s += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return s;
}

KVMEM_CLONES void Axpy(float alpha, const float* __restrict x,
                       float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace kvmem

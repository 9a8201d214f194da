// The AVX-512 VNNI kernels of int8_kernels.h: Int8SegmentKernel's and
// Int8BlockKernel's, the same integers as the scalar definitions
// (tests/engine/index/int8_kernels_test.cc). Call only where the CPU has
// AVX-512 F, BW, VL and VNNI (AvailableInt8Kernels checks).
#ifndef KVMEM_ENGINE_INDEX_INT8_VNNI_H_
#define KVMEM_ENGINE_INDEX_INT8_VNNI_H_

#include <cstddef>
#include <cstdint>

namespace kvmem {

void VnniSegmentKernel(const uint8_t* packed, size_t nblocks, size_t seg_groups,
                       size_t segments, const int8_t* hi, const int8_t* lo,
                       int32_t* out);
void VnniKernel(const uint8_t* packed, size_t nblocks, size_t groups,
                const int8_t* hi, const int8_t* lo, int32_t* out);
// Int8MultiSegmentKernel's.
void VnniMultiSegmentKernel(const uint8_t* packed, size_t nblocks,
                            size_t seg_groups, size_t segments, size_t vectors,
                            const int8_t* const* hi, const int8_t* const* lo,
                            int32_t* const* out);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_INT8_VNNI_H_

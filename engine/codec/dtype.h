// Element types of KV payloads and their conversion to fp32.
// All functions are pure and safe to call from any thread.
#ifndef KVMEM_ENGINE_CODEC_DTYPE_H_
#define KVMEM_ENGINE_CODEC_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace kvmem {

// Values match kvmem.v1.DType.
enum class DType : uint32_t {
  kUnspecified = 0,
  kFp16 = 1,
  kBf16 = 2,
  kFp32 = 3
};

// Bytes per element; 0 for kUnspecified or an unknown value.
size_t DTypeBytes(DType dtype);

// Name for messages ("fp16"), "unspecified" or "unknown".
const char* DTypeName(DType dtype);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);  // Round to nearest even.
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);  // Round to nearest even.

// Adds the n little-endian elements at src, converted to fp32, into acc[0..n).
// REQUIRES: dtype has a non-zero DTypeBytes; src holds n * DTypeBytes bytes.
void AccumulateAsFloat(const uint8_t* src, size_t n, DType dtype, double* acc);

// The fp16 conversions EncodeFromFloat and DecodeToFloat use on this CPU:
// "f16c" (AVX + F16C, bit-identical to FloatToHalf / HalfToFloat) or
// "scalar".
const char* Fp16Kernel();

// Writes n fp32 values as dtype elements to dst (n * DTypeBytes bytes).
void EncodeFromFloat(const float* src, size_t n, DType dtype, uint8_t* dst);

// Converts n dtype elements at src to fp32.
void DecodeToFloat(const uint8_t* src, size_t n, DType dtype, float* dst);

// Index of the first element among the n dtype elements at src that is NaN,
// Inf, or of magnitude above 65536 (kMaxInputMagnitude), or -1.
int64_t FindOutOfRange(const uint8_t* src, size_t n, DType dtype);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_CODEC_DTYPE_H_

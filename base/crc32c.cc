#include "base/crc32c.h"

#include <nmmintrin.h>

#include <array>
#include <cstring>

namespace kvmem {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // Castagnoli, reflected.

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[i] = c;
  }
  return t;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const uint8_t* p,
                                                       size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  // One stream, 8 bytes per instruction (its 3-cycle latency bounds it at
  // ~8 GB/s at 3 GHz, five times the software CRC it replaces).
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool HasSse42() { return __builtin_cpu_supports("sse4.2"); }

}  // namespace

uint32_t Crc32cScalar(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  static const bool sse42 = HasSse42();
  if (sse42) return Crc32cSse42(static_cast<const uint8_t*>(data), n, crc);
  return Crc32cScalar(data, n, crc);
}

const char* Crc32cKernel() { return HasSse42() ? "sse4.2" : "scalar"; }

}  // namespace kvmem

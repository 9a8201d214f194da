// CRC32C (Castagnoli, the checksum of iSCSI and of RocksDB's blocks), with
// the SSE4.2 crc32 instruction where the CPU has it (chosen at run time;
// inputs of 12 KiB or more as three streams folded together) and a
// table-driven scalar definition elsewhere; both give the same value.
//
// Why kvmem has its own: Debian's RocksDB 7.8 is built without SSE4.2
// ("Not supported on x86" from its IsFastCrc32Supported) and checks every
// blob it reads at ~1.6 GB/s in software, which bounded cold reads. The
// cold tier's layer records carry this checksum instead (storage/
// rocks_cold_store.cc), read with RocksDB's own check off. Since
// 2026-12-06 RocksDB's own CRC32C calls run this one too
// (storage/rocks_crc32c.h).
#ifndef KVMEM_BASE_CRC32C_H_
#define KVMEM_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvmem {

// CRC32C of n bytes, continuing from crc (0 to start).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
// The scalar definition (what Crc32c must equal).
uint32_t Crc32cScalar(const void* data, size_t n, uint32_t crc = 0);
// "sse4.2" or "scalar": the kernel Crc32c runs here.
const char* Crc32cKernel();

}  // namespace kvmem

#endif  // KVMEM_BASE_CRC32C_H_

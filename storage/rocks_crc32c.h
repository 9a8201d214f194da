// RocksDB's CRC32C on the CPU's crc32 instruction.
//
// Debian's librocksdb 7.8 is built portable, without SSE4.2, so every
// checksum RocksDB computes (each WAL record, each blob record, each table
// block) runs its table-driven CRC32C at ~1.5 GB/s: in a two-camera
// profile (kvmem bench --cameras=2, 7B frames of 16 MiB) that table loop
// was about a seventh of the server's samples, the WAL's and the blob
// files' checksums of every appended byte. RocksDB calls its CRC32C through
// one exported function, rocksdb::crc32c::Extend (through the PLT: 37 call
// sites in Debian's library, objdump -d), so a program that defines the
// same symbol is the one those calls reach, as a program's own malloc is
// the one libc calls. rocks_crc32c.cc defines it as kvmem's Crc32c
// (base/crc32c.h: the SSE4.2 instruction where the CPU has it, three
// streams for long inputs, the table elsewhere), which gives the same
// values (CRC32C continued from a finished value, as RocksDB's), so files
// written either way read with the other.
#ifndef KVMEM_STORAGE_ROCKS_CRC32C_H_
#define KVMEM_STORAGE_ROCKS_CRC32C_H_

#include <string>

namespace kvmem {

// rocksdb::crc32c::Extend(uint32_t, const char*, size_t), mangled: the
// name the dynamic linker binds librocksdb's calls by.
inline constexpr char kRocksCrc32cExtendSymbol[] =
    "_ZN7rocksdb6crc32c6ExtendEjPKcm";

// Whose CRC32C RocksDB's calls run here: "kvmem-sse4.2" or "kvmem-scalar"
// when the program's rocksdb::crc32c::Extend is the one the dynamic linker
// binds (kvmem's, on the kernel Crc32cKernel names), "rocksdb" when
// librocksdb's own is (the program was linked so that its definition is
// not exported).
std::string RocksCrc32cKernel();

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_CRC32C_H_

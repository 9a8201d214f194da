#include "storage/rocks_crc32c.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

#include "base/crc32c.h"

// RocksDB's own declaration (util/crc32c.h, not among Debian's installed
// headers): the CRC32C of buf continued from crc, a finished value.
namespace rocksdb {
namespace crc32c {
uint32_t Extend(uint32_t crc, const char* buf, size_t size);
}  // namespace crc32c
}  // namespace rocksdb

// Exported from the program (default visibility; GNU ld exports a program's
// definition of a symbol a linked shared library defines too), so
// librocksdb's calls through its PLT bind here.
__attribute__((visibility("default"))) uint32_t rocksdb::crc32c::Extend(
    uint32_t crc, const char* buf, size_t size) {
  return kvmem::Crc32c(buf, size, crc);
}

namespace kvmem {

std::string RocksCrc32cKernel() {
  // The definition the dynamic linker finds first in the global scope is
  // the one librocksdb's PLT slots are bound to.
  void* bound = dlsym(RTLD_DEFAULT, kRocksCrc32cExtendSymbol);
  if (bound != reinterpret_cast<void*>(&rocksdb::crc32c::Extend)) {
    return "rocksdb";
  }
  return std::string("kvmem-") + Crc32cKernel();
}

}  // namespace kvmem

// RocksDB's CRC32C calls reach kvmem's (storage/rocks_crc32c.h), and give
// the values librocksdb's own table definition gives, so stores written
// with either read with the other.
#include "storage/rocks_crc32c.h"

#include <dlfcn.h>

#include <cstdint>
#include <random>
#include <string>

#include "base/crc32c.h"
#include "gtest/gtest.h"
#include "storage/rocks_cold_store.h"
#include "tests/test_util.h"

namespace rocksdb {
namespace crc32c {
uint32_t Extend(uint32_t crc, const char* buf, size_t size);
}  // namespace crc32c
}  // namespace rocksdb

namespace kvmem {
namespace {

using ExtendFn = uint32_t (*)(uint32_t, const char*, size_t);

TEST(RocksCrc32cTest, RocksDbsCallsReachKvmemsCrc32c) {
  // The definition the global lookup finds (the one librocksdb's PLT slots
  // bind to) is this program's.
  EXPECT_EQ(RocksCrc32cKernel(), std::string("kvmem-") + Crc32cKernel());
  EXPECT_EQ(dlsym(RTLD_DEFAULT, kRocksCrc32cExtendSymbol),
            reinterpret_cast<void*>(&rocksdb::crc32c::Extend));
  // A store opens with it (its manifest and WAL records checked); every
  // other RocksDB test of this binary writes and reads through it too.
  testing::TempDir dir;
  RocksColdStoreOptions o;
  o.path = dir.path();
  auto store = OpenRocksColdStore(o);
  ASSERT_TRUE(store.ok()) << store.status();
}

TEST(RocksCrc32cTest, EqualsLibrocksdbsOwnDefinition) {
  // librocksdb's own Extend: the next definition after this program's.
  auto own =
      reinterpret_cast<ExtendFn>(dlsym(RTLD_NEXT, kRocksCrc32cExtendSymbol));
  ASSERT_NE(own, nullptr) << dlerror();
  ASSERT_NE(reinterpret_cast<void*>(own),
            reinterpret_cast<void*>(&rocksdb::crc32c::Extend));
  EXPECT_EQ(rocksdb::crc32c::Extend(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(own(0, "123456789", 9), 0xE3069283u);
  std::mt19937_64 rng(5);
  std::string buf(200 << 10, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  // Lengths across the three-stream threshold (12 KiB) and RocksDB's
  // alignment prologue, starts at every offset mod 8, continued values.
  for (size_t n : {0ul, 1ul, 7ul, 8ul, 15ul, 16ul, 100ul, 4095ul, 12287ul,
                   12288ul, 12289ul, 32768ul, 65543ul, 196608ul}) {
    for (size_t at = 0; at < 8; ++at) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(rocksdb::crc32c::Extend(seed, buf.data() + at, n),
                own(seed, buf.data() + at, n))
          << "n " << n << " at " << at;
    }
  }
}

}  // namespace
}  // namespace kvmem

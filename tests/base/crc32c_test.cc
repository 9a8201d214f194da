// CRC32C (base/crc32c.h): the kernel this CPU runs equals the scalar
// definition on every length and alignment, and both match the standard's
// check values.
#include "base/crc32c.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(Crc32cTest, StandardCheckValues) {
  std::printf("crc32c kernel: %s\n", Crc32cKernel());
  // RFC 3720 (iSCSI) B.4 and the usual "123456789" check value.
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32cScalar(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(digits.data(), digits.size()), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  std::vector<uint8_t> inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, KernelEqualsScalarOnEveryLengthAndAlignment) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> buf(70000);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097,
                     65536, 69000}) {
      const uint8_t* p = buf.data() + offset;
      ASSERT_EQ(Crc32c(p, n), Crc32cScalar(p, n)) << offset << " " << n;
    }
  }
  // Long inputs (three streams of 4 KiB folded together, then the rest as
  // one): lengths around each round's edge, continuing from a CRC.
  std::vector<uint8_t> big(300000);
  for (uint8_t& b : big) b = static_cast<uint8_t>(rng());
  for (size_t n : {12287, 12288, 12289, 24575, 24576, 24583, 100003, 300000}) {
    for (uint32_t from : {0u, 0xdeadbeefu}) {
      ASSERT_EQ(Crc32c(big.data(), n, from), Crc32cScalar(big.data(), n, from))
          << n << " " << from;
    }
  }
  // Continuing a CRC over a split equals the CRC of the whole.
  const uint32_t whole = Crc32c(buf.data(), 50000);
  EXPECT_EQ(
      Crc32c(buf.data() + 12345, 50000 - 12345, Crc32c(buf.data(), 12345)),
      whole);
  EXPECT_EQ(Crc32cScalar(buf.data() + 12345, 50000 - 12345,
                         Crc32cScalar(buf.data(), 12345)),
            whole);
}

}  // namespace
}  // namespace kvmem

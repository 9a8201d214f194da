#include "engine/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(DTypeTest, HalfKnownBitPatterns) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // Smallest subnormal.
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // Smallest normal.
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);  // Overflow to +Inf.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  // 1 + 2^-11 is exactly halfway between 1 and the next half: ties to even.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(DTypeTest, EveryFiniteHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << "half bits " << h;
  }
}

TEST(DTypeTest, Bf16RoundTripAndRounding) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-3.5f), 0xc060);
  for (uint32_t b = 0; b < 0x10000; b += 7) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBf16(f), b);
  }
}

TEST(DTypeTest, AccumulateAddsDecodedValues) {
  const float src[] = {0.5f, -1.25f, 3.0f};
  for (DType t : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    std::vector<uint8_t> buf(3 * DTypeBytes(t));
    EncodeFromFloat(src, 3, t, buf.data());
    double acc[3] = {1, 1, 1};
    AccumulateAsFloat(buf.data(), 3, t, acc);
    EXPECT_EQ(acc[0], 1.5);
    EXPECT_EQ(acc[1], -0.25);
    EXPECT_EQ(acc[2], 4.0);
  }
  EXPECT_EQ(DTypeBytes(static_cast<DType>(9)), 0u);
}

}  // namespace
}  // namespace kvmem

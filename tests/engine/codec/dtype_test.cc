#include "engine/codec/dtype.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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

// The bulk decoder (F16C where the CPU has it) gives exactly the scalar
// conversion for every half, in runs of any length; NaNs stay NaN.
TEST(DTypeTest, BulkHalfDecodeEqualsScalarForEveryHalf) {
  std::vector<uint8_t> src(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    src[2 * h] = static_cast<uint8_t>(h & 0xff);
    src[2 * h + 1] = static_cast<uint8_t>(h >> 8);
  }
  std::vector<float> out(65536);
  DecodeToFloat(src.data() + 2, 65535 - 2, DType::kFp16, out.data());
  DecodeToFloat(src.data(), 1, DType::kFp16, out.data() + 65533);
  for (uint32_t h = 1; h < 65534; ++h) {
    const float want = HalfToFloat(static_cast<uint16_t>(h));
    const float got = out[h - 1];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      uint32_t a, b;
      std::memcpy(&a, &want, 4);
      std::memcpy(&b, &got, 4);
      ASSERT_EQ(a, b) << "half " << h;
    }
  }
  EXPECT_EQ(out[65533], 0.0f);  // Half 0.
}

// The bulk encoder (F16C where the CPU has it) gives exactly the scalar
// conversion's bits: every half's value, the float just above and below it,
// the exact midpoints between neighbouring halves (ties to even), the
// subnormal and overflow boundaries, infinities, NaNs with payloads (a run
// of 8 holding one goes the scalar way), 1M random floats, odd lengths.
TEST(DTypeTest, BulkHalfEncodeEqualsScalarBitForBit) {
  std::printf("fp16 conversions on this CPU: %s\n", Fp16Kernel());
  std::vector<float> in;
  auto bits_to_float = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    in.push_back(f);
    in.push_back(std::nextafter(f, INFINITY));
    in.push_back(std::nextafter(f, -INFINITY));
    const float next = HalfToFloat(static_cast<uint16_t>(h + 1));
    if (!std::isnan(next) && std::isfinite(f) && std::isfinite(next)) {
      in.push_back(f + (next - f) / 2);  // Exact in float: a tie.
    }
  }
  for (uint32_t b = 0x33000000u - 4096; b < 0x38800000u + 4096; b += 997) {
    in.push_back(bits_to_float(b));  // Subnormal halves and their edge.
    in.push_back(-bits_to_float(b));
  }
  for (uint32_t b = 0x477fe000u; b < 0x47800000u + 4096; ++b) {
    in.push_back(bits_to_float(b));  // Around 65504 and the overflow.
  }
  for (uint32_t payload : {1u, 0x1fffu, 0x2000u, 0x400000u, 0x7fffffu}) {
    in.push_back(bits_to_float(0x7f800000u | payload));
    in.push_back(bits_to_float(0xff800000u | payload));
  }
  in.push_back(INFINITY);
  in.push_back(-INFINITY);
  std::mt19937_64 rng(9);
  for (int i = 0; i < 1000000; ++i) {
    in.push_back(bits_to_float(static_cast<uint32_t>(rng())));
  }
  for (size_t offset : {0u, 3u}) {
    const size_t n = in.size() - offset - 5;  // Not a multiple of 8.
    std::vector<uint8_t> out(2 * n);
    EncodeFromFloat(in.data() + offset, n, DType::kFp16, out.data());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = FloatToHalf(in[offset + i]);
      const uint16_t got =
          static_cast<uint16_t>(out[2 * i] | out[2 * i + 1] << 8);
      if (got != want && ++wrong <= 5) {
        ADD_FAILURE() << "float bits " << std::hex <<
            [&] {
              uint32_t b;
              std::memcpy(&b, &in[offset + i], 4);
              return b;
            }() << ": got "
                      << got << ", want " << want;
      }
    }
    EXPECT_EQ(wrong, 0u) << "of " << n;
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

namespace kvmem {
namespace {

// NaN, Inf and magnitudes beyond 65536 are found in every dtype at their
// index; in-range extremes (the largest, the smallest subnormal, negative
// zero) are not.
TEST(DTypeTest, FindOutOfRangeInEveryDtype) {
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const float top = d == DType::kFp16 ? 65504.0f : 65536.0f;
    const std::vector<float> finite = {top, -top, 6e-8f, -0.0f, 1.0f};
    std::vector<uint8_t> bytes(finite.size() * DTypeBytes(d));
    EncodeFromFloat(finite.data(), finite.size(), d, bytes.data());
    EXPECT_EQ(FindOutOfRange(bytes.data(), finite.size(), d), -1)
        << DTypeName(d);
    std::vector<float> bads = {std::nanf(""), INFINITY, -INFINITY};
    if (d != DType::kFp16) bads.insert(bads.end(), {66000.0f, -3e38f, 1e20f});
    for (float bad : bads) {
      std::vector<float> v = finite;
      v[3] = bad;
      EncodeFromFloat(v.data(), v.size(), d, bytes.data());
      EXPECT_EQ(FindOutOfRange(bytes.data(), v.size(), d), 3)
          << DTypeName(d) << " " << bad;
    }
  }
}

// The check runs chunk by chunk (512 elements): an element out of range is
// found at its index wherever it falls (first, chunk ends and starts,
// last), the first of two is the one reported, and a long in-range payload
// passes.
TEST(DTypeTest, FindOutOfRangeAcrossChunks) {
  for (DType d : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    const size_t n = 1500;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = (i % 2 ? -1.0f : 1.0f) * (i % 97);
    v[700] = d == DType::kFp16 ? 65504.0f : 65536.0f;
    std::vector<uint8_t> bytes(n * DTypeBytes(d));
    EncodeFromFloat(v.data(), n, d, bytes.data());
    EXPECT_EQ(FindOutOfRange(bytes.data(), n, d), -1) << DTypeName(d);
    for (size_t at :
         {size_t{0}, size_t{511}, size_t{512}, size_t{1023}, size_t{1499}}) {
      std::vector<float> w = v;
      w[at] = -INFINITY;
      if (at + 600 < n) w[at + 600] = std::nanf("");
      EncodeFromFloat(w.data(), n, d, bytes.data());
      EXPECT_EQ(FindOutOfRange(bytes.data(), n, d), static_cast<int64_t>(at))
          << DTypeName(d) << " at " << at;
    }
  }
}

}  // namespace
}  // namespace kvmem

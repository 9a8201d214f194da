// Frames compressed when written (engine/codec/frame_codec.h): sizes, the
// stated error bound of every row, rows encoded independently (so a frame's
// parts and its whole encode alike), and damaged records.
#include "engine/codec/frame_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/codec/dtype.h"
#include "engine/codec/frame_parts.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"

namespace kvmem {
namespace {

constexpr ColdPrecision kForms[] = {ColdPrecision::kInt8, ColdPrecision::kInt4};

std::string AsDtype(const std::vector<float>& x, DType dtype) {
  std::string out(x.size() * DTypeBytes(dtype), '\0');
  EncodeFromFloat(x.data(), x.size(), dtype,
                  reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

std::vector<float> AsFloat(const std::string& bytes, DType dtype) {
  std::vector<float> x(bytes.size() / DTypeBytes(dtype));
  DecodeToFloat(reinterpret_cast<const uint8_t*>(bytes.data()), x.size(), dtype,
                x.data());
  return x;
}

TEST(FrameCodecTest, SizesAreRowsTimesTheEncodedRow) {
  const Geometry g{32, 8, 128, DType::kFp16, 128};  // A 7B frame.
  EXPECT_FALSE(FramesEncoded(ColdPrecision::kFull));
  EXPECT_EQ(EncodedRowBytes(g, ColdPrecision::kFull), 256u);
  EXPECT_EQ(EncodedRowBytes(g, ColdPrecision::kInt8), 4u + 128u);
  EXPECT_EQ(EncodedRowBytes(g, ColdPrecision::kInt4), 8u + 64u);
  EXPECT_EQ(EncodedFrameBytes(g, ColdPrecision::kFull, 128),
            FramePayloadBytes(g, 128));
  // 0.516 and 0.281 of fp16's bytes.
  EXPECT_EQ(EncodedFrameBytes(g, ColdPrecision::kInt8, 128),
            32ull * 2 * 8 * 128 * 132);
  EXPECT_EQ(EncodedFrameBytes(g, ColdPrecision::kInt4, 128),
            32ull * 2 * 8 * 128 * 72);
  const Geometry odd{1, 1, 5, DType::kFp32, 4};
  EXPECT_EQ(EncodedRowBytes(odd, ColdPrecision::kInt4), 8u + 3u);
}

// Every value within the form's bound of its row: int8 max|x| / 254, int4
// (max - min) / 30, plus the re-encode to the dtype (half an ulp: 2^-11 of
// the value for fp16, 2^-8 for bf16, none beyond float rounding for fp32).
TEST(FrameCodecTest, EveryRowWithinItsBound) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    for (ColdPrecision p : kForms) {
      const Geometry g{2, 3, 20, dtype, 8};
      std::mt19937_64 rng(7);
      std::normal_distribution<float> n(0.0f, 1.0f);
      std::vector<float> x(FramePayloadBytes(g, 5) / DTypeBytes(dtype));
      for (size_t i = 0; i < x.size(); ++i) {
        // Rows of different scales, one all zero, one constant.
        const size_t row = i / g.head_dim;
        x[i] = row == 3 ? 0.0f : row == 4 ? 1.5f : n(rng) * (1 + row % 7);
      }
      const std::string in = AsDtype(x, dtype);
      const std::vector<float> orig = AsFloat(in, dtype);
      std::string enc, dec;
      EncodeFrameRows(g, p, in, &enc);
      ASSERT_EQ(enc.size(), EncodedFrameBytes(g, p, 5));
      ASSERT_TRUE(DecodeFrameRows(g, p, enc, &dec).ok());
      ASSERT_EQ(dec.size(), in.size());
      const std::vector<float> got = AsFloat(dec, dtype);
      const float ulp = dtype == DType::kFp16   ? 1.0f / 2048
                        : dtype == DType::kBf16 ? 1.0f / 256
                                                : 1e-6f;
      for (size_t r = 0; r * g.head_dim < orig.size(); ++r) {
        const auto b = orig.begin() + r * g.head_dim;
        const auto [lo, hi] = std::minmax_element(b, b + g.head_dim);
        const float amax = std::max(std::fabs(*lo), std::fabs(*hi));
        const float bound =
            p == ColdPrecision::kInt8 ? amax / 254 : (*hi - *lo) / 30;
        for (size_t i = r * g.head_dim; i < (r + 1) * g.head_dim; ++i) {
          ASSERT_LE(std::fabs(got[i] - orig[i]),
                    bound * 1.0001f + std::fabs(orig[i]) * ulp + 1e-7f)
              << DTypeName(dtype) << " row " << r << " value " << i;
        }
        if (r == 3 || r == 4) {  // Zero and constant rows come back exact.
          for (size_t i = r * g.head_dim; i < (r + 1) * g.head_dim; ++i) {
            EXPECT_EQ(got[i], orig[i]) << "row " << r;
          }
        }
      }
    }
  }
}

// The codes are the definition's, value by value, on the SSE2 path (16
// values at a time) and the scalar tail alike: int8 q = x / scale rounded
// half away from zero; int4 q = (x - min) / step rounded half up.
TEST(FrameCodecTest, CodesFollowTheScalarDefinition) {
  const Geometry g{1, 1, 37, DType::kFp32, 4};  // 2 x 16 + a tail of 5.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-5.0f, 5.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(g.head_dim);
    for (float& v : x) v = u(rng);
    if (trial % 3 == 0) x[trial % g.head_dim] = 0.5f;  // Ties, near ones.
    const std::string in = AsDtype(x, g.dtype);
    std::string enc;
    EncodeFrameRows(g, ColdPrecision::kInt8, in, &enc);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float scale = amax / 127.0f, inv = 1.0f / scale;
    float got_scale;
    std::memcpy(&got_scale, enc.data(), 4);
    ASSERT_EQ(got_scale, scale);
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = std::clamp(x[i] * inv, -127.0f, 127.0f);
      const auto want =
          static_cast<int8_t>(static_cast<int32_t>(v + std::copysign(0.5f, v)));
      ASSERT_EQ(static_cast<int8_t>(enc[4 + i]), want) << trial << " " << i;
    }
    EncodeFrameRows(g, ColdPrecision::kInt4, in, &enc);
    const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
    const float step = (*hi - *lo) / 15.0f, inv4 = 1.0f / step;
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = std::min((x[i] - *lo) * inv4, 15.0f);
      const auto want = static_cast<uint8_t>(static_cast<int32_t>(v + 0.5f));
      const auto byte = static_cast<uint8_t>(enc[8 + i / 2]);
      ASSERT_EQ(i % 2 == 0 ? byte & 0x0f : byte >> 4, want)
          << trial << " " << i;
    }
  }
}

// Rows are independent: a frame's parts encoded one by one are the whole's
// encoding, byte for byte (the store reads a token's part alone).
TEST(FrameCodecTest, PartsEncodeAsTheWhole) {
  const Geometry g{3, 2, 16, DType::kFp16, 16};
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(FramePayloadBytes(g, 7) / 2);
  for (float& v : x) v = u(rng);
  std::string parted;
  SplitFrame(g, 7, 3, AsDtype(x, g.dtype), &parted);
  for (ColdPrecision p : kForms) {
    std::string whole;
    EncodeFrameRows(g, p, parted, &whole);
    std::string pieces;
    const uint64_t part_bytes = FramePayloadBytes(g, 3);
    for (uint64_t at = 0; at < parted.size(); at += part_bytes) {
      std::string one;
      EncodeFrameRows(g, p, absl::string_view(parted).substr(at, part_bytes),
                      &one);
      EXPECT_EQ(
          one.size(),
          EncodedFrameBytes(
              g, p, std::min<uint64_t>(3, 7 - at / FramePayloadBytes(g, 1))));
      pieces += one;
    }
    EXPECT_EQ(pieces, whole);
    // Encoded in frame order, then its rows moved into parts (what an
    // append stores): the same bytes as the parts encoded.
    std::string frame_order, moved;
    EncodeFrameRows(g, p, AsDtype(x, g.dtype), &frame_order);
    SplitFrameRows(g, 7, 3, EncodedRowBytes(g, p), frame_order, &moved);
    EXPECT_EQ(moved, whole);
  }
}

TEST(FrameCodecTest, DamagedSizesAreDataLoss) {
  const Geometry g{1, 1, 16, DType::kFp16, 4};
  for (ColdPrecision p : kForms) {
    std::string out;
    const absl::Status s = DecodeFrameRows(
        g, p, std::string(EncodedRowBytes(g, p) + 1, 'x'), &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    std::string bytes(EncodedRowBytes(g, p) * 2 - 3, 'x');
    EXPECT_EQ(DecodeStoredFrame(g, p, &bytes).code(),
              absl::StatusCode::kDataLoss);
  }
  std::string kept = "as appended";
  EXPECT_TRUE(DecodeStoredFrame(g, ColdPrecision::kFull, &kept).ok());
  EXPECT_EQ(kept, "as appended");
}

}  // namespace
}  // namespace kvmem

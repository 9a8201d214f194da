// StreamCopy writes exactly memcpy's bytes for every length and every
// source and destination alignment (the head before the destination's
// 16-byte boundary, the streamed body, the tail), and nothing beyond.
#include "base/stream_copy.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(StreamCopyTest, EqualsMemcpyAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> src(4096 + 64);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  int checked = 0;
  for (size_t n : {0, 1, 15, 16, 63, 64, 65, 100, 255, 256, 257, 1000, 4096}) {
    for (size_t so = 0; so < 16; so += 5) {
      for (size_t d_off = 0; d_off < 32; d_off += 3) {
        std::vector<uint8_t> got(n + 64, 0xAB), want(n + 64, 0xAB);
        StreamCopy(got.data() + d_off, src.data() + so, n);
        StreamFence();
        std::memcpy(want.data() + d_off, src.data() + so, n);
        ASSERT_EQ(got, want)
            << "n " << n << " src +" << so << " dst +" << d_off;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 13 * 4 * 11);
}

}  // namespace
}  // namespace kvmem

// The int8 kernels of the progressive search's first stage, each kernel this
// CPU can run (engine/index/int8_kernels.h: "avx512vnni" and "avx2" where
// present, "scalar" everywhere) against the scalar definitions written out
// here: block sums, per-segment sums and the survivor selector.
#include "engine/index/int8_kernels.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

struct Packed {
  size_t nblocks = 0, groups = 0;
  std::vector<uint8_t> codes;  // ((block * groups + g) * lanes + l) * 4 + j
  std::vector<int8_t> hi, lo;
};

// Random codes and query; block 0 at the extremes (codes 255 against a
// query of +-63 / +-32: the products that would saturate 16 bits).
Packed RandomPacked(std::mt19937_64& rng, size_t nblocks, size_t groups) {
  Packed p;
  p.nblocks = nblocks;
  p.groups = groups;
  std::uniform_int_distribution<int> code(0, 255), qd(-63, 63), ld(-32, 32);
  p.codes.resize(nblocks * groups * 4 * kInt8Lanes);
  for (auto& c : p.codes) c = static_cast<uint8_t>(code(rng));
  std::fill_n(p.codes.begin(), groups * 4 * kInt8Lanes, 255);
  p.hi.resize(groups * 4);
  p.lo.resize(groups * 4);
  for (size_t j = 0; j < p.hi.size(); ++j) {
    p.hi[j] = static_cast<int8_t>(j < 8 ? (j % 2 ? 63 : -63) : qd(rng));
    p.lo[j] = static_cast<int8_t>(j < 8 ? (j % 2 ? 32 : -32) : ld(rng));
  }
  return p;
}

// The definition: raw = sum over the groups [g0, g1) of (code) * d, with
// d = 64 * hi + lo, or hi alone.
int32_t Raw(const Packed& p, size_t block, size_t lane, size_t g0, size_t g1,
            bool two_terms) {
  int32_t sum = 0;
  for (size_t g = g0; g < g1; ++g) {
    for (size_t j = 0; j < 4; ++j) {
      const int d =
          two_terms ? 64 * p.hi[g * 4 + j] + p.lo[g * 4 + j] : p.hi[g * 4 + j];
      sum += p.codes[((block * p.groups + g) * kInt8Lanes + lane) * 4 + j] * d;
    }
  }
  return sum;
}

void PrintKernels() {
  std::string names;
  for (const Int8KernelInfo& k : AvailableInt8Kernels()) names += k.name + " ";
  std::printf("int8 kernels on this CPU: %s(active: %s)\n", names.c_str(),
              ActiveInt8Kernel().name.c_str());
}

TEST(Int8KernelsTest, ScalarIsAlwaysThereAndLast) {
  PrintKernels();
  const auto& kernels = AvailableInt8Kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.back().name, "scalar");
  EXPECT_EQ(ActiveInt8Kernel().name, kernels.front().name);
  EXPECT_FALSE(SelectInt8Kernel("avx9000"));
  EXPECT_TRUE(SelectInt8Kernel(ActiveInt8Kernel().name));
}

// 52 dims (56 vectors), and 128 and 192 dims, whole runs of 16 groups for
// the VNNI kernel, over enough blocks for several of its tiles.
TEST(Int8KernelsTest, BlockSumsEqualTheDefinitionAtTheExtremes) {
  std::mt19937_64 rng(21);
  for (const auto& [nblocks, groups] :
       {std::pair<size_t, size_t>{7, 13}, {45, 32}, {45, 48}}) {
    const Packed p = RandomPacked(rng, nblocks, groups);
    for (bool two_terms : {false, true}) {
      std::vector<int32_t> want(p.nblocks * kInt8Lanes);
      for (size_t b = 0; b < p.nblocks; ++b) {
        for (size_t l = 0; l < kInt8Lanes; ++l) {
          want[b * kInt8Lanes + l] = Raw(p, b, l, 0, p.groups, two_terms);
        }
      }
      for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
        std::vector<int32_t> got(want.size(), -1);
        k.fn(p.codes.data(), p.nblocks, p.groups, p.hi.data(),
             two_terms ? p.lo.data() : nullptr, got.data());
        EXPECT_EQ(got, want) << k.name << " " << groups << " groups"
                             << (two_terms ? " two terms" : "");
      }
    }
  }
}

// Segments of 4 and of 3 or 5 groups (16, 12 and 20 dims): the VNNI
// kernel's pairs of groups then straddle a segment's end. Segments of 16
// and 32 groups (64 and 128 dims) take its runs with the query in
// registers, over 100 blocks: several chunks, the last one short.
TEST(Int8KernelsTest, SegmentSumsEqualTheDefinition) {
  std::mt19937_64 rng(22);
  for (const size_t seg_groups : {4, 3, 5, 16, 32}) {
    const size_t segments = 3;
    const Packed p =
        RandomPacked(rng, seg_groups >= 16 ? 100 : 5, seg_groups * segments);
    for (bool two_terms : {false, true}) {
      std::vector<int32_t> want(p.nblocks * segments * kInt8Lanes);
      for (size_t b = 0; b < p.nblocks; ++b) {
        for (size_t s = 0; s < segments; ++s) {
          for (size_t l = 0; l < kInt8Lanes; ++l) {
            want[(b * segments + s) * kInt8Lanes + l] =
                Raw(p, b, l, s * seg_groups, (s + 1) * seg_groups, two_terms);
          }
        }
      }
      for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
        std::vector<int32_t> got(want.size(), -1);
        k.segments(p.codes.data(), p.nblocks, seg_groups, segments, p.hi.data(),
                   two_terms ? p.lo.data() : nullptr, got.data());
        EXPECT_EQ(got, want) << k.name << " " << seg_groups << " groups"
                             << (two_terms ? " two terms" : "");
      }
    }
  }
}

// The segment kernels of several queries at once: each query's sums the
// definition's (the VNNI kernel tiles the blocks and runs the queries over
// each tile: runs of 16 groups, tiles ending mid-way, a short last tile).
TEST(Int8KernelsTest, MultiQuerySegmentSumsEqualTheDefinition) {
  std::mt19937_64 rng(24);
  for (const size_t seg_groups : {4, 16, 32}) {
    const size_t segments = 3, vectors = 3;
    const Packed p = RandomPacked(rng, 37, seg_groups * segments);
    std::vector<Packed> q(vectors, p);  // The same codes, other queries.
    for (size_t j = 1; j < vectors; ++j) {
      const Packed other = RandomPacked(rng, 1, seg_groups * segments);
      q[j].hi = other.hi;
      q[j].lo = other.lo;
    }
    for (bool two_terms : {false, true}) {
      std::vector<const int8_t*> hi, lo;
      for (const Packed& x : q) {
        hi.push_back(x.hi.data());
        lo.push_back(x.lo.data());
      }
      for (const Int8KernelInfo& k : AvailableInt8Kernels()) {
        std::vector<std::vector<int32_t>> got(
            vectors, std::vector<int32_t>(p.nblocks * segments * kInt8Lanes));
        std::vector<int32_t*> out;
        for (auto& g : got) out.push_back(g.data());
        k.multi_segments(p.codes.data(), p.nblocks, seg_groups, segments,
                         vectors, hi.data(), two_terms ? lo.data() : nullptr,
                         out.data());
        for (size_t j = 0; j < vectors; ++j) {
          for (size_t b = 0; b < p.nblocks; ++b) {
            for (size_t s = 0; s < segments; ++s) {
              for (size_t l = 0; l < kInt8Lanes; ++l) {
                ASSERT_EQ(got[j][(b * segments + s) * kInt8Lanes + l],
                          Raw(q[j], b, l, s * seg_groups, (s + 1) * seg_groups,
                              two_terms))
                    << k.name << " query " << j << " block " << b << " "
                    << seg_groups << " groups"
                    << (two_terms ? " two terms" : "");
              }
            }
          }
        }
      }
    }
  }
}

// The selector's contract: theta is the k-th largest lower bound, and the
// survivors are exactly the rows whose upper bound reaches it, in order.
TEST(Int8KernelsTest, SelectorKeepsExactlyWhatCanReachTheTopK) {
  std::mt19937_64 rng(23);
  for (size_t n : {1u, 7u, 8u, 9u, 300u, 5000u}) {
    std::vector<int32_t> raw(n);
    std::vector<float> scale(n), enorm(n), cnorm(n);
    std::uniform_int_distribution<int32_t> r(-200000, 200000);
    std::uniform_real_distribution<float> u(0.5f, 1.5f), e(0.0f, 0.05f);
    for (size_t i = 0; i < n; ++i) {
      raw[i] = r(rng);
      scale[i] = u(rng);
      enorm[i] = e(rng);
      cnorm[i] = e(rng);
    }
    raw[n / 2] = raw[0];  // A tie.
    BoundInputs in;
    in.raw = raw.data();
    in.scale = scale.data();
    in.enorm = enorm.data();
    in.cnorm = cnorm.data();
    in.n = n;
    in.t = 1e-5f;
    in.qnorm = 3.0f;
    in.fnorm = 2.0f;
    in.offset = 17;
    std::vector<float> lower(n), upper(n);
    for (size_t i = 0; i < n; ++i) {
      const float ts = in.t * scale[i];
      const float approx = ts * static_cast<float>(raw[i] - in.offset);
      const float bound = (in.qnorm * enorm[i] + in.fnorm * cnorm[i]) +
                          1e-4f * std::fabs(approx);
      lower[i] = approx - bound;
      upper[i] = approx + bound;
    }
    for (uint32_t k : {1u, 4u, 16u}) {
      if (k > n) continue;
      std::vector<float> sorted = lower;
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      const float theta = sorted[k - 1];
      std::vector<uint32_t> want;
      for (size_t i = 0; i < n; ++i) {
        if (upper[i] >= theta) want.push_back(static_cast<uint32_t>(i));
      }
      for (const Int8KernelInfo& kernel : AvailableInt8Kernels()) {
        SelectScratch scratch;
        std::vector<Survivor> out;
        const float got_theta = kernel.select(in, k, &scratch, &out);
        EXPECT_EQ(got_theta, theta) << kernel.name << " n " << n << " k " << k;
        std::vector<uint32_t> rows;
        for (const Survivor& s : out) {
          rows.push_back(s.row);
          EXPECT_EQ(s.upper, upper[s.row]) << kernel.name;
        }
        EXPECT_EQ(rows, want) << kernel.name << " n " << n << " k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace kvmem

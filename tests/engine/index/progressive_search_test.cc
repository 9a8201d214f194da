// Progressive (int8 then fp32) search returns the exact top-k: the same set
// as FAISS's exact flat index (BlockIndex), on planted and on random data.
#include "engine/index/progressive_search.h"

#include <algorithm>
#include <random>

#include "engine/index/dot.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(ProgressiveSearchTest, FindsPlantedNeighboursAndMatchesFlatOnRandomData) {
  const uint32_t dim = 128, n = 5000, k = 16;
  std::mt19937_64 rng(11);
  ProgressiveIndex prog(dim);
  BlockIndex flat(dim);
  std::vector<float> data = testing::RandomQuery(rng, size_t{n} * dim);
  const std::vector<float> query = testing::RandomQuery(rng, dim);
  // Plant 16 vectors close to the query (ids 100..115) with decreasing
  // similarity.
  for (uint32_t p = 0; p < k; ++p) {
    for (uint32_t j = 0; j < dim; ++j) {
      data[(100 + p) * dim + j] =
          query[j] * (3.0f - 0.1f * p) + 0.05f * data[(100 + p) * dim + j];
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    prog.Add(i, data.data() + size_t{i} * dim);
    flat.Add(i, data.data() + size_t{i} * dim);
  }
  ProgressiveStats st;
  auto got = prog.Search(query.data(), k, &st);
  ASSERT_EQ(got.size(), k);
  for (uint32_t p = 0; p < k; ++p) EXPECT_EQ(got[p].id, 100u + p) << p;
  EXPECT_TRUE(st.exact);
  EXPECT_EQ(st.scanned, n);
  EXPECT_LT(st.candidates, n / 10) << "the int8 bound should prune most";
  // Random queries: the same ids as the exact flat index, in order, and
  // scores equal up to float rounding.
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<float> q = testing::RandomQuery(rng, dim);
    auto a = prog.Search(q.data(), k, &st);
    auto b = flat.Search(q.data(), k);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(st.exact);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].id, b[i].id) << "trial " << trial << " rank " << i;
      EXPECT_NEAR(a[i].score, b[i].score, 1e-3f * (1 + std::fabs(b[i].score)));
    }
  }
}

TEST(ProgressiveSearchTest, RemoveAndCandidateCap) {
  const uint32_t dim = 32;
  std::mt19937_64 rng(5);
  ProgressiveIndex prog(dim, /*max_candidates=*/4);
  for (uint64_t i = 0; i < 200; ++i)
    prog.Add(i, testing::RandomQuery(rng, dim).data());
  const std::vector<float> q = testing::RandomQuery(rng, dim);
  const auto before = prog.Search(q.data(), 3);
  ASSERT_EQ(before.size(), 3u);
  EXPECT_TRUE(prog.Remove(before[0].id));
  EXPECT_FALSE(prog.Remove(before[0].id));
  EXPECT_EQ(prog.size(), 199u);
  ProgressiveStats st;
  const auto after = prog.Search(q.data(), 3, &st);
  for (const auto& h : after) EXPECT_NE(h.id, before[0].id);
  EXPECT_LE(st.candidates, 4u);
  // With a zero query every score is 0: the bound cannot prune, the cap
  // binds, and the answer says it is not guaranteed exact.
  const std::vector<float> zero(dim, 0.0f);
  prog.Search(zero.data(), 3, &st);
  EXPECT_FALSE(st.exact);
  EXPECT_EQ(st.candidates, 4u);
}

// Search through every kernel this CPU has (the kernels alone:
// int8_kernels_test.cc) gives flat's answers.
TEST(ProgressiveSearchTest, EveryKernelGivesFlatsResults) {
  const auto& kernels = AvailableInt8Kernels();
  ASSERT_FALSE(kernels.empty());
  std::mt19937_64 rng(21);
  // Dim 50 (not a multiple of 4; one query term) and 522 (two terms),
  // 1,001 vectors (a partial last block), some removed.
  const std::string best = ActiveInt8Kernel().name;
  for (const uint32_t dim : {50u, 522u}) {
    ASSERT_GE(522u, kTwoTermMinDim);
    ProgressiveIndex prog(dim);
    BlockIndex flat(dim);
    for (uint64_t i = 0; i < 1001; ++i) {
      const std::vector<float> v = testing::RandomQuery(rng, dim);
      prog.Add(i, v.data());
      flat.Add(i, v.data());
    }
    for (uint64_t i = 0; i < 1001; i += 7) {
      ASSERT_TRUE(prog.Remove(i));
      ASSERT_TRUE(flat.Remove(i));
    }
    for (int trial = 0; trial < 10; ++trial) {
      const std::vector<float> query = testing::RandomQuery(rng, dim);
      const auto exact = flat.Search(query.data(), 16);
      for (const Int8KernelInfo& k : kernels) {
        ASSERT_TRUE(SelectInt8Kernel(k.name));
        ProgressiveStats st;
        const auto got = prog.Search(query.data(), 16, &st);
        ASSERT_EQ(got.size(), exact.size()) << k.name;
        EXPECT_TRUE(st.exact);
        EXPECT_LT(st.candidates, 200u) << "dim " << dim;
        for (size_t r = 0; r < got.size(); ++r) {
          EXPECT_EQ(got[r].id, exact[r].id)
              << k.name << " dim " << dim << " rank " << r;
        }
      }
    }
  }
  ASSERT_TRUE(SelectInt8Kernel(best));
}

// Grown off the writer's lock: adds after an adopted growth copy no vector
// in place, and the index answers as one grown in place; a growth made
// before any change (an add, a removal) is refused and changes nothing.
TEST(ProgressiveSearchTest, GrowthAdoptedOffTheLockCopiesNothingInPlace) {
  const uint32_t dim = 64, k = 8;
  std::mt19937_64 rng(21);
  const std::vector<float> data = testing::RandomQuery(rng, 600 * dim);
  ProgressiveIndex grown(dim, 0, 16), in_place(dim, 0, 16);
  for (uint32_t i = 0; i < 600; ++i) {
    if (i % 50 == 0) {
      std::unique_ptr<ProgressiveIndex::Growth> g = grown.Grow(50);
      if (g != nullptr) {
        EXPECT_TRUE(grown.Adopt(g.get())) << i;
      }
    }
    grown.Add(i, data.data() + size_t{i} * dim);
    in_place.Add(i, data.data() + size_t{i} * dim);
  }
  EXPECT_EQ(grown.copied_in_place(), 0u);
  EXPECT_GT(in_place.copied_in_place(), 0u) << "a vector's doubling copies";
  // Removals and a scan of every segment: the same in both.
  for (uint64_t id : {7u, 599u, 300u}) {
    EXPECT_TRUE(grown.Remove(id));
    EXPECT_TRUE(in_place.Remove(id));
  }
  for (int trial = 0; trial < 10; ++trial) {
    const std::vector<float> q = testing::RandomQuery(rng, dim);
    const auto a = grown.Search(q.data(), k), b = in_place.Search(q.data(), k);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].id, b[i].id);
      EXPECT_EQ(a[i].score, b[i].score);
    }
    SegmentScan sa, sb;
    grown.ScanSegments(q.data(), &sa);
    in_place.ScanSegments(q.data(), &sb);
    EXPECT_EQ(sa.ids, sb.ids);
    EXPECT_EQ(sa.dots, sb.dots);
  }
  // Stale: an add or a removal after Grow.
  for (int change = 0; change < 2; ++change) {
    std::unique_ptr<ProgressiveIndex::Growth> g = grown.Grow(grown.size());
    ASSERT_NE(g, nullptr);
    if (change == 0) {
      grown.Add(1000, data.data());
    } else {
      EXPECT_TRUE(grown.Remove(1000));
    }
    const uint64_t size = grown.size();
    EXPECT_FALSE(grown.Adopt(g.get()));
    EXPECT_EQ(grown.size(), size);
  }
  // Room already: nothing to grow.
  std::unique_ptr<ProgressiveIndex::Growth> g = grown.Grow(grown.size() + 8);
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(grown.Adopt(g.get()));
  EXPECT_EQ(grown.Grow(1), nullptr);
}

// At 7B's summary width (32,768 dims: 128 KiB a row, two rows a chunk) the
// fp32 rows live in chunks: a growth brings new chunks for the rows to come
// only (no copy of the rows held), removals move rows across chunks, and
// the answers are a flat exact search's, as an index grown in place gives.
TEST(ProgressiveSearchTest, WideRowsGrowInChunksWithoutCopies) {
  const uint32_t dim = 32768, n = 40, k = 5;
  std::mt19937_64 rng(31);
  const std::vector<float> data = testing::RandomQuery(rng, size_t{n} * dim);
  ProgressiveIndex grown(dim, 0, 128), in_place(dim, 0, 128);
  const uint64_t row_bytes = uint64_t{dim} * sizeof(float);
  for (uint32_t i = 0; i < n; ++i) {
    if (i % 5 == 0) {
      const uint64_t before = grown.memory_bytes();
      std::unique_ptr<ProgressiveIndex::Growth> g = grown.Grow(5);
      ASSERT_NE(g, nullptr) << i;
      // New chunks for the five rows to come, at most one more.
      EXPECT_LE(g->full.size() * kRowChunkBytes, 5 * row_bytes + kRowChunkBytes)
          << i;
      EXPECT_TRUE(grown.Adopt(g.get())) << i;
      EXPECT_GE(grown.memory_bytes() - before, 4 * row_bytes) << i;
    }
    grown.Add(i, data.data() + size_t{i} * dim);
    in_place.Add(i, data.data() + size_t{i} * dim);
  }
  for (uint64_t id : {0u, 39u, 17u, 1u}) {  // The last row moves into holes.
    EXPECT_TRUE(grown.Remove(id));
    EXPECT_TRUE(in_place.Remove(id));
  }
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<float> q = testing::RandomQuery(rng, dim);
    std::vector<ScoredId> exact;
    for (uint64_t i = 0; i < n; ++i) {
      if (i == 0 || i == 39 || i == 17 || i == 1) continue;
      exact.push_back({i, Dot(q.data(), data.data() + i * dim, dim)});
    }
    std::sort(
        exact.begin(), exact.end(),
        [](const ScoredId& a, const ScoredId& b) { return a.score > b.score; });
    const auto a = grown.Search(q.data(), k), b = in_place.Search(q.data(), k);
    ASSERT_EQ(a.size(), k);
    ASSERT_EQ(b.size(), k);
    for (size_t r = 0; r < k; ++r) {
      EXPECT_EQ(a[r].id, exact[r].id) << r;
      EXPECT_EQ(a[r].score, exact[r].score) << r;
      EXPECT_EQ(b[r].id, exact[r].id) << r;
    }
    SegmentScan sa, sb;
    grown.ScanSegments(q.data(), &sa);
    in_place.ScanSegments(q.data(), &sb);
    EXPECT_EQ(sa.ids, sb.ids);
    EXPECT_EQ(sa.dots, sb.dots);
  }
  // Emptied, an index keeps one spare chunk of the 18 its 36 rows held.
  const uint64_t held = grown.memory_bytes();
  for (uint64_t i = 0; i < n; ++i) grown.Remove(i);
  EXPECT_EQ(grown.size(), 0u);
  EXPECT_GE(held - grown.memory_bytes(), 17 * kRowChunkBytes);
}

}  // namespace
}  // namespace kvmem

// BlockIndex kinds: exact ones equal brute force; FAISS descriptions work
// with removal (tombstones, rebuilds), training thresholds and sampled
// recall; bad descriptions are INVALID_ARGUMENT; a stream can use them.
#include "engine/index/block_index.h"

#include <algorithm>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

constexpr uint32_t kDim = 32;

// Exact top-k by brute force over the live vectors.
std::vector<uint64_t> Exact(const std::map<uint64_t, std::vector<float>>& live,
                            const std::vector<float>& q, uint32_t k) {
  std::vector<std::pair<double, uint64_t>> s;
  for (const auto& [id, v] : live) {
    double dot = 0;
    for (uint32_t i = 0; i < kDim; ++i) dot += double(v[i]) * q[i];
    s.emplace_back(-dot, id);
  }
  std::sort(s.begin(), s.end());
  std::vector<uint64_t> out;
  for (size_t i = 0; i < s.size() && i < k; ++i) out.push_back(s[i].second);
  return out;
}

// Fills an index with n random vectors, removes every 7th, and returns the
// mean recall@k of 50 random queries against brute force.
double RecallAfterChurn(BlockIndex* index, uint32_t n, uint32_t k) {
  std::mt19937_64 rng(9);
  std::map<uint64_t, std::vector<float>> live;
  for (uint64_t id = 0; id < n; ++id) {
    live[id] = testing::RandomQuery(rng, kDim);
    index->Add(id, live[id].data());
  }
  for (uint64_t id = 0; id < n; id += 7) {
    EXPECT_TRUE(index->Remove(id));
    EXPECT_FALSE(index->Remove(id));
    live.erase(id);
  }
  EXPECT_EQ(index->size(), live.size());
  double hits = 0, wanted = 0;
  for (int t = 0; t < 50; ++t) {
    const std::vector<float> q = testing::RandomQuery(rng, kDim);
    const auto want = Exact(live, q, k);
    const auto got = index->Search(q.data(), k);
    EXPECT_EQ(got.size(), want.size());
    std::set<uint64_t> g;
    for (const auto& h : got) {
      EXPECT_TRUE(live.count(h.id)) << "removed id " << h.id << " returned";
      g.insert(h.id);
    }
    for (uint64_t id : want) hits += g.count(id);
    wanted += want.size();
  }
  return hits / wanted;
}

TEST(BlockIndexTest, ExactKindsEqualBruteForce) {
  for (const char* kind : {"Flat", "Progressive"}) {
    BlockIndex index(kDim, kind);
    EXPECT_TRUE(BlockIndex::IsExact(kind));
    EXPECT_EQ(RecallAfterChurn(&index, 400, 8), 1.0) << kind;
    EXPECT_EQ(index.quality().samples, 0u) << kind;
  }
}

TEST(BlockIndexTest, FaissKindsSurviveRemovalAndSampleTheirRecall) {
  // Random data has no cluster structure: IVF (2 of 8 lists probed) is
  // expected to miss about half; the floors are far below each kind's
  // typical recall here and far above what broken id mapping would give.
  const std::pair<const char*, double> kinds[] = {
      {"HNSW16", 0.8}, {"SQ8", 0.8}, {"IVF8,Flat", 0.35}};
  for (const auto& [kind, floor] : kinds) {
    BlockIndex index(kDim, kind);
    EXPECT_FALSE(BlockIndex::IsExact(kind));
    const double recall = RecallAfterChurn(&index, 600, 8);
    EXPECT_GE(recall, floor) << kind;
    const IndexQuality q = index.quality();
    EXPECT_GE(q.samples, 3u) << kind;  // Every 16th of 50 searches.
    // The index's own sampled recall tells the same story as the test's.
    EXPECT_NEAR(q.recall(), recall, 0.3) << kind;
  }
}

TEST(BlockIndexTest, UntrainableYetMeansExact) {
  // IVF256 cannot train on 100 vectors: search stays exact meanwhile.
  BlockIndex index(kDim, "IVF256,Flat");
  EXPECT_EQ(RecallAfterChurn(&index, 100, 8), 1.0);
}

TEST(BlockIndexTest, BadFactoryIsInvalidArgumentNamingIt) {
  EXPECT_TRUE(BlockIndex::ValidateFactory("HNSW32", {kDim}).ok());
  EXPECT_TRUE(BlockIndex::ValidateFactory("Progressive", {kDim}).ok());
  const absl::Status s = BlockIndex::ValidateFactory("Bogus42", {kDim});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"Bogus42\""), std::string::npos) << s;

  testing::TempDir dir;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(testing::TestGeometry(), 16, 1);
  c.index_factory = "Bogus42";
  auto opened = e->OpenStream("cam", c);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
}

// Descriptions FAISS accepts and then crashes on (found from outside: at
// index dimensions 12 and 6, "d % M == 0" thrown at stream creation, NSG's
// SIGFPE at the 64th block, PQ1x24's 255 MiB codebook) are refused before
// anything is built; the allowed kinds validate where they divide.
TEST(BlockIndexTest, AllowListRefusesKindsThatCrashFaiss) {
  const std::vector<uint32_t> dims = {12, 6, 6};
  for (const char* bad :
       {"PQ4",       "PQ12",       "IVF2,PQ4",     "OPQ4,PQ4",
        "HNSW4_PQ4", "PQ4x4fs",    "IVF4,PQ4x4fs", "NSG8,Flat",
        "NSG16",     "NSG32,Flat", "PQ1x24",       "PQ1x27",
        "HNSW3",     "HNSW65",     "IVF1025,Flat", "IVF0,Flat",
        "PQ2x9",     "LSH",        "PCA4,Flat",    "IVF4,Flat,Refine(Flat)",
        "HNSW8,SQ8", "SQ8 ",       "IDMap,Flat",   "PQ0",
        "RFlat"}) {
    const absl::Status s = BlockIndex::ValidateFactory(bad, dims);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("index_factory"), std::string::npos) << s;
  }
  for (const char* good :
       {"HNSW4", "HNSW64,Flat", "SQ4", "SQ6", "SQ8", "SQfp16", "PQ2", "PQ3x4",
        "PQ6x1", "IVF1,Flat", "IVF1024,Flat", "IVF4,SQ8", "IVF2,PQ3x4"}) {
    EXPECT_TRUE(BlockIndex::ValidateFactory(good, dims).ok())
        << good << ": " << BlockIndex::ValidateFactory(good, dims);
  }
  // Centroids over every index of the stream are bounded.
  const absl::Status big =
      BlockIndex::ValidateFactory("IVF1024,Flat", {16384, 4096, 4096});
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("at most 67108864"), std::string::npos) << big;
}

TEST(BlockIndexTest, StreamWithHnswRecallsAndReportsSampledRecall) {
  const testing::TestGeometry g;
  testing::TempDir dir;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(g, 16, 1);
  c.index_factory = "HNSW16";
  ASSERT_TRUE(e->OpenStream("cam", c).ok());
  std::mt19937_64 rng(3);
  for (uint64_t i = 0; i < 120; ++i) {
    const testing::FloatFrame f = testing::RandomFrame(rng, g, 4);
    ASSERT_TRUE(e->Append("cam", testing::FrameOf(f, i, g.dtype)).ok());
  }
  for (int i = 0; i < 64; ++i) {
    RecallQuery q;
    q.query = testing::RandomQuery(rng, 2 * g.kv_heads * g.head_dim);
    q.top_k = 4;
    q.max_tokens = 64;
    auto r = e->Recall("cam", q);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->blocks.size(), 4u);
  }
  auto st = e->GetStats("cam");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->config.index_factory, "HNSW16");
  EXPECT_GE(st->index_recall_samples, 4u);
  EXPECT_GT(st->index_recall_at_k, 0.5);
  EXPECT_LE(st->index_recall_at_k, 1.0);
}

// With one indexed layer there is no separate per-layer index: a per-layer
// recall uses the all-layers one and returns the same set.
TEST(BlockIndexTest, SingleIndexedLayerServesPerLayerRecall) {
  const testing::TestGeometry g;
  testing::TempDir dir;
  auto engine = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(g, 16, 2);
  c.indexed_layers = {1};
  ASSERT_TRUE(engine->OpenStream("cam", c).ok());
  std::mt19937_64 rng(9);
  for (uint64_t i = 0; i < 60; ++i) {
    ASSERT_TRUE(
        engine
            ->Append("cam", testing::FrameOf(testing::RandomFrame(rng, g, 4), i,
                                             g.dtype))
            .ok());
  }
  RecallQuery q;
  q.query = testing::RandomQuery(rng, g.kv_heads * g.head_dim);
  q.max_tokens = 24;
  auto whole = engine->Recall("cam", q);
  q.per_layer = true;
  auto layered = engine->Recall("cam", q);
  ASSERT_TRUE(whole.ok() && layered.ok()) << layered.status();
  ASSERT_EQ(layered->layer_sets.size(), 1u);
  EXPECT_EQ(layered->layer_sets[0].layer, 1u);
  ASSERT_FALSE(whole->blocks.empty());
  ASSERT_EQ(layered->layer_sets[0].blocks.size(), whole->blocks.size());
  for (size_t i = 0; i < whole->blocks.size(); ++i) {
    EXPECT_EQ(layered->layer_sets[0].blocks[i].block.id,
              whole->blocks[i].block.id);
  }
}

}  // namespace
}  // namespace kvmem

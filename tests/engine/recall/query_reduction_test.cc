// Whole-frame queries (engine/recall/query_reduction.h): the reduction
// finds clusters, weighs them by size, combines window log-sum-exps by the
// documented formula, and through the engine a query of more than
// kMaxScoredVectors vectors is answered from that many representatives;
// kMaxScoredVectors vectors each sent twice recall as they do once.
#include "engine/recall/query_reduction.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

std::vector<float> Gaussian(std::mt19937_64& rng, size_t n, float sigma) {
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

TEST(QueryReductionTest, FewVectorsStayAsTheyAre) {
  std::mt19937_64 rng(1);
  const uint32_t dim = 12, heads = 3, n = 5;
  const std::vector<float> q = Gaussian(rng, n * dim, 1.0f);
  const std::vector<float> w = Gaussian(rng, n * heads, 2.0f);
  const ReducedQuery r = ReduceQuery(q, w, dim, heads, 8);
  ASSERT_EQ(r.weight.size(), n);
  for (float x : r.weight) EXPECT_FLOAT_EQ(x, 1.0f / n);
  // Each vector its own cluster: the same vectors and window terms.
  for (uint32_t j = 0; j < n; ++j) {
    const uint32_t c = r.cluster[j];
    for (uint32_t i = 0; i < dim; ++i) {
      EXPECT_FLOAT_EQ(r.query[c * dim + i], q[j * dim + i]);
    }
    for (uint32_t h = 0; h < heads; ++h) {
      EXPECT_NEAR(r.window_lse[c * heads + h], w[j * heads + h], 1e-5);
    }
  }
}

TEST(QueryReductionTest, FindsTightClustersWeighsThemAndCombinesWindows) {
  std::mt19937_64 rng(2);
  const uint32_t dim = 64, heads = 4, k = 8;
  const std::vector<float> centres = Gaussian(rng, k * dim, 1.0f);
  // 128 vectors: cluster c gets 4 + 2c members, scattered by 0.01.
  std::vector<float> q, w;
  std::vector<uint32_t> truth;
  for (uint32_t c = 0; c < k; ++c) {
    for (uint32_t m = 0; m < 4 + 2 * c; ++m) {
      const std::vector<float> noise = Gaussian(rng, dim, 0.01f);
      for (uint32_t i = 0; i < dim; ++i) {
        q.push_back(centres[c * dim + i] + noise[i]);
      }
      for (const float x : Gaussian(rng, heads, 1.5f)) w.push_back(x + 3.0f);
      truth.push_back(c);
    }
  }
  const uint32_t n = static_cast<uint32_t>(truth.size());
  const ReducedQuery r = ReduceQuery(q, w, dim, heads, k);
  ASSERT_EQ(r.weight.size(), k);
  // The clusters found are the true ones (up to their order).
  std::vector<int> map(k, -1);
  for (uint32_t j = 0; j < n; ++j) {
    int& m = map[truth[j]];
    if (m < 0) m = static_cast<int>(r.cluster[j]);
    EXPECT_EQ(static_cast<uint32_t>(m), r.cluster[j]) << "vector " << j;
  }
  for (uint32_t c = 0; c < k; ++c) {
    const uint32_t rc = static_cast<uint32_t>(map[c]);
    EXPECT_FLOAT_EQ(r.weight[rc], float(4 + 2 * c) / n);
    // Its representative is its members' mean, and its window term
    // -ln(mean exp(-w)) of theirs, per head.
    std::vector<double> mean(dim, 0.0), inv(heads, 0.0);
    uint32_t members = 0;
    for (uint32_t j = 0; j < n; ++j) {
      if (truth[j] != c) continue;
      ++members;
      for (uint32_t i = 0; i < dim; ++i) mean[i] += q[j * dim + i];
      for (uint32_t h = 0; h < heads; ++h)
        inv[h] += std::exp(-w[j * heads + h]);
    }
    for (uint32_t i = 0; i < dim; ++i) {
      EXPECT_NEAR(r.query[rc * dim + i], mean[i] / members, 1e-5);
    }
    for (uint32_t h = 0; h < heads; ++h) {
      EXPECT_NEAR(r.window_lse[rc * heads + h], -std::log(inv[h] / members),
                  1e-4);
    }
  }
  // Deterministic.
  const ReducedQuery again = ReduceQuery(q, w, dim, heads, k);
  EXPECT_EQ(again.query, r.query);
  EXPECT_EQ(again.cluster, r.cluster);
}

class WholeFrameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testing::OpenTestEngine(dir_.path());
    StreamConfig c = testing::TestConfig(g_, 64, 2);
    c.weights.score = ScoreMode::kMass;
    c.weights.scorer = "mass";
    c.groups_per_block = 0;
    ASSERT_TRUE(engine_->OpenStream("s", c).ok());
    std::mt19937_64 rng(31);
    for (uint64_t f = 0; f < 60; ++f) {
      ASSERT_TRUE(
          engine_
              ->Append("s", testing::FrameOf(testing::RandomFrame(rng, g_, 8),
                                             f, g_.dtype))
              .ok());
    }
  }
  testing::TempDir dir_;
  const testing::TestGeometry g_{};
  std::unique_ptr<MemoryEngine> engine_;
  const uint32_t dim_ = 2 * 2 * 16;  // Indexed layers x KV heads x head_dim.
};

TEST_F(WholeFrameTest, ManyVectorsAreScoredAsRepresentatives) {
  std::mt19937_64 rng(32);
  RecallQuery q;
  q.query = Gaussian(rng, 200 * dim_, 0.5f);
  q.window_lse = Gaussian(rng, 200 * 4, 1.0f);
  q.max_tokens = 30;
  auto r = engine_->Recall("s", q);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->query_vectors, 200u);
  EXPECT_EQ(r->scored_vectors, kMaxScoredVectors);
  EXPECT_LE(r->total_tokens, 30u);
  EXPECT_GT(r->total_tokens, 0u);
}

TEST_F(WholeFrameTest, VectorsSentTwiceRecallAsThemOnce) {
  std::mt19937_64 rng(33);
  const uint32_t k = kMaxScoredVectors;
  RecallQuery once;
  once.query = Gaussian(rng, k * dim_, 0.5f);
  once.window_lse = Gaussian(rng, k * 4, 1.0f);
  once.max_tokens = 30;
  once.identity_share = 0.25f;
  RecallQuery twice = once;
  twice.query.insert(twice.query.end(), once.query.begin(), once.query.end());
  twice.window_lse.insert(twice.window_lse.end(), once.window_lse.begin(),
                          once.window_lse.end());
  auto a = engine_->Recall("s", once);
  auto b = engine_->Recall("s", twice);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->scored_vectors, k);
  EXPECT_EQ(b->query_vectors, 2 * k);
  EXPECT_EQ(b->scored_vectors, k);
  ASSERT_EQ(a->blocks.size(), b->blocks.size());
  for (size_t i = 0; i < a->blocks.size(); ++i) {
    EXPECT_EQ(a->blocks[i].block.id, b->blocks[i].block.id);
    EXPECT_EQ(a->blocks[i].token_offsets, b->blocks[i].token_offsets);
    EXPECT_FLOAT_EQ(a->blocks[i].mass, b->blocks[i].mass);
  }
}

}  // namespace
}  // namespace kvmem

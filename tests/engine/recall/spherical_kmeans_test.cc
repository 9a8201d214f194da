// SphericalKMeans against the plain algorithm it replaced (every row scored
// against every centre in every pass, with Dot): the same centre for every
// row, on clustered keys (where the bounds keep most rows), random ones
// (where rows move for several passes), and rows that tie (duplicates, zero
// rows, opposite rows), at every pass count.
#include "engine/recall/spherical_kmeans.h"

#include <cmath>
#include <random>
#include <vector>

#include "engine/index/dot.h"
#include "gtest/gtest.h"

namespace kvmem {
namespace {

void Normalize(float* v, size_t n) {
  const float norm = std::sqrt(Dot(v, v, n));
  if (norm > 0) {
    for (size_t i = 0; i < n; ++i) v[i] /= norm;
  }
}

// The plain spherical k-means: farthest-point seeds from row 0, then passes
// of every row against every centre, centres the unit mean of their rows.
std::vector<uint8_t> PlainKMeans(const std::vector<float>& rows, size_t dim,
                                 size_t k, int passes) {
  const size_t n = rows.size() / dim;
  std::vector<float> norms(n);
  for (size_t i = 0; i < n; ++i) {
    norms[i] = std::sqrt(Dot(&rows[i * dim], &rows[i * dim], dim));
  }
  auto cosine = [&](size_t i, const float* c) {
    return norms[i] > 0 ? Dot(&rows[i * dim], c, dim) / norms[i] : 0.0f;
  };
  std::vector<float> centres(k * dim);
  std::vector<float> best(n, -INFINITY);
  size_t next = 0;
  for (size_t c = 0; c < k; ++c) {
    std::copy_n(&rows[next * dim], dim, &centres[c * dim]);
    Normalize(&centres[c * dim], dim);
    float lowest = INFINITY;
    for (size_t i = 0; i < n; ++i) {
      best[i] = std::max(best[i], cosine(i, &centres[c * dim]));
      if (best[i] < lowest) {
        lowest = best[i];
        next = i;
      }
    }
  }
  std::vector<uint8_t> assign(n, 0);
  for (int pass = 0; pass < passes; ++pass) {
    bool changed = pass == 0;
    for (size_t i = 0; i < n; ++i) {
      size_t arg = 0;
      float top = -INFINITY;
      for (size_t c = 0; c < k; ++c) {
        const float s = cosine(i, &centres[c * dim]);
        if (s > top) {
          top = s;
          arg = c;
        }
      }
      changed |= assign[i] != arg;
      assign[i] = static_cast<uint8_t>(arg);
    }
    if (!changed) break;
    std::fill(centres.begin(), centres.end(), 0.0f);
    for (size_t i = 0; i < n; ++i) {
      if (norms[i] <= 0) continue;
      AddDivided(&rows[i * dim], norms[i], &centres[assign[i] * dim], dim);
    }
    for (size_t c = 0; c < k; ++c) Normalize(&centres[c * dim], dim);
  }
  return assign;
}

// n rows around `clusters` directions (noise: each coordinate's spread
// against the directions' unit ones).
std::vector<float> Clustered(size_t n, size_t dim, size_t clusters, float noise,
                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> centres(clusters * dim);
  for (float& v : centres) v = g(rng) / std::sqrt(float(dim));
  std::vector<float> rows(n * dim);
  for (size_t i = 0; i < n; ++i) {
    const size_t c = (i * 7919) % clusters;
    const float scale = 0.5f + float(i % 5);  // Norms differ.
    for (size_t d = 0; d < dim; ++d) {
      rows[i * dim + d] = scale * (centres[c * dim + d] +
                                   noise * g(rng) / std::sqrt(float(dim)));
    }
  }
  return rows;
}

void ExpectPlain(const std::vector<float>& rows, size_t dim, size_t k,
                 int passes, KMeansCounts* counts = nullptr) {
  const std::vector<uint8_t> want = PlainKMeans(rows, dim, k, passes);
  const std::vector<uint8_t> got =
      SphericalKMeans(rows.data(), rows.size() / dim, dim, k, passes, counts);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(int{got[i]}, int{want[i]})
        << "row " << i << " of " << want.size() << ", dim " << dim << ", k "
        << k << ", passes " << passes;
  }
}

TEST(SphericalKMeansTest, ClusteredKeysMatchThePlainPassesAndMostRowsAreKept) {
  // Blocks of 512 tokens of 512 floats, 64 groups, around 48 directions:
  // loose clusters (rows move after the first assignment) and tight ones.
  for (float noise : {0.6f, 0.1f}) {
    const std::vector<float> rows = Clustered(512, 512, 48, noise, 1);
    for (int passes = 1; passes <= 6; ++passes) {
      ExpectPlain(rows, 512, 64, passes);
    }
  }
  // Where the groups stand apart, the bounds spare most of the scoring
  // after the seeding's.
  KMeansCounts counts;
  ExpectPlain(Clustered(512, 512, 48, 0.1f, 1), 512, 64, 6, &counts);
  EXPECT_GT(counts.passes, 1);
  EXPECT_GT(counts.rows_kept, 2 * counts.rows_scored);
}

TEST(SphericalKMeansTest, RandomRowsMovingForSeveralPassesMatchThePlainPasses) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (size_t dim : {size_t{3}, size_t{13}, size_t{100}, size_t{1030}}) {
    std::vector<float> rows(300 * dim);
    for (float& v : rows) v = g(rng);
    for (size_t k : {size_t{1}, size_t{2}, size_t{5}, size_t{37}, size_t{64}}) {
      KMeansCounts counts;
      ExpectPlain(rows, dim, k, 6, &counts);
      if (dim == 3 && k == 37) {
        // Rows still moved after the seeding: the bounded passes ran.
        EXPECT_GT(counts.passes, 2);
        EXPECT_GT(counts.rows_scored, 0u);
      }
    }
  }
}

TEST(SphericalKMeansTest, TiesZeroRowsAndEveryRowItsOwnCentreMatchThePlain) {
  const size_t dim = 16;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> rows;
  for (int i = 0; i < 24; ++i) {
    std::vector<float> v(dim);
    for (float& x : v) x = g(rng);
    // The row, a duplicate, a multiple, its opposite and a zero row.
    for (float scale : {1.0f, 1.0f, 3.0f, -1.0f, 0.0f}) {
      for (float x : v) rows.push_back(scale * x);
    }
  }
  const size_t n = rows.size() / dim;
  for (size_t k : {size_t{1}, size_t{3}, size_t{8}, size_t{40}, n / 2}) {
    for (int passes = 1; passes <= 6; ++passes)
      ExpectPlain(rows, dim, k, passes);
  }
  // k = n: every distinct row a seed (the zero and duplicate rows tie).
  std::vector<float> few(rows.begin(), rows.begin() + 10 * dim);
  ExpectPlain(few, dim, 10, 6);
}

// Rows of 2,048 floats (the fold's width), some so short that their
// squares underflow (a norm short of the row's: such rows are scored every
// pass), beside ordinary ones.
TEST(SphericalKMeansTest, WideAndTinyRowsMatchThePlain) {
  std::vector<float> rows = Clustered(200, 2048, 12, 0.5f, 3);
  for (size_t i = 0; i < 200; i += 3) {
    for (size_t d = 0; d < 2048; ++d) rows[i * 2048 + d] *= 1e-21f;
  }
  for (size_t i = 1; i < 200; i += 7) {  // One larger entry, the rest tiny.
    for (size_t d = 0; d < 2048; ++d) {
      rows[i * 2048 + d] = d == i % 2048 ? 1e-21f : 2.6e-23f;
    }
  }
  for (size_t k : {size_t{1}, size_t{16}}) {
    for (int passes = 1; passes <= 6; ++passes) {
      ExpectPlain(rows, 2048, k, passes);
    }
  }
}

}  // namespace
}  // namespace kvmem

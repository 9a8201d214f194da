// SelectTop (engine/recall/top_select.h) against its definition: a full
// sort by value (ties by the given order), then the shortest prefix whose
// weights reach the budget; with ties in every bit of the value (so every
// level of the radix selection runs), -0 beside +0, negative values, zero
// weights, and counts (no weights).
#include "engine/recall/top_select.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

std::vector<uint32_t> Definition(const std::vector<float>& value,
                                 const std::vector<uint32_t>* weight,
                                 const std::vector<uint32_t>& tie,
                                 uint64_t budget) {
  std::vector<uint32_t> all(value.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  std::sort(all.begin(), all.end(), [&](uint32_t a, uint32_t b) {
    return value[a] != value[b] ? value[a] > value[b] : tie[a] > tie[b];
  });
  uint64_t total = 0;
  for (uint32_t i : all) total += weight == nullptr ? 1 : (*weight)[i];
  if (total < budget) return all;
  std::vector<uint32_t> want;
  uint64_t held = 0;
  for (uint32_t i : all) {
    if (held >= budget) break;
    want.push_back(i);
    held += weight == nullptr ? 1 : (*weight)[i];
  }
  return want;
}

TEST(TopSelectTest, OrderKeyKeepsTheFloatOrder) {
  const std::vector<float> v = {-INFINITY, -3e38f, -1.5f,  -1e-30f,
                                -0.0f,     0.0f,   1e-40f, 1e-30f,
                                0.25f,     1.0f,   3e38f,  INFINITY};
  for (size_t a = 0; a < v.size(); ++a) {
    for (size_t b = 0; b < v.size(); ++b) {
      EXPECT_EQ(v[a] > v[b], OrderKey(v[a]) > OrderKey(v[b])) << a << " " << b;
      EXPECT_EQ(v[a] == v[b], OrderKey(v[a]) == OrderKey(v[b]))
          << a << " " << b;
    }
  }
}

TEST(TopSelectTest, IsTheSortedPrefixThatHoldsTheBudget) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 72; ++trial) {
    const size_t n = trial < 10 ? 1 + rng() % 40 : 100 + rng() % 20000;
    std::vector<float> value(n);
    std::vector<uint32_t> weight(n), tie(n);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::exponential_distribution<float> ex(1.0f);
    for (size_t i = 0; i < n; ++i) {
      switch (trial % 6) {
        case 0:  // Densities over many octaves.
          value[i] = std::exp(-20.0f * u(rng));
          break;
        case 1:  // Few distinct values: ties through every bit.
          value[i] = static_cast<float>(rng() % 5) * 0.125f;
          break;
        case 2:  // Signs, zeros of both signs.
          value[i] = (rng() % 7 == 0) ? (rng() % 2 ? 0.0f : -0.0f)
                                      : (u(rng) - 0.5f) * ex(rng);
          break;
        case 3:  // Values that differ in the last bits only.
          value[i] = 1.0f + static_cast<float>(rng() % 300) * 1.1920929e-7f;
          break;
        case 4:  // One value: every candidate ties.
          value[i] = 0.25f;
          break;
        default:  // The whole float range at once, and its ends.
          value[i] = rng() % 9 == 0 ? (rng() % 2 ? 3e38f : -3e38f)
                                    : (u(rng) - 0.5f) * std::exp(80 * u(rng));
      }
      weight[i] =
          trial % 3 == 0 ? 1 + rng() % 8 : (rng() % 4 == 0 ? 0 : 1 + rng() % 3);
      tie[i] = static_cast<uint32_t>(i);
    }
    std::shuffle(tie.begin(), tie.end(), rng);  // A total order on ties.
    const auto tie_better = [&](uint32_t a, uint32_t b) {
      return tie[a] > tie[b];
    };
    for (uint64_t budget :
         {uint64_t{0}, uint64_t{1}, 1 + rng() % (2 * n), uint64_t{n} * 9}) {
      for (const std::vector<uint32_t>* w :
           {static_cast<const std::vector<uint32_t>*>(&weight),
            static_cast<const std::vector<uint32_t>*>(nullptr)}) {
        const std::vector<uint32_t> want = Definition(value, w, tie, budget);
        std::vector<uint32_t> got;
        SelectTop(value.data(), w == nullptr ? nullptr : w->data(), n, budget,
                  tie_better, true, &got);
        EXPECT_EQ(got, want) << "trial " << trial << " budget " << budget;
        SelectTop(value.data(), w == nullptr ? nullptr : w->data(), n, budget,
                  tie_better, false, &got);
        std::sort(got.begin(), got.end());
        std::vector<uint32_t> as_set = want;
        std::sort(as_set.begin(), as_set.end());
        EXPECT_EQ(got, as_set) << "trial " << trial << " budget " << budget;
      }
    }
  }
}

}  // namespace
}  // namespace kvmem

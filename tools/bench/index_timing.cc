#include "tools/bench/index_timing.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "base/timing.h"

namespace kvmem {

std::vector<float> Gaussian(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

IndexData RandomIndexData(uint32_t n, uint32_t dim, uint32_t queries,
                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  IndexData d;
  d.dim = dim;
  d.base.reserve(static_cast<size_t>(n) * dim);
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<float> v = Gaussian(rng, dim);
    d.base.insert(d.base.end(), v.begin(), v.end());
  }
  d.queries.reserve(static_cast<size_t>(queries) * dim);
  for (uint32_t q = 0; q < queries; ++q) {
    const std::vector<float> v = Gaussian(rng, dim);
    d.queries.insert(d.queries.end(), v.begin(), v.end());
  }
  return d;
}

SearchRun TimeSearches(const IndexData& d, const SearchFn& search) {
  SearchRun run;
  std::vector<double> us;
  us.reserve(d.query_count());
  run.answers.reserve(d.query_count());
  for (size_t q = 0; q < d.query_count(); ++q) {
    const auto t0 = SteadyClock::now();
    run.answers.push_back(search(d.query(q)));
    us.push_back(MicrosSince(t0));
  }
  run.latency = Summarize(&us);
  return run;
}

double RecallOf(const std::vector<std::vector<uint64_t>>& got,
                const std::vector<std::vector<uint64_t>>& truth) {
  uint64_t hits = 0, wanted = 0;
  for (size_t q = 0; q < truth.size() && q < got.size(); ++q) {
    wanted += truth[q].size();
    for (uint64_t id : truth[q]) {
      hits += std::count(got[q].begin(), got[q].end(), id) > 0;
    }
  }
  return wanted ? double(hits) / wanted : 1.0;
}

}  // namespace kvmem

// Percentiles, the one definition kvmem reports them by (stats, eval,
// benchmarks, the CLI): the q-quantile of n values is the value of rank
// floor(q * n) among them sorted ascending (0-based), the largest when that
// rank is n or more; 0 for no values. So p50 of {1, 2, 3, 4} is 3 and p99 of
// 100 values is the 100th. Pure functions, safe from any thread.
#ifndef KVMEM_BASE_PERCENTILE_H_
#define KVMEM_BASE_PERCENTILE_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvmem {

// The rank Percentile takes for q (in [0, 1]) of n > 0 values. q * n is
// nudged up by 1e-9 so that q = 0.99 of 100 values is rank 99, as in exact
// arithmetic, not 98 (0.99 * 100 is 98.999... in binary).
inline size_t PercentileRank(double q, size_t n) {
  const double r = q * static_cast<double>(n) + 1e-9;
  if (!(r > 0)) return 0;
  return std::min(n - 1, static_cast<size_t>(r));
}

// The q-quantile (q in [0, 1]) of values; values is taken by copy and
// partially reordered.
template <typename T>
T Percentile(std::vector<T> values, double q) {
  if (values.empty()) return T{};
  const size_t i = PercentileRank(q, values.size());
  std::nth_element(values.begin(), values.begin() + i, values.end());
  return values[i];
}

// The same over values already sorted ascending.
template <typename T>
T SortedPercentile(const std::vector<T>& sorted, double q) {
  return sorted.empty() ? T{} : sorted[PercentileRank(q, sorted.size())];
}

}  // namespace kvmem

#endif  // KVMEM_BASE_PERCENTILE_H_

// Timing single-query top-k searches over block summaries: the one loop
// `kvmem bench` (its in-process index figures) and kvmem_index_bench (FAISS
// kinds side by side) both measure with.
#ifndef KVMEM_TOOLS_BENCH_INDEX_TIMING_H_
#define KVMEM_TOOLS_BENCH_INDEX_TIMING_H_

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "tools/bench/bench.h"

namespace kvmem {

// n values drawn from N(0, 1) by a fresh distribution over rng.
std::vector<float> Gaussian(std::mt19937_64& rng, size_t n);

// Random N(0, 1) summaries and queries: the hardest case for pruning (no
// structure). Vectors are drawn base first, then queries, each from a fresh
// distribution over one generator seeded with `seed`.
struct IndexData {
  uint32_t dim = 0;
  std::vector<float> base, queries;  // Row-major, dim floats per vector.
  size_t size() const { return dim ? base.size() / dim : 0; }
  size_t query_count() const { return dim ? queries.size() / dim : 0; }
  const float* vector(size_t i) const { return base.data() + i * dim; }
  const float* query(size_t q) const { return queries.data() + q * dim; }
};
IndexData RandomIndexData(uint32_t n, uint32_t dim, uint32_t queries,
                          uint64_t seed);

// A search: the ids of a query's top k, best first.
using SearchFn = std::function<std::vector<uint64_t>(const float* query)>;

struct SearchRun {
  Latency latency;  // Per query.
  std::vector<std::vector<uint64_t>> answers;
};
// Every query once, one at a time, in its own loop (warm caches, as a server
// answering recalls back to back).
SearchRun TimeSearches(const IndexData& d, const SearchFn& search);

// The share of truth's ids that got found, over all queries (1 when truth
// is empty).
double RecallOf(const std::vector<std::vector<uint64_t>>& got,
                const std::vector<std::vector<uint64_t>>& truth);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_INDEX_TIMING_H_

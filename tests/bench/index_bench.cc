// Single-query top-16 search over block summaries: FAISS Flat (exact), HNSW32
// (efSearch 64), SQ8 (8-bit scalar quantizer), and kvmem's progressive
// int8 -> fp32 search, at 10,800 and 100,000 summaries of dim 128 (one and
// ten camera-hours of 3 fps, one summary per frame). Random N(0,1) data: the
// hardest case for pruning (no structure). Each reports p50/p99 latency per
// query and recall@16 against exact top-16 of the same queries.
//
//   build/bin/kvmem_index_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexScalarQuantizer.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "engine/index/progressive_search.h"

namespace kvmem {
namespace {

constexpr int kDim = 128, kK = 16, kQueries = 200;

struct Data {
  std::vector<float> base, queries;
  std::vector<std::vector<int64_t>> truth;  // Exact top-k ids per query.
};

const Data& GetData(int n) {
  static std::map<int, Data> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  Data d;
  std::mt19937_64 rng(n);
  std::normal_distribution<float> g(0.0f, 1.0f);
  d.base.resize(size_t(n) * kDim);
  for (auto& x : d.base) x = g(rng);
  d.queries.resize(size_t(kQueries) * kDim);
  for (auto& x : d.queries) x = g(rng);
  faiss::IndexFlatIP flat(kDim);
  flat.add(n, d.base.data());
  std::vector<float> s(kK);
  std::vector<faiss::Index::idx_t> ids(kK);
  for (int q = 0; q < kQueries; ++q) {
    flat.search(1, d.queries.data() + size_t(q) * kDim, kK, s.data(),
                ids.data());
    d.truth.emplace_back(ids.begin(), ids.end());
  }
  return cache.emplace(n, std::move(d)).first->second;
}

// Runs one query per iteration, round robin; reports p50/p99 and recall@16.
template <typename SearchFn>
void Measure(benchmark::State& state, const Data& d, SearchFn search) {
  std::vector<double> us;
  double hits = 0, total = 0;
  int q = 0;
  for (auto _ : state) {
    const float* query = d.queries.data() + size_t(q) * kDim;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int64_t> got = search(query);
    us.push_back(std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
    const std::set<int64_t> want(d.truth[q].begin(), d.truth[q].end());
    for (int64_t id : got) hits += want.count(id);
    total += kK;
    q = (q + 1) % kQueries;
  }
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  state.counters["recall_at_16"] = hits / total;
}

std::vector<int64_t> FaissSearch(const faiss::Index& index, const float* q) {
  std::vector<float> s(kK);
  std::vector<faiss::Index::idx_t> ids(kK);
  index.search(1, q, kK, s.data(), ids.data());
  return {ids.begin(), ids.end()};
}

void BM_Flat(benchmark::State& state) {
  omp_set_num_threads(1);
  const Data& d = GetData(state.range(0));
  faiss::IndexFlatIP index(kDim);
  index.add(state.range(0), d.base.data());
  Measure(state, d, [&](const float* q) { return FaissSearch(index, q); });
}

void BM_HNSW32(benchmark::State& state) {
  omp_set_num_threads(1);
  const Data& d = GetData(state.range(0));
  faiss::IndexHNSWFlat index(kDim, 32, faiss::METRIC_INNER_PRODUCT);
  index.hnsw.efSearch = 64;
  omp_set_num_threads(2);  // Building is not what is measured.
  index.add(state.range(0), d.base.data());
  omp_set_num_threads(1);
  Measure(state, d, [&](const float* q) { return FaissSearch(index, q); });
}

void BM_SQ8(benchmark::State& state) {
  omp_set_num_threads(1);
  const Data& d = GetData(state.range(0));
  faiss::IndexScalarQuantizer index(kDim, faiss::ScalarQuantizer::QT_8bit,
                                    faiss::METRIC_INNER_PRODUCT);
  index.train(state.range(0), d.base.data());
  index.add(state.range(0), d.base.data());
  Measure(state, d, [&](const float* q) { return FaissSearch(index, q); });
}

void BM_Progressive(benchmark::State& state) {
  const Data& d = GetData(state.range(0));
  ProgressiveIndex index(kDim);
  for (int64_t i = 0; i < state.range(0); ++i)
    index.Add(i, d.base.data() + size_t(i) * kDim);
  double candidates = 0;
  int64_t n = 0;
  Measure(state, d, [&](const float* q) {
    ProgressiveStats st;
    std::vector<int64_t> ids;
    for (const ScoredId& h : index.Search(q, kK, &st)) ids.push_back(h.id);
    candidates += st.candidates;
    ++n;
    return ids;
  });
  state.counters["fp32_candidates"] = n ? candidates / n : 0;
}

BENCHMARK(BM_Flat)->Arg(10800)->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HNSW32)->Arg(10800)->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SQ8)->Arg(10800)->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Progressive)
    ->Arg(10800)
    ->Arg(100000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvmem

BENCHMARK_MAIN();

// kvmem_index_bench: single-query top-16 search over block summaries, kvmem's
// progressive int8 -> fp32 index beside FAISS Flat (exact), HNSW32
// (efSearch 64) and SQ8 (8-bit scalar quantizer), at 10,800 and 100,000
// summaries of dim 128 (one and ten camera-hours at 3 fps, one summary per
// frame), on random N(0,1) data: the hardest case for pruning. Per kind:
// p50/p99 per query and recall@16 against Flat's answers, measured with the
// same loop as `kvmem bench` (tools/bench/index_timing.h).
//
//   build/bin/kvmem_index_bench [--sizes=10800,100000] [--queries=200]
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexScalarQuantizer.h>
#include <omp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/index/int8_kernels.h"
#include "engine/index/progressive_search.h"
#include "tools/bench/bench_inproc.h"
#include "tools/bench/index_timing.h"

ABSL_FLAG(std::string, sizes, "10800,100000",
          "summaries per index, comma-separated");
ABSL_FLAG(uint32_t, queries, 200, "queries per index");
ABSL_FLAG(uint32_t, k, 16, "top k");
ABSL_FLAG(std::string, kinds, "Flat,HNSW32,SQ8,Progressive",
          "indexes to time beside Flat (always timed: the recall reference); "
          "building HNSW32 over 100,000 summaries takes minutes");

namespace kvmem {
namespace {

constexpr uint32_t kDim = 128;

SearchFn FaissSearch(const faiss::Index& index, uint32_t k) {
  return [&index, k](const float* q) {
    std::vector<float> s(k);
    std::vector<faiss::Index::idx_t> ids(k);
    index.search(1, q, k, s.data(), ids.data());
    return std::vector<uint64_t>(ids.begin(), ids.end());
  };
}

void Row(const char* kind, uint32_t n, const SearchRun& run,
         const SearchRun& exact, double fp32_candidates) {
  std::printf("%-12s %8u %10.1f %10.1f %10.3f", kind, n, run.latency.p50_us,
              run.latency.p99_us, RecallOf(run.answers, exact.answers));
  if (fp32_candidates >= 0) std::printf(" %10.1f", fp32_candidates);
  std::printf("\n");
}

bool Wanted(const char* kind) {
  for (absl::string_view k : absl::StrSplit(absl::GetFlag(FLAGS_kinds), ',')) {
    if (k == kind) return true;
  }
  return false;
}

void RunSize(uint32_t n, uint32_t queries, uint32_t k) {
  const IndexData d = RandomIndexData(n, kDim, queries, n);
  const std::vector<float>& base = d.base;
  omp_set_num_threads(1);  // Single-query search, as a server runs it.
  faiss::IndexFlatIP flat(kDim);
  flat.add(n, base.data());
  const SearchRun exact = TimeSearches(d, FaissSearch(flat, k));
  Row("Flat", n, exact, exact, -1);
  if (Wanted("HNSW32")) {
    faiss::IndexHNSWFlat hnsw(kDim, 32, faiss::METRIC_INNER_PRODUCT);
    hnsw.hnsw.efSearch = 64;
    omp_set_num_threads(2);  // Building is not what is measured.
    hnsw.add(n, base.data());
    omp_set_num_threads(1);
    Row("HNSW32", n, TimeSearches(d, FaissSearch(hnsw, k)), exact, -1);
  }
  if (Wanted("SQ8")) {
    faiss::IndexScalarQuantizer sq8(kDim, faiss::ScalarQuantizer::QT_8bit,
                                    faiss::METRIC_INNER_PRODUCT);
    sq8.train(n, base.data());
    sq8.add(n, base.data());
    Row("SQ8", n, TimeSearches(d, FaissSearch(sq8, k)), exact, -1);
  }
  if (!Wanted("Progressive")) return;
  ProgressiveIndex prog(kDim);
  for (uint32_t i = 0; i < n; ++i) prog.Add(i, d.vector(i));
  uint64_t candidates = 0;
  const SearchRun p = TimeSearches(d, [&](const float* q) {
    ProgressiveStats st;
    std::vector<uint64_t> ids;
    for (const ScoredId& h : prog.Search(q, k, &st)) ids.push_back(h.id);
    candidates += st.candidates;
    return ids;
  });
  Row("Progressive", n, p, exact, double(candidates) / queries);
}

}  // namespace
}  // namespace kvmem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::printf("cpu: %s; int8 kernel: %s\n", kvmem::CpuModel().c_str(),
              kvmem::ActiveInt8Kernel().name.c_str());
  std::printf("%-12s %8s %10s %10s %10s %10s\n", "index", "vectors", "p50_us",
              "p99_us", "recall@k", "fp32_cand");
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0) {
      std::fprintf(stderr, "--sizes: \"%s\" is not a count\n",
                   std::string(s).c_str());
      return 2;
    }
    kvmem::RunSize(n, absl::GetFlag(FLAGS_queries), absl::GetFlag(FLAGS_k));
  }
  return 0;
}

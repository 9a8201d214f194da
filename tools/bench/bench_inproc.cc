#include "tools/bench/bench_inproc.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <vector>

#include "base/timing.h"
#include "engine/codec/dtype.h"
#include "engine/index/block_index.h"
#include "engine/index/progressive_search.h"
#include "engine/memory_engine.h"
#include "storage/rocks_cold_store.h"
#include "tools/bench/index_timing.h"

namespace kvmem {
namespace {

using Clock = SteadyClock;

}  // namespace

void InprocIndex(uint32_t n, uint32_t dim, uint32_t k, uint32_t queries,
                 uint64_t seed, Latency* prog_lat, Latency* flat_lat,
                 double* recall, double* candidates) {
  const IndexData d = RandomIndexData(n, dim, queries, seed);
  BlockIndex flat(dim, "Flat");
  ProgressiveIndex prog(dim);
  for (uint32_t i = 0; i < n; ++i) {
    flat.Add(i, d.vector(i));
    prog.Add(i, d.vector(i));
  }
  auto ids_of = [](const std::vector<ScoredId>& hits) {
    std::vector<uint64_t> ids;
    ids.reserve(hits.size());
    for (const ScoredId& h : hits) ids.push_back(h.id);
    return ids;
  };
  uint64_t rescored = 0;
  const SearchRun p = TimeSearches(d, [&](const float* q) {
    ProgressiveStats st;
    std::vector<ScoredId> hits = prog.Search(q, k, &st);
    rescored += st.candidates;
    return ids_of(hits);
  });
  const SearchRun f = TimeSearches(
      d, [&](const float* q) { return ids_of(flat.Search(q, k)); });
  *prog_lat = p.latency;
  *flat_lat = f.latency;
  if (recall != nullptr) *recall = RecallOf(p.answers, f.answers);
  if (candidates != nullptr) *candidates = double(rescored) / queries;
}

absl::Status InprocStreamRecall(const BenchOptions& o, Latency* mass,
                                Latency* summed) {
  RocksColdStoreOptions so;
  so.path = o.scratch_dir + "/stream-recall";
  auto store = OpenRocksColdStore(so);
  if (!store.ok()) return store.status();
  auto engine = MemoryEngine::Open(std::move(*store));
  if (!engine.ok()) return engine.status();
  const uint32_t heads = std::max<uint32_t>(1, o.inproc_dim / 64);
  StreamConfig c;
  c.geometry = {2, heads, 64, DType::kFp16, 4};
  c.hot_window_tokens = 64;
  c.frames_per_block = 1;
  c.indexed_layers = {0};
  c.index_factory = "Progressive";
  const std::pair<const char*, ScoreMode> streams[] = {
      {"mass", ScoreMode::kMass}, {"summed", ScoreMode::kSummed}};
  for (const auto& [id, score] : streams) {
    c.weights.score = score;
    if (auto st = (*engine)->OpenStream(id, c); !st.ok()) return st.status();
  }
  std::mt19937_64 rng(o.seed + 7);
  const size_t values = 2 * 2 * heads * 4 * 64;  // 2 layers, K+V, 4 tokens.
  for (uint32_t i = 0; i < o.inproc_vectors + 16; ++i) {
    Frame f;
    f.index = i;
    f.first_token_position = i * 4;
    f.token_count = 4;
    const std::vector<float> kv = Gaussian(rng, values);
    f.payload.resize(values * 2);
    EncodeFromFloat(kv.data(), values, DType::kFp16,
                    reinterpret_cast<uint8_t*>(f.payload.data()));
    for (const auto& [id, score] : streams) {
      if (auto st = (*engine)->Append(id, f); !st.ok()) return st.status();
    }
  }
  (*engine)->WaitForBackground();
  std::vector<double> a, b;
  for (uint32_t q = 0; q < o.inproc_queries; ++q) {
    RecallQuery rq;
    rq.query = Gaussian(rng, heads * 64);
    for (const auto& [id, lat] :
         {std::pair<const char*, std::vector<double>*>{"mass", &a},
          {"summed", &b}}) {
      const auto t0 = Clock::now();
      auto r = (*engine)->Recall(id, rq);
      lat->push_back(MicrosSince(t0));
      if (!r.ok()) return r.status();
    }
  }
  *mass = Summarize(&a);
  *summed = Summarize(&b);
  return absl::OkStatus();
}

absl::Status InprocTokenRecall(const BenchOptions& o, Latency* tokens,
                               Latency* groups, double* tokens_scored) {
  RocksColdStoreOptions so;
  so.path = o.scratch_dir + "/token-recall";
  auto store = OpenRocksColdStore(so);
  if (!store.ok()) return store.status();
  auto engine = MemoryEngine::Open(std::move(*store));
  if (!engine.ok()) return engine.status();
  const uint32_t heads = std::max<uint32_t>(1, o.inproc_dim / 64);
  constexpr uint32_t kTokens = 16;
  StreamConfig c;
  c.geometry = {2, heads, 64, DType::kFp16, kTokens};
  c.hot_window_tokens = 256;
  c.frames_per_block = 1;
  c.indexed_layers = {0};
  c.groups_per_block = 4;
  c.weights.score = ScoreMode::kMass;
  const char* const scorers[] = {"mass", "mass_groups"};
  for (const char* id : scorers) {
    c.weights.scorer = id;
    if (auto st = (*engine)->OpenStream(id, c); !st.ok()) return st.status();
  }
  std::mt19937_64 rng(o.seed + 11);
  const size_t values = 2 * 2 * heads * kTokens * 64;  // 2 layers, K+V.
  for (uint32_t i = 0; i < o.inproc_vectors + 16; ++i) {
    Frame f;
    f.index = i;
    f.first_token_position = uint64_t{i} * kTokens;
    f.token_count = kTokens;
    const std::vector<float> kv = Gaussian(rng, values);
    f.payload.resize(values * 2);
    EncodeFromFloat(kv.data(), values, DType::kFp16,
                    reinterpret_cast<uint8_t*>(f.payload.data()));
    for (const char* id : scorers) {
      if (auto st = (*engine)->Append(id, f); !st.ok()) return st.status();
    }
  }
  (*engine)->WaitForBackground();
  std::vector<double> a, b;
  double scored = 0;
  for (uint32_t q = 0; q < o.inproc_queries; ++q) {
    RecallQuery rq;
    rq.query = Gaussian(rng, heads * 64);
    rq.max_tokens = 64;
    for (const auto& [id, lat] :
         {std::pair<const char*, std::vector<double>*>{"mass", &a},
          {"mass_groups", &b}}) {
      const auto t0 = Clock::now();
      auto r = (*engine)->Recall(id, rq);
      lat->push_back(MicrosSince(t0));
      if (!r.ok()) return r.status();
      if (lat == &a) scored += static_cast<double>(r->tokens_scored);
    }
  }
  *tokens = Summarize(&a);
  *groups = Summarize(&b);
  *tokens_scored = o.inproc_queries > 0 ? scored / o.inproc_queries : 0;
  return absl::OkStatus();
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  }
  return "";
}

}  // namespace kvmem

#include "tools/bench/bench_inproc.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <vector>

#include "engine/codec/dtype.h"
#include "engine/index/block_index.h"
#include "engine/index/progressive_search.h"
#include "engine/memory_engine.h"
#include "storage/rocks_cold_store.h"

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::vector<float> Gaussian(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

}  // namespace

void InprocIndex(uint32_t n, uint32_t dim, uint32_t k, uint32_t queries,
                 uint64_t seed, Latency* prog_lat, Latency* flat_lat,
                 double* recall, double* candidates) {
  std::mt19937_64 rng(seed);
  BlockIndex flat(dim, "Flat");
  ProgressiveIndex prog(dim);
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<float> v = Gaussian(rng, dim);
    flat.Add(i, v.data());
    prog.Add(i, v.data());
  }
  std::vector<std::vector<float>> qs;
  for (uint32_t q = 0; q < queries; ++q) qs.push_back(Gaussian(rng, dim));
  std::vector<double> a, b;
  std::vector<std::vector<ScoredId>> got, want;
  uint64_t rescored = 0;
  for (const auto& query : qs) {
    const auto t0 = Clock::now();
    ProgressiveStats st;
    got.push_back(prog.Search(query.data(), k, &st));
    a.push_back(MicrosSince(t0));
    rescored += st.candidates;
  }
  for (const auto& query : qs) {
    const auto t0 = Clock::now();
    want.push_back(flat.Search(query.data(), k));
    b.push_back(MicrosSince(t0));
  }
  uint64_t hits = 0, wanted = 0;
  for (size_t q = 0; q < qs.size(); ++q) {
    wanted += want[q].size();
    for (const ScoredId& w : want[q]) {
      hits += std::any_of(got[q].begin(), got[q].end(),
                          [&](const ScoredId& g) { return g.id == w.id; });
    }
  }
  *prog_lat = Summarize(&a);
  *flat_lat = Summarize(&b);
  if (recall != nullptr) *recall = wanted ? double(hits) / wanted : 1.0;
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

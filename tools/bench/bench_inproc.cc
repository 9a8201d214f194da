#include "tools/bench/bench_inproc.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status_macros.h"
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

namespace {

// An engine over a RocksDB store in o.scratch_dir/sub.
absl::StatusOr<std::unique_ptr<MemoryEngine>> ScratchEngine(
    const BenchOptions& o, const std::string& sub) {
  RocksColdStoreOptions so;
  so.path = o.scratch_dir + "/" + sub;
  auto store = OpenRocksColdStore(so);
  if (!store.ok()) return store.status();
  return MemoryEngine::Open(std::move(*store));
}

// inproc_vectors + 16 random frames of `tokens` tokens (2 layers of
// `heads` x 64, fp16) into every stream of `ids`, then the background
// work settled.
absl::Status AppendRandomFrames(const BenchOptions& o, MemoryEngine* engine,
                                const std::vector<std::string>& ids,
                                uint32_t heads, uint32_t tokens,
                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t values = size_t{2} * 2 * heads * tokens * 64;  // K+V.
  for (uint32_t i = 0; i < o.inproc_vectors + 16; ++i) {
    Frame f;
    f.index = i;
    f.first_token_position = uint64_t{i} * tokens;
    f.token_count = tokens;
    const std::vector<float> kv = Gaussian(rng, values);
    f.payload.resize(values * 2);
    EncodeFromFloat(kv.data(), values, DType::kFp16,
                    reinterpret_cast<uint8_t*>(f.payload.data()));
    for (const std::string& id : ids) {
      if (auto st = engine->Append(id, f); !st.ok()) return st.status();
    }
  }
  engine->WaitForBackground();
  return absl::OkStatus();
}

// inproc_queries random queries, each recalled from streams a then b (the
// same machine state for both); each response passed to *seen (may be
// empty) with the stream's index.
absl::Status AlternateRecalls(
    const BenchOptions& o, MemoryEngine* engine, const std::string& a,
    const std::string& b, uint32_t dim, uint32_t max_tokens, uint64_t seed,
    Latency* la, Latency* lb,
    const std::function<void(int, const RecallResult&)>& seen) {
  std::mt19937_64 rng(seed);
  std::vector<double> us[2];
  for (uint32_t q = 0; q < o.inproc_queries; ++q) {
    RecallQuery rq;
    rq.query = Gaussian(rng, dim);
    rq.max_tokens = max_tokens;
    for (int k = 0; k < 2; ++k) {
      const auto t0 = Clock::now();
      auto r = engine->Recall(k == 0 ? a : b, rq);
      us[k].push_back(MicrosSince(t0));
      if (!r.ok()) return r.status();
      if (seen) seen(k, *r);
    }
  }
  *la = Summarize(&us[0]);
  *lb = Summarize(&us[1]);
  return absl::OkStatus();
}

}  // namespace

absl::Status InprocStreamRecall(const BenchOptions& o, Latency* mass,
                                Latency* summed) {
  auto engine = ScratchEngine(o, "stream-recall");
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
  KVMEM_RETURN_IF_ERROR(AppendRandomFrames(o, engine->get(), {"mass", "summed"},
                                           heads, 4, o.seed + 7));
  // The default budget (0: the stream's).
  return AlternateRecalls(o, engine->get(), "mass", "summed", heads * 64, 0,
                          o.seed + 8, mass, summed, nullptr);
}

absl::Status InprocTokenRecall(const BenchOptions& o, Latency* tokens,
                               Latency* groups, double* tokens_scored) {
  auto engine = ScratchEngine(o, "token-recall");
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
  for (const char* id : {"mass", "mass_groups"}) {
    c.weights.scorer = id;
    if (auto st = (*engine)->OpenStream(id, c); !st.ok()) return st.status();
  }
  KVMEM_RETURN_IF_ERROR(AppendRandomFrames(
      o, engine->get(), {"mass", "mass_groups"}, heads, kTokens, o.seed + 11));
  double scored = 0;
  KVMEM_RETURN_IF_ERROR(AlternateRecalls(
      o, engine->get(), "mass", "mass_groups", heads * 64, 64, o.seed + 12,
      tokens, groups, [&](int k, const RecallResult& r) {
        if (k == 0) scored += static_cast<double>(r.tokens_scored);
      }));
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

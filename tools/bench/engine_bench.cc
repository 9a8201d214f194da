// Engine pieces one at a time (Google Benchmark): the recall planner, the
// shot segmenter, int8 degradation of a block's layer and its inverse,
// frame encode/decode between fp32 and fp16, block record encode/decode,
// the int8 kernel per dispatch level, and RocksDB puts/gets per block size
// through the cold store. Each prints a rate (items or bytes per second);
// the kernel benchmarks compare against each other in the same run.
//
//   build/bin/kvmem_engine_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "base/crc32c.h"
#include "base/percentile.h"
#include "base/timing.h"
#include "engine/codec/dtype.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/quantize.h"
#include "engine/codec/record_codec.h"
#include "engine/index/block_index.h"
#include "engine/index/int8_kernels.h"
#include "engine/index/token_codes.h"
#include "engine/memory_engine.h"
#include "engine/recall/fast_exp.h"
#include "engine/recall/mass_rows.h"
#include "engine/recall/recall_planner.h"
#include "engine/recall/token_groups.h"
#include "engine/recall/token_lanes.h"
#include "engine/stream/segmenter.h"
#include "engine/stream_config.h"
#include "server/ops/metrics.h"
#include "storage/rocks_cold_store.h"
#include "tests/test_util.h"
#include "tools/common/demo_workload.h"

namespace kvmem {
namespace {

// n random N(0,1) values as fp16 bytes.
std::string Fp16Of(std::mt19937_64& rng, size_t n) {
  const std::vector<float> f = testing::RandomQuery(rng, n);
  std::string out(n * 2, '\0');
  EncodeFromFloat(f.data(), n, DType::kFp16,
                  reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// A 4-layer, 2-head, 64-dim fp16 geometry (2 KiB of KV per token).
Geometry BenchGeometry() { return {4, 2, 64, DType::kFp16, 128}; }

// RecallPlanner::PlanBlocks over N candidate blocks of 32 tokens, budget
// 512, no top_k cap (ranking included).
void BM_RecallPlanner(benchmark::State& state) {
  std::mt19937_64 rng(1);
  std::vector<PlanUnit> units(state.range(0));
  std::uniform_real_distribution<float> u(0, 1);
  for (size_t i = 0; i < units.size(); ++i) units[i] = {i, 0, 32, u(rng), 0};
  PlanPolicy policy;
  policy.mode = ScoreMode::kSummed;
  policy.max_tokens = 512;
  for (auto _ : state) {
    benchmark::DoNotOptimize(RecallPlanner::PlanBlocks(policy, units));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// One CutBefore + Add per frame on 256-float signatures (shot mode).
void BM_Segmenter(benchmark::State& state) {
  StreamConfig c;
  c.geometry = BenchGeometry();
  c.segment_mode = SegmentMode::kShot;
  c.frames_per_block = 8;
  c = WithDefaults(c);
  Segmenter seg(c);
  std::mt19937_64 rng(2);
  std::vector<std::vector<float>> sigs;
  for (int i = 0; i < 64; ++i) sigs.push_back(testing::RandomQuery(rng, 256));
  uint32_t open = 0;
  size_t i = 0;
  for (auto _ : state) {
    const auto& s = sigs[i++ % sigs.size()];
    if (seg.CutBefore(s, 32, open, open * 32) != Segmenter::Cut::kNone) {
      seg.Reset();
      open = 0;
    }
    seg.Add(s);
    ++open;
  }
  state.SetItemsProcessed(state.iterations());
}

// One layer of a block: int8 per-channel quantisation (the degraded tier and
// cold_precision INT8) or int4 KIVI-style (cold_precision INT4), and back.
// Args: tokens, kv_heads x head_dim (2 x 64, or a 7B model's 8 x 128), int4.
Geometry LayerGeometry(const benchmark::State& state) {
  return state.range(1) == 1024 ? Geometry{32, 8, 128, DType::kFp16, 128}
                                : BenchGeometry();
}

void BM_DegradeLayer(benchmark::State& state) {
  const Geometry g = LayerGeometry(state);
  const uint32_t tokens = state.range(0);
  const bool int4 = state.range(2) != 0;
  std::mt19937_64 rng(3);
  const std::string layer =
      Fp16Of(rng, 2ull * g.kv_heads * tokens * g.head_dim);
  for (auto _ : state) {
    benchmark::DoNotOptimize(int4 ? QuantizeLayerInt4(g, tokens, layer)
                                  : QuantizeLayer(g, tokens, layer));
  }
  state.SetBytesProcessed(state.iterations() * layer.size());
}

// What an append of a stream with tier_policy.ingest_precision pays on top
// of a full-precision one's: its rows encoded and decoded back (arg: int4),
// 7B rows (head_dim 128, fp16), 1 MiB of them; bytes are the frame's.
void BM_IngestRoundTrip(benchmark::State& state) {
  const Geometry g{32, 8, 128, DType::kFp16, 128};
  const ColdPrecision p =
      state.range(0) != 0 ? ColdPrecision::kInt4 : ColdPrecision::kInt8;
  std::mt19937_64 rng(3);
  const std::string rows = Fp16Of(rng, 512 * 1024);
  std::string enc, dec;
  for (auto _ : state) {
    EncodeFrameRows(g, p, rows, &enc);
    benchmark::DoNotOptimize(DecodeFrameRows(g, p, enc, &dec).ok());
  }
  state.SetBytesProcessed(state.iterations() * rows.size());
}

void BM_RestoreLayer(benchmark::State& state) {
  const Geometry g = LayerGeometry(state);
  const uint32_t tokens = state.range(0);
  const bool int4 = state.range(2) != 0;
  std::mt19937_64 rng(3);
  const std::string layer =
      Fp16Of(rng, 2ull * g.kv_heads * tokens * g.head_dim);
  const std::string q = int4 ? QuantizeLayerInt4(g, tokens, layer)
                             : QuantizeLayer(g, tokens, layer);
  for (auto _ : state) {
    benchmark::DoNotOptimize(int4 ? DequantizeLayerInt4(g, tokens, q)
                                  : DequantizeLayer(g, tokens, q));
  }
  state.SetBytesProcessed(state.iterations() * layer.size());
}

// A 256 KiB frame (128 tokens) between fp32 and fp16.
void BM_FrameEncodeFp16(benchmark::State& state) {
  std::mt19937_64 rng(4);
  const std::vector<float> f = testing::RandomQuery(rng, 128 * 1024);
  std::vector<uint8_t> out(f.size() * 2);
  for (auto _ : state) {
    EncodeFromFloat(f.data(), f.size(), DType::kFp16, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * out.size());
}

void BM_FrameDecodeFp16(benchmark::State& state) {
  std::mt19937_64 rng(4);
  const std::vector<float> f = testing::RandomQuery(rng, 128 * 1024);
  std::vector<uint8_t> enc(f.size() * 2);
  EncodeFromFloat(f.data(), f.size(), DType::kFp16, enc.data());
  std::vector<float> out(f.size());
  for (auto _ : state) {
    DecodeToFloat(enc.data(), f.size(), DType::kFp16, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * enc.size());
}

// A block record with 8 groups of 256-float summaries.
void BM_BlockRecordCodec(benchmark::State& state) {
  std::mt19937_64 rng(5);
  BlockRecord b;
  b.info.id = 7;
  b.info.token_count = 128;
  b.summary = testing::RandomQuery(rng, 256);
  b.group_summaries = testing::RandomQuery(rng, 8 * 256);
  b.token_group.assign(128, 3);
  for (auto _ : state) {
    auto d = DecodeBlock(EncodeBlock(b));
    benchmark::DoNotOptimize(d);
  }
  state.SetItemsProcessed(state.iterations());
}

// CRC32C (base/crc32c.h: the layer records' trailer, checked on every cold
// read) over arg 0 bytes: below 12 KiB it runs as one stream, from there as
// three folded together; "scalar" is the table-driven definition.
void BM_Crc32c(benchmark::State& state) {
  std::vector<uint8_t> buf(static_cast<size_t>(state.range(0)));
  std::mt19937_64 rng(9);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  const bool scalar = state.range(1) != 0;
  uint32_t crc = 0;
  for (auto _ : state) {
    crc = scalar ? Crc32cScalar(buf.data(), buf.size(), crc)
                 : Crc32c(buf.data(), buf.size(), crc);
    benchmark::DoNotOptimize(crc);
  }
  state.SetLabel(scalar ? "scalar" : Crc32cKernel());
  state.SetBytesProcessed(state.iterations() * buf.size());
}
BENCHMARK(BM_Crc32c)
    ->Args({8 << 10, 0})
    ->Args({1 << 20, 0})
    ->Args({12 << 20, 0})
    ->Args({1 << 20, 1});

// The int8 kernel, per dispatch level (arg 0), over 10,800 codes of dim
// 128 (one query term) or 1024 (arg 1; two terms, as searches use there).
// Bytes/s of codes read is the figure: the scan's floor is size / rate.
void BM_Int8Kernel(benchmark::State& state) {
  const auto& kernels = AvailableInt8Kernels();
  if (static_cast<size_t>(state.range(0)) >= kernels.size()) {
    state.SkipWithError("kernel not available on this CPU");
    return;
  }
  const Int8KernelInfo& k = kernels[state.range(0)];
  const size_t n = 10800, groups = state.range(1) / 4;
  const bool two_terms = groups * 4 >= kTwoTermMinDim;
  state.SetLabel(k.name + (two_terms ? " two terms" : " one term"));
  std::vector<uint8_t> packed(n / 8 * groups * 32, 100);
  std::vector<int8_t> q(groups * 4, -5), lo(groups * 4, 3);
  std::vector<int32_t> out(n);
  for (auto _ : state) {
    k.fn(packed.data(), n / 8, groups, q.data(),
         two_terms ? lo.data() : nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * packed.size());
}

// The token-code kernel, per dispatch level (arg 0), over 6,144 token
// records (the eval's pool: 8x a 614-token budget, 2 indexed layers x 4 KV
// heads) of head_dim arg 1 against arg 2 query vectors; arg 3 = 1: the
// records are runs of 8 tokens at random places of 6 copies of their codes
// (36,864 records, 10 MiB at head_dim 64; a 5-minute eval camera's codes
// are 8 MiB), one
// kernel call per run with the next run prefetched, as the token stage
// reads its pool (engine/recall/token_stage.cc); 0: one call over 6,144
// consecutive records. The figures: tokens scored per second, and
// 64-dimension dots per second (dots_per_s).
void BM_TokenKernel(benchmark::State& state) {
  const auto& kernels = AvailableTokenKernels();
  if (static_cast<size_t>(state.range(0)) >= kernels.size()) {
    state.SkipWithError("kernel not available on this CPU");
    return;
  }
  const TokenKernelInfo& k = kernels[state.range(0)];
  const TokenCodeShape shape{8, static_cast<uint32_t>(state.range(1))};
  const uint32_t vectors = static_cast<uint32_t>(state.range(2));
  const bool scattered = state.range(3) != 0;
  const size_t n = 6144, run = 8, copies = scattered ? 6 : 1, all = copies * n;
  std::mt19937_64 rng(4);
  std::normal_distribution<float> g;
  std::vector<float> keys(n * shape.segments * shape.head_dim);
  for (float& x : keys) x = g(rng);
  std::string codes;  // Scattered: 6 copies of n tokens' codes.
  const std::string one = EncodeTokenCodes(shape, keys.data(), n);
  for (size_t c = 0; c < copies; ++c) codes += one;
  const auto* base = reinterpret_cast<const uint8_t*>(codes.data());
  const size_t stride = shape.bytes_per_token();
  std::vector<const uint8_t*> runs;
  for (size_t r = 0; r < n / run; ++r) {
    runs.push_back(base + (scattered ? rng() % (all / run) : r) * run * stride);
  }
  std::vector<float> query(size_t{vectors} * shape.segments * shape.head_dim);
  for (float& x : query) x = g(rng);
  TokenQuery q;
  PrepareTokenQuery(shape, query.data(), vectors, &q);
  const size_t per_token = size_t{vectors} * shape.segments;
  std::vector<float> out(n * per_token);
  for (auto _ : state) {
    if (!scattered) {
      k.dots(shape, q, base, n, 0, shape.segments, out.data());
    } else {
      for (size_t r = 0; r < runs.size(); ++r) {
        if (r + 1 < runs.size()) {
          for (size_t b = 0; b < run * stride; b += 64) {
            __builtin_prefetch(runs[r + 1] + b);
          }
        }
        k.dots(shape, q, runs[r], run, 0, shape.segments,
               out.data() + r * run * per_token);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(k.name + (scattered ? " scattered runs" : " consecutive"));
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["dots_per_s"] = benchmark::Counter(
      static_cast<double>(n) * vectors * shape.segments * shape.chunks(),
      benchmark::Counter::kIsIterationInvariantRate);
}

// Cold store puts and gets of frames of N KiB, WAL on (the server's
// options), in a temp dir.
class StoreFixture {
 public:
  explicit StoreFixture(const char* name) {
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("kvmem-engine-bench-") + name);
    std::filesystem::remove_all(dir_);
    RocksColdStoreOptions o;
    o.path = dir_.string();
    store_ = *OpenRocksColdStore(o);
  }
  ~StoreFixture() {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  ColdStore& store() { return *store_; }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<ColdStore> store_;
};

void BM_StorePut(benchmark::State& state) {
  StoreFixture f("put");
  const std::string payload(state.range(0) << 10, 'k');
  uint64_t i = 0;
  for (auto _ : state) {
    StreamWrite w;
    w.stream_id = "bench";
    w.frame.emplace(i++, payload);
    if (!f.store().Commit(w).ok()) state.SkipWithError("commit failed");
  }
  state.SetBytesProcessed(state.iterations() * payload.size());
}

void BM_StoreGet(benchmark::State& state) {
  StoreFixture f("get");
  const std::string payload(state.range(0) << 10, 'k');
  const uint64_t n = 64;
  for (uint64_t i = 0; i < n; ++i) {
    StreamWrite w;
    w.stream_id = "bench";
    w.frame.emplace(i, payload);
    (void)f.store().Commit(w);
  }
  uint64_t i = 0;
  for (auto _ : state) {
    auto got = f.store().GetFrame("bench", i++ % n);
    if (!got.ok()) state.SkipWithError("get failed");
    benchmark::DoNotOptimize(got);
  }
  state.SetBytesProcessed(state.iterations() * payload.size());
}

// Bytes malloc has handed out and not had back (all arenas).
uint64_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Appends `frames` frames of `tokens` random fp16 tokens (`values` KV
// values each) to stream "cam"; false (with the benchmark's error set)
// when an append fails.
bool AppendRandomFrames(benchmark::State& state, MemoryEngine* engine,
                        uint64_t frames, uint32_t tokens, size_t values,
                        std::mt19937_64& rng) {
  for (uint64_t i = 0; i < frames; ++i) {
    Frame f;
    f.index = i;
    f.first_token_position = i * tokens;
    f.token_count = tokens;
    f.payload = Fp16Of(rng, values);
    if (!engine->Append("cam", std::move(f)).ok()) {
      state.SkipWithError("Append failed");
      return false;
    }
  }
  return true;
}

// An engine on a fresh RocksDB store in dir (emptied first), default
// store options.
std::unique_ptr<MemoryEngine> FreshEngine(const std::filesystem::path& dir,
                                          int recall_threads = 1,
                                          bool keep_frames = false) {
  std::filesystem::remove_all(dir);
  RocksColdStoreOptions so;
  so.path = dir.string();
  EngineOptions options;
  options.recall_threads = recall_threads;
  options.demote_keeps_frames = keep_frames;
  return *MemoryEngine::Open(*OpenRocksColdStore(so), options);
}

// Recalls on stream "cam", one query from next() per iteration, timed one
// by one: p50_us and p99_us counters. The first kWarmRecalls recalls of the
// fresh engine are not timed: they ran 1.3-2x slower than the rest (first
// touches of the planner's and the scan's buffers, cold caches), which is a
// stream's first second, not its steady state; with ~800 timed recalls two
// of them were a quarter of the p99's samples.
constexpr int kWarmRecalls = 8;

// Reads 96 MiB (three times this machine's L3, or more than most) so that a
// recall after it finds none of its stream in the caches: a server's recall
// between other streams' ingest and recalls, or the eval's between its
// oracle and the other policies. Returns a sum the caller keeps.
uint64_t EvictCaches() {
  static std::vector<uint64_t> junk((96u << 20) / sizeof(uint64_t), 1);
  uint64_t sum = 0;
  for (size_t i = 0; i < junk.size(); i += 8) sum += junk[i];
  return sum;
}

// cold: each timed recall follows EvictCaches (not timed).
template <typename Next>
void TimeRecalls(benchmark::State& state, MemoryEngine* engine, Next next,
                 bool cold = false) {
  for (int i = 0; i < kWarmRecalls; ++i) {
    if (!engine->Recall("cam", next()).ok()) {
      state.SkipWithError("Recall failed");
      return;
    }
  }
  std::vector<double> us;
  double search_us = 0, plan_us = 0, token_us = 0, scored = 0, calls = 0;
  uint64_t junk = 0;
  for (auto _ : state) {
    const RecallQuery q = next();
    if (cold) junk += EvictCaches();
    const auto t0 = SteadyClock::now();
    auto r = engine->Recall("cam", q);
    us.push_back(MicrosSince(t0));
    if (!r.ok()) {
      state.SkipWithError("Recall failed");
      continue;
    }
    search_us += r->search_us;
    plan_us += r->plan_us;
    token_us += r->token_us;
    scored += static_cast<double>(r->tokens_scored);
    calls += 1;
  }
  benchmark::DoNotOptimize(junk);
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = SortedPercentile(us, 0.50);
  state.counters["p99_us"] = SortedPercentile(us, 0.99);
  if (calls > 0) {
    // Means per recall: search, plan (token stage included) and the token
    // stage; tokens scored and their rate (millions per second, one core).
    state.counters["search_us"] = search_us / calls;
    state.counters["plan_us"] = plan_us / calls;
    state.counters["token_us"] = token_us / calls;
    state.counters["tokens_scored"] = scored / calls;
    if (token_us > 0) state.counters["Mtok_per_s"] = scored / token_us;
  }
}

// The stream of BM_StreamRecall and BM_AppendRebuildEveryBlock: one-frame
// blocks of 4 tokens, 2 layers x 2 KV heads x 64, layer 0 indexed with
// `factory`, a 64-token window. Every block stays warm: picking a demotion
// victim scans all blocks, which at one demotion per append would dominate
// the build.
StreamConfig OneFrameBlocksConfig(const std::string& factory) {
  StreamConfig c;
  c.geometry = {2, 2, 64, DType::kFp16, 4};
  c.hot_window_tokens = 64;
  c.frames_per_block = 1;
  c.indexed_layers = {0};
  c.index_factory = factory;
  c.tiers.warm_budget_bytes = 0;
  return c;
}

// Engine-level Recall over a stream of N sealed blocks (one 4-token frame
// per block, summary dim 128: one indexed layer of 2 heads x 64), index
// Flat (arg 1 = 0) or Progressive (1). Counters: RAM per block beyond the
// 512-byte summary (index copies, block records, maps), from the heap's
// growth (mallinfo2) less the warm payload copies; RocksDB's memtables
// (4 MiB each here) are in it too.
void BM_StreamRecall(benchmark::State& state) {
  const uint64_t n = state.range(0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-recall";
  std::filesystem::remove_all(dir);
  RocksColdStoreOptions so;
  so.path = dir.string();
  // Small memtables and cache, so RSS growth is mostly the engine's.
  so.write_buffer_bytes = 4 << 20;
  so.block_cache_bytes = 8 << 20;
  auto engine = *MemoryEngine::Open(*OpenRocksColdStore(so));
  StreamConfig c =
      OneFrameBlocksConfig(state.range(1) ? "Progressive" : "Flat");
  // Arg 2: 1 per-head mass (the default), 2 the summed score.
  c.weights.score = static_cast<ScoreMode>(state.range(2));
  if (!engine->OpenStream("cam", c).ok()) {
    state.SkipWithError("OpenStream failed");
    return;
  }
  std::mt19937_64 rng(6);
  const uint64_t heap0 = HeapInUse();
  if (!AppendRandomFrames(state, engine.get(), n + 16, 4, 2 * 2 * 2 * 4 * 64,
                          rng)) {
    return;
  }
  engine->WaitForBackground();
  // Heap growth less the warm payload copies the stats account for.
  const auto stats = engine->GetStats("cam");
  const double per_block =
      (double(HeapInUse()) - double(heap0) - double(stats->warm.bytes)) / n;
  TimeRecalls(state, engine.get(), [&] {
    RecallQuery q;
    q.query = testing::RandomQuery(rng, 128);
    q.top_k = 16;
    return q;
  });
  state.counters["ram_per_block"] = per_block;
  state.counters["beyond_summary"] = per_block - 128 * sizeof(float);
  state.SetLabel(c.index_factory +
                 (c.weights.score == ScoreMode::kMass ? " mass" : " summed"));
  engine.reset();
  std::filesystem::remove_all(dir);
}

// Appends with index rebuilds asked for after every seal (arg 1) or never
// (arg 0): 4,000 blocks of OneFrameBlocksConfig's stream, all kept,
// background work settled; the process's CPU seconds (the rebuilds run on
// the background executor), the rebuilds run, and CPU per append.
void BM_AppendRebuildEveryBlock(benchmark::State& state) {
  constexpr uint64_t kFrames = 4000;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-rebuild";
  for (auto _ : state) {
    std::unique_ptr<MemoryEngine> engine = FreshEngine(dir);
    StreamConfig c = OneFrameBlocksConfig("Progressive");
    c.tiers.rebuild_every_blocks = static_cast<uint32_t>(state.range(0));
    if (!engine->OpenStream("cam", c).ok()) {
      state.SkipWithError("OpenStream failed");
      return;
    }
    std::mt19937_64 rng(8);
    const std::clock_t c0 = std::clock();
    if (!AppendRandomFrames(state, engine.get(), kFrames, 4, 2 * 2 * 2 * 4 * 64,
                            rng)) {
      return;
    }
    engine->WaitForBackground();
    const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
    state.counters["cpu_s"] = cpu;
    state.counters["cpu_us_per_append"] = cpu * 1e6 / kFrames;
    state.counters["rebuilds"] =
        static_cast<double>(engine->GetStats("cam")->policy.rebuilds);
  }
  std::filesystem::remove_all(dir);
}

// Stream "cam" at the 7B geometry (32 x 8 x 128 fp16, 16-token frames,
// 4-frame blocks, a 64-token window, RAM for every block): 13 blocks and
// `more` frames appended, background work settled; null (the benchmark
// skipped) on an error. *config: the stream's config.
std::unique_ptr<MemoryEngine> Warm7BStream(benchmark::State& state,
                                           const std::filesystem::path& dir,
                                           uint64_t more, std::mt19937_64& rng,
                                           StreamConfig* config = nullptr) {
  std::unique_ptr<MemoryEngine> engine = FreshEngine(dir);
  StreamConfig c;
  c.geometry = {32, 8, 128, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.frames_per_block = 4;
  c.tiers.warm_budget_bytes = 1ull << 30;
  if (!engine->OpenStream("cam", c).ok()) {
    state.SkipWithError("OpenStream failed");
    return nullptr;
  }
  if (!AppendRandomFrames(state, engine.get(), 13 * 4 + more, 16,
                          size_t{32} * 2 * 8 * 128 * 16, rng)) {
    return nullptr;
  }
  engine->WaitForBackground();
  if (config != nullptr) *config = c;
  return engine;
}

// Reading recalled blocks' KV into one buffer at the 7B geometry (32 x 8
// x 128 fp16, 64-token blocks, 12 warm blocks, 96 MiB): arg 0 = 0 whole
// blocks layer-major (ReadBlockPayloadInto), 1 a random 80 % of each
// block's tokens (ReadBlockTokensInto, what TOKEN_LAYER_MAJOR delivers),
// 2 every token through the token path. One thread; bytes/s counts the
// bytes written.
void BM_ReadTokens(benchmark::State& state) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-tokens";
  std::mt19937_64 rng(8);
  StreamConfig c;
  std::unique_ptr<MemoryEngine> engine = Warm7BStream(state, dir, 0, rng, &c);
  if (engine == nullptr) return;
  const StreamHandle stream = *engine->Find("cam");
  const int mode = static_cast<int>(state.range(0));
  std::vector<std::vector<uint32_t>> tokens(12);
  std::bernoulli_distribution keep(0.8);
  uint64_t total = 0;
  for (auto& t : tokens) {
    for (uint32_t j = 0; j < 64; ++j) {
      if (mode == 2 || keep(rng)) t.push_back(j);
    }
    total += BlockPayloadBytes(c.geometry, mode == 0 ? 64 : t.size(),
                               PayloadLayout::kBlockLayerMajor, 0);
  }
  std::vector<uint8_t> buffer(total);
  for (auto _ : state) {
    uint8_t* dst = buffer.data();
    for (uint64_t b = 0; b < 12; ++b) {
      const uint64_t n =
          BlockPayloadBytes(c.geometry, mode == 0 ? 64 : tokens[b].size(),
                            PayloadLayout::kBlockLayerMajor, 0);
      auto r = mode == 0 ? stream.ReadBlockPayloadInto(
                               b, PayloadLayout::kBlockLayerMajor, {}, dst, n)
                         : stream.ReadBlockTokensInto(b, tokens[b], {}, dst, n);
      if (!r.ok()) {
        state.SkipWithError("read failed");
        break;
      }
      dst += n;
    }
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * total);
  state.counters["MiB"] = total / 1048576.0;
  state.SetLabel(mode == 0   ? "whole blocks"
                 : mode == 1 ? "80% of tokens"
                             : "every token");
  engine.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_ReadTokens)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

// The same read from blocks out of RAM (the warm budget holds none): arg 0
// = 1 the blocks keep their frames (--cold_form=frames), 0 they were
// rewritten per layer; arg 1 = tokens read per 64-token block (spread
// evenly over its 4 frames). The store's files are in the page cache.
void BM_ReadColdTokens(benchmark::State& state) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-cold";
  const bool frames = state.range(0) == 1;
  const uint32_t per_block = static_cast<uint32_t>(state.range(1));
  std::unique_ptr<MemoryEngine> engine = FreshEngine(dir, 1, frames);
  StreamConfig c;
  c.geometry = {32, 8, 128, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.frames_per_block = 4;
  c.tiers.warm_budget_bytes = 1;
  std::mt19937_64 rng(9);
  if (!engine->OpenStream("cam", c).ok() ||
      !AppendRandomFrames(state, engine.get(), 13 * 4, 16,
                          size_t{32} * 2 * 8 * 128 * 16, rng)) {
    state.SkipWithError("setup failed");
    return;
  }
  engine->WaitForBackground();
  const StreamHandle stream = *engine->Find("cam");
  std::vector<uint32_t> tokens;
  for (uint32_t j = 0; j < per_block; ++j) tokens.push_back(j * 64 / per_block);
  const uint64_t n = BlockPayloadBytes(c.geometry, tokens.size(),
                                       PayloadLayout::kBlockLayerMajor, 0);
  std::vector<uint8_t> buffer(12 * n);
  for (auto _ : state) {
    for (uint64_t b = 0; b < 12; ++b) {
      if (!stream.ReadBlockTokensInto(b, tokens, {}, buffer.data() + b * n, n)
               .ok()) {
        state.SkipWithError("read failed");
        break;
      }
    }
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * 12 * n);
  state.SetLabel(frames ? "cold, frames" : "cold, layers");
  engine.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_ReadColdTokens)
    ->ArgsProduct({{0, 1}, {8, 51}})
    ->Unit(benchmark::kMillisecond);

// kvmem bench's token-resolution figure in process: a camera-hour of
// one-frame blocks (10,800 frames of 16 tokens in 4 token groups, 2 KV
// heads x 64 of one indexed layer, a 256-token window), a 64-token budget,
// one query vector; arg 0 the scorer (1 "mass": token resolution, 3
// "mass_groups"), so a profile shows what the tokens add.
void BM_CameraHourTokenRecall(benchmark::State& state) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-hour";
  std::unique_ptr<MemoryEngine> engine = FreshEngine(dir);
  StreamConfig c;
  c.geometry = {2, 2, 64, DType::kFp16, 16};
  c.hot_window_tokens = 256;
  c.frames_per_block = 1;
  c.indexed_layers = {0};
  c.groups_per_block = 4;
  c.weights.score = ScoreMode::kMass;
  const char* const scorers[] = {"", "mass", "summed", "mass_groups"};
  c.weights.scorer = scorers[state.range(0)];
  if (!engine->OpenStream("cam", c).ok()) {
    state.SkipWithError("OpenStream failed");
    return;
  }
  std::mt19937_64 rng(11);
  if (!AppendRandomFrames(state, engine.get(), 10800 + 16, 16,
                          size_t{2} * 2 * 2 * 16 * 64, rng)) {
    return;
  }
  engine->WaitForBackground();
  std::vector<std::vector<float>> queries;
  for (int i = 0; i < 64; ++i)
    queries.push_back(testing::RandomQuery(rng, 128));
  size_t i = 0;
  TimeRecalls(state, engine.get(), [&] {
    RecallQuery q;
    q.query = queries[i++ % queries.size()];
    q.max_tokens = 64;
    return q;
  });
  state.SetLabel(c.weights.scorer);
  engine.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_CameraHourTokenRecall)
    ->Arg(1)
    ->Arg(3)
    ->Unit(benchmark::kMicrosecond);

// Recall at the 7B geometry of `kvmem bench --fetch`'s recall (32 x 8 x 128
// fp16, every layer indexed, 64-token blocks, 13 warm blocks, a 614-token
// budget, one query vector of 32,768 floats): what the engine adds to the
// recall + delivery figure before any byte is copied.
void BM_Recall7B(benchmark::State& state) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-recall7b";
  std::mt19937_64 rng(8);
  std::unique_ptr<MemoryEngine> engine = Warm7BStream(state, dir, 4, rng);
  if (engine == nullptr) return;
  std::vector<std::vector<float>> queries;
  for (int i = 0; i < 16; ++i) {
    queries.push_back(testing::RandomQuery(rng, 32 * 8 * 128));
  }
  size_t i = 0;
  TimeRecalls(state, engine.get(), [&] {
    RecallQuery q;
    q.query = queries[i++ % queries.size()];
    q.max_tokens = 614;
    return q;
  });
  engine.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Recall7B)->Unit(benchmark::kMicrosecond);

// Token groups of one sealed block (k-means on the append path): arg 0
// tokens, arg 1 groups, over 2 indexed layers x 4 KV heads x 64 dims.
void BM_TokenGroups(benchmark::State& state) {
  StreamConfig c;
  c.geometry = {2, 4, 64, DType::kFp16, 4096};
  c.hot_window_tokens = 64;
  const uint32_t tokens = static_cast<uint32_t>(state.range(0));
  std::mt19937_64 rng(3);
  const std::string frame = Fp16Of(rng, 2 * 2 * 4 * tokens * 64);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        BuildTokenGroups(WithDefaults(c), {frame}, {tokens},
                         static_cast<uint32_t>(state.range(1))));
  }
}
BENCHMARK(BM_TokenGroups)
    ->Args({128, 8})
    ->Args({128, 16})
    ->Args({512, 32})
    ->Args({512, 64})
    ->Unit(benchmark::kMicrosecond);

// Token groups of kvmem bench's blocks (4 layers x 2 KV heads x 64 dims,
// 4 frames of 128 tokens, 64 groups) from the demo's camera workload, whose
// keys cluster as objects do (the random keys above never settle): the
// seal's k-means as kvmem bench's ingest runs it.
void BM_TokenGroupsCamera(benchmark::State& state) {
  DemoGeometry g;
  g.tokens_per_frame = 128;
  StreamConfig c;
  c.geometry = {g.layers, g.kv_heads, g.head_dim, DType::kFp16,
                g.tokens_per_frame};
  c.hot_window_tokens = 2048;
  c = WithDefaults(c);
  CameraWorkload camera(7, g, 6, 64);
  std::vector<std::string> frames;
  for (int f = 0; f < 64; ++f) frames.push_back(camera.MakeFrame(f).payload);
  size_t block = 0;
  for (auto _ : state) {
    const size_t f0 = (block++ % 16) * 4;
    const std::vector<absl::string_view> views(frames.begin() + f0,
                                               frames.begin() + f0 + 4);
    benchmark::DoNotOptimize(
        BuildTokenGroups(c, views, std::vector<uint32_t>(4, g.tokens_per_frame),
                         c.groups_per_block));
  }
  state.SetLabel(absl::StrCat(c.groups_per_block, " groups"));
}
BENCHMARK(BM_TokenGroupsCamera)->Unit(benchmark::kMicrosecond);

// The same for a 7B block with the stream defaults (every layer indexed:
// 32 x 8 x 128 = 32,768 floats of keys per token): 4 frames of 128 tokens,
// the default groups per block. The seal's k-means over 64 MiB of keys.
void BM_TokenGroups7B(benchmark::State& state) {
  StreamConfig c;
  c.geometry = {32, 8, 128, DType::kFp16, 128};
  c.hot_window_tokens = 256;
  c = WithDefaults(c);
  std::mt19937_64 rng(3);
  std::vector<std::string> frames;
  for (int f = 0; f < 4; ++f)
    frames.push_back(Fp16Of(rng, 2 * 32 * 8 * 128 * 128));
  const std::vector<absl::string_view> views(frames.begin(), frames.end());
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        BuildTokenGroups(c, views, {128, 128, 128, 128}, c.groups_per_block));
  }
  state.SetLabel(absl::StrCat(c.groups_per_block, " groups"));
}
BENCHMARK(BM_TokenGroups7B)->Unit(benchmark::kMillisecond);

// Recall in the evaluation's shape (kvmem eval's default workload): 2
// layers x 4 KV heads x 64 dims, both layers indexed, 32 tokens per frame,
// 4-frame blocks with arg 1 token groups each (arg 0 blocks: 225 is a
// 5-minute camera), a 2048-token window and a 614-token budget; arg 2 the
// scorer (1 mass: token resolution, 2 summed, 3 mass_groups); arg 3 the
// query's vectors (8: a frame's query tokens; more than 16 are reduced to
// 16 representatives) and a window log-sum-exp per vector and head, as the
// README's front end sends; arg 4 the engine's recall_threads (1: the
// caller alone, the default; 0: the hardware threads up to 4). Random
// keys: the cost, not the quality. cold (BM_EvalShapedRecallCold): the
// caches evicted before each recall, as in the eval (its oracle and other
// policies run between kvmem's recalls) and in a server with other streams.
void EvalShapedRecall(benchmark::State& state, bool cold) {
  const uint64_t blocks = state.range(0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "kvmem-engine-bench-evalshape";
  std::unique_ptr<MemoryEngine> engine =
      FreshEngine(dir, static_cast<int>(state.range(4)));
  StreamConfig c;
  c.geometry = {2, 4, 64, DType::kFp16, 32};
  c.hot_window_tokens = 2048;
  c.frames_per_block = 4;
  c.groups_per_block = static_cast<uint32_t>(state.range(1));
  c.default_max_tokens = 614;
  const char* const scorers[] = {"", "mass", "summed", "mass_groups"};
  c.weights.scorer = scorers[state.range(2)];
  if (!engine->OpenStream("cam", c).ok()) {
    state.SkipWithError("OpenStream failed");
    return;
  }
  std::mt19937_64 rng(7);
  if (!AppendRandomFrames(state, engine.get(), blocks * 4 + 2048 / 32, 32,
                          2 * 2 * 4 * 32 * 64, rng)) {
    return;
  }
  engine->WaitForBackground();
  // RAM per sealed block (x 2,700 blocks = a camera-hour of this shape):
  // the records' summaries, the token codes, the indexes.
  if (auto st = engine->GetStats("cam"); st.ok() && st->sealed_blocks > 0) {
    const double b = static_cast<double>(st->sealed_blocks) * 1024;
    state.counters["summary_kib_per_block"] = st->summary_bytes / b;
    state.counters["code_kib_per_block"] = st->token_code_bytes / b;
    state.counters["index_kib_per_block"] = st->index_bytes / b;
  }
  const size_t vectors = static_cast<size_t>(state.range(3));
  std::vector<std::vector<float>> queries;
  for (int i = 0; i < 64; ++i) {
    queries.emplace_back();
    for (size_t j = 0; j < vectors; ++j) {
      const std::vector<float> v = testing::RandomQuery(rng, 512);
      queries.back().insert(queries.back().end(), v.begin(), v.end());
    }
    // Logits of a few units, as real queries have.
    for (float& x : queries.back()) x *= 3;
  }
  size_t i = 0;
  TimeRecalls(
      state, engine.get(),
      [&] {
        RecallQuery q;
        q.query = queries[i++ % queries.size()];
        q.window_lse.assign(vectors * 8, 4.0f);
        return q;
      },
      cold);
  state.SetLabel(c.weights.scorer);
  engine.reset();
  std::filesystem::remove_all(dir);
}
void BM_EvalShapedRecall(benchmark::State& state) {
  EvalShapedRecall(state, false);
}
void BM_EvalShapedRecallCold(benchmark::State& state) {
  EvalShapedRecall(state, true);
}
BENCHMARK(BM_EvalShapedRecall)
    ->Args({225, 8, 1, 1, 0})
    ->Args({225, 16, 1, 1, 1})
    ->Args({225, 16, 1, 1, 0})
    ->Args({225, 16, 1, 8, 1})
    ->Args({225, 16, 1, 8, 0})
    ->Args({225, 16, 1, 128, 1})
    ->Args({225, 16, 1, 128, 0})
    ->Args({225, 8, 3, 1, 0})
    ->Args({225, 16, 3, 1, 0})
    ->Args({225, 16, 3, 8, 1})
    ->Args({225, 16, 3, 8, 0})
    ->Args({225, 8, 2, 1, 0})
    ->Args({225, 16, 2, 1, 0})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EvalShapedRecallCold)
    ->Args({225, 16, 1, 1, 1})
    ->Args({225, 16, 1, 8, 1})
    ->Args({225, 16, 3, 8, 1})
    ->Unit(benchmark::kMicrosecond);

// The per-head scan of a recall's query vectors over the unit index, in the
// evaluation's shape (3,856 units of 2 layers x 4 KV heads x 64 dims: 225
// blocks of 16 groups plus the window's): arg 0 the vectors, arg 1 the
// ScanMode (0 proofs, as "mass_groups" scans; 1 ranks, as the token
// stage's), arg 2 1 for one ScanSegments of all the vectors (as a recall
// makes it), 0 for one per vector. The label names the int8 kernel.
void BM_ScanSegments(benchmark::State& state) {
  const uint32_t dim = 512, n = 3856;
  BlockIndex index(dim, "Progressive", 64);
  std::mt19937_64 rng(9);
  for (uint64_t i = 0; i < n; ++i) {
    index.Add(i, testing::RandomQuery(rng, dim).data());
  }
  const size_t vectors = static_cast<size_t>(state.range(0));
  std::vector<float> queries;
  for (size_t j = 0; j < vectors; ++j) {
    const std::vector<float> q = testing::RandomQuery(rng, dim);
    queries.insert(queries.end(), q.begin(), q.end());
  }
  std::vector<SegmentScan> scans(vectors);
  const ScanMode mode = static_cast<ScanMode>(state.range(1));
  for (auto _ : state) {
    if (state.range(2) != 0) {
      index.ScanSegments(queries.data(), vectors, scans.data(), mode);
    } else {
      for (size_t j = 0; j < vectors; ++j) {
        index.ScanSegments(queries.data() + j * dim, &scans[j], mode);
      }
    }
    benchmark::DoNotOptimize(scans.data());
  }
  state.SetItemsProcessed(state.iterations() * vectors * n);
  state.SetLabel(ActiveInt8Kernel().name);
}
BENCHMARK(BM_ScanSegments)
    ->Args({1, 0, 1})
    ->Args({8, 0, 0})
    ->Args({8, 0, 1})
    ->Args({1, 1, 1})
    ->Args({8, 1, 0})
    ->Args({8, 1, 1})
    ->Unit(benchmark::kMicrosecond);

// What server metrics add to every call (ServerMetrics::OnCallDone, run by
// the interceptor) and to every recall (ObserveRecall): compare with the
// recall figures above. Threads share the method map's mutex.
void BM_CallMetrics(benchmark::State& state) {
  static ServerMetrics* metrics = [] {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / "kvmem-engine-bench-metrics";
    std::filesystem::remove_all(dir);
    RocksColdStoreOptions so;
    so.path = dir.string();
    static auto engine = *MemoryEngine::Open(*OpenRocksColdStore(so));
    return new ServerMetrics(engine.get(), ServerMetrics::Options());
  }();
  const std::string method = "/kvmem.v1.KvMemory/Recall";
  for (auto _ : state) {
    metrics->ObserveRecall(false, 80e-6);
    metrics->OnCallDone(method, grpc::StatusCode::OK, 90e-6);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CallMetrics)->Threads(1)->Threads(2);

BENCHMARK(BM_AppendRebuildEveryBlock)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
// Score MASS's cold mass over the rows of BM_StreamRecall/10000's recall
// (10,016 rows, three in four recallable): arg 0 the scalar loop, 1
// ColdMass (SSE2). The same double either way (MassRowsTest).
void BM_ColdMass(benchmark::State& state) {
  constexpr size_t kRows = 10016;
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(0.0f, 1e-3f);
  std::vector<float> density(kRows), recallable(kRows);
  std::vector<uint32_t> tokens(kRows);
  for (size_t i = 0; i < kRows; ++i) {
    density[i] = u(rng);
    recallable[i] = rng() % 4 != 0 ? 1.0f : 0.0f;
    tokens[i] = 4;
  }
  auto cold = state.range(0) == 0 ? ColdMassScalar : ColdMass;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        cold(density.data(), recallable.data(), tokens.data(), kRows));
  }
  state.SetLabel(state.range(0) == 0 ? "scalar" : "sse2");
}
BENCHMARK(BM_ColdMass)->Arg(0)->Arg(1);

BENCHMARK(BM_StreamRecall)
    ->Args({1000, 1, 1})
    ->Args({10000, 1, 1})
    ->Args({100000, 1, 1})
    ->Args({10000, 0, 1})
    ->Args({1000, 1, 2})
    ->Args({10000, 1, 2})
    ->Args({100000, 1, 2})
    ->Args({10000, 0, 2})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RecallPlanner)->Arg(64)->Arg(1024);
BENCHMARK(BM_Segmenter);
BENCHMARK(BM_DegradeLayer)
    ->Args({32, 128, 0})
    ->Args({128, 128, 0})
    ->Args({512, 1024, 0})
    ->Args({512, 1024, 1});
BENCHMARK(BM_RestoreLayer)
    ->Args({32, 128, 0})
    ->Args({128, 128, 0})
    ->Args({512, 1024, 0})
    ->Args({512, 1024, 1});
BENCHMARK(BM_IngestRoundTrip)->Arg(0)->Arg(1);
BENCHMARK(BM_FrameEncodeFp16);
BENCHMARK(BM_FrameDecodeFp16);
BENCHMARK(BM_BlockRecordCodec);
BENCHMARK(BM_Int8Kernel)
    ->ArgsProduct({{0, 1, 2}, {128, 1024}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TokenKernel)
    ->ArgsProduct({{0, 1}, {64, 128}, {1, 8}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StorePut)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StoreGet)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond);

// What an append holds the stream's writer lock for while its block's
// summaries enter the index (every recall of the stream waits for it), at
// 7B's summary width (32 layers x 8 KV heads x 128 = 32,768 floats a unit,
// "Progressive", scanned per head): arg 0 blocks of arg 1 units (token
// groups) added one block at a time; arg 2 0 adds in place (the arrays
// double and copy every unit under the lock), 1 grows them beside recalls
// first (StreamIndexes::Grow, under the reader's lock) and adopts them
// under the writer's, as Stream::InstallCommitted does. Counters: the
// writer's section per block, max and total, and the time grown beside.
void BM_IndexGrowthUnderLock(benchmark::State& state) {
  const uint32_t dim = 32 * 8 * 128;
  const int64_t blocks = state.range(0), units = state.range(1);
  const bool beside = state.range(2) == 1;
  std::mt19937_64 rng(3);
  const std::vector<float> unit = testing::RandomQuery(rng, dim);
  double max_us = 0, lock_ms = 0, beside_ms = 0;
  for (auto _ : state) {
    BlockIndex index(dim, "Progressive", 128);
    for (int64_t b = 0; b < blocks; ++b) {
      std::unique_ptr<BlockIndex::Growth> g;
      if (beside) {
        const auto t0 = SteadyClock::now();
        g = index.Grow(static_cast<size_t>(units));
        beside_ms += MicrosSince(t0) / 1e3;
      }
      const auto t0 = SteadyClock::now();
      if (g != nullptr) index.Adopt(g.get());
      for (int64_t u = 0; u < units; ++u) {
        index.Add(static_cast<uint64_t>(b * units + u), unit.data());
      }
      const double us = MicrosSince(t0);
      g.reset();  // The old arrays, freed after the lock.
      max_us = std::max(max_us, us);
      lock_ms += us / 1e3;
    }
    benchmark::DoNotOptimize(index.size());
  }
  state.counters["lock_max_us"] = max_us;
  state.counters["lock_total_ms"] = lock_ms;
  state.counters["beside_total_ms"] = beside_ms;
  state.SetLabel(beside ? "grown beside" : "in place");
}
BENCHMARK(BM_IndexGrowthUnderLock)
    ->Args({64, 32, 0})
    ->Args({64, 32, 1})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvmem

// KVMEM_INT8_KERNEL / KVMEM_TOKEN_KERNEL=<name> run the benchmarks on that
// kernel (e.g. avx2 on an AVX-512 machine, for the ratio), and
// KVMEM_TOKEN_LANES=off (or avx2) the token stage without its lanes kernel
// (or with the AVX2 one); all but BM_Int8Kernel and BM_TokenKernel, which
// name theirs by dispatch level.
int main(int argc, char** argv) {
  for (const auto& [var, select] :
       {std::pair<const char*, bool (*)(const std::string&)>{
            "KVMEM_INT8_KERNEL", &kvmem::SelectInt8Kernel},
        {"KVMEM_TOKEN_KERNEL", &kvmem::SelectTokenKernel},
        {"KVMEM_TOKEN_LANES", &kvmem::SelectLaneTokenKernel}}) {
    const char* name = std::getenv(var);
    if (name != nullptr && !select(name)) {
      std::fprintf(stderr, "%s=%s: no such kernel on this CPU\n", var, name);
      return 2;
    }
  }
  std::fprintf(stderr,
               "int8 kernel %s, token kernel %s, token lanes %s, exp kernel "
               "%s\n",
               kvmem::ActiveInt8Kernel().name.c_str(),
               kvmem::ActiveTokenKernel().name.c_str(),
               kvmem::LaneTokenKernel().c_str(),
               kvmem::ActiveExpKernel().name.c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Helpers for engine tests over a real RocksDB cold store in a temp dir (or,
// with KVMEM_TEST_STORE=memory, the in-memory store: see OpenTestStore).
#ifndef KVMEM_TESTS_ENGINE_FIXTURE_H_
#define KVMEM_TESTS_ENGINE_FIXTURE_H_

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/codec/block_layout.h"
#include "engine/codec/dtype.h"
#include "engine/memory_engine.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "storage/forwarding_store.h"
#include "storage/rocks_cold_store.h"
#include "tests/stream_model.h"
#include "tests/test_util.h"

namespace kvmem {

// Reaches what Stream keeps private for tests (engine/stream/stream.h).
class StreamTestPeer {
 public:
  // Where the open block keeps frame i's payload; null when absent.
  static const char* OpenPayloadData(const StreamHandle& h, size_t i) {
    return h.stream_->OpenPayloadData(i);
  }
  // Evicts block `id` as the tier policy does.
  static absl::Status Evict(const StreamHandle& h, uint64_t id) {
    TierManager& t = h.stream_->tiers_;
    kvmem::MutexLock lock(&t.mu_);
    return t.Evict(id);
  }
  // Runs f while the stream's tier manager holds its moves' lock (as a
  // promotion reading a block does).
  static void HoldMoves(const StreamHandle& h, const std::function<void()>& f) {
    h.stream_->tiers_.WithoutMoves(f);
  }
  // Queues f on the engine's background executor, behind what is queued.
  static void SubmitBackground(const StreamHandle& h, std::function<void()> f) {
    h.stream_->env_.background->Submit(std::move(f));
  }
  // Applies recall hits as the stream's maintenance does after recalls.
  static absl::Status ApplyHits(const StreamHandle& h,
                                const std::vector<RecallHit>& hits) {
    return h.stream_->tiers_.ApplyHits(hits);
  }
  // Whether block `id` is still in RAM's table and, if so, the bytes its
  // record holds for token codes (their string's capacity).
  static std::optional<size_t> CodeCapacity(const StreamHandle& h,
                                            uint64_t id) {
    const RecallView& v = h.stream_->view_;
    kvmem::ReaderMutexLock lock(&v.mu());
    if (!v.blocks().Has(id)) return {};
    return v.blocks()[id].rec.token_codes.capacity();
  }
};

}  // namespace kvmem

namespace kvmem::testing {

// The store an engine test opens in `dir`: RocksDB in dir/db, or with
// KVMEM_TEST_STORE=memory an in-memory store kept for `dir` for the rest
// of the process, so a test that reopens its engine finds what it stored
// (as a store that outlives its server would keep it). ctest runs the
// engine tests both ways (tests/CMakeLists.txt, the memory_store tests).
inline std::unique_ptr<ColdStore> OpenTestStore(const std::string& dir) {
  const char* kind = std::getenv("KVMEM_TEST_STORE");
  if (kind != nullptr && std::string(kind) == "memory") {
    static std::mutex mu;
    static auto* stores = new std::map<std::string, std::shared_ptr<ColdStore>>;
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<ColdStore>& s = (*stores)[dir];
    if (s == nullptr) s = NewMemColdStore();
    return std::make_unique<ForwardingColdStore>(s);
  }
  RocksColdStoreOptions o;
  o.path = dir + "/db";
  o.write_buffer_bytes = 4 << 20;
  o.block_cache_bytes = 8 << 20;
  auto store = OpenRocksColdStore(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

inline std::unique_ptr<MemoryEngine> OpenTestEngine(
    const std::string& dir, const EngineOptions& options = {}) {
  std::unique_ptr<ColdStore> store = OpenTestStore(dir);
  auto engine = MemoryEngine::Open(std::move(store), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

inline Frame ToFrame(const ModelFrame& m, uint64_t index,
                     FrameSignals signals = {}) {
  Frame f;
  f.index = index;
  f.first_token_position = m.first_pos;
  f.token_count = m.kv.tokens;
  f.payload = m.bytes;
  f.signals = std::move(signals);
  return f;
}

// Frame `index` of a stream whose frames all hold f.tokens tokens, with no
// position gaps.
inline Frame FrameOf(const FloatFrame& f, uint64_t index, DType dtype) {
  Frame fr;
  fr.index = index;
  fr.first_token_position = index * f.tokens;
  fr.token_count = f.tokens;
  fr.payload = Encode(f, dtype);
  return fr;
}

inline StreamConfig TestConfig(const TestGeometry& g, uint32_t window,
                               uint32_t frames_per_block) {
  StreamConfig c;
  c.geometry = {g.layers, g.kv_heads, g.head_dim, g.dtype, 16};
  c.hot_window_tokens = window;
  c.frames_per_block = frames_per_block;
  c.indexed_layers = {2, 0};
  // StreamModel's oracle ranks whole blocks by the summed score; score
  // MASS and token groups have their own oracles and tests.
  c.weights.score = ScoreMode::kSummed;
  c.groups_per_block = 1;
  return c;
}

// A block's payload read back in frame-major layout, or the read's error.
inline absl::StatusOr<std::string> FrameMajor(const StreamHandle& stream,
                                              uint64_t block) {
  auto pieces = stream.ReadBlockPayload(block, PayloadLayout::kFrameMajor, {});
  if (!pieces.ok()) return pieces.status();
  std::string got;
  for (const auto& p : *pieces) got += p.ToString();
  return got;
}

// A lossy copy: the same size, not the same values, every value within
// `bound` of the original's.
inline void ExpectWithin(const std::string& want, const std::string& got,
                         DType dtype, float bound, uint64_t block) {
  ASSERT_EQ(got.size(), want.size()) << "block " << block;
  std::vector<float> x(want.size() / DTypeBytes(dtype)), y(x.size());
  DecodeToFloat(reinterpret_cast<const uint8_t*>(want.data()), x.size(), dtype,
                x.data());
  DecodeToFloat(reinterpret_cast<const uint8_t*>(got.data()), y.size(), dtype,
                y.data());
  EXPECT_NE(x, y) << "block " << block;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::fabs(x[i] - y[i]), bound)
        << "block " << block << " value " << i;
  }
}

// 2-frame blocks, an 8-token window, the mass scorer with 4 token groups a
// block, and a warm budget of two blocks of 4-token frames: the older
// blocks leave RAM (the compressed tiers' tests).
inline StreamConfig TwoWarmBlocksConfig(const TestGeometry& g) {
  StreamConfig c = TestConfig(g, 8, 2);
  c.weights.score = ScoreMode::kMass;
  c.groups_per_block = 4;
  c.tiers.warm_budget_bytes =
      2 * WarmBlock::AllocatedBytes(WithDefaults(c).geometry, 2 * 4);
  return c;
}

// The product's path (the default scorer and token groups) for frames of
// `tokens` tokens: a window of two frames, 4-frame blocks, 24 tokens a
// recall.
inline StreamConfig GroupedConfig(const TestGeometry& g, uint32_t tokens) {
  StreamConfig c;
  c.geometry = {g.layers, g.kv_heads, g.head_dim, g.dtype, 16};
  c.hot_window_tokens = 2 * tokens;
  c.frames_per_block = 4;
  c.default_max_tokens = 24;
  return c;
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_ENGINE_FIXTURE_H_

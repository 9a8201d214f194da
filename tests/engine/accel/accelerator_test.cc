// The accelerator interface: cpu and sim return the same ids for every index
// kind; the sim's costs follow its model (search, injections capped, SRAM
// re-partitioned and given back); its queue serves by priority and charges
// the wait; an approximate index below the recall floor is flagged.
#include "engine/accel/accelerator.h"

#include <atomic>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

constexpr uint32_t kDim = 48;

TEST(AcceleratorTest, CpuAndSimReturnTheSameIdsForEveryIndexKind) {
  std::mt19937_64 rng(3);
  const SimHardware hw;
  for (const char* factory : {"Flat", "Progressive", "HNSW32", "SQ8"}) {
    BlockIndex index(kDim, factory);
    for (uint64_t id = 0; id < 3000; ++id) {
      index.Add(id, testing::RandomQuery(rng, kDim).data());
    }
    auto cpu = NewCpuAccelerator();
    auto sim = NewSimAccelerator(hw);
    CallCost cpu_cost, sim_cost;
    for (int i = 0; i < 20; ++i) {
      const std::vector<float> q = testing::RandomQuery(rng, kDim);
      const auto a = cpu->Search(index, q.data(), {16, 0}, &cpu_cost);
      const auto b = sim->Search(index, q.data(), {16, 0}, &sim_cost);
      ASSERT_EQ(a.size(), 16u) << factory;
      ASSERT_EQ(a.size(), b.size()) << factory;
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_EQ(a[k].id, b[k].id) << factory << " query " << i;
        EXPECT_EQ(a[k].score, b[k].score) << factory;
      }
    }
    EXPECT_EQ(cpu_cost.searches, 20u);
    EXPECT_GT(cpu_cost.measured_us, 0.0);
    EXPECT_EQ(cpu_cost.modelled_us, 0.0);
    EXPECT_FALSE(cpu->modelled());
    // Each sim search: arbitration + the model's scan of every vector.
    const SimCost s = SearchCost(hw, 3000, kDim, 16);
    EXPECT_NEAR(sim_cost.modelled_us,
                20 * (hw.arbitration_cycles / hw.clock_hz + s.seconds) * 1e6,
                1e-6);
    EXPECT_EQ(sim_cost.dram_bytes, 20 * s.dram_bytes);
    EXPECT_EQ(sim_cost.queue_us, 0.0);  // Nobody else was searching.
    EXPECT_EQ(sim->Stats().total.searches, 20u);
  }
}

TEST(AcceleratorTest, CpuStagingIsANoOpAndSimCapsBlocksPerInjection) {
  SimHardware hw;
  hw.max_blocks_per_injection = 8;
  std::vector<StageItem> items(20, StageItem{64 << 10, 0, true, 1});
  CallCost cpu_cost;
  NewCpuAccelerator()->Stage(items, {}, &cpu_cost);
  EXPECT_EQ(cpu_cost.injections, 0u);
  EXPECT_EQ(cpu_cost.dram_bytes, 0u);
  auto sim = NewSimAccelerator(hw);
  CallCost c;
  sim->Stage(items, {}, &c);
  EXPECT_EQ(c.injections, 3u);  // 8 + 8 + 4.
  // Each injection costs arbitration + its items through the buffer.
  const double arb = hw.arbitration_cycles / hw.clock_hz;
  const uint64_t staging = StagingBytesFor(hw, items.data(), 8);
  const double want =
      2 * (arb + InjectionCost(hw, items.data(), 8, staging).seconds) + arb +
      InjectionCost(hw, items.data(), 4, staging).seconds;
  EXPECT_NEAR(c.modelled_us, want * 1e6, 1e-6);
  EXPECT_EQ(c.dram_bytes, 20u * (64 << 10));  // Aligned: no extra bursts.
  EXPECT_EQ(sim->Stats().total.injections, 3u);
}

TEST(AcceleratorTest, StagingBorrowsSramGranulesAndGivesThemBack) {
  SimHardware hw;
  hw.sram_bytes = 4 << 20;
  hw.sram_granule_bytes = 256 << 10;
  auto sim = NewSimAccelerator(hw);
  AcceleratorStats s = sim->Stats();
  EXPECT_EQ(s.sram_staging_bytes, 256u << 10);
  EXPECT_EQ(s.sram_hot_bytes + s.sram_staging_bytes, hw.sram_bytes);
  // Small blocks fit the idle staging buffer: no re-partition.
  CallCost small;
  sim->Stage({StageItem{64 << 10, 0, true, 1}}, {}, &small);
  EXPECT_EQ(small.repartitions, 0u);
  EXPECT_EQ(small.dram_bytes, 64u << 10);
  // A 1 MiB block wants 2 MiB (two halves): 7 more granules leave the hot
  // window, and come back (refilled from DRAM) once nobody waits.
  CallCost big;
  sim->Stage({StageItem{1 << 20, 0, true, 1}}, {}, &big);
  EXPECT_EQ(big.repartitions, 2u);
  EXPECT_EQ(big.dram_bytes, (1u << 20) + 7 * (256u << 10));
  s = sim->Stats();
  EXPECT_EQ(s.repartitions, 2u);
  EXPECT_EQ(s.sram_staging_bytes, 256u << 10);
  EXPECT_EQ(s.sram_hot_bytes, (4u << 20) - (256u << 10));
  // The refill occupies the engine but is not this injection's latency.
  const SimCost inj = InjectionCost(
      hw, std::vector<StageItem>{{1 << 20, 0, true, 1}}.data(), 1, 2 << 20);
  EXPECT_NEAR(big.modelled_us,
              (hw.arbitration_cycles / hw.clock_hz + inj.seconds) * 1e6, 1e-6);
}

// Waits until `gate` has n waiters.
void AwaitWaiters(const PriorityGate& gate, size_t n) {
  while (gate.waiting() < n) std::this_thread::yield();
}

TEST(AcceleratorTest, GateServesHigherPriorityFirstAndChargesTheWait) {
  PriorityGate gate;
  gate.Acquire(0);  // The holder the others queue behind.
  std::vector<std::string> order;
  std::atomic<int> done{0};
  double queued_low = -1, queued_high = -1, queued_late = -1;
  auto caller = [&](const std::string& name, uint32_t prio, double service,
                    double* queued) {
    return std::thread([&, name, prio, service, queued] {
      *queued = gate.Acquire(prio).queue_s;
      order.push_back(name);  // Only the holder runs here.
      gate.Release(service);
      ++done;
    });
  };
  std::thread low = caller("low", 1, 2e-6, &queued_low);
  AwaitWaiters(gate, 1);
  std::thread high = caller("high", 9, 4e-6, &queued_high);
  AwaitWaiters(gate, 2);
  std::thread late = caller("late", 1, 1e-6, &queued_late);
  AwaitWaiters(gate, 3);
  gate.Release(1e-6);
  low.join();
  high.join();
  late.join();
  ASSERT_EQ(done.load(), 3);
  EXPECT_EQ(order, (std::vector<std::string>{"high", "low", "late"}));
  // Each waited for the modelled service of everyone admitted before it.
  EXPECT_NEAR(queued_high, 1e-6, 1e-15);
  EXPECT_NEAR(queued_low, 1e-6 + 4e-6, 1e-15);
  EXPECT_NEAR(queued_late, 1e-6 + 4e-6 + 2e-6, 1e-15);
}

// An IVF index probing a quarter of its lists misses exact neighbours on
// random data: under the sim (floor 0.95) its stream says so in stats and
// the engine warns once; the cpu backend has no floor.
TEST(AcceleratorTest, SimFlagsAnIndexBelowTheRecallFloor) {
  const testing::TestGeometry g;
  for (bool with_sim : {true, false}) {
    testing::TempDir dir;
    EngineOptions options;
    if (with_sim) options.sim = SimHardware();
    std::vector<std::string> warnings;
    options.warn = [&](const std::string& w) { warnings.push_back(w); };
    auto engine = testing::OpenTestEngine(dir.path(), options);
    StreamConfig c = testing::TestConfig(g, 8, 1);
    c.index_factory = "IVF16,Flat";
    ASSERT_TRUE(engine->OpenStream("cam", c).ok());
    std::mt19937_64 rng(5);
    for (uint64_t i = 0; i < 300; ++i) {
      ASSERT_TRUE(
          engine
              ->Append("cam", testing::FrameOf(testing::RandomFrame(rng, g, 4),
                                               i, g.dtype))
              .ok());
    }
    for (int i = 0; i < 160; ++i) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, 2 * g.kv_heads * g.head_dim);
      q.top_k = 16;
      ASSERT_TRUE(engine->Recall("cam", q).ok());
    }
    auto stats = engine->GetStats("cam");
    ASSERT_TRUE(stats.ok());
    ASSERT_GE(stats->index_recall_samples, 4u);
    ASSERT_LT(stats->index_recall_at_k, 0.95);
    if (with_sim) {
      EXPECT_NE(stats->accel.warning.find("below the sim accelerator's "
                                          "recall floor 0.95"),
                std::string::npos)
          << stats->accel.warning;
      ASSERT_EQ(warnings.size(), 1u);  // Once per crossing, not per recall.
      EXPECT_EQ(warnings[0].rfind("stream \"cam\": index IVF16,Flat", 0), 0u)
          << warnings[0];
    } else {
      EXPECT_TRUE(stats->accel.warning.empty());
      EXPECT_TRUE(warnings.empty());
    }
  }
}

}  // namespace
}  // namespace kvmem

// The simulated accelerator's cost model grows as it says it does.
#include "engine/accel/sim_model.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "engine/accel/device_profile.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(SimModelTest, SearchCostGrowsWithVectorsAndCandidates) {
  const SimHardware hw;
  const SimCost small = SearchCost(hw, 10800, 128, 64);
  const SimCost more_vectors = SearchCost(hw, 100000, 128, 64);
  const SimCost more_refined = SearchCost(hw, 10800, 128, 20000);
  EXPECT_GT(small.seconds, 0);
  EXPECT_GT(more_vectors.seconds, small.seconds);
  EXPECT_GT(more_vectors.dram_bytes, small.dram_bytes);
  EXPECT_GT(more_refined.seconds, small.seconds);
  EXPECT_GT(more_refined.joules, small.joules);
  // 10,800 x 128 at 8 bits through 256 lanes at 800 MHz: 5,400 cycles +
  // 32 fill = 6.79 us. DRAM: 1,382,400 B of int8 summaries + 64 x 128 x 2 B
  // refined = 1,398,784 B (21,856 bursts of 64) at 100 GB/s = 13.99 us: the
  // call is DRAM-bound.
  EXPECT_EQ(small.dram_bytes, 1398784u);
  EXPECT_NEAR(small.seconds, 1398784.0 / 100e9, 1e-12);
  // 4-bit first stage halves the stream.
  SimHardware four = hw;
  four.precision_bits = 4;
  EXPECT_LT(SearchCost(four, 10800, 128, 64).dram_bytes, small.dram_bytes);
}

TEST(SimModelTest, MisalignedOrFrameMajorMovesCostMore) {
  const SimHardware hw;
  const uint64_t block = 256 * 1024;  // One block of KV.
  const SimCost aligned = MoveCost(hw, block, 0, true, 1);
  const SimCost misaligned = MoveCost(hw, block, 32, true, 1);
  EXPECT_EQ(aligned.dram_bytes, block);
  EXPECT_GT(misaligned.dram_bytes, aligned.dram_bytes);
  EXPECT_GT(misaligned.seconds, aligned.seconds);
  // Frame-major: 2 layers x K/V x 4 frames = 16 runs of 16 KiB + 16 B each
  // (rows not burst multiples): every run pays its own tail and setup.
  const SimCost frame_major = MoveCost(hw, block + 16 * 16, 0, false, 16);
  const SimCost one_run = MoveCost(hw, block + 16 * 16, 0, true, 1);
  EXPECT_GT(frame_major.dram_bytes, one_run.dram_bytes);
  EXPECT_GT(frame_major.seconds, one_run.seconds);
  // Misalignment hurts frame-major moves once per row.
  EXPECT_GT(MoveCost(hw, block, 32, false, 16).dram_bytes,
            MoveCost(hw, block, 32, true, 1).dram_bytes);
}

TEST(SimModelTest, ProfilesGiveHardwareAndBadValuesNameTheKey) {
  const std::filesystem::path dir = KVMEM_PROFILES_DIR;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto p = LoadDeviceProfile(e.path().string());
    ASSERT_TRUE(p.ok()) << p.status();
    auto hw = SimHardwareFromProfile(*p);
    ASSERT_TRUE(hw.ok()) << e.path() << ": " << hw.status();
    EXPECT_EQ(hw->dram_bandwidth_bytes_per_s,
              p->Get("dram_bandwidth_gbs", 0) * 1e9);
    EXPECT_EQ(hw->sram_bytes, p->Get("sim_sram_kib", 0) * 1024);
    EXPECT_EQ(hw->max_blocks_per_injection,
              p->Get("sim_max_blocks_per_injection", 0));
    EXPECT_EQ(hw->recall_floor, p->Get("sim_recall_floor", 0));
  }
  // Absent keys keep the defaults; an SRAM of one granule is refused.
  auto empty = ParseDeviceProfile("name = \"x\"\n", "t");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(SimHardwareFromProfile(*empty)->sram_bytes,
            SimHardware().sram_bytes);
  auto tiny = ParseDeviceProfile(
      "name = \"x\"\nsim_sram_kib = 256\nsim_sram_granule_kib = 256\n", "t");
  ASSERT_TRUE(tiny.ok());
  EXPECT_NE(SimHardwareFromProfile(*tiny).status().message().find(
                "sim_sram_granule_kib is 256"),
            std::string::npos);
  auto bad = ParseDeviceProfile("name = \"x\"\nsim_precision_bits = 12\n", "t");
  ASSERT_TRUE(bad.ok());
  const auto hw = SimHardwareFromProfile(*bad);
  ASSERT_FALSE(hw.ok());
  EXPECT_EQ(hw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(hw.status().message().find("sim_precision_bits is 12"),
            std::string::npos)
      << hw.status();
}

TEST(SimModelTest, DoubleBufferingOverlapsMovesWithConsumption) {
  SimHardware hw;
  const uint64_t buffer = 512 << 10;  // Two halves of 256 KiB.
  // One layer-major item of four half-buffers: four chunks.
  const StageItem big{1 << 20, 0, true, 1};
  const SimCost m = MoveCost(hw, 256 << 10, 0, true, 1);
  const double c = (256 << 10) / hw.sram_read_bytes_per_s;
  const SimCost dbl = InjectionCost(hw, &big, 1, buffer);
  // m_1 + 3 max(m, c) + c.
  EXPECT_NEAR(dbl.seconds, m.seconds + 3 * std::max(m.seconds, c) + c, 1e-15);
  EXPECT_EQ(dbl.dram_bytes, 4 * m.dram_bytes);
  hw.double_buffering = false;
  // Without: the whole buffer per chunk (two chunks), move then consume.
  const SimCost single = InjectionCost(hw, &big, 1, buffer);
  const SimCost m2 = MoveCost(hw, 512 << 10, 0, true, 1);
  EXPECT_NEAR(single.seconds, 2 * (m2.seconds + 2 * c), 1e-15);
  EXPECT_GT(single.seconds, dbl.seconds);
  // Misaligned and frame-major items cost more here too.
  hw.double_buffering = true;
  const StageItem misaligned{1 << 20, 32, true, 1};
  const StageItem frame_major{1 << 20, 0, false, 64};
  EXPECT_GT(InjectionCost(hw, &misaligned, 1, buffer).seconds, dbl.seconds);
  EXPECT_GT(InjectionCost(hw, &frame_major, 1, buffer).seconds, dbl.seconds);
  // A frame-major item is chunked on rows: 64 rows of 16 KiB, 16 per half.
  EXPECT_EQ(InjectionCost(hw, &frame_major, 1, buffer).dram_bytes,
            4 * MoveCost(hw, 256 << 10, 0, false, 16).dram_bytes);
}

TEST(SimModelTest, StagingTakesWholeGranulesAndLeavesTheHotWindowOne) {
  SimHardware hw;
  hw.sram_bytes = 2 << 20;
  hw.sram_granule_bytes = 256 << 10;
  const StageItem small{1000, 0, true, 1};
  const StageItem mid{300 << 10, 0, true, 1};
  const StageItem huge{64 << 20, 0, true, 1};
  EXPECT_EQ(StagingBytesFor(hw, nullptr, 0), 256u << 10);
  EXPECT_EQ(StagingBytesFor(hw, &small, 1), 256u << 10);
  // Double-buffered: 2 x 300 KiB = 600 KiB -> three granules.
  EXPECT_EQ(StagingBytesFor(hw, &mid, 1), 768u << 10);
  EXPECT_EQ(StagingBytesFor(hw, &huge, 1), (2u << 20) - (256u << 10));
  hw.double_buffering = false;
  EXPECT_EQ(StagingBytesFor(hw, &mid, 1), 512u << 10);
}

// Two engines over the same frames, one with the sim backend: the same
// recall sets; only the sim reports a modelled cost: the model's search over
// every summary (refining the pool the planner asks for), then each group
// of at most max_blocks_per_injection blocks (warm: one layer-major run;
// otherwise a run per frame, layer and K/V) through the staging buffer.
TEST(SimModelTest, SimBackendRecallsAsTheCpuAndAddsModelledCost) {
  const testing::TestGeometry g;
  testing::TempDir dir_cpu, dir_sim;
  SimHardware hw;
  hw.max_blocks_per_injection = 2;  // Several injections per recall.
  EngineOptions sim_options;
  sim_options.sim = hw;
  auto cpu = testing::OpenTestEngine(dir_cpu.path());
  auto sim = testing::OpenTestEngine(dir_sim.path(), sim_options);
  const StreamConfig c = testing::TestConfig(g, 16, 2);
  ASSERT_TRUE(cpu->OpenStream("cam", c).ok());
  ASSERT_TRUE(sim->OpenStream("cam", c).ok());
  std::mt19937_64 rng(8);
  const uint64_t per_token = 3 * 2 * g.kv_heads * g.head_dim * 2;
  const uint32_t dim = 2 * g.kv_heads * g.head_dim;
  const double arbitration = hw.arbitration_cycles / hw.clock_hz;
  const uint64_t idle = StagingBytesFor(hw, nullptr, 0);
  uint32_t injections = 0;
  for (uint64_t i = 0; i < 120; ++i) {
    const testing::FloatFrame f = testing::RandomFrame(rng, g, 4);
    for (MemoryEngine* e : {cpu.get(), sim.get()}) {
      ASSERT_TRUE(e->Append("cam", testing::FrameOf(f, i, g.dtype)).ok());
    }
    if (i % 30 != 29) continue;
    RecallQuery q;
    q.query = testing::RandomQuery(rng, dim);
    q.max_tokens = 40;
    q.top_k = 8;
    auto a = cpu->Recall("cam", q);
    auto b = sim->Recall("cam", q);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->blocks.size(), b->blocks.size());
    ASSERT_GE(a->blocks.size(), 3u);
    for (size_t k = 0; k < a->blocks.size(); ++k) {
      EXPECT_EQ(a->blocks[k].block.id, b->blocks[k].block.id);
      EXPECT_EQ(a->blocks[k].block.tier, b->blocks[k].block.tier);
    }
    EXPECT_EQ(a->accel.modelled_us, 0.0);
    EXPECT_EQ(a->accel.dram_bytes, 0u);
    EXPECT_EQ(a->accel.searches, 1u);
    EXPECT_EQ(a->accel.injections, 0u);
    auto stats = sim->GetStats("cam");
    ASSERT_TRUE(stats.ok());
    // The planner asks for top_k eligible results plus every window block.
    const uint64_t sealed = stats->sealed_blocks;
    const uint64_t asked =
        std::min<uint64_t>(b->top_k, b->candidates) + sealed - b->candidates;
    const SimCost s = SearchCost(hw, sealed, dim, std::min(sealed, asked));
    double want_us = (arbitration + s.seconds) * 1e6;
    uint64_t want_bytes = s.dram_bytes;
    double want_uj = s.joules * 1e6;
    std::vector<StageItem> items;
    for (const RecalledBlock& r : b->blocks) {
      items.push_back(
          {RecalledTokens(r) * per_token, 0, r.block.tier == Tier::kWarm,
           static_cast<uint32_t>(
               (r.block.last_frame - r.block.first_frame + 1) * 3 * 2)});
    }
    uint32_t want_injections = 0;
    for (size_t k = 0; k < items.size(); k += 2, ++want_injections) {
      const size_t n = std::min<size_t>(2, items.size() - k);
      const uint64_t staging = StagingBytesFor(hw, &items[k], n);
      const SimCost inj = InjectionCost(hw, &items[k], n, staging);
      want_us += (arbitration + inj.seconds) * 1e6;
      want_bytes += inj.dram_bytes;
      want_uj += inj.joules * 1e6;
      // Nobody else waits: the hot window takes its granules back.
      const SimCost refill = MoveCost(hw, staging - idle, 0, true, 1);
      want_bytes += refill.dram_bytes;
      want_uj += refill.joules * 1e6;
    }
    EXPECT_EQ(b->accel.injections, want_injections);
    EXPECT_GE(want_injections, 2u);
    EXPECT_NEAR(b->accel.modelled_us, want_us, 1e-6) << "frame " << i;
    EXPECT_EQ(b->accel.queue_us, 0.0);
    EXPECT_EQ(b->accel.dram_bytes, want_bytes);
    EXPECT_NEAR(b->accel.energy_uj, want_uj, 1e-6);
    injections += want_injections;
    // Stats carry the stream's totals and the device's (idle) SRAM split.
    EXPECT_EQ(stats->accel.backend, "sim");
    EXPECT_EQ(stats->accel.cost.injections, injections);
    EXPECT_EQ(stats->accel.sram_staging_bytes, idle);
    EXPECT_EQ(stats->accel.sram_hot_bytes, hw.sram_bytes - idle);
    EXPECT_EQ(stats->accel.recall_floor, hw.recall_floor);
    EXPECT_TRUE(stats->accel.warning.empty());
  }
  auto cpu_stats = cpu->GetStats("cam");
  ASSERT_TRUE(cpu_stats.ok());
  EXPECT_EQ(cpu_stats->accel.backend, "cpu");
  EXPECT_EQ(cpu_stats->accel.cost.searches, 4u);
  EXPECT_EQ(cpu_stats->accel.cost.modelled_us, 0.0);
}

}  // namespace
}  // namespace kvmem

// The simulated accelerator's cost model grows as it says it does.
#include "engine/sim_model.h"

#include <filesystem>
#include <random>

#include "engine/device_profile.h"
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
  }
  auto bad = ParseDeviceProfile("name = \"x\"\nsim_precision_bits = 12\n", "t");
  ASSERT_TRUE(bad.ok());
  const auto hw = SimHardwareFromProfile(*bad);
  ASSERT_FALSE(hw.ok());
  EXPECT_EQ(hw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(hw.status().message().find("sim_precision_bits is 12"),
            std::string::npos)
      << hw.status();
}

// Two engines over the same frames, one with the sim backend: the same
// recall sets; only the sim reports a modelled cost: the model's search over
// every summary plus moving each chosen block (warm: one layer-major run;
// otherwise a run per frame, layer and K/V).
TEST(SimModelTest, SimBackendRecallsAsTheCpuAndAddsModelledCost) {
  const testing::TestGeometry g;
  testing::TempDir dir_cpu, dir_sim;
  EngineOptions sim_options;
  sim_options.sim = SimHardware();
  auto cpu = testing::OpenTestEngine(dir_cpu.path());
  auto sim = testing::OpenTestEngine(dir_sim.path(), sim_options);
  const StreamConfig c = testing::TestConfig(g, 16, 2);
  ASSERT_TRUE(cpu->OpenStream("cam", c).ok());
  ASSERT_TRUE(sim->OpenStream("cam", c).ok());
  std::mt19937_64 rng(8);
  const SimHardware hw;
  const uint64_t per_token = 3 * 2 * g.kv_heads * g.head_dim * 2;
  for (uint64_t i = 0; i < 120; ++i) {
    const testing::FloatFrame f = testing::RandomFrame(rng, g, 4);
    for (MemoryEngine* e : {cpu.get(), sim.get()}) {
      ASSERT_TRUE(e->Append("cam", testing::FrameOf(f, i, g.dtype)).ok());
    }
    if (i % 30 != 29) continue;
    RecallQuery q;
    q.query = testing::RandomQuery(rng, 2 * g.kv_heads * g.head_dim);
    q.max_tokens = 24;
    auto a = cpu->Recall("cam", q);
    auto b = sim->Recall("cam", q);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->blocks.size(), b->blocks.size());
    ASSERT_FALSE(a->blocks.empty());
    for (size_t k = 0; k < a->blocks.size(); ++k) {
      EXPECT_EQ(a->blocks[k].block.id, b->blocks[k].block.id);
    }
    EXPECT_EQ(a->modelled_us, 0.0);
    EXPECT_EQ(a->modelled_dram_bytes, 0u);
    auto stats = sim->GetStats("cam");
    ASSERT_TRUE(stats.ok());
    SimCost want =
        SearchCost(hw, stats->sealed_blocks, 2 * g.kv_heads * g.head_dim,
                   std::min<uint64_t>(stats->sealed_blocks, b->top_k));
    for (const RecalledBlock& r : b->blocks) {
      const SimCost m = MoveCost(
          hw, RecalledTokens(r) * per_token, 0, r.block.tier == Tier::kWarm,
          static_cast<uint32_t>((r.block.last_frame - r.block.first_frame + 1) *
                                3 * 2));
      want.seconds += m.seconds;
      want.dram_bytes += m.dram_bytes;
      want.joules += m.joules;
    }
    EXPECT_NEAR(b->modelled_us, want.seconds * 1e6, 1e-9) << "frame " << i;
    EXPECT_EQ(b->modelled_dram_bytes, want.dram_bytes);
    EXPECT_NEAR(b->modelled_energy_uj, want.joules * 1e6, 1e-9);
    EXPECT_GT(b->modelled_us, 0.0);
  }
}

}  // namespace
}  // namespace kvmem

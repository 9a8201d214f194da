// The simulated accelerator's cost model grows as it says it does.
#include "engine/sim_model.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace kvmem

// The append path's CPU by stage (engine/stream/ingest_cpu.h): every stage
// a sealing append passes through is charged, and the stages never add up
// to more than the process spent.
#include "engine/stream/ingest_cpu.h"

#include <time.h>

#include <random>

#include "engine/memory_engine.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

uint64_t ProcessCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(ts.tv_nsec);
}

TEST(IngestCpuTest, SealingAppendsChargeEveryStageWithinTheProcessCpu) {
  testing::TempDir dir;
  auto engine = testing::OpenTestEngine(dir.path());
  ASSERT_NE(engine, nullptr);
  const testing::TestGeometry g;
  StreamConfig c = testing::TestConfig(g, /*window=*/40, /*fpb=*/3);
  c.groups_per_block = 4;  // Token groups and codes at each seal.
  c.weights.score = ScoreMode::kMass;
  ASSERT_TRUE(engine->OpenStream("cam", c).ok());
  std::mt19937_64 rng(3);
  testing::StreamModel model(g, 3, 40, {2, 0});
  const uint64_t before = ProcessCpuNs();
  for (uint64_t f = 0; f < 30; ++f) {
    ASSERT_TRUE(
        engine->Append("cam", testing::ToFrame(model.AddFrame(rng, 12), f))
            .ok());
  }
  auto stats = engine->GetStats("cam");  // Seals what an ack left pending.
  const uint64_t spent = ProcessCpuNs() - before;
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->sealed_blocks, 10u);
  uint64_t sum = 0;
  for (int i = 0; i < kIngestStages; ++i) {
    EXPECT_GT(stats->ingest_cpu_ns[i], 0u) << kIngestStageNames[i];
    sum += stats->ingest_cpu_ns[i];
  }
  EXPECT_LE(sum, spent) << "the stages count more CPU than the process spent";
}

TEST(IngestCpuTest, AClockWithoutASinkChargesNothing) {
  IngestCpu cpu;
  StageClock counted(&cpu), none(nullptr);
  volatile double x = 1;
  for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
  counted.Mark(IngestStage::kCommit);
  none.Mark(IngestStage::kCommit);
  const IngestCpuNs ns = cpu.Snapshot();
  EXPECT_GT(ns[static_cast<int>(IngestStage::kCommit)], 0u);
  for (int i = 0; i < kIngestStages; ++i) {
    if (i != static_cast<int>(IngestStage::kCommit)) {
      EXPECT_EQ(ns[i], 0u);
    }
  }
}

}  // namespace
}  // namespace kvmem

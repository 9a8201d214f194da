// One simulated camera-hour (10,800 frames at 3 fps, small geometry) with a
// warm budget of 2 MiB: the warm tier never exceeds it, RSS stays flat after
// warm-up, and recall keeps answering throughout.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "engine/stream_config.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

uint64_t RssBytes() {
  return static_cast<uint64_t>(testing::RssKib(::getpid())) * 1024;
}

TEST(LongRunTest, OneCameraHourStaysWithinBudgetsAndFlatRss) {
  testing::TempDir dir;
  testing::TestGeometry g;
  g.layers = 2;
  g.head_dim = 16;
  constexpr uint32_t kTokens = 16;
  constexpr uint64_t kFrames = 10800;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(g, 256, 12);
  c.indexed_layers = {1, 0};
  c.segment_mode = SegmentMode::kShot;
  c.max_tokens_per_block = 64;  // So blocks fit the default budget (20 %).
  c.default_max_tokens = 96;
  c.tiers.warm_budget_bytes = 2 << 20;
  c.tiers.cold_budget_bytes = 8 << 20;
  c.tiers.storage_cap_bytes = 24 << 20;
  c.tiers.prefetch_blocks = 2;
  c.tiers.stage_budget_bytes = 256 << 10;
  c.tiers.rebuild_every_blocks = 200;
  c.weights.track = 1;
  ASSERT_TRUE(e->OpenStream("cam", c).ok());
  // Frames are generated and dropped: the test keeps no model of the stream,
  // so the RSS it measures is the engine's.
  const size_t summary_dim = 2 * g.kv_heads * g.head_dim;
  std::mt19937_64 rng(10);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<std::vector<float>> places;
  for (int p = 0; p < 8; ++p) places.push_back(testing::RandomQuery(rng, 16));
  uint64_t rss_warm = 0, max_warm = 0, recalls = 0, empty_recalls = 0;
  int place = 0, shot_left = 0;
  for (uint64_t f = 0; f < kFrames; ++f) {
    if (shot_left-- == 0) {  // A cut every 2-10 s, places revisited.
      place = rng() % places.size();
      shot_left = 6 + rng() % 24;
    }
    FrameSignals sig;
    for (float x : places[place]) sig.scene_embedding.push_back(x + noise(rng));
    sig.detections.push_back(
        {static_cast<uint64_t>(place), 0, 0.1f, 0.1f, 0.4f, 0.4f, 0.9f});
    Frame frame;
    frame.index = f;
    frame.first_token_position = f * kTokens;
    frame.token_count = kTokens;
    frame.payload =
        testing::Encode(testing::RandomFrame(rng, g, kTokens), g.dtype);
    frame.signals = sig;
    frame.timestamp_us = static_cast<int64_t>(f) * 1000000 / 3;
    auto r = e->Append("cam", std::move(frame));
    ASSERT_TRUE(r.ok()) << r.status();
    if (f % 3 == 2) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, summary_dim);
      q.signals = sig;
      auto rec = e->Recall("cam", q);
      ASSERT_TRUE(rec.ok()) << rec.status();
      ++recalls;
      if (f > 300 && rec->blocks.empty()) ++empty_recalls;
    }
    if (f % 50 == 0) {
      const StreamStats s = *e->GetStats("cam");
      ASSERT_LE(s.warm.bytes, c.tiers.warm_budget_bytes) << "frame " << f;
      ASSERT_LE(s.cold.bytes, c.tiers.cold_budget_bytes) << "frame " << f;
      max_warm = std::max(max_warm, s.warm.bytes);
    }
    if (f == kFrames / 3) {
      e->WaitForBackground();
      rss_warm = RssBytes();
    }
  }
  e->WaitForBackground();
  const uint64_t rss_end = RssBytes();
  const StreamStats s = *e->GetStats("cam");
  std::printf(
      "long run: %llu frames, %llu blocks (warm %llu / cold %llu / degraded "
      "%llu / evicted %llu), max warm %.2f MiB, RSS %.1f MiB at 1/3 -> %.1f "
      "MiB at end, %llu recalls (p50 %u us, p99 %u us), rebuilds %llu, "
      "stage hits %llu of %llu staged\n",
      static_cast<unsigned long long>(s.frames),
      static_cast<unsigned long long>(s.sealed_blocks),
      static_cast<unsigned long long>(s.warm.blocks),
      static_cast<unsigned long long>(s.cold.blocks),
      static_cast<unsigned long long>(s.degraded.blocks),
      static_cast<unsigned long long>(s.evicted.blocks), max_warm / 1048576.0,
      rss_warm / 1048576.0, rss_end / 1048576.0,
      static_cast<unsigned long long>(recalls), s.policy.recall_us_p50,
      s.policy.recall_us_p99,
      static_cast<unsigned long long>(s.policy.rebuilds),
      static_cast<unsigned long long>(s.policy.stage_hits),
      static_cast<unsigned long long>(s.policy.staged));
  EXPECT_EQ(s.frames, kFrames);
  EXPECT_GT(s.warm.blocks, 0u);
  EXPECT_GT(s.cold.blocks, 0u);
  EXPECT_GT(s.degraded.blocks, 0u);
  EXPECT_GT(s.policy.rebuilds, 0u);
  EXPECT_EQ(empty_recalls, 0u);
  // 2/3 of the hour appends ~85 MiB of KV; the process may grow by what
  // stays in RAM per block (summaries, index entries, records: ~2 KiB each,
  // ~4 MiB for the ~1,900 blocks sealed meanwhile) plus RocksDB file
  // metadata and allocator slack (measured: 7-9 MiB; on a Zen 5 VM with
  // kernel 6.18, 13.8-16.8 MiB in three runs, which failed the 16 MiB this
  // bound was), not by the KV.
#if !KVMEM_TEST_ASAN
  EXPECT_LT(rss_end, rss_warm + (24u << 20))
      << "RSS grew from " << rss_warm << " to " << rss_end;
#endif
}

// Two camera-days' blocks (64,800 a day: 3 fps, 4 frames a block),
// compressed in time with one-frame blocks, under a storage cap that evicts
// all but the newest ~200: the engine's heap must not grow with the
// stream's age. The outside report measured ~3.7 KiB kept per evicted block
// (240 MiB a day); with every evicted block's card kept it was 120-360 B.
// Heap in use (mallinfo2) is sampled over the second day (the first fills
// RocksDB's memtables and block cache, which then cycle by a few MiB); its
// slope per evicted block is printed and bounded.
TEST(LongRunTest, CameraDayOfEvictionsKeepsHeapFlat) {
  if (KVMEM_TEST_ASAN) GTEST_SKIP() << "heap figures mean nothing under ASan";
  testing::TempDir dir;
  testing::TestGeometry g;
  g.layers = 2;
  g.head_dim = 32;
  constexpr uint32_t kTokens = 16;
  constexpr uint64_t kBlocks = 2 * 64800;
  auto e = testing::OpenTestEngine(dir.path());
  StreamConfig c = testing::TestConfig(g, 64, 1);
  c.indexed_layers = {0, 1};
  const uint64_t frame_bytes = FramePayloadBytes(c.geometry, kTokens);
  c.tiers.warm_budget_bytes = 32 * frame_bytes;
  c.tiers.cold_budget_bytes = 64 * frame_bytes;
  c.tiers.storage_cap_bytes = 200 * frame_bytes;
  c.weights.track = 1;
  ASSERT_TRUE(e->OpenStream("cam", c).ok());
  const size_t summary_dim = 2 * g.kv_heads * g.head_dim;
  std::mt19937_64 rng(12);
  // (evicted blocks, bytes): heap in use, and the process's RSS.
  std::vector<std::pair<uint64_t, double>> heap, rss;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t f = 0; f < kBlocks; ++f) {
    Frame frame =
        testing::FrameOf(testing::RandomFrame(rng, g, kTokens), f, g.dtype);
    // People come and go: a few tracks per frame, new ids all day.
    for (uint64_t t = 0; t < 3; ++t) {
      frame.signals.detections.push_back(
          {f / 90 + t * 7, 0, 0.1f, 0.1f, 0.4f, 0.4f, 0.9f});
    }
    FrameSignals sig = frame.signals;
    ASSERT_TRUE(e->Append("cam", std::move(frame)).ok());
    if (f % 30 == 0) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, summary_dim);
      q.signals = sig;
      ASSERT_TRUE(e->Recall("cam", q).ok());
    }
    if (f >= kBlocks / 2 && f % 2000 == 0) {
      e->WaitForBackground();
      const StreamStats s = *e->GetStats("cam");
      heap.emplace_back(s.evicted.blocks,
                        static_cast<double>(mallinfo2().uordblks));
      rss.emplace_back(s.evicted.blocks, static_cast<double>(RssBytes()));
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  const StreamStats s = *e->GetStats("cam");
  // Least-squares slope of bytes over evicted blocks.
  auto slope_of = [](const std::vector<std::pair<uint64_t, double>>& v) {
    double mx = 0, my = 0;
    for (const auto& [x, y] : v) mx += x, my += y;
    mx /= v.size();
    my /= v.size();
    double sxy = 0, sxx = 0;
    for (const auto& [x, y] : v) {
      sxy += (x - mx) * (y - my);
      sxx += (x - mx) * (x - mx);
    }
    return sxx > 0 ? sxy / sxx : 0;
  };
  const double slope = slope_of(heap), rss_slope = slope_of(rss);
  std::printf(
      "two camera-days: %llu blocks (%llu evicted) in %.1f s; heap %.1f MiB "
      "after day 1 -> %.1f MiB at end; slope %.1f bytes per evicted block "
      "(%.2f MiB per camera-day of 64,800 blocks); RSS %.1f -> %.1f MiB, "
      "slope %.1f bytes per evicted block\n",
      static_cast<unsigned long long>(s.sealed_blocks),
      static_cast<unsigned long long>(s.evicted.blocks), secs,
      heap.front().second / 1048576.0, heap.back().second / 1048576.0, slope,
      slope * 64800 / 1048576.0, rss.front().second / 1048576.0,
      rss.back().second / 1048576.0, rss_slope);
  EXPECT_GT(s.evicted.blocks, kBlocks - 400);
  // Noise: the memtable cycle moves the day-2 slope by up to ~+-60 B.
  EXPECT_LT(slope, 128.0) << "bytes kept per evicted block";
}

}  // namespace
}  // namespace kvmem

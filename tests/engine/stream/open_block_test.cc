// OpenBlock (frames of the block being built) and BlockTable (sealed blocks
// by id, the evicted run dropped from the front), each on its own.
#include "engine/stream/open_block.h"

#include <random>

#include "engine/stream_config.h"
#include "engine/view/block_table.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(OpenBlockTest, HoldsTheVeryPayloadsAndSealsTheirSummary) {
  const testing::TestGeometry g;
  const StreamConfig config = WithDefaults(testing::TestConfig(g, 64, 3));
  OpenBlock open(config);
  std::mt19937_64 rng(5);
  std::vector<testing::FloatFrame> floats;
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 3; ++i) {
    floats.push_back(testing::RandomFrame(rng, g, 2 + i));
    Frame f = testing::FrameOf(floats.back(), i, g.dtype);
    f.signals.detections.push_back({7, 1, 0.1f, 0.1f, 0.4f, 0.4f, 0.9f});
    payloads.push_back(f.payload);
    const char* buffer = f.payload.data();
    open.Add(&f, open.Signature(f));
    EXPECT_EQ(open.payload_data(i), buffer) << "moved in, not copied";
  }
  EXPECT_EQ(open.payload_data(3), nullptr);
  EXPECT_EQ(open.tokens(), 2u + 3u + 4u);
  EXPECT_EQ(open.last_payload(), payloads.back());
  EXPECT_TRUE(open.FullAfter(3));  // Three frames per block.
  EXPECT_FALSE(open.FullAfter(2));

  BlockRecord rec;
  std::unique_ptr<WarmBlock> warm = open.Seal(&rec);
  EXPECT_EQ(rec.frame_tokens, (std::vector<uint32_t>{2, 3, 4}));
  ASSERT_EQ(rec.tracks.size(), 1u);
  EXPECT_EQ(rec.tracks[0].track_id, 7u);
  // The summary is the mean key of the indexed layers over every token.
  const std::vector<double> want = testing::MeanKey(
      g, {&floats[0], &floats[1], &floats[2]}, config.indexed_layers);
  ASSERT_EQ(rec.summary.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(rec.summary[i], want[i], 1e-3) << i;
  }
  // The warm copy holds every frame's keys, layer-major.
  ASSERT_NE(warm, nullptr);
  EXPECT_EQ(warm->K(0).size(), 2 * LayerSliceElements(config.geometry, 9));

  open.Reset();
  EXPECT_EQ(open.tokens(), 0u);
  EXPECT_EQ(open.payload_data(0), nullptr);
}

BlockEntry Entry(uint64_t id, DiskForm disk) {
  BlockEntry e;
  e.rec.info.id = id;
  e.rec.disk = disk;
  return e;
}

TEST(BlockTableTest, DropsOnlyTheLeadingRunOfGoneBlocks) {
  BlockTable t;
  for (uint64_t id = 0; id < 6; ++id) {
    t.push_back(
        Entry(id, id == 2 || id == 4 ? DiskForm::kFrames : DiskForm::kNone));
  }
  EXPECT_EQ(t.size(), 6u);
  EXPECT_EQ(t.first(), 0u);
  auto gone = [](const BlockEntry& e) { return e.rec.disk == DiskForm::kNone; };
  // 0 and 1 are gone; 2 stops the run, so 3 stays (a card between kept ones).
  EXPECT_EQ(t.DropLeading(gone), 2u);
  EXPECT_EQ(t.first(), 2u);
  EXPECT_EQ(t.size(), 6u);  // Ids keep counting.
  EXPECT_FALSE(t.Has(1));
  EXPECT_TRUE(t.Has(3));
  EXPECT_FALSE(t.Has(6));
  EXPECT_EQ(t[3].rec.info.id, 3u);
  EXPECT_EQ(t.DropLeading(gone), 0u);
  t[2].rec.disk = DiskForm::kNone;  // Block 2 evicted: 2 and 3 go.
  EXPECT_EQ(t.DropLeading(gone), 2u);
  EXPECT_EQ(t.first(), 4u);
  t.push_back(Entry(6, DiskForm::kFrames));
  EXPECT_EQ(t.size(), 7u);
  EXPECT_EQ(t[6].rec.info.id, 6u);
  size_t kept = 0;
  for (const BlockEntry& e : t) kept += e.rec.info.id >= 4;
  EXPECT_EQ(kept, 3u);
}

}  // namespace
}  // namespace kvmem

// FrameIngest hands a received payload to the stream without copying it, and
// assembles chunked frames in one buffer.
#include "server/service/frame_ingest.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(FrameIngestTest, WholeFramePayloadReachesTheStreamWithoutACopy) {
  const testing::TestGeometry g;
  testing::TempDir dir;
  auto engine = testing::OpenTestEngine(dir.path());
  ASSERT_TRUE(engine->OpenStream("cam", testing::TestConfig(g, 64, 4)).ok());
  auto stream = engine->Find("cam");
  ASSERT_TRUE(stream.ok());
  FrameIngest ingest(*stream);
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i < 3; ++i) {
    const Frame f =
        testing::FrameOf(testing::RandomFrame(rng, g, 4), i, g.dtype);
    v1::FrameHeader h;
    h.set_frame_index(i);
    h.set_first_token_position(f.first_token_position);
    h.set_token_count(f.token_count);
    h.set_payload_bytes(f.payload.size());
    h.set_payload(f.payload);
    const char* received = h.payload().data();
    auto r = ingest.OnHeader(&h);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value());
    // The open block holds the very buffer the message was parsed into.
    EXPECT_EQ(StreamTestPeer::OpenPayloadData(*stream, i), received) << i;
  }
  // A chunked frame arrives in pieces and is stored whole.
  const Frame f = testing::FrameOf(testing::RandomFrame(rng, g, 4), 3, g.dtype);
  v1::FrameHeader h;
  h.set_frame_index(3);
  h.set_first_token_position(f.first_token_position);
  h.set_token_count(f.token_count);
  h.set_payload_bytes(f.payload.size());
  h.set_payload(f.payload.substr(0, 100));
  auto r = ingest.OnHeader(&h);
  ASSERT_TRUE(r.ok() && !r->has_value());
  v1::PayloadChunk c;
  c.set_frame_index(3);
  c.set_offset(100);
  c.set_data(f.payload.substr(100));
  r = ingest.OnChunk(&c);
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status();
  EXPECT_EQ(ingest.frames_written(), 4u);
  auto stored = engine->Find("cam");
  ASSERT_TRUE(stored.ok());
  auto payload = stored->ReadBlockPayload(0, PayloadLayout::kFrameMajor, {});
  // Frames 0..3 make block 0 (4 frames per block): its last piece is frame 3.
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_EQ(payload->size(), 4u);
  EXPECT_EQ(payload->back().ToString(), f.payload);
}

}  // namespace
}  // namespace kvmem

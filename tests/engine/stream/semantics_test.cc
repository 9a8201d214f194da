// Semantic signals (engine/signals/semantics.h): what a block's builder keeps,
// and how a query's detections and scene match a block.
#include "engine/signals/semantics.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

Detection Box(uint64_t track, float x0, float y0, float x1, float y1) {
  return {track, 1, x0, y0, x1, y1, 0.9f};
}

TEST(SemanticsTest, BuilderCountsFramesPerTrackAndKeepsTheLastBox) {
  BlockSemanticsBuilder b;
  FrameSignals f0;
  f0.detections = {Box(7, 0, 0, 1, 1), Box(3, 0, 0, 0.5f, 0.5f)};
  f0.scene_embedding = {1, 0};
  b.AddFrame(10, f0);
  FrameSignals f1;
  // Track 7 twice in one frame counts once; its last box is kept.
  f1.detections = {Box(7, 0.1f, 0, 1, 1), Box(7, 0.2f, 0.2f, 0.6f, 0.6f)};
  f1.scene_embedding = {0, 1};
  b.AddFrame(11, f1);
  const std::vector<TrackPresence> t = b.Tracks();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].track_id, 3u);  // Sorted by id.
  EXPECT_EQ(t[0].frames, 1u);
  EXPECT_EQ(t[1].track_id, 7u);
  EXPECT_EQ(t[1].frames, 2u);
  EXPECT_EQ(t[1].first_frame, 10u);
  EXPECT_EQ(t[1].last_frame, 11u);
  EXPECT_FLOAT_EQ(t[1].box[0], 0.2f);
  EXPECT_EQ(b.SceneMean(), (std::vector<float>{0.5f, 0.5f}));
  // A frame whose scene has another length: no mean at all.
  FrameSignals f2;
  f2.scene_embedding = {1, 2, 3};
  b.AddFrame(12, f2);
  EXPECT_TRUE(b.SceneMean().empty());
  b.Reset();
  EXPECT_TRUE(b.Tracks().empty());
  EXPECT_TRUE(b.SceneMean().empty());
}

TEST(SemanticsTest, IoUAndCosineEdgeCases) {
  const float a[4] = {0, 0, 2, 2}, b[4] = {1, 1, 3, 3}, far[4] = {5, 5, 6, 6};
  EXPECT_FLOAT_EQ(BoxIoU(a, a), 1.0f);
  EXPECT_FLOAT_EQ(BoxIoU(a, b), 1.0f / 7.0f);  // 1 / (4 + 4 - 1).
  EXPECT_EQ(BoxIoU(a, far), 0.0f);
  const float point[4] = {1, 1, 1, 1};
  EXPECT_EQ(BoxIoU(point, point), 0.0f);  // No area: 0, not NaN.
  EXPECT_FLOAT_EQ(Cosine({1, 0}, {2, 0}), 1.0f);
  EXPECT_FLOAT_EQ(Cosine({1, 0}, {-1, 0}), -1.0f);
  EXPECT_EQ(Cosine({}, {}), 0.0f);
  EXPECT_EQ(Cosine({1, 0}, {1, 0, 0}), 0.0f);
  EXPECT_EQ(Cosine({0, 0}, {1, 0}), 0.0f);
}

TEST(SemanticsTest, MatchAndScore) {
  BlockRecord block;
  block.tracks.resize(2);
  block.tracks[0].track_id = 3;
  block.tracks[1].track_id = 7;
  const float box7[4] = {0, 0, 2, 2};
  std::copy(box7, box7 + 4, block.tracks[1].box);
  block.scene = {1, 0};
  FrameSignals q;
  q.detections = {Box(7, 1, 1, 3, 3), Box(9, 0, 0, 1, 1)};
  q.scene_embedding = {-1, 0};  // Opposite scene: clamped to 0.
  const SemanticMatch m = MatchSignals(block, q);
  EXPECT_FLOAT_EQ(m.tracks, 0.5f);  // One of the query's two tracks.
  EXPECT_FLOAT_EQ(m.iou, 1.0f / 7.0f);
  EXPECT_EQ(m.scene, 0.0f);
  RecallWeights w;
  w.track = 2;
  w.iou = 7;
  w.scene = 5;
  EXPECT_FLOAT_EQ(SemanticScore(m, w), 2 * 0.5f + 1.0f);
  q.scene_embedding = {2, 0};
  EXPECT_FLOAT_EQ(MatchSignals(block, q).scene, 1.0f);
  // No detections in the query: no track or IoU term.
  q.detections.clear();
  EXPECT_EQ(MatchSignals(block, q).tracks, 0.0f);
  EXPECT_EQ(MatchSignals(block, q).iou, 0.0f);
}

}  // namespace
}  // namespace kvmem

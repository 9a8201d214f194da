// Finite in, finite out: at the largest inputs kvmem accepts (keys and
// queries of magnitude 65536, gate_temperature 0.001) every score, mass,
// priority and gate of a recall is finite, in both score modes and every
// dtype that can hold them; just past the bounds (3e38 keys in FP32 and
// BF16, 3e38 queries, gate_temperature 1e-45: the report's inputs that
// returned inf scores and NaN gates) is INVALID_ARGUMENT.
#include <cmath>
#include <random>

#include "engine/memory_engine.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

// Frame i with every key and value at +-magnitude (random signs).
Frame Extreme(std::mt19937_64& rng, const testing::TestGeometry& g, uint64_t i,
              float magnitude) {
  testing::FloatFrame f = testing::RandomFrame(rng, g, 4);
  for (float& v : f.values) v = v < 0 ? -magnitude : magnitude;
  return testing::FrameOf(f, i, g.dtype);
}

void ExpectFinite(const RecallResult& r, const char* what) {
  ASSERT_FALSE(r.blocks.empty()) << what;
  double gates = 0;
  for (const RecalledBlock& b : r.blocks) {
    EXPECT_TRUE(std::isfinite(b.score)) << what << " score " << b.score;
    EXPECT_TRUE(std::isfinite(b.priority)) << what << " priority";
    EXPECT_TRUE(std::isfinite(b.mass)) << what << " mass " << b.mass;
    EXPECT_TRUE(std::isfinite(b.gate_weight)) << what << " gate";
    gates += b.gate_weight;
  }
  EXPECT_NEAR(gates, 1.0, 1e-4) << what;
  EXPECT_TRUE(std::isfinite(r.recalled_mass)) << what;
}

TEST(BoundsTest, LargestAcceptedInputsGiveFiniteScoresAndGates) {
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    for (ScoreMode mode : {ScoreMode::kMass, ScoreMode::kSummed}) {
      testing::TempDir dir;
      auto e = testing::OpenTestEngine(dir.path());
      testing::TestGeometry g;
      g.dtype = dtype;
      g.head_dim = 4096;  // The largest head: the longest dot products.
      g.layers = 2;
      g.kv_heads = 1;
      StreamConfig c = testing::TestConfig(g, 4, 1);
      c.indexed_layers = {0, 1};
      c.weights.score = mode;
      c.gate_temperature = 0.001f;
      ASSERT_TRUE(e->OpenStream("cam", c).ok());
      std::mt19937_64 rng(4);
      for (uint64_t i = 0; i < 8; ++i) {
        auto a = e->Append("cam", Extreme(rng, g, i, 65536.0f));
        ASSERT_TRUE(a.ok()) << a.status();
      }
      RecallQuery q;
      for (uint32_t k = 0; k < 2 * g.head_dim; ++k) {
        q.query.push_back(k % 3 == 0 ? -65536.0f : 65536.0f);
      }
      q.max_tokens = 64;
      auto r = e->Recall("cam", q);
      ASSERT_TRUE(r.ok()) << r.status();
      ExpectFinite(*r, DTypeName(dtype));
      q.window_lse = {65536.0f, -65536.0f};
      if (mode == ScoreMode::kMass) {
        r = e->Recall("cam", q);
        ASSERT_TRUE(r.ok()) << r.status();
        ExpectFinite(*r, "window_lse at the bound");
      }

      // Past the bounds.
      auto bad = e->Append("cam", Extreme(rng, g, 8, 3e38f));
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(bad.status().message().find("[-65536, 65536]"),
                std::string::npos)
          << bad.status();
      q.window_lse.clear();
      q.query[5] = 3e38f;
      EXPECT_EQ(e->Recall("cam", q).status().code(),
                absl::StatusCode::kInvalidArgument);
      c.gate_temperature = 1e-45f;
      EXPECT_EQ(e->OpenStream("other", c).status().code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
}

// One embedding model per stream: a scene embedding whose length changes
// is refused (it was accepted, and shot cuts compared vectors of different
// lengths), before and after a restart.
TEST(BoundsTest, SceneEmbeddingLengthIsFixedPerStream) {
  testing::TempDir dir;
  const testing::TestGeometry g;
  StreamConfig c = testing::TestConfig(g, 16, 4);
  c.segment_mode = SegmentMode::kShot;
  std::mt19937_64 rng(2);
  auto frame = [&](uint64_t i, size_t dim) {
    Frame f = testing::FrameOf(testing::RandomFrame(rng, g, 4), i, g.dtype);
    f.signals.scene_embedding.assign(dim, 0.5f);
    return f;
  };
  {
    auto e = testing::OpenTestEngine(dir.path());
    ASSERT_TRUE(e->OpenStream("cam", c).ok());
    ASSERT_TRUE(e->Append("cam", frame(0, 8)).ok());
    auto bad = e->Append("cam", frame(1, 9));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("has 9 values; stream \"cam\" has "
                                          "had 8"),
              std::string::npos)
        << bad.status();
    for (uint64_t i = 1; i < 6; ++i)
      ASSERT_TRUE(e->Append("cam", frame(i, 8)).ok());
  }
  auto e = testing::OpenTestEngine(dir.path());
  EXPECT_EQ(e->Append("cam", frame(6, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(e->Append("cam", frame(6, 8)).ok());
}

}  // namespace
}  // namespace kvmem

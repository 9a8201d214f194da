// RecallScorer: the registry, and a scorer added by a test alone. "Oldest
// first" is defined below in one class and registered with one call; no
// stream, recall or tier file knows it, and recalls through MemoryEngine
// match its oracle over StreamModel's blocks (tests/stream_model.h).
#include "engine/recall/scorer.h"

#include <algorithm>
#include <memory>

#include "engine/codec/record_codec.h"
#include "engine/memory_engine.h"
#include "engine/stream_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::StreamModel;
using testing::ToFrame;

// Recalls the oldest eligible blocks first, whole, ignoring the query.
class OldestFirst final : public RecallScorer {
 public:
  const std::string& name() const override { return name_; }
  absl::Status Score(const RecallView& view, const ScoreRequest& req,
                     ScoredRecall* out, CallCost*) const override
      ABSL_SHARED_LOCKS_REQUIRED(view.mu()) {
    out->policy.mode = ScoreMode::kSummed;  // Scores rank as they are.
    out->policy.max_tokens = req.budget.tokens;
    out->policy.top_k = req.budget.top_k;
    ScoredSet& set = out->sets.emplace_back();
    const BlockTable& blocks = view.blocks();
    for (uint64_t b = blocks.first(); b < req.eligible; ++b) {
      if (blocks[b].rec.disk == DiskForm::kNone) continue;
      set.ranked.push_back(
          {b, 0, blocks[b].rec.info.token_count, -static_cast<float>(b), 0});
    }
    return absl::OkStatus();
  }

 private:
  const std::string name_ = "oldest_first";
};

void RegisterOldestFirstOnce() {
  static const absl::Status registered =
      RegisterRecallScorer(std::make_unique<OldestFirst>());
  ASSERT_TRUE(registered.ok()) << registered;
}

// The oracle: the eligible blocks in id order, each taken while it fits the
// budget, at most top_k (0: no cap).
std::vector<uint64_t> OldestOracle(const StreamModel& m, uint32_t top_k,
                                   uint32_t max_tokens) {
  std::vector<uint64_t> ids;
  uint32_t used = 0;
  for (const testing::OracleHit& h : m.Eligible()) {
    if (top_k > 0 && ids.size() >= top_k) break;
    if (used + h.tokens > max_tokens) continue;
    used += h.tokens;
    ids.push_back(h.block_id);
  }
  return ids;
}

TEST(ScorerTest, BuiltInsAreRegisteredAndNamesAreChecked) {
  const std::vector<std::string> names = RecallScorerNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "mass"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "summed"), names.end());
  ASSERT_NE(FindRecallScorer("mass"), nullptr);
  EXPECT_TRUE(FindRecallScorer("mass")->answers_per_head());
  EXPECT_TRUE(FindRecallScorer("mass")->wants_open_mean());
  EXPECT_TRUE(FindRecallScorer("summed")->wants_layer_indexes());
  EXPECT_EQ(FindRecallScorer("no_such"), nullptr);

  class Named final : public RecallScorer {
   public:
    explicit Named(std::string n) : n_(std::move(n)) {}
    const std::string& name() const override { return n_; }
    absl::Status Score(const RecallView&, const ScoreRequest&, ScoredRecall*,
                       CallCost*) const override {
      return absl::OkStatus();
    }

   private:
    std::string n_;
  };
  EXPECT_EQ(RegisterRecallScorer(std::make_unique<Named>("mass")).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(RegisterRecallScorer(std::make_unique<Named>("Bad Name")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterRecallScorer(nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScorerTest, ConfigNamesAScorerAndAgreesWithTheScoreMode) {
  RegisterOldestFirstOnce();
  testing::TestGeometry g;
  StreamConfig c = testing::TestConfig(g, 40, 3);
  c.weights.score = ScoreMode::kUnspecified;
  c.weights.scorer = "no_such";
  absl::Status s = ValidateStreamConfig(WithDefaults(c));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("config.recall_policy.scorer is \"no_such\""));
  EXPECT_THAT(s.message(),
              HasSubstr("mass, mass_groups, oldest_first, summed"));
  c.weights.scorer = std::string(1 << 20, 'x');  // Not echoed back whole.
  s = ValidateStreamConfig(WithDefaults(c));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has 1048576 bytes"));
  EXPECT_LT(s.message().size(), 200u);
  c.weights.scorer = "summed";
  c.weights.score = ScoreMode::kMass;
  s = ValidateStreamConfig(WithDefaults(c));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("set one of the two"));
  // Either alone names the same built-in scorer.
  c.weights.score = ScoreMode::kSummed;
  c.weights.scorer.clear();
  EXPECT_EQ(WithDefaults(c).weights.scorer, "summed");
  c.weights.score = ScoreMode::kUnspecified;
  c.weights.scorer = "summed";
  EXPECT_EQ(WithDefaults(c).weights.score, ScoreMode::kSummed);
  c.weights.scorer = "oldest_first";
  EXPECT_TRUE(ValidateStreamConfig(WithDefaults(c)).ok());
  EXPECT_EQ(WithDefaults(c).weights.score, ScoreMode::kUnspecified);
}

TEST(ScorerTest, AScorerAddedByATestRecallsThroughTheEngine) {
  RegisterOldestFirstOnce();
  testing::TempDir dir;
  testing::TestGeometry g;
  StreamModel model(g, /*frames_per_block=*/3, /*hot_window=*/40, {2, 0});
  StreamConfig c = testing::TestConfig(g, 40, 3);
  c.weights.score = ScoreMode::kUnspecified;
  c.weights.scorer = "oldest_first";
  std::mt19937_64 rng(5);
  {
    auto e = testing::OpenTestEngine(dir.path());
    ASSERT_TRUE(e->OpenStream("cam", c).ok());
    for (uint64_t i = 0; i < 45; ++i) {
      ASSERT_TRUE(
          e->Append("cam", ToFrame(model.AddFrame(rng, 1 + rng() % 12), i))
              .ok());
    }
    size_t returned = 0;
    for (int i = 0; i < 12; ++i) {
      RecallQuery q;
      q.query = testing::RandomQuery(rng, model.summary_dim());
      q.top_k = i % 4;  // 0: no cap.
      q.max_tokens = 5 + 11 * i;
      auto got = e->Recall("cam", q);
      ASSERT_TRUE(got.ok()) << got.status();
      std::vector<uint64_t> ids;
      for (const RecalledBlock& b : got->blocks) ids.push_back(b.block.id);
      EXPECT_EQ(ids, OldestOracle(model, q.top_k, q.max_tokens)) << i;
      EXPECT_LE(got->total_tokens, q.max_tokens);
      returned += ids.size();
    }
    EXPECT_GT(returned, 0u);
    // Its answers do not answer per head: that is MASS's.
    RecallQuery per_head;
    per_head.query = testing::RandomQuery(rng, model.summary_dim());
    per_head.per_head = true;
    EXPECT_THAT(e->Recall("cam", per_head).status().message(),
                HasSubstr("scores with \"oldest_first\""));
  }
  // The name is stored with the stream: a restart recalls the same way.
  auto e = testing::OpenTestEngine(dir.path());
  auto stats = e->GetStats("cam");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->config.weights.scorer, "oldest_first");
  RecallQuery q;
  q.query = testing::RandomQuery(rng, model.summary_dim());
  q.max_tokens = 30;
  auto got = e->Recall("cam", q);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<uint64_t> ids;
  for (const RecalledBlock& b : got->blocks) ids.push_back(b.block.id);
  EXPECT_EQ(ids, OldestOracle(model, 0, 30));
}

// A stored stream naming a scorer this build does not have is quarantined
// (FAILED_PRECONDITION), and the others serve.
TEST(ScorerTest, AStreamNamingAnUnknownScorerIsQuarantined) {
  testing::TempDir dir;
  testing::TestGeometry g;
  {
    auto e = testing::OpenTestEngine(dir.path());
    ASSERT_TRUE(e->OpenStream("ok", testing::TestConfig(g, 40, 3)).ok());
  }
  {
    std::unique_ptr<ColdStore> store = testing::OpenTestStore(dir.path());
    ASSERT_NE(store, nullptr);
    StreamConfig c = WithDefaults(testing::TestConfig(g, 40, 3));
    c.weights.score = ScoreMode::kUnspecified;
    c.weights.scorer = "gone_scorer";
    StreamWrite w;
    w.stream_id = "orphan";
    w.config = EncodeConfig(c);
    w.state = EncodeState(StreamState());
    ASSERT_TRUE(store->Commit(w).ok());
  }
  auto e = testing::OpenTestEngine(dir.path());
  std::vector<std::string> quarantined;
  for (const QuarantinedStream& q : e->Quarantined()) {
    quarantined.push_back(q.stream_id);
    EXPECT_EQ(q.reason.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(q.reason.message(), HasSubstr("gone_scorer"));
  }
  EXPECT_THAT(quarantined, ElementsAre("orphan"));
  EXPECT_TRUE(e->GetStats("ok").ok());
}

}  // namespace
}  // namespace kvmem

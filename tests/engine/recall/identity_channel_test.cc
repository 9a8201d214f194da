// The identity channel of score MASS (engine/recall/identity_channel.h):
// the planner takes each channel's units within its share and every token
// once; the query as a whole is scored by the documented formula; through
// the engine, a query's track brings back its last appearance outside the
// window, and the channel shares follow the documented rule.
#include "engine/recall/identity_channel.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "engine/recall/mass_estimate.h"
#include "engine/recall/recall_planner.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

PlanUnit Token(uint64_t block, uint32_t token, float density,
               RecallChannel channel = RecallChannel::kAttention) {
  PlanUnit u{block, 0, 1, density, 0, token};
  u.channel = channel;
  return u;
}

PlanPolicy Mass(uint32_t max_tokens) {
  PlanPolicy p;
  p.mode = ScoreMode::kMass;
  p.max_tokens = max_tokens;
  return p;
}

TEST(IdentityPlanTest, ChannelsTakeTheirShareFirstAndEachTokenOnce) {
  RecallPlanner planner(Mass(6));
  // Tracks: at most 2 tokens of the 3 offered.
  planner.Take({Token(1, 0, 0.1f, RecallChannel::kTrack),
                Token(1, 1, 0.1f, RecallChannel::kTrack),
                Token(1, 2, 0.1f, RecallChannel::kTrack)},
               2);
  // The query: up to 3 in the identity share; its first unit repeats a
  // track token (not taken again, not counted).
  planner.Take({Token(1, 1, 0.2f, RecallChannel::kQuery),
                Token(2, 5, 0.2f, RecallChannel::kQuery),
                Token(2, 6, 0.2f, RecallChannel::kQuery)},
               1);
  // Attention fills the rest, skipping what the channels took.
  planner.Take({Token(2, 5, 0.9f), Token(3, 0, 0.8f), Token(1, 0, 0.7f),
                Token(3, 1, 0.6f), Token(3, 2, 0.5f), Token(3, 3, 0.4f)});
  const RecallPlan plan = planner.Finish();
  EXPECT_EQ(plan.total_tokens, 6u);
  EXPECT_EQ(plan.channels.track, 2u);
  EXPECT_EQ(plan.channels.query, 1u);
  EXPECT_EQ(plan.channels.attention, 3u);
  std::set<std::pair<uint64_t, uint32_t>> seen;
  for (const PlannedBlock& b : plan.blocks) {
    for (uint32_t t : b.single_tokens) {
      EXPECT_TRUE(seen.insert({b.block, t}).second)
          << "block " << b.block << " token " << t << " twice";
    }
    if (b.block == 1) {
      EXPECT_EQ(b.track_tokens, (PlanTokens{0, 1}));
    }
    if (b.block == 2) {
      EXPECT_EQ(b.query_tokens, (PlanTokens{5}));
    }
  }
  EXPECT_EQ(seen.size(), 6u);
}

TEST(IdentityPlanTest, SplitIsTheDocumentedRule) {
  EXPECT_EQ(SplitIdentity(614, 0.25f, 0).identity, 154u);  // round(153.5)
  EXPECT_EQ(SplitIdentity(614, 0.25f, 0).track, 0u);
  EXPECT_EQ(SplitIdentity(614, 0.25f, 3).track, 77u);  // half, rounded up
  EXPECT_EQ(SplitIdentity(10, 1.0f, 2).identity, 10u);
  EXPECT_EQ(SplitIdentity(10, 0.0f, 2).identity, 0u);
  EXPECT_EQ(SplitIdentity(10, 0.0f, 2).track, 0u);
  RecallWeights w;
  RecallQuery q;
  EXPECT_EQ(IdentityShare(w, q), kDefaultIdentityShare);
  w.identity_share = 0.5f;
  EXPECT_EQ(IdentityShare(w, q), 0.5f);
  q.identity_share = 0.0f;
  EXPECT_EQ(IdentityShare(w, q), 0.0f);
}

// The mean vector's density against a direct computation in double: the
// logit of the weighted mean vector is the weighted mean of the logits.
TEST(IdentityPlanTest, MeanVectorDensityIsTheFormula) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0.0f, 3.0f);
  const uint32_t heads = 4, vectors = 3, m = 7;
  const std::vector<float> weight = {0.5f, 0.25f, 0.25f};
  std::vector<float> dots(m * vectors * heads);
  for (float& d : dots) d = g(rng);
  MassEstimate mean;
  mean.heads = heads;
  mean.vectors = 1;
  for (uint32_t h = 0; h < heads; ++h) mean.log_norm.push_back(2.0f + h);
  // The vectors' own estimate (its densities are CandidateDensities',
  // tested in mass_estimate_test.cc).
  MassEstimate est;
  est.heads = heads;
  est.vectors = vectors;
  est.weight = weight;
  est.log_norm.assign(vectors * heads, 3.0f);
  const float scale = 0.25f;
  for (const auto& [h0, h1] : {std::pair<uint32_t, uint32_t>{0, 4},
                               std::pair<uint32_t, uint32_t>{1, 2}}) {
    DensityTerms terms;
    PrepareDensityTerms(est, h0, h1, scale, &mean, weight.data(), &terms);
    std::vector<float> attention(m), got(m);
    TermDensities(terms, dots.data(), m, attention.data(), got.data());
    for (uint32_t c = 0; c < m; ++c) {
      double want = 0;
      for (uint32_t h = h0; h < h1; ++h) {
        double z = 0;
        for (uint32_t j = 0; j < vectors; ++j) {
          z += double(weight[j]) * dots[(c * vectors + j) * heads + h];
        }
        want += std::exp(z * scale - mean.log_norm[h]);
      }
      want /= (h1 - h0);
      EXPECT_NEAR(got[c], want, 2e-5 * want) << "candidate " << c;
    }
  }
}

// Through the engine: track 7 shows in the first frames only, with keys
// that match nothing the query asks for; the query (a direction planted in
// other tokens) carries track 7's detection.
class TrackChannelTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kFpb = 2, kTokens = 8, kWindow = 64;
  static constexpr uint32_t kFrames = 60;

  void SetUp() override {
    engine_ = testing::OpenTestEngine(dir_.path());
    StreamConfig c = testing::TestConfig(g_, kWindow, kFpb);
    c.weights.score = ScoreMode::kMass;
    c.weights.scorer = "mass";
    c.groups_per_block = 0;
    ASSERT_TRUE(engine_->OpenStream("s", c).ok());
    std::mt19937_64 rng(23);
    uint64_t pos = 0;
    for (uint64_t f = 0; f < kFrames; ++f) {
      testing::ModelFrame m;
      m.kv = testing::RandomFrame(rng, g_, kTokens);
      m.first_pos = pos;
      m.bytes = testing::Encode(m.kv, g_.dtype);
      pos += kTokens;
      FrameSignals sig;
      if (f < 6) sig.detections.push_back({7, 1, 0.1f, 0.1f, 0.3f, 0.3f, 0.9f});
      ASSERT_TRUE(engine_->Append("s", testing::ToFrame(m, f, sig)).ok());
    }
    query_.resize(2 * g_.kv_heads * g_.head_dim);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (float& x : query_) x = n(rng);
  }

  RecallQuery Query(std::optional<float> share, bool track) const {
    RecallQuery q;
    q.query = query_;
    q.max_tokens = 24;
    q.identity_share = share;
    if (track)
      q.signals.detections.push_back({7, 1, 0.2f, 0.2f, 0.4f, 0.4f, 1});
    return q;
  }

  testing::TempDir dir_;
  const testing::TestGeometry g_{};
  std::unique_ptr<MemoryEngine> engine_;
  std::vector<float> query_;
};

TEST_F(TrackChannelTest, ATrackBringsBackItsLastAppearanceWithinItsShare) {
  for (std::optional<float> share :
       {std::optional<float>(), std::optional<float>(0.0f),
        std::optional<float>(0.25f), std::optional<float>(0.5f),
        std::optional<float>(1.0f)}) {
    SCOPED_TRACE(share.value_or(-1));
    auto r = engine_->Recall("s", Query(share, true));
    ASSERT_TRUE(r.ok()) << r.status();
    const float s = share.value_or(kDefaultIdentityShare);
    const uint32_t identity = static_cast<uint32_t>(std::lround(s * 24));
    const ChannelTokens& ch = r->channels;
    EXPECT_LE(r->total_tokens, 24u);
    EXPECT_EQ(ch.attention + ch.query + ch.track, r->total_tokens);
    EXPECT_EQ(ch.identity_budget, identity);
    EXPECT_LE(ch.query + ch.track, identity);
    EXPECT_LE(ch.track, (identity + 1) / 2);
    uint32_t track = 0, query = 0;
    bool anchor_recalled = false;
    for (const RecalledBlock& b : r->blocks) {
      std::vector<uint32_t> chosen = b.token_offsets;
      if (chosen.empty()) {
        for (uint32_t t = 0; t < b.block.token_count; ++t) chosen.push_back(t);
      }
      for (const auto* part : {&b.query_offsets, &b.track_offsets}) {
        EXPECT_TRUE(std::is_sorted(part->begin(), part->end()));
        for (uint32_t t : *part) {
          EXPECT_TRUE(std::binary_search(chosen.begin(), chosen.end(), t))
              << "block " << b.block.id << " token " << t;
        }
      }
      track += b.track_offsets.size();
      query += b.query_offsets.size();
      // Frames 0-5 hold the track: blocks 0-2; its last block is 2.
      if (!b.track_offsets.empty()) {
        EXPECT_EQ(b.block.id, 2u);
        anchor_recalled = true;
      }
    }
    EXPECT_EQ(track, ch.track);
    EXPECT_EQ(query, ch.query);
    // Half of the identity share goes to the one track (its block has 16
    // tokens, more than the part).
    EXPECT_EQ(anchor_recalled, identity > 0);
    if (identity > 0) {
      EXPECT_EQ(ch.track, (identity + 1) / 2);
    }
  }
}

TEST_F(TrackChannelTest, WithoutTracksTheQueryAsAWholeTakesTheShare) {
  auto r = engine_->Recall("s", Query(0.5f, false));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->channels.track, 0u);
  EXPECT_EQ(r->channels.query, 12u);
  EXPECT_EQ(r->channels.attention, r->total_tokens - 12u);
}

TEST_F(TrackChannelTest, ASharePastOneIsRefusedNamingTheField) {
  for (float bad : {1.5f, -0.5f, -1.0f, NAN}) {
    auto r = engine_->Recall("s", Query(bad, true));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("budget.identity_share"),
              absl::string_view::npos)
        << r.status();
  }
  StreamConfig c = testing::TestConfig(g_, kWindow, kFpb);
  c.weights.identity_share = 2.0f;
  auto s = engine_->OpenStream("t", c);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("config.recall_policy.identity_share"),
            absl::string_view::npos)
      << s.status();
}

}  // namespace
}  // namespace kvmem

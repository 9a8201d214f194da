// Token-resolution recall (engine/recall/token_stage.h, scorer "mass"):
// per-token densities against the formula computed directly in double, and
// through a real engine over RocksDB: budgets filled token by token and
// never exceeded, offsets inside their blocks and outside the window, and
// more of the true attention mass than whole groups ("mass_groups") when
// attention lives in a few tokens of many blocks; and the same recall sets
// with the recall's loops spread over helper threads (recall_threads).
#include "engine/recall/token_stage.h"

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "engine/memory_engine.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(TokenStageTest, DensitiesAreTheFormulaOverTheCodes) {
  for (const auto& [h0, h1] : {std::pair<uint32_t, uint32_t>{0, 6},
                               std::pair<uint32_t, uint32_t>{2, 3}}) {
    std::mt19937_64 rng(3 + h0);
    const uint32_t hd = 32, heads = 6, vectors = 3;
    const TokenCodeShape shape{heads, hd};
    const size_t n = 20;
    const std::vector<float> keys =
        testing::RandomNormal(rng, n * heads * hd, 1.0f);
    const std::vector<float> query =
        testing::RandomNormal(rng, vectors * heads * hd, 2.0f);
    const std::string codes = EncodeTokenCodes(shape, keys.data(), n);
    TokenQuery q;
    PrepareTokenQuery(shape, query.data(), vectors, &q);
    MassEstimate est;
    est.heads = heads;
    est.vectors = vectors;
    std::normal_distribution<float> lse(6.0f, 1.0f);
    for (size_t i = 0; i < vectors * heads; ++i)
      est.log_norm.push_back(lse(rng));
    TokenStageInput in;
    in.query = &q;
    in.est = &est;
    in.h0 = h0;
    in.h1 = h1;
    in.logit_scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // A run of 5 records from record 3.
    const std::vector<uint32_t> tokens = {3, 4, 5, 6, 7};
    std::vector<float> got(tokens.size());
    TokenDensities(shape, in,
                   reinterpret_cast<const uint8_t*>(codes.data()) +
                       3 * shape.bytes_per_token(),
                   tokens.size(), got.data());
    std::vector<float> key(heads * hd);
    for (size_t k = 0; k < tokens.size(); ++k) {
      DecodeTokenCodes(shape, codes, tokens[k], key.data());
      // The query as the kernel reads it: int8 times its scale.
      double want = 0, exact = 0;
      for (uint32_t j = 0; j < vectors; ++j) {
        for (uint32_t h = h0; h < h1; ++h) {
          const size_t r = size_t{j} * heads + h;
          double dot = 0, dot_exact = 0;
          for (uint32_t i = 0; i < hd; ++i) {
            dot += double(q.q[r * 64 + i]) * q.scale[r] * key[h * hd + i];
            dot_exact += double(query[r * hd + i]) *
                         keys[(tokens[k] * heads + h) * hd + i];
          }
          const double s = 1.0 / std::sqrt(double(hd));
          want += std::exp(dot * s - est.log_norm[r]);
          exact += std::exp(dot_exact * s - est.log_norm[r]);
        }
      }
      want /= vectors * (h1 - h0);
      exact /= vectors * (h1 - h0);
      // The formula over the codes, to float rounding (and fast_exp's
      // relative error, engine/recall/fast_exp.h).
      EXPECT_NEAR(got[k], want, 2e-5 * want) << "token " << tokens[k];
      // And against the exact keys: within int4's rounding of the logits.
      EXPECT_NEAR(std::log(got[k]), std::log(exact), 0.35)
          << "token " << tokens[k];
    }
  }
}

// GroupOrder's places are each group's tokens in append order, group by
// group, over several place lists a block: blocks of 1 to 700 tokens, 1 to
// 64 groups, some empty, tokens of groups beyond the count without a place,
// places past the block dropped.
TEST(TokenStageTest, GroupOrderPlacesAreEachGroupsTokensInAppendOrder) {
  std::mt19937_64 rng(31);
  GroupOrder order;
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng() % 700);
    const uint32_t groups = 1 + static_cast<uint32_t>(rng() % 64);
    std::vector<uint8_t> token_group(n);
    std::vector<uint32_t> counts(groups, 0);
    for (uint8_t& g : token_group) {
      // A few tokens of no group (>= groups); group 0 often left empty.
      g = static_cast<uint8_t>(rng() % 20 == 0 ? groups + rng() % 3
                                               : rng() % groups);
      if (trial % 3 == 0 && g == 0) g = static_cast<uint8_t>(groups - 1);
      if (g < groups) ++counts[g];
    }
    std::vector<uint32_t> want;  // [place]: the token there.
    for (uint32_t g = 0; g < groups; ++g) {
      for (uint32_t t = 0; t < n; ++t) {
        if (token_group[t] == g) want.push_back(t);
      }
    }
    order.Reset(token_group, counts.data(), groups);
    // Place lists as a recall asks: a few, then (sometimes) many.
    const uint32_t lists = 1 + static_cast<uint32_t>(rng() % 6);
    std::vector<uint32_t> got;
    for (uint32_t l = 0; l < lists; ++l) {
      std::vector<uint32_t> places(rng() % 2 == 0 ? rng() % 6 : rng() % 60);
      for (uint32_t& p : places) {
        p = static_cast<uint32_t>(rng() % (want.size() + 4));
      }
      order.Tokens(places, &got);
      std::vector<uint32_t> expect;
      for (uint32_t p : places) {
        if (p < want.size()) expect.push_back(want[p]);
      }
      ASSERT_EQ(got, expect) << "trial " << trial << " list " << l << ", " << n
                             << " tokens, " << groups << " groups";
    }
  }
}

// BestUntil equals a full sort's prefix, also where the best candidates
// are smaller than the mean, and where many hold no token.
TEST(TokenStageTest, BestUntilIsTheSortedPrefixThatHoldsTheBudget) {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 36; ++trial) {
    // Small pools of many candidates past 20.
    const size_t n = trial < 20 ? 1 + rng() % 3000 : 9000 + rng() % 60000;
    std::vector<float> value(n);
    std::vector<uint32_t> tokens(n);
    std::vector<uint64_t> id(n);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      value[i] = u(rng);
      // Odd trials: the best candidates are the smallest.
      tokens[i] = trial % 2 ? (value[i] > 0.9f ? 1 : 12) : 1 + rng() % 8;
      // Past 30: most hold no token.
      if (trial >= 30 && rng() % 10 != 0) tokens[i] = 0;
      id[i] = i;
    }
    std::shuffle(id.begin(), id.end(), rng);  // Unique ids, in no order.
    value[0] = value[n / 2];                  // A tie, broken by id.
    if (trial % 5 == 4) {
      // Many ties around where the floor falls.
      for (size_t i = 0; i < n; i += 3) value[i] = 0.95f;
    }
    const uint64_t budget = 1 + rng() % 2000;
    std::vector<uint32_t> all(n);
    for (uint32_t i = 0; i < n; ++i) all[i] = i;
    std::sort(all.begin(), all.end(), [&](uint32_t a, uint32_t b) {
      return value[a] != value[b] ? value[a] > value[b] : id[a] > id[b];
    });
    std::vector<uint32_t> want;
    uint64_t held = 0;
    for (uint32_t i : all) {
      if (held >= budget) break;
      want.push_back(i);
      held += tokens[i];
    }
    EXPECT_EQ(BestUntil(value, tokens, id, budget), want) << "trial " << trial;
    // PoolUntil: the same candidates, in any order.
    std::vector<uint32_t> pool = PoolUntil(value, tokens, id, budget);
    std::sort(pool.begin(), pool.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(pool, want) << "trial " << trial;
  }
  // The edges: no budget, and a budget all of them do not exceed.
  const std::vector<float> v = {0.5f, 0.2f, 0.9f};
  const std::vector<uint32_t> t = {2, 3, 1};
  const std::vector<uint64_t> ids = {7, 8, 9};
  EXPECT_TRUE(PoolUntil(v, t, ids, 0).empty());
  EXPECT_EQ(PoolUntil(v, t, ids, 6).size(), 3u);
  EXPECT_EQ(PoolUntil(v, t, ids, 60).size(), 3u);
  std::vector<uint32_t> two = PoolUntil(v, t, ids, 3);  // 0.9 and 0.5.
  std::sort(two.begin(), two.end());
  EXPECT_EQ(two, (std::vector<uint32_t>{0, 2}));
}

// Two streams of the same frames, one per scorer: each block holds a few
// "needle" tokens whose keys share one direction among tokens that match
// nothing (attention lives in a few tokens of many blocks).
class NeedleTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kFpb = 3, kTokens = 8, kWindow = 48;
  static constexpr uint32_t kFrames = 90;

  void SetUp() override {
    engine_ = testing::OpenTestEngine(dir_.path());
    EngineOptions parallel;
    parallel.recall_threads = 3;
    parallel_ = testing::OpenTestEngine(parallel_dir_.path(), parallel);
    for (const char* scorer : {"mass", "mass_groups"}) {
      StreamConfig c = testing::TestConfig(g_, kWindow, kFpb);
      c.weights.score = ScoreMode::kMass;
      c.weights.scorer = scorer;
      c.index_factory = "Flat";
      c.groups_per_block = 0;  // The default: about one per 8 tokens.
      ASSERT_TRUE(engine_->OpenStream(scorer, c).ok()) << scorer;
      c.index_factory = "Progressive";  // It scans through the int8 kernel.
      ASSERT_TRUE(parallel_->OpenStream(scorer, c).ok()) << scorer;
      ASSERT_TRUE(engine_->OpenStream(std::string(scorer) + "-p", c).ok());
    }
    std::mt19937_64 rng(17);
    std::uniform_int_distribution<int> sign(0, 1);
    needle_.resize(layers_.size() * g_.kv_heads * g_.head_dim);
    for (float& x : needle_) x = sign(rng) ? 1.5f : -1.5f;
    uint64_t pos = 0;
    for (uint64_t f = 0; f < kFrames; ++f) {
      testing::FloatFrame kv = testing::RandomFrame(rng, g_, kTokens);
      // Frames 1 and 2 of each block: their token 5 is a needle.
      if (f % kFpb != 0) Plant(&kv, 5);
      testing::ModelFrame m;
      m.kv = kv;
      m.first_pos = pos;
      m.bytes = testing::Encode(kv, g_.dtype);
      pos += kTokens;
      for (const char* scorer : {"mass", "mass_groups"}) {
        ASSERT_TRUE(engine_->Append(scorer, testing::ToFrame(m, f)).ok());
        ASSERT_TRUE(parallel_->Append(scorer, testing::ToFrame(m, f)).ok());
        ASSERT_TRUE(
            engine_->Append(std::string(scorer) + "-p", testing::ToFrame(m, f))
                .ok());
      }
      frames_.push_back(std::move(kv));
    }
    next_pos_ = pos;
  }

  // Token t's keys of the indexed layers, the summary's order.
  std::vector<float> KeyOf(const testing::FloatFrame& kv, uint32_t t) const {
    std::vector<float> k;
    for (uint32_t l : layers_) {
      for (uint32_t h = 0; h < g_.kv_heads; ++h) {
        for (uint32_t d = 0; d < g_.head_dim; ++d) {
          k.push_back(kv.Key(g_, l, h, t, d));
        }
      }
    }
    return k;
  }

  void Plant(testing::FloatFrame* kv, uint32_t t) const {
    const size_t slice = size_t{g_.kv_heads} * kv->tokens * g_.head_dim;
    for (size_t li = 0; li < layers_.size(); ++li) {
      for (uint32_t h = 0; h < g_.kv_heads; ++h) {
        for (uint32_t d = 0; d < g_.head_dim; ++d) {
          kv->values[2 * slice * layers_[li] +
                     (size_t{h} * kv->tokens + t) * g_.head_dim + d] =
              needle_[(li * g_.kv_heads + h) * g_.head_dim + d];
        }
      }
    }
  }

  // The true attention mass of every eligible token for query q (one
  // vector) with window log-sum-exp w per head: mean over heads of
  // exp(z_th - L_h), L_h over the window and every eligible token.
  std::map<std::pair<uint64_t, uint32_t>, double> TrueMass(
      const std::vector<float>& q, float w) const {
    const uint32_t hd = g_.head_dim;
    const size_t heads = layers_.size() * g_.kv_heads;
    const uint64_t eligible_end = (next_pos_ - kWindow) / (kFpb * kTokens);
    std::vector<std::vector<double>> z;  // [token][head]
    std::vector<std::pair<uint64_t, uint32_t>> where;
    for (uint64_t b = 0; b < eligible_end; ++b) {
      for (uint32_t f = 0; f < kFpb; ++f) {
        for (uint32_t t = 0; t < kTokens; ++t) {
          const std::vector<float> k = KeyOf(frames_[b * kFpb + f], t);
          std::vector<double> zt(heads);
          for (size_t h = 0; h < heads; ++h) {
            double dot = 0;
            for (uint32_t d = 0; d < hd; ++d) {
              dot += double(q[h * hd + d]) * k[h * hd + d];
            }
            zt[h] = dot / std::sqrt(double(hd));
          }
          z.push_back(zt);
          where.emplace_back(b, f * kTokens + t);
        }
      }
    }
    std::vector<double> norm(heads, std::exp(double(w)));
    for (const auto& zt : z) {
      for (size_t h = 0; h < heads; ++h) norm[h] += std::exp(zt[h]);
    }
    std::map<std::pair<uint64_t, uint32_t>, double> mass;
    for (size_t i = 0; i < z.size(); ++i) {
      double m = 0;
      for (size_t h = 0; h < heads; ++h) m += std::exp(z[i][h]) / norm[h];
      mass[where[i]] = m / heads;
    }
    return mass;
  }

  testing::TempDir dir_, parallel_dir_;
  const testing::TestGeometry g_{};
  const std::vector<uint32_t> layers_ = {2, 0};
  std::unique_ptr<MemoryEngine> engine_;
  // The same streams (Progressive index) in an engine whose recalls use 3
  // threads; engine_ holds them too, as "<scorer>-p", for one thread.
  std::unique_ptr<MemoryEngine> parallel_;
  std::vector<testing::FloatFrame> frames_;
  std::vector<float> needle_;
  uint64_t next_pos_ = 0;
};

TEST_F(NeedleTest, TokensFillTheBudgetAndFindTheNeedles) {
  const size_t heads = layers_.size() * g_.kv_heads;
  std::vector<float> q = needle_;
  for (float& x : q) x *= 0.5f;
  const float w = 2.0f;
  const auto truth = TrueMass(q, w);
  std::vector<double> all;
  for (const auto& [k, m] : truth) all.push_back(m);
  std::sort(all.rbegin(), all.rend());
  const uint64_t window_start = next_pos_ - kWindow;
  for (uint32_t budget : {8u, 20u, 37u, 60u}) {
    double oracle = 0;
    for (uint32_t i = 0; i < budget && i < all.size(); ++i) oracle += all[i];
    std::map<std::string, double> got_mass;
    for (const char* scorer : {"mass", "mass_groups"}) {
      RecallQuery rq;
      rq.query = q;
      rq.window_lse.assign(heads, w);
      rq.max_tokens = budget;
      auto r = engine_->Recall(scorer, rq);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_LE(r->total_tokens, budget);
      uint32_t used = 0;
      double mass = 0;
      for (const RecalledBlock& b : r->blocks) {
        EXPECT_LE(b.block.end_token_position, window_start);
        const uint32_t n = RecalledTokens(b);
        used += n;
        std::vector<uint32_t> offsets = b.token_offsets;
        if (offsets.empty()) {
          for (uint32_t t = 0; t < b.block.token_count; ++t)
            offsets.push_back(t);
        }
        EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
        for (uint32_t t : offsets) {
          ASSERT_LT(t, b.block.token_count);
          mass += truth.at({b.block.id, t});
        }
      }
      EXPECT_EQ(used, r->total_tokens) << scorer;
      // recalled_mass is a share of the query's attention: the needles hold
      // far more than their groups' means say, and the token stage's
      // renormalisation (ScoredSet::mass_scale) keeps it one.
      // (Without it: 0.40, 1.01, 1.86 and 2.83 for true shares of 0.12,
      // 0.30, 0.56 and 0.85.)
      std::printf("%s budget %u: recalled_mass %.4f, true %.4f\n", scorer,
                  budget, r->recalled_mass, mass);
      EXPECT_LE(r->recalled_mass, 1.0f) << scorer << " budget " << budget;
      EXPECT_NEAR(r->recalled_mass, mass, 0.1)
          << scorer << " budget " << budget;
      if (std::string(scorer) == "mass") {
        // One token at a time: the budget is filled exactly, and every
        // pooled token was scored from its codes.
        EXPECT_EQ(used, budget);
        EXPECT_GE(r->tokens_scored, budget);
      } else {
        EXPECT_EQ(r->tokens_scored, 0u);
      }
      got_mass[scorer] = mass;
    }
    std::printf("budget %u: oracle %.4f, mass %.4f, mass_groups %.4f\n", budget,
                oracle, got_mass["mass"], got_mass["mass_groups"]);
    EXPECT_GE(got_mass["mass"], 0.9 * oracle) << "budget " << budget;
    EXPECT_GT(got_mass["mass"], got_mass["mass_groups"]) << "budget " << budget;
  }
}

// A front end that holds exactly its hot window holds none of the tokens of
// the block that straddles the window's start, and they are the most recent
// cold ones: "mass" recalls those before the window (by token), never one
// in it, with and without the front end's window_lse and per head;
// "mass_groups" (whole groups) leaves the block out.
TEST_F(NeedleTest, TheStraddlingBlocksTokensBeforeTheWindowAreRecallable) {
  const size_t heads = layers_.size() * g_.kv_heads;
  const uint32_t block_tokens = kFpb * kTokens;
  // The window ends 8 tokens before the newest one: it starts 16 tokens
  // into a block whose needles are at offsets 13 (before) and 21 (in it).
  const uint64_t window_end = next_pos_ - 8;
  const uint64_t window_start = window_end - kWindow;
  const uint64_t straddle = window_start / block_tokens;
  ASSERT_EQ(window_start % block_tokens, 16u);
  for (const char* scorer : {"mass", "mass_groups"}) {
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(::testing::Message() << scorer << ", variant " << variant);
      RecallQuery rq;
      rq.query = needle_;
      for (float& x : rq.query) x *= 0.5f;
      if (variant != 1) rq.window_lse.assign(heads, 2.0f);
      rq.per_head = variant == 2;
      // Every needle before the window (two per block, one in the
      // straddling block) and a few more.
      rq.max_tokens = 64;
      rq.current_token_position = window_end - 1;
      auto r = engine_->Recall(scorer, rq);
      ASSERT_TRUE(r.ok()) << r.status();
      std::vector<const std::vector<RecalledBlock>*> sets;
      if (rq.per_head) {
        for (const LayerRecallSet& s : r->layer_sets) sets.push_back(&s.blocks);
      } else {
        sets.push_back(&r->blocks);
      }
      ASSERT_FALSE(sets.empty());
      for (const std::vector<RecalledBlock>* blocks : sets) {
        bool straddle_needle = false;
        for (const RecalledBlock& b : *blocks) {
          if (std::string(scorer) == "mass_groups") {
            EXPECT_LE(b.block.end_token_position, window_start);
            continue;
          }
          ASSERT_LE(b.block.id, straddle);
          if (b.block.id < straddle) continue;
          ASSERT_FALSE(b.token_offsets.empty());  // Never the whole block.
          for (uint32_t t : b.token_offsets) {
            EXPECT_LT(b.block.first_token_position + t, window_start);
            straddle_needle |= t == 13;
          }
        }
        if (std::string(scorer) == "mass") {
          EXPECT_TRUE(straddle_needle);
        }
      }
    }
  }
}

// Helper threads change when the recall's scans and token scores are
// computed, not what they are: the recall sets are the same, token by
// token, with 1 and 3 threads, for queries of 1 and 5 vectors and budgets
// whose pools span several slices (kParallelPoolTokens).
TEST_F(NeedleTest, HelperThreadsGiveTheSameRecallSets) {
  const size_t heads = layers_.size() * g_.kv_heads;
  std::mt19937_64 rng(5);
  for (uint32_t vectors : {1u, 5u}) {
    for (uint32_t budget : {20u, 60u}) {
      RecallQuery rq;
      rq.query =
          testing::RandomNormal(rng, vectors * heads * g_.head_dim, 1.0f);
      for (size_t i = 0; i < needle_.size(); ++i) rq.query[i] += needle_[i];
      rq.window_lse.assign(vectors * heads, 2.0f);
      rq.max_tokens = budget;
      for (const char* scorer : {"mass", "mass_groups"}) {
        SCOPED_TRACE(::testing::Message() << scorer << ", " << vectors
                                          << " vectors, budget " << budget);
        auto one = engine_->Recall(std::string(scorer) + "-p", rq);
        auto three = parallel_->Recall(scorer, rq);
        ASSERT_TRUE(one.ok()) << one.status();
        ASSERT_TRUE(three.ok()) << three.status();
        EXPECT_EQ(one->total_tokens, three->total_tokens);
        EXPECT_EQ(one->tokens_scored, three->tokens_scored);
        if (std::string(scorer) == "mass") {
          EXPECT_GE(three->tokens_scored, 8u * budget);
        }
        ASSERT_EQ(one->blocks.size(), three->blocks.size());
        for (size_t b = 0; b < one->blocks.size(); ++b) {
          EXPECT_EQ(one->blocks[b].block.id, three->blocks[b].block.id);
          EXPECT_EQ(one->blocks[b].token_offsets,
                    three->blocks[b].token_offsets);
          EXPECT_EQ(one->blocks[b].mass, three->blocks[b].mass);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvmem

// Token groups: clustering of a block's keys, their records, and recall at
// group granularity through the engine over RocksDB (with a restart).
#include "engine/recall/token_groups.h"

#include <atomic>
#include <random>
#include <thread>

#include "engine/codec/dtype.h"
#include "engine/codec/record_codec.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

using testing::Encode;
using testing::FloatFrame;
using testing::TempDir;
using testing::TestGeometry;

// A frame whose token t shows "entity" kinds[t]: every layer's and head's key
// is that entity's direction plus a little noise (multiples of 1/64, exact
// in fp16). Values are noise.
FloatFrame PlantedFrame(const TestGeometry& g, const std::vector<int>& kinds,
                        std::mt19937_64& rng) {
  std::uniform_int_distribution<int> noise(-2, 2);
  FloatFrame f;
  f.tokens = static_cast<uint32_t>(kinds.size());
  const size_t slice = static_cast<size_t>(g.kv_heads) * f.tokens * g.head_dim;
  f.values.assign(g.layers * 2 * slice, 0.0f);
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      for (uint32_t t = 0; t < f.tokens; ++t) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          // Entity k is a one-hot-ish direction: dims 4k..4k+3 set to 1.
          const float base =
              d / 4 == static_cast<uint32_t>(kinds[t]) ? 1.0f : 0.0f;
          f.values[2 * slice * l + (h * f.tokens + t) * g.head_dim + d] =
              base + noise(rng) / 64.0f;
          f.values[2 * slice * l + slice + (h * f.tokens + t) * g.head_dim +
                   d] = noise(rng) / 64.0f;
        }
      }
    }
  }
  return f;
}

StreamConfig GroupConfig(const TestGeometry& g, uint32_t groups) {
  StreamConfig c =
      testing::TestConfig(g, /*window=*/16, /*frames_per_block=*/2);
  c.groups_per_block = groups;
  c.default_top_k = 8;
  return c;
}

TEST(TokenGroupsTest, ClustersPlantedEntitiesAndSummarisesEachGroup) {
  const TestGeometry g;
  std::mt19937_64 rng(1);
  const std::vector<int> kinds = {0, 0, 1, 2, 1, 0, 2, 2, 1, 0};
  const FloatFrame f = PlantedFrame(g, kinds, rng);
  const std::string bytes = Encode(f, g.dtype);
  const StreamConfig c = GroupConfig(g, 3);
  const TokenGroups tg =
      BuildTokenGroups(c, {absl::string_view(bytes)}, {f.tokens}, 3);
  ASSERT_EQ(tg.token_group.size(), kinds.size());
  const size_t dim = 2 * g.kv_heads * g.head_dim;  // Indexed layers {2, 0}.
  ASSERT_EQ(tg.summaries.size(), 3 * dim);
  // Same entity <=> same group.
  for (size_t a = 0; a < kinds.size(); ++a) {
    for (size_t b = 0; b < kinds.size(); ++b) {
      EXPECT_EQ(kinds[a] == kinds[b], tg.token_group[a] == tg.token_group[b])
          << a << " vs " << b;
    }
  }
  // Each summary is the plain mean key of its tokens, laid out like a block
  // summary: [indexed_layer][kv_head][head_dim].
  const std::vector<uint32_t> layers = {2, 0};
  for (uint8_t grp = 0; grp < 3; ++grp) {
    for (size_t li = 0; li < layers.size(); ++li) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          double sum = 0;
          int n = 0;
          for (uint32_t t = 0; t < f.tokens; ++t) {
            if (tg.token_group[t] != grp) continue;
            sum += f.Key(g, layers[li], h, t, d);
            ++n;
          }
          EXPECT_NEAR(
              tg.summaries[grp * dim + (li * g.kv_heads + h) * g.head_dim + d],
              sum / n, 1e-6);
        }
      }
    }
  }
  // More groups than tokens: one per token at most.
  const TokenGroups many =
      BuildTokenGroups(c, {absl::string_view(bytes)}, {f.tokens}, 64);
  EXPECT_LE(many.summaries.size() / dim, kinds.size());
  EXPECT_GE(many.summaries.size() / dim, 3u);
}

// Seals reuse pooled key buffers: a block's groups and codes do not depend
// on what was sealed before it (a larger block, then a smaller one, from
// several threads at once).
TEST(TokenGroupsTest, ABlocksGroupsDoNotDependOnEarlierSeals) {
  const TestGeometry g;
  std::mt19937_64 rng(2);
  const FloatFrame small = PlantedFrame(g, {0, 1, 2, 1, 0, 2}, rng);
  const FloatFrame large =
      PlantedFrame(g, {3, 0, 1, 2, 3, 1, 0, 2, 3, 1, 0, 2, 3, 0}, rng);
  const std::string small_bytes = Encode(small, g.dtype);
  const std::string large_bytes = Encode(large, g.dtype);
  const StreamConfig c = GroupConfig(g, 4);
  auto build = [&](const std::string& bytes, uint32_t tokens) {
    return BuildTokenGroups(c, {absl::string_view(bytes)}, {tokens}, 4);
  };
  const TokenGroups first = build(small_bytes, small.tokens);
  std::vector<std::thread> threads;
  std::atomic<int> differ{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        build(large_bytes, large.tokens);
        const TokenGroups again = build(small_bytes, small.tokens);
        if (again.token_group != first.token_group ||
            again.summaries != first.summaries || again.codes != first.codes) {
          differ.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(differ.load(), 0);
  EXPECT_FALSE(first.codes.empty());
}

// A 7B-shaped block (32 layers x 8 KV heads x 128, every layer indexed:
// 32,768 floats of keys a token) is clustered on a fold of its keys to 2,048
// floats (token_groups.cc kClusterDim). Token t shows entity t % 12: a
// random key pattern per layer and head, plus noise, plus a component every
// token shares on 8 dimensions of each head (like RoPE's low frequencies,
// large in every layer). The fold must still put exactly the tokens of one
// entity together, and the summaries stay means of the full keys.
TEST(TokenGroupsTest, WideKeysClusterOnTheirFoldAndSummariseTheFullKeys) {
  TestGeometry g;
  g.layers = 32;
  g.kv_heads = 8;
  g.head_dim = 128;
  constexpr uint32_t kTokens = 192, kEntities = 12;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t per_token = size_t{g.layers} * g.kv_heads * g.head_dim;
  std::vector<float> pattern(kEntities * per_token);
  for (float& x : pattern) x = normal(rng);
  FloatFrame f;
  f.tokens = kTokens;
  const size_t slice = size_t{g.kv_heads} * kTokens * g.head_dim;
  f.values.assign(g.layers * 2 * slice, 0.0f);
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      for (uint32_t t = 0; t < kTokens; ++t) {
        const float* p = pattern.data() + (t % kEntities) * per_token +
                         (size_t{l} * g.kv_heads + h) * g.head_dim;
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          f.values[2 * slice * l + (size_t{h} * kTokens + t) * g.head_dim + d] =
              p[d] + 0.7f * normal(rng) + (d < 8 ? 3.0f : 0.0f);
        }
      }
    }
  }
  const std::string bytes = Encode(f, g.dtype);
  StreamConfig c;
  c.geometry = {g.layers, g.kv_heads, g.head_dim, g.dtype, kTokens};
  c.hot_window_tokens = 256;
  c = WithDefaults(c);
  ASSERT_EQ(SummaryDim(c), per_token);  // Every layer indexed.
  const TokenGroups tg =
      BuildTokenGroups(c, {absl::string_view(bytes)}, {kTokens}, kEntities);
  ASSERT_EQ(tg.token_group.size(), kTokens);
  ASSERT_EQ(tg.summaries.size(), kEntities * per_token);
  for (uint32_t a = 0; a < kTokens; ++a) {
    for (uint32_t b = a + 1; b < kTokens; ++b) {
      ASSERT_EQ(a % kEntities == b % kEntities,
                tg.token_group[a] == tg.token_group[b])
          << a << " vs " << b;
    }
  }
  // Summaries: each group's mean key over all 32,768 floats (spot checks
  // across layers and heads, from the fp16 keys the block holds).
  for (uint32_t grp = 0; grp < kEntities; ++grp) {
    for (size_t i = 0; i < per_token; i += 997) {
      const uint32_t l = i / (g.kv_heads * g.head_dim);
      const uint32_t h = (i / g.head_dim) % g.kv_heads, d = i % g.head_dim;
      double sum = 0;
      int n = 0;
      for (uint32_t t = 0; t < kTokens; ++t) {
        if (tg.token_group[t] != grp) continue;
        sum += HalfToFloat(FloatToHalf(f.Key(g, l, h, t, d)));
        ++n;
      }
      ASSERT_GT(n, 0);
      EXPECT_NEAR(tg.summaries[grp * per_token + i], sum / n, 1e-5) << i;
    }
  }
}

TEST(TokenGroupsTest, RecordsKeepGroupsAndConfigsKeepTheSetting) {
  BlockRecord b;
  b.info.id = 7;
  b.info.token_count = 3;
  b.summary = {1, 2};
  b.group_summaries = {1, 2, 3, 4};
  b.token_group = {0, 1, 1};
  auto back = DecodeBlock(EncodeBlock(b));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->group_summaries, b.group_summaries);
  EXPECT_EQ(back->token_group, b.token_group);
  StreamConfig c = GroupConfig(TestGeometry(), 5);
  auto cb = DecodeConfig(EncodeConfig(c));
  ASSERT_TRUE(cb.ok()) << cb.status();
  EXPECT_EQ(cb->groups_per_block, 5u);
}

TEST(TokenGroupsTest, RecallReturnsTheMatchingTokensWithinBudgetAcrossRestart) {
  const TestGeometry g;
  TempDir dir;
  std::mt19937_64 rng(2);
  // Frames of 8 tokens: background (entity 0) except frames 2 and 3, where
  // tokens 6 and 7 show entity 3. Blocks of 2 frames; window 16 tokens.
  const StreamConfig config = GroupConfig(g, 4);
  auto query_for = [&](int entity) {
    std::vector<float> q(2 * g.kv_heads * g.head_dim, 0.0f);
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = (i % g.head_dim) / 4 == static_cast<size_t>(entity) ? 1.0f : 0.0f;
    }
    return q;
  };
  auto check = [&](MemoryEngine* e) {
    RecallQuery q;
    q.query = query_for(3);
    q.max_tokens = 4;
    auto r = e->Recall("cam", q);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->blocks.empty());
    // The best block is block 1 (frames 2-3); only its entity-3 tokens:
    // offsets 6, 7 (frame 2) and 14, 15 (frame 3).
    EXPECT_EQ(r->blocks[0].block.id, 1u);
    EXPECT_EQ(r->blocks[0].token_offsets,
              (std::vector<uint32_t>{6, 7, 14, 15}));
    EXPECT_EQ(r->total_tokens, 4u);
    uint32_t sum = 0;
    for (const auto& b : r->blocks) sum += RecalledTokens(b);
    EXPECT_EQ(sum, r->total_tokens);
  };
  {
    auto e = testing::OpenTestEngine(dir.path());
    ASSERT_TRUE(e->OpenStream("cam", config).ok());
    for (uint64_t i = 0; i < 10; ++i) {
      std::vector<int> kinds(8, 0);
      if (i == 2 || i == 3) kinds[6] = kinds[7] = 3;
      const FloatFrame f = PlantedFrame(g, kinds, rng);
      ASSERT_TRUE(e->Append("cam", testing::FrameOf(f, i, g.dtype)).ok());
    }
    check(e.get());
    auto stats = e->GetStats("cam");
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->config.groups_per_block, 4u);
  }
  auto reopened = testing::OpenTestEngine(dir.path());
  check(reopened.get());
}

TEST(TokenGroupsTest, TrackSignalBringsGroupsOfTheTracksBlocks) {
  // Blocks of 2 frames of background, except frames 2 and 3 (block 1),
  // which show entity 1 and send a detection of track 5. The query points
  // away from entity 1 (the index ranks block 1 last) and asks for one
  // block, but names track 5: block 1's groups come in as track candidates
  // and win on the semantic signal.
  const TestGeometry g;
  TempDir dir;
  std::mt19937_64 rng(4);
  StreamConfig config = GroupConfig(g, 2);
  config.weights.track = 100;
  auto e = testing::OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("cam", config).ok());
  for (uint64_t i = 0; i < 10; ++i) {
    FrameSignals sig;
    if (i == 2 || i == 3) {
      Detection d;
      d.track_id = 5;
      d.x_max = d.y_max = 0.5f;
      d.score = 0.9f;
      sig.detections.push_back(d);
    }
    const FloatFrame f =
        PlantedFrame(g, std::vector<int>(8, i == 2 || i == 3 ? 1 : 0), rng);
    Frame fr;
    fr.index = i;
    fr.first_token_position = i * 8;
    fr.token_count = 8;
    fr.payload = Encode(f, g.dtype);
    fr.signals = std::move(sig);
    ASSERT_TRUE(e->Append("cam", std::move(fr)).ok());
  }
  RecallQuery q;
  q.query.assign(2 * g.kv_heads * g.head_dim, 0.0f);
  for (size_t i = 0; i < q.query.size(); ++i) {
    if ((i % g.head_dim) / 4 == 1) q.query[i] = -1.0f;  // Away from entity 1.
  }
  q.max_tokens = 16;
  q.top_k = 1;
  Detection d;
  d.track_id = 5;
  d.x_max = d.y_max = 0.5f;
  q.signals.detections.push_back(d);
  auto r = e->Recall("cam", q);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->blocks.empty());
  EXPECT_EQ(r->blocks[0].block.id, 1u);
  EXPECT_GT(r->blocks[0].semantic_score, 0.0f);
  EXPECT_LE(r->total_tokens, 16u);
}

TEST(TokenGroupsTest, TooManyGroupsIsInvalidArgumentNamingTheField) {
  TempDir dir;
  auto e = testing::OpenTestEngine(dir.path());
  auto s = e->OpenStream("cam", GroupConfig(TestGeometry(), 65));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("groups_per_block is 65"),
            std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace kvmem

// Token reads (StreamHandle::ReadBlockTokens/Into, what TOKEN_LAYER_MAJOR
// delivers): the chosen tokens' rows of each layer, checked against the
// frames as the test appended them, for blocks in RAM, on disk and
// degraded; every token chosen is BLOCK_LAYER_MAJOR byte for byte; bad
// token lists and a wrong destination size are refused.
#include <atomic>
#include <optional>
#include <random>

#include "engine/codec/block_layout.h"
#include "engine/codec/quantize.h"
#include "engine/stream_config.h"
#include "gmock/gmock.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using testing::TestGeometry;

constexpr uint32_t kTokens = 4;  // Per frame; 2 frames per block.

// The TOKEN_LAYER_MAJOR bytes of `tokens` of a block, straight from its
// frames as appended (frame-major, kTokens tokens each): per layer, K then
// V, [head][token][dim].
std::string FromFrames(const std::string& frames, const TestGeometry& g,
                       const std::vector<uint32_t>& tokens,
                       const std::vector<uint32_t>& layers) {
  const size_t row = g.head_dim * 2;  // fp16.
  const size_t frame_bytes = g.layers * 2 * g.kv_heads * kTokens * row;
  std::string out;
  for (uint32_t l : layers) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t o : tokens) {
          const size_t f = o / kTokens, j = o % kTokens;
          const size_t at =
              f * frame_bytes +
              (((l * 2 + kv) * g.kv_heads + h) * kTokens + j) * row;
          out.append(frames, at, row);
        }
      }
    }
  }
  return out;
}

// The same rows picked out of BLOCK_LAYER_MAJOR bytes of `layers`.
std::string FromLayerMajor(const std::string& bytes, const TestGeometry& g,
                           uint32_t block_tokens,
                           const std::vector<uint32_t>& tokens, size_t layers) {
  const size_t row = g.head_dim * 2;
  const size_t slice = g.kv_heads * block_tokens * row;
  std::string out;
  for (size_t l = 0; l < layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t o : tokens) {
          out.append(bytes, (2 * l + kv) * slice + (h * block_tokens + o) * row,
                     row);
        }
      }
    }
  }
  return out;
}

std::string Joined(const std::vector<PayloadPiece>& pieces) {
  std::string out;
  for (const PayloadPiece& p : pieces) out += p.ToString();
  return out;
}

// Param: whether a demoted block keeps its frames as its durable copy
// (EngineOptions::demote_keeps_frames) or is rewritten per layer.
class ColdFormTokenReadTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(ColdForms, ColdFormTokenReadTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Frames" : "Layers";
                         });

TEST_P(ColdFormTokenReadTest, ChosenTokensAreTheAppendedRowsInEveryTier) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = testing::TestConfig(g, 8, 2);
  const Geometry geo = WithDefaults(c).geometry;
  const uint64_t block_bytes = FramePayloadBytes(geo, 2 * kTokens);
  c.tiers.warm_budget_bytes = 2 * WarmBlock::AllocatedBytes(geo, 2 * kTokens);
  c.tiers.cold_budget_bytes = 4 * block_bytes;
  c.tiers.storage_cap_bytes =
      4 * block_bytes + 30 * g.layers * QuantizedLayerBytes(geo, 2 * kTokens);
  testing::StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(12);
  EngineOptions options;
  options.demote_keeps_frames = GetParam();
  auto e = testing::OpenTestEngine(dir.path(), options);
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  for (uint64_t f = 0; f < 24; ++f) {
    ASSERT_TRUE(
        e->Append("s", testing::ToFrame(m.AddFrame(rng, kTokens), f)).ok());
  }
  e->WaitForBackground();
  // The handle goes before the engine closes (below).
  std::optional<StreamHandle> handle = *e->Find("s");
  const StreamHandle& stream = *handle;
  const std::vector<std::vector<uint32_t>> lists = {
      {0}, {7}, {0, 1, 2, 3}, {1, 4, 6}, {0, 1, 2, 3, 4, 5, 6, 7}, {2, 3, 5}};
  const std::vector<std::vector<uint32_t>> layer_lists = {{}, {2, 0}, {1}};
  int seen[4] = {0, 0, 0, 0};  // warm, cold, degraded, compared.
  std::vector<BlockInfo> cold;
  for (uint64_t b = 0; b < 11; ++b) {
    auto info = stream.GetBlock(b);
    ASSERT_TRUE(info.ok()) << "block " << b << ": " << info.status();
    ASSERT_EQ(info->token_count, 2 * kTokens);
    seen[info->degraded ? 2 : info->tier == Tier::kWarm ? 0 : 1]++;
    if (info->tier == Tier::kCold) cold.push_back(*info);
    for (const std::vector<uint32_t>& layers : layer_lists) {
      std::vector<uint32_t> all_layers = layers;
      if (all_layers.empty()) all_layers = {0, 1, 2};
      auto whole =
          stream.ReadBlockPayload(b, PayloadLayout::kBlockLayerMajor, layers);
      ASSERT_TRUE(whole.ok()) << whole.status();
      const std::string layer_major = Joined(*whole);
      for (const std::vector<uint32_t>& tokens : lists) {
        const std::string want =
            info->degraded ? FromLayerMajor(layer_major, g, 2 * kTokens, tokens,
                                            all_layers.size())
                           : FromFrames(m.BlockBytes(b), g, tokens, all_layers);
        std::string got(want.size(), '\0');
        auto n = stream.ReadBlockTokensInto(
            b, tokens, layers, reinterpret_cast<uint8_t*>(got.data()),
            got.size());
        ASSERT_TRUE(n.ok()) << n.status();
        EXPECT_EQ(*n, want.size());
        EXPECT_EQ(got, want)
            << "block " << b << ", " << tokens.size() << " tokens";
        auto pieces = stream.ReadBlockTokens(b, tokens, layers);
        ASSERT_TRUE(pieces.ok()) << pieces.status();
        ASSERT_EQ(pieces->size(), all_layers.size());
        EXPECT_EQ((*pieces)[0].layer, all_layers[0]);
        EXPECT_EQ(Joined(*pieces), want);
        if (tokens.size() == 2 * kTokens) {
          EXPECT_EQ(got, layer_major);
        }
        ++seen[3];
      }
      // No tokens named: all of them, BLOCK_LAYER_MAJOR's bytes.
      auto all = stream.ReadBlockTokens(b, {}, layers);
      ASSERT_TRUE(all.ok());
      EXPECT_EQ(Joined(*all), layer_major);
    }
  }
  EXPECT_GT(seen[0], 0) << "no warm block";
  EXPECT_GT(seen[1], 0) << "no cold block";
  EXPECT_GT(seen[2], 0) << "no degraded block";
  EXPECT_EQ(seen[3], 11 * 3 * 6);
  // What the cold blocks keep on disk: their frames, or their layers.
  handle.reset();
  e.reset();
  std::unique_ptr<ColdStore> store = testing::OpenTestStore(dir.path());
  for (const BlockInfo& b : cold) {
    auto frame = store->GetFrame("s", b.first_frame);
    auto layer = store->GetBlockLayer("s", b.id, 0);
    if (GetParam()) {
      EXPECT_TRUE(frame.ok()) << "block " << b.id << ": " << frame.status();
      EXPECT_EQ(layer.status().code(), absl::StatusCode::kNotFound);
      auto frames = store->GetFrames("s", b.first_frame, b.last_frame);
      ASSERT_TRUE(frames.ok()) << frames.status();
      EXPECT_EQ(frames->size(), b.last_frame - b.first_frame + 1);
      EXPECT_EQ(frames->front(), *frame);
    } else {
      EXPECT_EQ(frame.status().code(), absl::StatusCode::kNotFound);
      EXPECT_TRUE(layer.ok()) << "block " << b.id << ": " << layer.status();
    }
  }
}

// Counts the frames, and the frame parts, a reader gets from the store.
class FrameCountingStore final : public ForwardingColdStore {
 public:
  using ForwardingColdStore::ForwardingColdStore;
  absl::StatusOr<std::vector<std::string>> GetFrameParts(
      absl::string_view id, uint64_t part_bytes,
      const std::vector<FramePart>& parts) override {
    auto r = ForwardingColdStore::GetFrameParts(id, part_bytes, parts);
    if (r.ok()) parts_read += r->size();
    return r;
  }
  absl::StatusOr<std::vector<std::string>> GetFrames(absl::string_view id,
                                                     uint64_t first,
                                                     uint64_t last) override {
    auto r = ForwardingColdStore::GetFrames(id, first, last);
    if (r.ok()) frames_read += r->size();
    return r;
  }
  absl::StatusOr<std::string> GetFrame(absl::string_view id,
                                       uint64_t f) override {
    frames_read += 1;
    return ForwardingColdStore::GetFrame(id, f);
  }
  std::atomic<uint64_t> frames_read{0}, parts_read{0};
};

// A block kept as frames (--cold_form=frames) reads, for a token read, only
// the frames holding the tokens, and with frames stored in parts only the
// parts holding them (the parameter: tokens per part; 0 whole frames).
class ColdFramesReadTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ColdFramesReadTest, ReadsOnlyWhatHoldsTheTokens) {
  testing::TempDir dir;
  TestGeometry g;
  StreamConfig c = testing::TestConfig(g, 8, 2);
  c.tiers.warm_budget_bytes = 1;  // Every block leaves RAM as it seals.
  testing::StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(13);
  auto counting = std::make_shared<FrameCountingStore>(
      std::shared_ptr<ColdStore>(testing::OpenTestStore(dir.path())));
  EngineOptions options;
  options.demote_keeps_frames = true;
  options.frame_parts = GetParam() > 0;
  options.frame_part_tokens = GetParam();
  auto e = MemoryEngine::Open(std::make_unique<ForwardingColdStore>(counting),
                              options);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->OpenStream("s", c).ok());
  for (uint64_t f = 0; f < 12; ++f) {
    ASSERT_TRUE(
        (*e)->Append("s", testing::ToFrame(m.AddFrame(rng, kTokens), f)).ok());
  }
  (*e)->WaitForBackground();
  {
    const StreamHandle stream = *(*e)->Find("s");
    ASSERT_EQ(stream.GetBlock(1)->tier, Tier::kCold);
    // Tokens 0-3 are block 1's first frame, 4-7 its second; what each read
    // gets: whole frames, parts of 1 token, parts of 3 (0-2, 3; 4-6, 7).
    struct Case {
      std::vector<uint32_t> tokens;
      uint64_t frames, parts1, parts3;
    };
    const std::vector<Case> cases = {{{0}, 1, 1, 1},       {{7}, 1, 1, 1},
                                     {{1, 2, 3}, 1, 3, 2}, {{3, 4}, 2, 2, 2},
                                     {{2, 6}, 2, 2, 2},    {{}, 2, 8, 4}};
    for (const auto& [tokens, frames, parts1, parts3] : cases) {
      const std::vector<uint32_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
      const std::string want = FromFrames(
          m.BlockBytes(1), g, tokens.empty() ? all : tokens, {0, 1, 2});
      std::string got(want.size(), '\0');
      const uint64_t frames0 = counting->frames_read;
      const uint64_t parts0 = counting->parts_read;
      auto n = stream.ReadBlockTokensInto(
          1, tokens, {}, reinterpret_cast<uint8_t*>(got.data()), got.size());
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_EQ(got, want) << tokens.size() << " tokens";
      const uint64_t parts = GetParam() == 1 ? parts1 : parts3;
      if (GetParam() == 0) {
        EXPECT_EQ(counting->frames_read - frames0, frames) << tokens.size();
        EXPECT_EQ(counting->parts_read - parts0, 0u);
      } else {
        EXPECT_EQ(counting->parts_read - parts0, parts) << tokens.size();
        EXPECT_EQ(counting->frames_read - frames0, 0u) << tokens.size();
      }
    }
    // The whole block (a promotion, a layer read) reads back byte-exact.
    auto whole = stream.ReadBlockPayload(1, PayloadLayout::kFrameMajor, {});
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(Joined(*whole), m.BlockBytes(1));
  }
  // An open block's frames replay from their parts after a restart.
  ASSERT_TRUE(
      (*e)->Append("s", testing::ToFrame(m.AddFrame(rng, kTokens), 12)).ok());
  e->reset();
  // (The same store: the test keeps it open through `counting`.)
  auto again = MemoryEngine::Open(
      std::make_unique<ForwardingColdStore>(counting), options);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)
                  ->Append("s", testing::ToFrame(m.AddFrame(rng, kTokens), 13))
                  .ok());
  (*again)->WaitForBackground();
  const StreamHandle reopened = *(*again)->Find("s");
  auto block6 = reopened.ReadBlockPayload(6, PayloadLayout::kFrameMajor, {});
  ASSERT_TRUE(block6.ok()) << block6.status();
  EXPECT_EQ(Joined(*block6), m.BlockBytes(6));
}

INSTANTIATE_TEST_SUITE_P(TokensPerPart, ColdFramesReadTest,
                         ::testing::Values(0u, 1u, 3u));

TEST(TokenReadTest, BadTokenListsAndSizesAreRefused) {
  testing::TempDir dir;
  TestGeometry g;
  testing::StreamModel m(g, 2, 8, {2, 0});
  std::mt19937_64 rng(13);
  auto e = testing::OpenTestEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", testing::TestConfig(g, 8, 2)).ok());
  for (uint64_t f = 0; f < 6; ++f) {
    ASSERT_TRUE(
        e->Append("s", testing::ToFrame(m.AddFrame(rng, kTokens), f)).ok());
  }
  const StreamHandle stream = *e->Find("s");
  auto r = stream.ReadBlockTokens(0, {1, 8}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("tokens of block 0 has offset 8; the block holds 8"));
  r = stream.ReadBlockTokens(0, {3, 3}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("strictly increasing"));
  r = stream.ReadBlockTokens(0, {1}, {5});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  std::string small(10, '\0');
  auto n = stream.ReadBlockTokensInto(
      0, {1, 2}, {}, reinterpret_cast<uint8_t*>(small.data()), small.size());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(stream.ReadBlockTokens(99, {0}, {}).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvmem

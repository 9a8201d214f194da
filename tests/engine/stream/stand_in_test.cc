// A seal's block record goes to the store with a stand-in without its token
// groups (StreamWrite::block_stand_ins): RocksDB logs the stand-in and writes
// the full record outside its WAL, so a crash before the memtable's flush
// leaves the stand-in. Recovery builds the groups again from the block's
// frames: the same groups, codes and recall sets as the seal's.
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "storage/forwarding_store.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using testing::OpenTestStore;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToFrame;

constexpr uint32_t kTokens = 8;
constexpr uint64_t kFrames = 24;  // Six blocks of four frames.

// What a store keeps after such a crash: each record that has a stand-in
// is written as its stand-in.
class StandInsOnly final : public ForwardingColdStore {
 public:
  using ForwardingColdStore::ForwardingColdStore;
  absl::Status Commit(const StreamWrite& w) override {
    StreamWrite kept = w;
    for (auto& [id, record] : kept.blocks) {
      for (const auto& [stand_in_id, stand_in] : w.block_stand_ins) {
        if (stand_in_id == id) record = stand_in;
      }
    }
    kept.block_stand_ins.clear();
    return ForwardingColdStore::Commit(kept);
  }
};

StreamConfig Config(const TestGeometry& g) {
  return testing::GroupedConfig(g, kTokens);
}

// The stored records of stream "s", decoded.
std::vector<BlockRecord> Records(ColdStore* store) {
  std::vector<BlockRecord> out;
  EXPECT_TRUE(store
                  ->ScanBlocks("s",
                               [&](uint64_t, absl::string_view bytes) {
                                 auto rec = DecodeBlock(bytes);
                                 EXPECT_TRUE(rec.ok()) << rec.status();
                                 if (rec.ok()) out.push_back(*std::move(rec));
                                 return absl::OkStatus();
                               })
                  .ok());
  return out;
}

class StandInTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(5);
    for (uint64_t i = 0; i < kFrames; ++i) model_.AddFrame(rng, kTokens);
    const size_t dim =
        static_cast<size_t>(g_.layers) * g_.kv_heads * g_.head_dim;
    for (int i = 0; i < 6; ++i)
      queries_.push_back(testing::RandomQuery(rng, dim));
  }
  // Stream "s" fed every frame through an engine over `store`.
  void Feed(std::unique_ptr<ColdStore> store) {
    auto e = MemoryEngine::Open(std::move(store), EngineOptions());
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->OpenStream("s", Config(g_)).ok());
    for (uint64_t f = 0; f < kFrames; ++f) {
      ASSERT_TRUE((*e)->Append("s", ToFrame(model_.frames()[f], f)).ok());
    }
  }
  // Each query's recall set (block ids and tokens).
  std::vector<std::vector<std::pair<uint64_t, std::vector<uint32_t>>>> Sets(
      MemoryEngine* e) {
    std::vector<std::vector<std::pair<uint64_t, std::vector<uint32_t>>>> sets;
    for (const std::vector<float>& v : queries_) {
      RecallQuery q;
      q.query = v;
      absl::StatusOr<RecallResult> r = e->Recall("s", q);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) continue;
      sets.emplace_back();
      for (const RecalledBlock& b : r->blocks) {
        sets.back().emplace_back(b.block.id, b.token_offsets);
      }
    }
    return sets;
  }

  TestGeometry g_;
  StreamModel model_{g_, 4, 2 * kTokens, {}};
  std::vector<std::vector<float>> queries_;
};

TEST_F(StandInTest, RecoveryBuildsTheGroupsTheCrashLost) {
  testing::TempDir whole_dir, crashed_dir;
  std::shared_ptr<ColdStore> whole(OpenTestStore(whole_dir.path()));
  std::shared_ptr<ColdStore> crashed(OpenTestStore(crashed_dir.path()));
  ASSERT_NO_FATAL_FAILURE(Feed(std::make_unique<ForwardingColdStore>(whole)));
  ASSERT_NO_FATAL_FAILURE(Feed(std::make_unique<StandInsOnly>(crashed)));

  const std::vector<BlockRecord> want = Records(whole.get());
  std::vector<BlockRecord> left = Records(crashed.get());
  ASSERT_EQ(want.size(), kFrames / 4);
  ASSERT_EQ(left.size(), want.size());
  for (const BlockRecord& r : left) {
    EXPECT_TRUE(r.groups_pending) << r.info.id;
    EXPECT_TRUE(r.token_codes.empty()) << r.info.id;
  }
  for (const BlockRecord& r : want) {
    EXPECT_FALSE(r.groups_pending) << r.info.id;
    EXPECT_FALSE(r.token_codes.empty()) << r.info.id;
  }

  auto a = MemoryEngine::Open(std::make_unique<ForwardingColdStore>(whole),
                              EngineOptions());
  auto b = MemoryEngine::Open(std::make_unique<ForwardingColdStore>(crashed),
                              EngineOptions());
  ASSERT_TRUE(a.ok() && b.ok());
  const auto want_sets = Sets(a->get());
  ASSERT_EQ(want_sets.size(), queries_.size());
  EXPECT_FALSE(want_sets[0].empty());
  EXPECT_EQ(Sets(b->get()), want_sets);

  // Stored complete again, byte for byte the seal's groups and codes.
  left = Records(crashed.get());
  ASSERT_EQ(left.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_FALSE(left[i].groups_pending) << i;
    EXPECT_EQ(left[i].group_summaries, want[i].group_summaries) << i;
    EXPECT_EQ(left[i].token_group, want[i].token_group) << i;
    EXPECT_EQ(left[i].token_codes, want[i].token_codes) << i;
  }
}

// A stand-in whose frames are gone cannot be completed: the stream is
// quarantined with DATA_LOSS, never served without its groups.
TEST_F(StandInTest, AStandInWithoutItsFramesIsDataLoss) {
  testing::TempDir dir;
  std::shared_ptr<ColdStore> crashed(OpenTestStore(dir.path()));
  ASSERT_NO_FATAL_FAILURE(Feed(std::make_unique<StandInsOnly>(crashed)));
  StreamWrite drop;
  drop.stream_id = "s";
  drop.delete_frames.emplace_back(0, 3);  // Block 0's frames.
  ASSERT_TRUE(crashed->Commit(drop).ok());
  auto e = MemoryEngine::Open(std::make_unique<ForwardingColdStore>(crashed),
                              EngineOptions());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->GetStats("s").status().code(), absl::StatusCode::kDataLoss);
  ASSERT_EQ((*e)->Quarantined().size(), 1u);
  EXPECT_EQ((*e)->Quarantined()[0].stream_id, "s");
  EXPECT_EQ((*e)->Quarantined()[0].reason.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE((*e)->Quarantined()[0].reason.message().find("token groups"),
            std::string::npos)
      << (*e)->Quarantined()[0].reason;
}

}  // namespace
}  // namespace kvmem

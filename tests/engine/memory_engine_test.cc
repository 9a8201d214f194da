// MemoryEngine over a real RocksDB cold store in a temp directory.
#include "engine/memory_engine.h"

#include <thread>

#include "engine/stream_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocks_cold_store.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using testing::StreamModel;

constexpr uint32_t kFpb = 3;
constexpr uint32_t kWindow = 40;

StreamConfig Config(const testing::TestGeometry& g) {
  return testing::TestConfig(g, kWindow, kFpb);
}

std::unique_ptr<MemoryEngine> OpenEngine(const std::string& dir) {
  return testing::OpenTestEngine(dir);
}

using testing::ToFrame;

void ExpectMatchesOracle(MemoryEngine& e, const std::string& id,
                         const StreamModel& model, std::mt19937_64& rng,
                         int queries) {
  size_t returned = 0;
  for (int i = 0; i < queries; ++i) {
    RecallQuery q;
    q.query = testing::RandomQuery(rng, model.summary_dim());
    q.top_k = 1 + i % 6;
    q.max_tokens = 10 + 13 * i;
    auto got = e.Recall(id, q);
    ASSERT_TRUE(got.ok()) << got.status();
    const auto want = model.Recall(q.query, q.top_k, q.max_tokens);
    ASSERT_EQ(got->blocks.size(), want.size()) << "query " << i;
    uint32_t tokens = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(got->blocks[j].block.id, want[j].block_id) << "query " << i;
      EXPECT_NEAR(got->blocks[j].score, want[j].score, 1e-3);
      tokens += got->blocks[j].block.token_count;
    }
    EXPECT_LE(tokens, q.max_tokens);
    EXPECT_EQ(tokens, got->total_tokens);
    returned += want.size();
  }
  EXPECT_GT(returned, 0u) << "the oracle comparison never saw a block";
}

TEST(MemoryEngineTest, RecallMatchesOracleAndSurvivesRestart) {
  testing::TempDir dir;
  testing::TestGeometry g;
  StreamModel model(g, kFpb, kWindow, {2, 0});
  std::mt19937_64 rng(42);
  {
    auto e = OpenEngine(dir.path());
    auto opened = e->OpenStream("cam", Config(g));
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_TRUE(opened->created);
    for (uint64_t i = 0; i < 40; ++i) {
      const auto& f = model.AddFrame(rng, 1 + rng() % 16, rng() % 3);
      auto r = e->Append("cam", ToFrame(f, i));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->last_durable_frame, static_cast<int64_t>(i));
      EXPECT_EQ(r->sealed_block, (i + 1) % kFpb == 0);
    }
    ExpectMatchesOracle(*e, "cam", model, rng, 30);
    // 13 blocks went in one at a time, past several of the index arrays'
    // doublings: each grown beside recalls, none copied under the lock.
    EXPECT_EQ(e->GetStats("cam")->index_copied_in_place, 0u);
    // Their RAM: a fp32 copy of each block's summary at least, besides the
    // records' own (summary_bytes).
    const StreamStats st = *e->GetStats("cam");
    EXPECT_GE(st.index_bytes, st.sealed_blocks * st.summary_dim * 4);
  }
  // Reopen: 40 frames = 13 sealed blocks + 1 frame in the open block.
  auto e = OpenEngine(dir.path());
  auto stats = e->GetStats("cam");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->last_durable_frame, 39);
  EXPECT_EQ(stats->sealed_blocks, 13u);
  EXPECT_EQ(stats->open_block_frames, 1u);
  EXPECT_EQ(stats->next_token_position, model.next_pos());
  ExpectMatchesOracle(*e, "cam", model, rng, 30);
  // The block open across the restart seals with the right summary.
  for (uint64_t i = 40; i < 47; ++i) {
    ASSERT_TRUE(e->Append("cam", ToFrame(model.AddFrame(rng, 8), i)).ok());
  }
  ExpectMatchesOracle(*e, "cam", model, rng, 30);
  // Close seals the partial block; reopening with the same config works.
  ASSERT_TRUE(e->CloseStream("cam").ok());
  model.Close();
  EXPECT_EQ(e->GetStats("cam")->sealed_blocks, model.sealed_blocks());
  ExpectMatchesOracle(*e, "cam", model, rng, 10);
  auto again = e->OpenStream("cam", Config(g));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
}

TEST(MemoryEngineTest, HotWindowBlocksAreNeverRecalled) {
  testing::TempDir dir;
  testing::TestGeometry g;
  auto e = OpenEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", Config(g)).ok());
  StreamModel model(g, kFpb, kWindow, {2, 0});
  std::mt19937_64 rng(3);
  for (uint64_t i = 0; i < 30; ++i) {
    ASSERT_TRUE(e->Append("s", ToFrame(model.AddFrame(rng, 4), i)).ok());
  }
  // 120 tokens; the window holds positions [80, 120).
  RecallQuery q;
  q.query = testing::RandomQuery(rng, model.summary_dim());
  q.top_k = 100;
  q.max_tokens = 100000;
  auto r = e->Recall("s", q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->candidates, 6u);  // Blocks of 12 tokens ending at <= 80.
  for (const auto& b : r->blocks) EXPECT_LE(b.block.end_token_position, 80u);
  // An explicit current position moves the window back.
  q.current_token_position = 59;  // Window [20, 60).
  r = e->Recall("s", q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->candidates, 1u);
  ASSERT_EQ(r->blocks.size(), 1u);
  EXPECT_EQ(r->blocks[0].block.id, 0u);
  EXPECT_NEAR(r->blocks[0].gate_weight, 1.0f, 1e-6);
}

TEST(MemoryEngineTest, RejectsBadInputWithPreciseStatus) {
  testing::TempDir dir;
  testing::TestGeometry g;
  auto e = OpenEngine(dir.path());
  ASSERT_TRUE(e->OpenStream("s", Config(g)).ok());
  std::mt19937_64 rng(5);
  StreamModel model(g, kFpb, kWindow, {2, 0});
  ASSERT_TRUE(e->Append("s", ToFrame(model.AddFrame(rng, 4), 0)).ok());

  auto code_and_msg = [](const absl::Status& s) {
    return std::make_pair(s.code(), std::string(s.message()));
  };
  Frame dup = ToFrame(model.frames()[0], 0);
  auto r = code_and_msg(e->Append("s", dup).status());
  EXPECT_EQ(r.first, absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(r.second, HasSubstr("frame_index 0"));

  Frame gap = ToFrame(model.AddFrame(rng, 4), 5);
  r = code_and_msg(e->Append("s", gap).status());
  EXPECT_EQ(r.first, absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.second, HasSubstr("next expected is 1"));

  Frame short_payload = ToFrame(model.frames()[1], 1);
  short_payload.payload.pop_back();
  r = code_and_msg(e->Append("s", short_payload).status());
  EXPECT_EQ(r.first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.second, HasSubstr("frame.payload has"));

  Frame overlap = ToFrame(model.frames()[1], 1);
  overlap.first_token_position = 2;
  r = code_and_msg(e->Append("s", overlap).status());
  EXPECT_EQ(r.first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.second, HasSubstr("first_token_position 2"));

  Frame bad_box = ToFrame(model.frames()[1], 1);
  bad_box.signals.detections.push_back({1, 0, 0.1f, 0.1f, 1.5f, 0.2f, 0.9f});
  r = code_and_msg(e->Append("s", bad_box).status());
  EXPECT_EQ(r.first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.second, HasSubstr("detections[0]"));

  RecallQuery q;
  r = code_and_msg(e->Recall("s", q).status());
  EXPECT_EQ(r.first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.second, HasSubstr("query is empty"));
  q.query.assign(model.summary_dim(), 0.0f);
  q.query[3] = std::nanf("");
  r = code_and_msg(e->Recall("s", q).status());
  EXPECT_EQ(r.first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.second, HasSubstr("query[3]"));
  q.query[3] = 0;
  q.top_k = 5000;
  r = code_and_msg(e->Recall("s", q).status());
  EXPECT_THAT(r.second, HasSubstr("budget.top_k is 5000"));

  r = code_and_msg(e->Recall("nope", RecallQuery()).status());
  EXPECT_EQ(r.first, absl::StatusCode::kNotFound);
  EXPECT_THAT(r.second, HasSubstr("\"nope\""));

  StreamConfig other = Config(g);
  other.hot_window_tokens = 99;
  EXPECT_EQ(e->OpenStream("s", other).status().code(),
            absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(e->CloseStream("s").ok());
  r = code_and_msg(e->Append("s", ToFrame(model.frames()[1], 1)).status());
  EXPECT_EQ(r.first, absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.second, HasSubstr("closed"));

  ASSERT_TRUE(e->DeleteStream("s").ok());
  EXPECT_EQ(e->GetStats("s").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(e->DeleteStream("s").code(), absl::StatusCode::kNotFound);
  // A deleted id can be created afresh.
  auto fresh = e->OpenStream("s", Config(g));
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(fresh->created);
  EXPECT_EQ(fresh->stats.last_durable_frame, -1);
}

TEST(MemoryEngineTest, ConcurrentAppendsAndRecallsOnManyStreams) {
  testing::TempDir dir;
  testing::TestGeometry g;
  auto e = OpenEngine(dir.path());
  constexpr int kStreams = 6, kFrames = 60;
  std::vector<std::unique_ptr<StreamModel>> models;
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_TRUE(e->OpenStream("s" + std::to_string(s), Config(g)).ok());
    models.push_back(std::make_unique<StreamModel>(
        g, kFpb, kWindow, std::vector<uint32_t>{2, 0}));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {  // Writer for stream s.
      std::mt19937_64 rng(100 + s);
      for (uint64_t i = 0; i < kFrames; ++i) {
        const auto& f = models[s]->AddFrame(rng, 6);
        if (!e->Append("s" + std::to_string(s), ToFrame(f, i)).ok()) ++failures;
      }
    });
    threads.emplace_back([&, s] {  // Reader racing the writer.
      std::mt19937_64 rng(200 + s);
      for (int i = 0; i < 200; ++i) {
        RecallQuery q;
        q.query = testing::RandomQuery(rng, models[s]->summary_dim());
        auto r = e->Recall("s" + std::to_string(s), q);
        if (!r.ok() || r->total_tokens > r->budget_tokens) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  std::mt19937_64 rng(9);
  for (int s = 0; s < kStreams; ++s) {
    EXPECT_EQ(e->GetStats("s" + std::to_string(s))->frames, kFrames + 0u);
    // Grown beside the racing recalls, never in place under the lock.
    EXPECT_EQ(e->GetStats("s" + std::to_string(s))->index_copied_in_place, 0u);
    ExpectMatchesOracle(*e, "s" + std::to_string(s), *models[s], rng, 5);
  }
}

}  // namespace
}  // namespace kvmem

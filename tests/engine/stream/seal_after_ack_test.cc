// EngineOptions::seal_after_ack: an append that fills its block returns
// once its frame is durable, and the seal follows (on the background
// executor, or first thing in the next append, or after a restart). The
// blocks, their bytes and every recall set end up as a sealing append makes
// them.
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "storage/forwarding_store.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using testing::OpenTestEngine;
using testing::OpenTestStore;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToFrame;

constexpr uint32_t kTokens = 8;

StreamConfig Config(const TestGeometry& g) {
  return testing::GroupedConfig(g, kTokens);
}

EngineOptions Deferred() {
  EngineOptions o;
  o.seal_after_ack = true;
  return o;
}

// Recall sets (ids and chosen tokens) and every sealed block's frame-major
// bytes: what two engines fed the same frames must agree on.
struct Answers {
  std::vector<std::vector<std::pair<uint64_t, std::vector<uint32_t>>>> sets;
  std::vector<std::string> blocks;
};

// The stream's stats as they stand (GetStats seals a pending block first).
StreamStats Peek(MemoryEngine* e) { return e->Find("s")->Stats(); }

// Block b's frame-major bytes, read through the stream's handle.
std::string ReadBlock(MemoryEngine* e, uint64_t b) {
  absl::StatusOr<std::vector<PayloadPiece>> p =
      e->Find("s")->ReadBlockPayload(b, PayloadLayout::kFrameMajor, {});
  EXPECT_TRUE(p.ok()) << p.status();
  std::string bytes;
  if (p.ok()) {
    for (const PayloadPiece& piece : *p) bytes += piece.ToString();
  }
  return bytes;
}

Answers Collect(MemoryEngine* e, const std::vector<std::vector<float>>& qs) {
  Answers a;
  for (const std::vector<float>& v : qs) {
    RecallQuery q;
    q.query = v;
    absl::StatusOr<RecallResult> r = e->Recall("s", q);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) continue;
    a.sets.emplace_back();
    for (const RecalledBlock& b : r->blocks) {
      a.sets.back().emplace_back(b.block.id, b.token_offsets);
    }
  }
  const uint64_t sealed = Peek(e).sealed_blocks;
  for (uint64_t b = 0; b < sealed; ++b) a.blocks.push_back(ReadBlock(e, b));
  return a;
}

class SealAfterAckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(11);
    for (int i = 0; i < 24; ++i) model_.AddFrame(rng, kTokens);
    const size_t dim =
        static_cast<size_t>(g_.layers) * g_.kv_heads * g_.head_dim;
    for (int i = 0; i < 6; ++i)
      queries_.push_back(testing::RandomQuery(rng, dim));
  }
  absl::StatusOr<AppendResult> Append(MemoryEngine* e, uint64_t f) {
    return e->Append("s", ToFrame(model_.frames()[f], f));
  }
  // The answers of an engine that seals in the append, fed frames [0, n).
  Answers Reference(size_t n) {
    testing::TempDir dir;
    auto e = OpenTestEngine(dir.path());
    EXPECT_TRUE(e->OpenStream("s", Config(g_)).ok());
    for (uint64_t f = 0; f < n; ++f) EXPECT_TRUE(Append(e.get(), f).ok());
    return Collect(e.get(), queries_);
  }
  // Feeds frames [from, 24), waits for the seals, and expects the blocks
  // and recall sets of an engine that seals in the append.
  void ExpectAnswersOfASealingEngine(MemoryEngine* e, uint64_t from) {
    for (uint64_t f = from; f < 24; ++f) ASSERT_TRUE(Append(e, f).ok());
    e->WaitForBackground();
    const Answers got = Collect(e, queries_);
    const Answers want = Reference(24);
    ASSERT_EQ(want.sets.size(), queries_.size());
    EXPECT_FALSE(want.sets[0].empty());  // Blocks to compare.
    EXPECT_EQ(got.blocks.size(), 6u);
    EXPECT_EQ(got.blocks, want.blocks);
    EXPECT_EQ(got.sets, want.sets);
  }
  // Opens stream "s", holds the background worker (*release lets it go)
  // and appends frames [0, n): the seal of a block they fill waits.
  void HeldAfter(MemoryEngine* e, uint64_t n,
                 std::shared_ptr<absl::Notification>* release) {
    ASSERT_TRUE(e->OpenStream("s", Config(g_)).ok());
    *release = HoldBackground(e);
    for (uint64_t f = 0; f < n; ++f) ASSERT_TRUE(Append(e, f).ok());
  }
  // Lets the held worker go, waits for its seals and returns how many
  // blocks are sealed then.
  static uint64_t SealedOnceReleased(MemoryEngine* e,
                                     absl::Notification* release) {
    release->Notify();
    e->WaitForBackground();
    return Peek(e).sealed_blocks;
  }
  // Holds the engine's background executor until the returned
  // notification is notified.
  static std::shared_ptr<absl::Notification> HoldBackground(MemoryEngine* e) {
    auto release = std::make_shared<absl::Notification>();
    StreamTestPeer::SubmitBackground(
        *e->Find("s"), [release] { release->WaitForNotification(); });
    return release;
  }

  TestGeometry g_;
  StreamModel model_{g_, 4, 2 * kTokens, {}};
  std::vector<std::vector<float>> queries_;
};

TEST_F(SealAfterAckTest, TheFillingAppendIsAcknowledgedBeforeItsSeal) {
  testing::TempDir dir;
  auto e = OpenTestEngine(dir.path(), Deferred());
  ASSERT_TRUE(e->OpenStream("s", Config(g_)).ok());
  std::shared_ptr<absl::Notification> release = HoldBackground(e.get());
  for (uint64_t f = 0; f < 4; ++f) {
    absl::StatusOr<AppendResult> r = Append(e.get(), f);
    ASSERT_TRUE(r.ok()) << r.status();
    // As an append that seals reports it: frame 3 completed the block.
    EXPECT_EQ(r->sealed_block, f == 3) << "frame " << f;
  }
  // Durable and acknowledged, not sealed: the seal waits for the worker.
  StreamStats st = Peek(e.get());
  EXPECT_EQ(st.last_durable_frame, 3);
  EXPECT_EQ(st.sealed_blocks, 0u);
  EXPECT_EQ(st.open_block_frames, 4u);
  release->Notify();
  e->WaitForBackground();
  st = Peek(e.get());
  EXPECT_EQ(st.sealed_blocks, 1u);
  EXPECT_EQ(st.open_block_frames, 0u);
  EXPECT_GT(st.token_code_bytes, 0u);  // Sealed as the append seals.
  ExpectAnswersOfASealingEngine(e.get(), 4);
}

TEST_F(SealAfterAckTest, TheNextAppendSealsAPendingBlockFirst) {
  testing::TempDir dir;
  auto e = OpenTestEngine(dir.path(), Deferred());
  std::shared_ptr<absl::Notification> release;
  ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 4, &release));
  // The worker is held: frame 4's append seals block 0 in its own commit.
  absl::StatusOr<AppendResult> r = Append(e.get(), 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->sealed_block);  // Frame 3 completed it and said so.
  StreamStats st = Peek(e.get());
  EXPECT_EQ(st.sealed_blocks, 1u);
  EXPECT_EQ(st.open_block_frames, 1u);
  // The queued seal finds nothing left to seal.
  EXPECT_EQ(SealedOnceReleased(e.get(), release.get()), 1u);
  ExpectAnswersOfASealingEngine(e.get(), 5);
}

// Read your writes: a frame's ack said it completed block 0, so the block
// can be read at once, sealed on demand if the worker has not sealed it.
TEST_F(SealAfterAckTest, AReadOfTheCompletedBlockFindsItSealed) {
  testing::TempDir dir;
  auto e = OpenTestEngine(dir.path(), Deferred());
  std::shared_ptr<absl::Notification> release;
  ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 4, &release));
  ASSERT_EQ(Peek(e.get()).sealed_blocks, 0u);
  EXPECT_EQ(ReadBlock(e.get(), 0), model_.BlockBytes(0));
  EXPECT_EQ(Peek(e.get()).sealed_blocks, 1u);
  // Block 1 has no acknowledged frame yet: NOT_FOUND, as before.
  EXPECT_EQ(e->Find("s")->GetBlock(1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(SealedOnceReleased(e.get(), release.get()), 1u);
}

// GetStats right after the ack shows the block the ack reported, sealed
// (a client reads its stats after its appends, as the Python test does).
TEST_F(SealAfterAckTest, StatsShowTheBlockAnAckCompleted) {
  testing::TempDir dir;
  auto e = OpenTestEngine(dir.path(), Deferred());
  std::shared_ptr<absl::Notification> release;
  ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 4, &release));
  ASSERT_EQ(Peek(e.get()).sealed_blocks, 0u);
  const StreamStats st = *e->GetStats("s");
  EXPECT_EQ(st.sealed_blocks, 1u);
  EXPECT_EQ(st.open_block_frames, 0u);
  EXPECT_EQ(SealedOnceReleased(e.get(), release.get()), 1u);
}

// A recall while the worker still holds the seal answers as the sealing
// engine does: kvmem estimates the window itself (no window_lse), and the
// pending block has tokens before the 2-frame window.
TEST_F(SealAfterAckTest, ARecallAnswersAsIfTheBlockWereSealed) {
  testing::TempDir dir;
  auto e = OpenTestEngine(dir.path(), Deferred());
  std::shared_ptr<absl::Notification> release;
  ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 8, &release));
  ASSERT_EQ(Peek(e.get()).sealed_blocks, 1u);  // Block 1 waits.
  const Answers got = Collect(e.get(), queries_);
  EXPECT_EQ(Peek(e.get()).sealed_blocks, 2u);  // The recall sealed it.
  const Answers want = Reference(8);
  ASSERT_EQ(want.sets.size(), queries_.size());
  EXPECT_FALSE(want.sets[0].empty());
  EXPECT_EQ(got.sets, want.sets);
  EXPECT_EQ(got.blocks, want.blocks);
  release->Notify();
  e->WaitForBackground();
}

// With the front end's window_lse a recall waits for the seal only when
// the block has candidates: tokens before the window.
TEST_F(SealAfterAckTest, ARecallWaitsForTheSealOnlyWhenTheBlockHasCandidates) {
  for (const uint32_t window_frames : {2u, 8u}) {
    testing::TempDir dir;
    auto e = OpenTestEngine(dir.path(), Deferred());
    StreamConfig c = Config(g_);
    c.hot_window_tokens = window_frames * kTokens;
    ASSERT_TRUE(e->OpenStream("s", c).ok());
    std::shared_ptr<absl::Notification> release = HoldBackground(e.get());
    for (uint64_t f = 0; f < 8; ++f) ASSERT_TRUE(Append(e.get(), f).ok());
    ASSERT_EQ(Peek(e.get()).sealed_blocks, 1u);
    RecallQuery q;
    q.query = queries_[0];
    q.window_lse.assign(q.query.size() / g_.head_dim, 0.0f);  // [head]
    absl::StatusOr<RecallResult> r = e->Recall("s", q);
    ASSERT_TRUE(r.ok()) << r.status();
    // A 2-frame window leaves block 1 (frames 4-7) half before it; an
    // 8-frame one holds it whole.
    EXPECT_EQ(Peek(e.get()).sealed_blocks, window_frames == 2 ? 2u : 1u)
        << "window of " << window_frames << " frames";
    EXPECT_EQ(SealedOnceReleased(e.get(), release.get()), 2u);
  }
}

// A recall with window_lse does not wait for a block wholly in the window,
// and still answers what it answers once that block is sealed: the same
// sets and masses to the bit (the identity channel takes the window as
// whole blocks, and the sealed block's rows join the scan with weight 0).
TEST_F(SealAfterAckTest, ARecallThatDoesNotWaitAnswersAsIfTheBlockWereSealed) {
  StreamConfig c = Config(g_);
  c.hot_window_tokens = 8 * kTokens;  // Blocks 4 and 5 (frames 16-23).
  auto answers = [&](MemoryEngine* e) {
    std::vector<std::pair<
        float, std::vector<std::pair<uint64_t, std::vector<uint32_t>>>>>
        out;
    for (const std::vector<float>& v : queries_) {
      RecallQuery q;
      q.query = v;
      q.window_lse.assign(v.size() / g_.head_dim, 2.0f);  // [head]
      absl::StatusOr<RecallResult> r = e->Recall("s", q);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) continue;
      out.emplace_back(
          r->recalled_mass,
          std::vector<std::pair<uint64_t, std::vector<uint32_t>>>{});
      for (const RecalledBlock& b : r->blocks) {
        out.back().second.emplace_back(b.block.id, b.token_offsets);
      }
    }
    return out;
  };
  testing::TempDir held_dir, ref_dir;
  auto held = OpenTestEngine(held_dir.path(), Deferred());
  ASSERT_TRUE(held->OpenStream("s", c).ok());
  std::shared_ptr<absl::Notification> release = HoldBackground(held.get());
  for (uint64_t f = 0; f < 24; ++f) ASSERT_TRUE(Append(held.get(), f).ok());
  ASSERT_EQ(Peek(held.get()).sealed_blocks, 5u);  // Block 5 waits.
  const auto got = answers(held.get());
  EXPECT_EQ(Peek(held.get()).sealed_blocks, 5u);  // Not sealed by a recall.
  auto ref = OpenTestEngine(ref_dir.path());
  ASSERT_TRUE(ref->OpenStream("s", c).ok());
  for (uint64_t f = 0; f < 24; ++f) ASSERT_TRUE(Append(ref.get(), f).ok());
  ASSERT_EQ(Peek(ref.get()).sealed_blocks, 6u);
  const auto want = answers(ref.get());
  ASSERT_EQ(want.size(), queries_.size());
  EXPECT_FALSE(want[0].second.empty());
  EXPECT_EQ(got, want);
  EXPECT_EQ(SealedOnceReleased(held.get(), release.get()), 6u);
  EXPECT_EQ(answers(held.get()), want);
}

// A store whose commits (and, with reads_too_, frame reads) fail while
// `fail` is set (a full disk, a store that cannot be reached).
class FailingCommits : public ForwardingColdStore {
 public:
  FailingCommits(std::shared_ptr<ColdStore> inner,
                 std::shared_ptr<std::atomic<bool>> fail)
      : ForwardingColdStore(std::move(inner)), fail_(std::move(fail)) {}
  absl::Status Commit(const StreamWrite& w) override {
    if (fail_->load()) return absl::UnavailableError("commits refused");
    return ForwardingColdStore::Commit(w);
  }
  absl::StatusOr<std::string> GetFrame(absl::string_view id,
                                       uint64_t f) override {
    if (fail_->load() && reads_too_) return absl::UnavailableError("no reads");
    return ForwardingColdStore::GetFrame(id, f);
  }
  bool reads_too_ = false;  // Reads of frames fail with the commits.

 private:
  std::shared_ptr<std::atomic<bool>> fail_;
};

// A deferred-seal engine over a FailingCommits store in `dir`; null (and a
// test failure) if it does not open.
std::unique_ptr<MemoryEngine> OpenFailing(
    const std::string& dir, std::shared_ptr<std::atomic<bool>> fail,
    bool reads_too) {
  auto store = std::make_unique<FailingCommits>(
      std::shared_ptr<ColdStore>(OpenTestStore(dir)), std::move(fail));
  store->reads_too_ = reads_too;
  absl::StatusOr<std::unique_ptr<MemoryEngine>> opened =
      MemoryEngine::Open(std::move(store), Deferred());
  EXPECT_TRUE(opened.ok()) << opened.status();
  return opened.ok() ? *std::move(opened) : nullptr;
}

TEST_F(SealAfterAckTest, ARestartSealsTheBlockItsServerLeftFull) {
  testing::TempDir dir;
  {
    auto fail = std::make_shared<std::atomic<bool>>(false);
    std::unique_ptr<MemoryEngine> e = OpenFailing(dir.path(), fail, false);
    ASSERT_NE(e, nullptr);
    std::shared_ptr<absl::Notification> release;
    ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 8, &release));
    // Block 0 sealed by frame 4's append; block 1 (frames 4-7) is full and
    // its seal fails: the server goes with it unsealed.
    fail->store(true);
    release->Notify();
    e->WaitForBackground();
    const StreamStats st = Peek(e.get());
    EXPECT_EQ(st.sealed_blocks, 1u);
    EXPECT_EQ(st.open_block_frames, 4u);
    EXPECT_EQ(st.last_durable_frame, 7);
  }
  auto e = OpenTestEngine(dir.path(), Deferred());
  e->WaitForBackground();
  StreamStats st = Peek(e.get());
  EXPECT_EQ(st.sealed_blocks, 2u);
  EXPECT_EQ(st.open_block_frames, 0u);
  EXPECT_EQ(st.last_durable_frame, 7);
  ExpectAnswersOfASealingEngine(e.get(), 8);
}

// A store that refuses writes (a full disk) refuses the seal a recall
// would run first; the recall still answers, from the blocks sealed so far.
TEST_F(SealAfterAckTest, ARecallAnswersWhenTheSealIsRefused) {
  testing::TempDir dir;
  auto fail = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<MemoryEngine> e = OpenFailing(dir.path(), fail, false);
  ASSERT_NE(e, nullptr);
  std::shared_ptr<absl::Notification> release;
  ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 8, &release));
  fail->store(true);
  RecallQuery q;
  q.query = queries_[0];
  absl::StatusOr<RecallResult> r = e->Recall("s", q);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->blocks.empty());  // Block 0.
  EXPECT_EQ(Peek(e.get()).sealed_blocks, 1u);
  fail->store(false);
  EXPECT_EQ(SealedOnceReleased(e.get(), release.get()), 2u);
}

// A seal whose commit failed while the store could not be read either
// leaves the open block without its frames; the next use of it reads them
// again, so the block sealed later holds every acknowledged frame (before,
// a later seal took the emptied open block for the full one).
TEST_F(SealAfterAckTest, ASealAfterAFailedReplayHoldsEveryFrame) {
  testing::TempDir dir;
  auto fail = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<MemoryEngine> e = OpenFailing(dir.path(), fail, true);
  ASSERT_NE(e, nullptr);
  std::shared_ptr<absl::Notification> release;
  ASSERT_NO_FATAL_FAILURE(HeldAfter(e.get(), 4, &release));
  fail->store(true);  // The seal's commit fails, and so does its replay.
  EXPECT_EQ(SealedOnceReleased(e.get(), release.get()), 0u);
  fail->store(false);
  EXPECT_EQ(ReadBlock(e.get(), 0), model_.BlockBytes(0));
  ExpectAnswersOfASealingEngine(e.get(), 4);
}

// A store whose `hold_at`-th commit from now waits until released: holds a
// seal's demotion once the seal itself has committed.
class HeldCommits : public ForwardingColdStore {
 public:
  using ForwardingColdStore::ForwardingColdStore;
  absl::Status Commit(const StreamWrite& w) override {
    if (hold_at_.fetch_sub(1) == 1) {
      held_.Notify();
      release_.WaitForNotification();
    }
    return ForwardingColdStore::Commit(w);
  }
  std::atomic<int> hold_at_{0};
  absl::Notification held_, release_;
};

// Stats taken while a queued seal enforces the budgets wait for it: they
// never show the sealed block warm over the warm budget (the server test
// TiersThroughTheServer saw 4 warm blocks of a 3-block budget in CI).
TEST_F(SealAfterAckTest, StatsWaitForTheBudgetsOfASealUnderWay) {
  testing::TempDir dir;
  auto store = std::make_unique<HeldCommits>(
      std::shared_ptr<ColdStore>(OpenTestStore(dir.path())));
  HeldCommits* held = store.get();
  absl::StatusOr<std::unique_ptr<MemoryEngine>> opened =
      MemoryEngine::Open(std::move(store), Deferred());
  ASSERT_TRUE(opened.ok()) << opened.status();
  MemoryEngine* e = opened->get();
  StreamConfig c = Config(g_);
  c.tiers.warm_budget_bytes = 1;  // No block fits: each seal demotes.
  ASSERT_TRUE(e->OpenStream("s", c).ok());
  std::shared_ptr<absl::Notification> release = HoldBackground(e);
  for (uint64_t f = 0; f < 4; ++f) ASSERT_TRUE(Append(e, f).ok());
  held->hold_at_ = 2;  // The seal's commit goes through, its demotion waits.
  release->Notify();
  held->held_.WaitForNotification();
  std::future<StreamStats> stats =
      std::async(std::launch::async, [e] { return *e->GetStats("s"); });
  // Long enough for stats that do not wait to be read before the release.
  EXPECT_EQ(stats.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);
  held->release_.Notify();
  const StreamStats st = stats.get();
  EXPECT_EQ(st.sealed_blocks, 1u);
  EXPECT_EQ(st.warm.blocks, 0u);
  EXPECT_EQ(st.warm.bytes, 0u);
  e->WaitForBackground();
}

}  // namespace
}  // namespace kvmem

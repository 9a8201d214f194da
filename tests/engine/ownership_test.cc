// MemoryEngine with a stream ownership (engine/ownership.h): two engines
// share one in-memory store that fences like RADOS does (a claim with a
// larger token makes the earlier claimer's commits ABORTED), and a registry
// of holders plays etcd. Streams are taken up on demand, calls on a stream
// another engine owns answer UNAVAILABLE naming it, a stream taken over is
// dropped by its earlier owner, and a lapsed ownership stops every write.
// The real coordinator and store: tests/distributed/takeover_test.cc.
#include "engine/ownership.h"

#include <map>
#include <mutex>
#include <random>

#include "absl/synchronization/notification.h"
#include "engine/memory_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/forwarding_store.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;

// Who holds each stream, and the last token handed out (etcd's revision).
struct Registry {
  std::mutex mu;
  std::map<std::string, std::pair<std::string, uint64_t>> holders;
  uint64_t revision = 0;
};

class FakeOwnership final : public StreamOwnership {
 public:
  FakeOwnership(std::shared_ptr<Registry> r, std::string self)
      : r_(std::move(r)), self_(std::move(self)) {}

  absl::StatusOr<uint64_t> Acquire(const std::string& id) override {
    if (absl::Status s = CheckServing(); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(r_->mu);
    auto& [owner, token] = r_->holders[id];
    if (owner.empty()) {
      owner = self_;
      token = ++r_->revision;
    }
    if (owner == self_) return token;
    return WithOwner(absl::UnavailableError("owned by " + owner), owner);
  }
  void Release(const std::string& id) override {
    std::lock_guard<std::mutex> lock(r_->mu);
    auto it = r_->holders.find(id);
    if (it != r_->holders.end() && it->second.first == self_) {
      r_->holders.erase(it);
    }
  }
  absl::Status Moved(const std::string& id,
                     const absl::Status& cause) override {
    std::lock_guard<std::mutex> lock(r_->mu);
    const std::string owner = r_->holders[id].first;
    return WithOwner(absl::UnavailableError(absl::StrCat(
                         "taken over by ", owner, ": ", cause.message())),
                     owner);
  }
  absl::Status CheckServing() override {
    std::lock_guard<std::mutex> lock(mu_);
    return serving_ ? absl::OkStatus()
                    : absl::UnavailableError("ownership lease lapsed");
  }
  void OnLost(std::function<void(const absl::Status&)> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    lost_ = std::move(fn);
  }
  void Lapse() {
    std::function<void(const absl::Status&)> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      serving_ = false;
      fn = lost_;
    }
    if (fn) fn(absl::UnavailableError("ownership lease lapsed"));
  }
  void Renew() {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = true;
  }

 private:
  std::shared_ptr<Registry> r_;
  const std::string self_;
  std::mutex mu_;
  bool serving_ = true;
  std::function<void(const absl::Status&)> lost_;
};

// The head's epoch per stream, shared by every instance of the store.
struct Epochs {
  std::mutex mu;
  std::map<std::string, uint64_t> epoch;
};

// A shared store that fences as RADOS does: ClaimStream sets the stream's
// epoch to the token (refused when smaller), and a commit of an instance
// whose claim is not the current epoch is ABORTED, changing nothing.
class FencingStore final : public ForwardingColdStore {
 public:
  FencingStore(std::shared_ptr<ColdStore> inner, std::shared_ptr<Epochs> e)
      : ForwardingColdStore(std::move(inner)), e_(std::move(e)) {}
  bool shared() const override { return true; }
  absl::Status ClaimStream(absl::string_view id, uint64_t token) override {
    std::lock_guard<std::mutex> lock(e_->mu);
    uint64_t& epoch = e_->epoch[std::string(id)];
    if (token < epoch) return absl::AbortedError("a larger claim was made");
    epoch = token;
    mine_[std::string(id)] = token;
    return absl::OkStatus();
  }
  void ReleaseStream(absl::string_view id) override {
    std::lock_guard<std::mutex> lock(e_->mu);
    mine_.erase(std::string(id));
  }
  absl::Status Commit(const StreamWrite& w) override {
    {
      std::lock_guard<std::mutex> lock(e_->mu);
      if (mine_[w.stream_id] != e_->epoch[w.stream_id]) {
        return absl::AbortedError("owned by a newer store instance");
      }
    }
    return inner().Commit(w);
  }

 private:
  std::shared_ptr<Epochs> e_;
  std::map<std::string, uint64_t> mine_;  // Guarded by e_->mu.
};

class OwnershipEngineTest : public ::testing::Test {
 protected:
  OwnershipEngineTest()
      : model_(g_, 3, 40, {2, 0}), rng_(7), store_(NewMemColdStore()) {}

  std::unique_ptr<MemoryEngine> Open(const std::string& name,
                                     std::shared_ptr<FakeOwnership>* own) {
    *own = std::make_shared<FakeOwnership>(registry_, name);
    EngineOptions o;
    o.ownership = *own;
    auto e =
        MemoryEngine::Open(std::make_unique<FencingStore>(store_, epochs_), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  }

  ::testing::AssertionResult Create(MemoryEngine& e) {
    auto r = e.OpenStream("cam", testing::TestConfig(g_, 40, 3));
    if (r.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << r.status();
  }

  Frame At(uint64_t i) {
    while (frames_.size() <= i) frames_.push_back(model_.AddFrame(rng_, 8, 0));
    return testing::ToFrame(frames_[i], i);
  }

  absl::Status AppendFrames(MemoryEngine& e, uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; ++i) {
      auto r = e.Append("cam", At(i));
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

  testing::TestGeometry g_;
  testing::StreamModel model_;
  std::vector<testing::ModelFrame> frames_;
  std::mt19937_64 rng_;
  std::shared_ptr<ColdStore> store_;
  std::shared_ptr<Epochs> epochs_ = std::make_shared<Epochs>();
  std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
};

TEST_F(OwnershipEngineTest, StreamsAreTakenUpOnDemandAndOthersNameTheOwner) {
  std::shared_ptr<FakeOwnership> own_a, own_b;
  auto a = Open("a", &own_a);
  auto b = Open("b", &own_b);
  ASSERT_TRUE(Create(*a));
  ASSERT_TRUE(AppendFrames(*a, 0, 12).ok());
  absl::StatusOr<StreamHandle> at_b = b->Find("cam");
  ASSERT_EQ(at_b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(OwnerOf(at_b.status()), "a");
  EXPECT_TRUE(b->ListStreams().empty());
  // A stream nobody stored: NOT_FOUND, and no ownership kept for it.
  EXPECT_EQ(b->Find("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->holders.count("ghost"), 0u);
  EXPECT_TRUE(a->Holds("cam"));
  EXPECT_FALSE(b->Holds("cam"));
  // Deleting gives the ownership up: b may create the stream afresh.
  ASSERT_TRUE(a->DeleteStream("cam").ok());
  EXPECT_EQ(registry_->holders.count("cam"), 0u);
  ASSERT_TRUE(b->OpenStream("cam", testing::TestConfig(g_, 40, 3)).ok());
}

TEST_F(OwnershipEngineTest, ATakenOverStreamIsDroppedAndNamesTheNewOwner) {
  std::shared_ptr<FakeOwnership> own_a, own_b;
  auto a = Open("a", &own_a);
  ASSERT_TRUE(Create(*a));
  ASSERT_TRUE(AppendFrames(*a, 0, 12).ok());
  {  // a's ownership lapses in the coordinator; b gets the next token.
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->holders["cam"] = {"b", ++registry_->revision};
  }
  auto b = Open("b", &own_b);
  absl::StatusOr<StreamStats> st = b->GetStats("cam");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->last_durable_frame, 11);
  // a's next write is refused by the store and names b; a drops the stream.
  absl::Status refused = AppendFrames(*a, 12, 13);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_EQ(OwnerOf(refused), "b");
  a->WaitForBackground();
  EXPECT_TRUE(a->ListStreams().empty());
  EXPECT_EQ(OwnerOf(a->Find("cam").status()), "b");
  // Nothing of a's refused frame was stored; b goes on.
  ASSERT_TRUE(AppendFrames(*b, 12, 15).ok());
  EXPECT_EQ(b->GetStats("cam")->last_durable_frame, 14);
}

TEST_F(OwnershipEngineTest, ALapsedOwnershipStopsWritesAndDropsStreams) {
  std::shared_ptr<FakeOwnership> own;
  auto a = Open("a", &own);
  ASSERT_TRUE(Create(*a));
  absl::StatusOr<StreamHandle> held = a->Find("cam");
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(AppendFrames(*a, 0, 9).ok());
  own->Lapse();
  // Refused at once (CheckServing); dropped in the background.
  EXPECT_EQ(a->Find("cam").status().code(), absl::StatusCode::kUnavailable);
  a->WaitForBackground();
  EXPECT_TRUE(a->ListStreams().empty());
  // A caller still holding the stream is refused with the reason.
  EXPECT_THAT(held->Append(At(9)).status().message(), HasSubstr("lapsed"));
  EXPECT_EQ(a->Find("cam").status().code(), absl::StatusCode::kUnavailable);
  // Renewed: the stream is taken up again with everything acknowledged.
  own->Renew();
  absl::StatusOr<StreamStats> st = a->GetStats("cam");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->last_durable_frame, 8);
  ASSERT_TRUE(AppendFrames(*a, 9, 12).ok());
}

// A lapse queues the dropping of the server's streams on the background
// worker, which may be busy (a seal). A fresh lease granted before the drop
// ran must not serve the stream it held from before: another server may
// have taken it on meanwhile. (A two-server CI run answered "frame 60
// skips frames; last durable frame is 39" from such a stale stream.)
TEST_F(OwnershipEngineTest, AStreamHeldFromBeforeALapseIsNotServedAfterIt) {
  std::shared_ptr<FakeOwnership> own_a, own_b;
  auto a = Open("a", &own_a);
  auto b = Open("b", &own_b);
  ASSERT_TRUE(Create(*a));
  ASSERT_TRUE(AppendFrames(*a, 0, 10).ok());
  absl::StatusOr<StreamHandle> held = a->Find("cam");
  ASSERT_TRUE(held.ok());
  auto release = std::make_shared<absl::Notification>();
  StreamTestPeer::SubmitBackground(
      *held, [release] { release->WaitForNotification(); });
  own_a->Lapse();  // Its DisownAll waits behind the held worker.
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->holders.erase("cam");  // The lease's keys expire.
  }
  ASSERT_TRUE(AppendFrames(*b, 10, 20).ok());  // b takes the stream on.
  own_a->Renew();
  const absl::StatusOr<AppendResult> stale = a->Append("cam", At(20));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kUnavailable)
      << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("owned by b"));
  release->Notify();
  a->WaitForBackground();
  absl::StatusOr<StreamStats> st = b->GetStats("cam");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->last_durable_frame, 19);
}

}  // namespace
}  // namespace kvmem

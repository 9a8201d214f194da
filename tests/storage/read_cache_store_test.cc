// The local read cache (storage/read_cache_store.h): reads served while the
// inner store is down, never a stale entry (after commits, deletions,
// another server's writes between a release and a claim, and a commit that
// races a read), and its bound on disk. The contract itself is checked by
// the conformance suite (CachedMemory, WriteThroughCachedMemory).
#include "storage/read_cache_store.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "storage/forwarding_store.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

// The inner store, with reads that can be made to fail (a remote tier that
// cannot be reached) or to wait (a read in flight).
class SwitchedStore final : public ForwardingColdStore {
 public:
  explicit SwitchedStore(std::shared_ptr<ColdStore> inner)
      : ForwardingColdStore(std::move(inner)) {}

  std::atomic<bool> down{false};
  std::atomic<int> reads{0};
  // When set, GetBlockLayers reads, then notifies `read_done` and waits for
  // `resume` before answering.
  absl::Notification* read_done = nullptr;
  absl::Notification* resume = nullptr;

  absl::StatusOr<std::string> GetFrame(absl::string_view id,
                                       uint64_t f) override {
    if (absl::Status s = Reach(); !s.ok()) return s;
    return inner().GetFrame(id, f);
  }
  absl::StatusOr<std::vector<std::string>> GetFrames(absl::string_view id,
                                                     uint64_t first,
                                                     uint64_t last) override {
    if (absl::Status s = Reach(); !s.ok()) return s;
    return inner().GetFrames(id, first, last);
  }
  absl::StatusOr<std::vector<std::string>> GetBlockLayers(
      absl::string_view id, uint64_t b,
      const std::vector<uint32_t>& layers) override {
    if (absl::Status s = Reach(); !s.ok()) return s;
    auto v = inner().GetBlockLayers(id, b, layers);
    if (read_done != nullptr) {
      read_done->Notify();
      resume->WaitForNotification();
    }
    return v;
  }

 private:
  absl::Status Reach() {
    reads.fetch_add(1);
    if (down.load()) return absl::UnavailableError("inner store unreachable");
    return absl::OkStatus();
  }
};

class ReadCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(false); }

  void Open(bool write_through, uint64_t capacity = 64ull << 20) {
    store_.reset();
    base_ = std::shared_ptr<ColdStore>(NewMemColdStore());
    auto sw = std::make_unique<SwitchedStore>(base_);
    inner_ = sw.get();
    ReadCacheOptions o;
    o.path = dir_.path() + "/cache";
    o.capacity_bytes = capacity;
    o.write_through = write_through;
    auto s = WithReadCache(std::move(sw), o, &counters_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }

  void Commit(const StreamWrite& w) {
    const absl::Status s = store_->Commit(w);
    ASSERT_TRUE(s.ok()) << s;
  }
  // Block b's layers 0..n-1 of "cam", each `bytes` of `fill`.
  StreamWrite Layers(uint64_t b, int n, size_t bytes, char fill) {
    StreamWrite w;
    w.stream_id = "cam";
    for (int l = 0; l < n; ++l) {
      w.block_layers.push_back(
          {b, static_cast<uint32_t>(l), std::string(bytes, fill + l)});
    }
    return w;
  }

  testing::TempDir dir_;
  std::shared_ptr<ColdStore> base_;  // What every server sees (the pool).
  SwitchedStore* inner_ = nullptr;
  const ReadCacheCounters* counters_ = nullptr;
  std::unique_ptr<ColdStore> store_;
};

TEST_F(ReadCacheTest, ReadsOnceServedGoOnWhileTheInnerStoreIsDown) {
  Commit(Layers(1, 4, 10000, 'a'));
  Commit(Layers(2, 4, 10000, 'k'));
  const std::string frames[3] = {"f0", std::string(5000, 'x'), "f2"};
  for (uint64_t f = 0; f < 3; ++f) {
    StreamWrite w;
    w.stream_id = "cam";
    w.frame.emplace(f, frames[f]);
    Commit(w);
  }
  // Read once: block 1's layers, frames 0-2 (and frame 1 alone).
  auto layers = store_->GetBlockLayers("cam", 1, {0, 1, 2, 3});
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_TRUE(store_->GetFrames("cam", 0, 2).ok());
  EXPECT_EQ(counters_->hits.load(), 0u);
  EXPECT_EQ(counters_->misses.load(), 4u + 3u);

  inner_->down = true;
  const int reads_before = inner_->reads.load();
  auto again = store_->GetBlockLayers("cam", 1, {3, 0});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0], std::string(10000, 'a' + 3));
  EXPECT_EQ((*again)[1], std::string(10000, 'a'));
  auto one = store_->GetBlockLayer("cam", 1, 2);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, std::string(10000, 'a' + 2));
  auto fr = store_->GetFrames("cam", 0, 2);
  ASSERT_TRUE(fr.ok()) << fr.status();
  EXPECT_EQ(*fr, std::vector<std::string>(frames, frames + 3));
  EXPECT_EQ(*store_->GetFrame("cam", 1), frames[1]);
  EXPECT_EQ(inner_->reads.load(), reads_before);  // All local.
  EXPECT_EQ(counters_->hits.load(), 2u + 1u + 3u + 1u);
  EXPECT_EQ(counters_->hit_bytes.load(), 3u * 10000 + 5004u + 5000u);

  // What was never read is the inner store's error, and one missing layer
  // fails the whole call.
  EXPECT_EQ(store_->GetBlockLayers("cam", 2, {0}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(store_->GetBlockLayers("cam", 1, {0, 9}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(store_->GetFrames("cam", 0, 3).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_GE(counters_->inner_errors.load(), 3u);

  inner_->down = false;  // Back: the misses are read and kept.
  EXPECT_EQ((*store_->GetBlockLayers("cam", 2, {1}))[0],
            std::string(10000, 'k' + 1));
  inner_->down = true;
  EXPECT_EQ((*store_->GetBlockLayers("cam", 2, {1}))[0],
            std::string(10000, 'k' + 1));
}

TEST_F(ReadCacheTest, CommitsAndDeletionsLeaveNoStaleEntry) {
  for (bool write_through : {false, true}) {
    SCOPED_TRACE(write_through ? "write-through" : "read-through");
    Open(write_through);
    Commit(Layers(1, 2, 100, 'a'));
    StreamWrite f;
    f.stream_id = "cam";
    f.frame.emplace(7, "old");
    Commit(f);
    ASSERT_EQ((*store_->GetBlockLayers("cam", 1, {0, 1}))[1],
              std::string(100, 'b'));
    ASSERT_EQ(*store_->GetFrame("cam", 7), "old");

    // The block rewritten (its degraded form), then read: the new bytes.
    Commit(Layers(1, 2, 50, 'p'));
    EXPECT_EQ((*store_->GetBlockLayers("cam", 1, {0, 1}))[1],
              std::string(50, 'q'));
    // Its layers deleted: gone.
    StreamWrite d;
    d.stream_id = "cam";
    d.delete_block_layers = {1};
    Commit(d);
    EXPECT_EQ(store_->GetBlockLayer("cam", 1, 0).status().code(),
              absl::StatusCode::kNotFound);
    // Frames deleted by range, then the frame index written again.
    StreamWrite df;
    df.stream_id = "cam";
    df.delete_frames = {{5, 7}};
    Commit(df);
    EXPECT_EQ(store_->GetFrame("cam", 7).status().code(),
              absl::StatusCode::kNotFound);
    f.frame.emplace(7, "new");
    Commit(f);
    EXPECT_EQ(*store_->GetFrame("cam", 7), "new");
    // The stream deleted and made again under the same id.
    ASSERT_TRUE(store_->DeleteStream("cam").ok());
    inner_->down = true;
    EXPECT_EQ(store_->GetFrame("cam", 7).status().code(),
              absl::StatusCode::kUnavailable);
    inner_->down = false;
    EXPECT_EQ(store_->GetFrame("cam", 7).status().code(),
              absl::StatusCode::kNotFound);
  }
}

// Another server owns the stream between a release and the next claim and
// rewrites what this one cached: the claim drops the stream's entries.
TEST_F(ReadCacheTest, AClaimForgetsWhatAnotherOwnerMayHaveChanged) {
  Commit(Layers(3, 1, 100, 'a'));
  StreamWrite f;
  f.stream_id = "cam";
  f.frame.emplace(0, "mine");
  Commit(f);
  ASSERT_EQ(*store_->GetFrame("cam", 0), "mine");
  ASSERT_EQ(*store_->GetBlockLayer("cam", 3, 0), std::string(100, 'a'));
  store_->ReleaseStream("cam");
  // The other owner's writes, straight into the shared store.
  StreamWrite other = Layers(3, 1, 100, 'z');
  other.frame.emplace(0, "theirs");
  ASSERT_TRUE(base_->Commit(other).ok());
  ASSERT_TRUE(store_->ClaimStream("cam", 9).ok());
  EXPECT_EQ(*store_->GetFrame("cam", 0), "theirs");
  EXPECT_EQ(*store_->GetBlockLayer("cam", 3, 0), std::string(100, 'z'));
}

// A read answered by the inner store before a commit changed the layer,
// but returning after it: its old bytes are not kept (the read starts
// again and answers the new ones).
TEST_F(ReadCacheTest, AReadThatRacesACommitKeepsNothingOld) {
  Commit(Layers(4, 2, 100, 'a'));
  ASSERT_TRUE(store_->GetBlockLayers("cam", 4, {0}).ok());  // Layer 0 kept.
  absl::Notification read_done, resume;
  inner_->read_done = &read_done;
  inner_->resume = &resume;
  absl::StatusOr<std::vector<std::string>> raced;
  std::thread reader([&] { raced = store_->GetBlockLayers("cam", 4, {0, 1}); });
  read_done.WaitForNotification();  // Layer 0 from the cache, 1 read.
  inner_->read_done = nullptr;
  Commit(Layers(4, 2, 100, 'n'));
  resume.Notify();
  reader.join();
  ASSERT_TRUE(raced.ok()) << raced.status();
  // Never one layer of each write.
  EXPECT_EQ((*raced)[0][0], (*raced)[1][0] - 1) << (*raced)[0][0];
  inner_->down = true;  // What the cache kept is the new bytes, or nothing.
  for (uint32_t l : {0u, 1u}) {
    auto v = store_->GetBlockLayer("cam", 4, l);
    if (v.ok()) {
      EXPECT_EQ(*v, std::string(100, 'n' + l));
    } else {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
    }
  }
}

TEST_F(ReadCacheTest, TheCacheStaysWithinItsCapacityOnDisk) {
  constexpr uint64_t kCapacity = 64ull << 20;
  Open(true, kCapacity);
  // 192 MiB of layer records through the cache, 1 MiB each.
  for (uint64_t b = 0; b < 48; ++b) Commit(Layers(b, 4, 1 << 20, 'a'));
  // FIFO compaction runs after flushes, in the background.
  uint64_t tables = 0;
  for (int i = 0; i < 100; ++i) {
    tables = 0;
    for (const auto& e :
         std::filesystem::directory_iterator(dir_.path() + "/cache")) {
      if (e.path().extension() == ".sst") tables += e.file_size();
    }
    if (tables <= kCapacity) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LE(tables, kCapacity);
  EXPECT_GT(tables, 0u);
  EXPECT_EQ(counters_->inserted_bytes.load(), 192ull << 20);
  // The newest are kept, the oldest dropped (first in, first out).
  inner_->down = true;
  EXPECT_TRUE(store_->GetBlockLayer("cam", 47, 3).ok());
  EXPECT_EQ(store_->GetBlockLayer("cam", 0, 0).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ReadCacheOptionsTest, RefusesAnEmptyPathOrATinyCapacity) {
  testing::TempDir dir;
  ReadCacheOptions o;
  auto s = WithReadCache(NewMemColdStore(), o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  o.path = dir.path() + "/c";
  o.capacity_bytes = 1 << 20;
  s = WithReadCache(NewMemColdStore(), o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("1048576"), std::string::npos);
  // Opened on what a previous run left: it starts empty.
  o.capacity_bytes = 64ull << 20;
  o.write_through = true;
  {
    auto first = WithReadCache(NewMemColdStore(), o);
    ASSERT_TRUE(first.ok()) << first.status();
    StreamWrite w;
    w.stream_id = "cam";
    w.frame.emplace(0, "kept");
    ASSERT_TRUE((*first)->Commit(w).ok());
  }
  auto second = WithReadCache(NewMemColdStore(), o);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->GetFrame("cam", 0).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvmem

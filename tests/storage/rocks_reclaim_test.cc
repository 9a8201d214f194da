// A deleted stream's space: the tombstones and the files wholly inside its
// range at once, the compaction of the range on the store's reclaimer
// thread (storage/rocks_disk_guard.cc, Reclaim), so DeleteStream does not
// hold its caller for it.
#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "storage/rocks_cold_store.h"
#include "storage/rocks_store.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

std::string Payload(const std::string& id, uint64_t f, int generation) {
  return std::string(
      64 << 10, static_cast<char>('a' + (f * 7 + id[0] + generation) % 26));
}

absl::Status Put(ColdStore& store, const std::string& id, uint64_t f,
                 int generation = 0) {
  const std::string payload = Payload(id, f, generation);
  StreamWrite w;
  w.stream_id = id;
  w.frame.emplace(f, payload);
  if (f == 0) w.config = "cfg" + std::to_string(generation);
  return store.Commit(w);
}

RocksColdStore* Rocks(std::unique_ptr<ColdStore>& s) {
  return dynamic_cast<RocksColdStore*>(s.get());
}

// Waits (at most 20 s) until the reclaimer has run `n` compactions.
bool ReclaimedWithin(RocksColdStore* s, uint64_t n) {
  for (int i = 0; i < 2000 && s->reclaims_done() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s->reclaims_done() >= n;
}

// With room on the disk, DeleteStream leaves the range's compaction to the
// reclaimer: it returns with the compaction queued or running, not done in
// its call. A stream of the same id written again at once, before that
// compaction runs, keeps every new frame through it (the compaction only
// drops what the older tombstones cover); the neighbour keeps its frames;
// the old frames stay gone.
TEST(RocksReclaimTest, DeletionCompactsLaterAndARecreatedStreamKeepsItsFrames) {
  testing::TempDir dir;
  RocksColdStoreOptions o;
  o.path = dir.path() + "/db";
  o.write_buffer_bytes = 1 << 20;  // Flushes (table files) along the way.
  auto opened = OpenRocksColdStore(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  RocksColdStore* store = Rocks(*opened);
  ASSERT_NE(store, nullptr);
  for (uint64_t f = 0; f < 96; ++f) {
    ASSERT_TRUE(Put(*store, "a", f).ok());
    ASSERT_TRUE(Put(*store, "b", f).ok());
  }
  ASSERT_EQ(store->reclaims_done(), 0u);

  ASSERT_TRUE(store->DeleteStream("a").ok());
  EXPECT_EQ(store->reclaims_done() + store->reclaims_pending(), 1u)
      << "the deletion's compaction was not handed to the reclaimer";
  // "a" again, at once: 40 frames of a new generation.
  for (uint64_t f = 0; f < 40; ++f) {
    ASSERT_TRUE(Put(*store, "a", f, /*generation=*/1).ok());
  }
  ASSERT_TRUE(ReclaimedWithin(store, 1));
  EXPECT_EQ(store->reclaims_pending(), 0u);
  for (uint64_t f = 0; f < 96; ++f) {
    auto a = store->GetFrame("a", f);
    if (f < 40) {
      ASSERT_TRUE(a.ok()) << "frame " << f << ": " << a.status();
      EXPECT_EQ(*a, Payload("a", f, 1)) << "frame " << f;
    } else {
      EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound) << f;
    }
    auto b = store->GetFrame("b", f);
    ASSERT_TRUE(b.ok()) << "frame " << f << ": " << b.status();
    EXPECT_EQ(*b, Payload("b", f, 0)) << "frame " << f;
  }
}

// A store closed with deletions queued or compacting closes promptly (a
// running compaction is told to stop), and the deletions stand after a
// reopen: the queue is only the space's, the tombstones are in the WAL.
TEST(RocksReclaimTest, CloseWithDeletionsQueuedKeepsThemDeleted) {
  testing::TempDir dir;
  RocksColdStoreOptions o;
  o.path = dir.path() + "/db";
  o.write_buffer_bytes = 1 << 20;
  const std::string ids[] = {"c0", "c1", "c2", "c3", "keep"};
  {
    auto opened = OpenRocksColdStore(o);
    ASSERT_TRUE(opened.ok()) << opened.status();
    for (uint64_t f = 0; f < 32; ++f) {
      for (const std::string& id : ids) ASSERT_TRUE(Put(**opened, id, f).ok());
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE((*opened)->DeleteStream(ids[i]).ok());
    }
    const auto t0 = std::chrono::steady_clock::now();
    opened->reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  }
  auto reopened = OpenRocksColdStore(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto list = (*reopened)->ListStreams();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].stream_id, "keep");
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*reopened)->GetFrame(ids[i], 0).status().code(),
              absl::StatusCode::kNotFound);
  }
  for (uint64_t f = 0; f < 32; ++f) {
    auto k = (*reopened)->GetFrame("keep", f);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(*k, Payload("keep", f, 0));
  }
}

}  // namespace
}  // namespace kvmem

// The ColdStore contract (storage/cold_store.h), one typed suite run on
// every store this machine can run: the in-memory store and RocksDB in a
// temp directory (opened through storage/store_factory.h, as the server
// opens them). Built again with KVMEM_CONFORMANCE_RADOS for the RADOS store
// (kvmem_rados_tests, label distributed: on the test cluster whose
// configuration KVMEM_CEPH_CONF names; each test under its own prefix). What
// only a durable store can show (reopen, the acknowledgement record after a
// crash) is in the store's own tests (rocks_cold_store_test.cc,
// tests/reliability/).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/checksummed_store.h"
#include "storage/cold_store.h"
#include "storage/read_cache_store.h"
#include "storage/store_factory.h"
#include "tests/distributed/ceph_env.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

struct MemoryStore {
  static std::string Spec(const std::string&) { return "memory:"; }
};
struct RocksStore {
  static std::string Spec(const std::string& dir) {
    return "rocksdb:" + dir + "/db";
  }
};
// The memory store behind the checksum decorator (what a backend without
// checksums of its own gets).
struct ChecksummedMemoryStore {
  static std::string Spec(const std::string&) { return "memory:"; }
  static constexpr bool kChecksummed = true;
};

// The memory store behind a local read cache (storage/read_cache_store.h):
// what the cache answers must keep the contract, so it must never be stale.
struct CachedMemoryStore {
  static std::string Spec(const std::string&) { return "memory:"; }
  static constexpr bool kCached = true;
  static constexpr bool kWriteThrough = false;
};
struct WriteThroughCachedMemoryStore {
  static std::string Spec(const std::string&) { return "memory:"; }
  static constexpr bool kCached = true;
  static constexpr bool kWriteThrough = true;
};

struct RadosStore {
  static std::string Spec(const std::string&) { return "rados:kvmem"; }
};

// RADOS behind the read cache a server puts in front of it (--store_cache).
struct CachedRadosStore {
  static std::string Spec(const std::string&) { return "rados:kvmem"; }
  static constexpr bool kCached = true;
  static constexpr bool kWriteThrough = true;
};

// Options for a RADOS store no other test sees.
inline RadosColdStoreOptions IsolatedRados() {
  RadosColdStoreOptions o;
  o.ceph_conf = testing::CephConf();
  o.prefix = testing::UniquePrefix("t");
  o.op_timeout = absl::Seconds(20);
  return o;
}

template <typename T, typename = void>
struct Checksummed : std::false_type {};
template <typename T>
struct Checksummed<T, std::void_t<decltype(T::kChecksummed)>> : std::true_type {
};

template <typename T, typename = void>
struct Cached : std::false_type {};
template <typename T>
struct Cached<T, std::void_t<decltype(T::kCached)>> : std::true_type {};

template <typename T>
class ColdStoreConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if ((std::is_same_v<T, RadosStore> ||
         std::is_same_v<T, CachedRadosStore>)&&testing::CephConf()
            .empty()) {
      GTEST_SKIP() << testing::kNoCephCluster;
    }
    absl::StatusOr<StoreSpec> spec = ParseStoreSpec(T::Spec(dir_.path()));
    ASSERT_TRUE(spec.ok()) << spec.status();
    RocksColdStoreOptions rocks;
    rocks.reserve_bytes = 0;  // A test's temp dir may sit on a full disk.
    absl::StatusOr<std::unique_ptr<ColdStore>> s =
        OpenColdStore(*spec, rocks, IsolatedRados());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    if (Checksummed<T>::value) store_ = WithLayerChecksums(std::move(store_));
    if constexpr (Cached<T>::value) {
      ReadCacheOptions c;
      c.path = dir_.path() + "/cache";
      c.capacity_bytes = 64ull << 20;
      c.write_through = T::kWriteThrough;
      absl::StatusOr<std::unique_ptr<ColdStore>> cached =
          WithReadCache(std::move(store_), c);
      ASSERT_TRUE(cached.ok()) << cached.status();
      store_ = *std::move(cached);
    }
  }

  ColdStore& store() { return *store_; }

  void Commit(const StreamWrite& w) {
    const absl::Status s = store_->Commit(w);
    ASSERT_TRUE(s.ok()) << s;
  }

  // Frame f of "cam" alone in a write, with its meta when one is given.
  void CommitFrame(uint64_t f, const std::string& payload,
                   const std::optional<std::string>& meta = std::nullopt) {
    StreamWrite w;
    w.stream_id = "cam";
    w.frame.emplace(f, payload);
    w.frame_meta = meta;
    Commit(w);
  }

  std::vector<std::pair<uint64_t, std::string>> Blocks(const std::string& id) {
    std::vector<std::pair<uint64_t, std::string>> out;
    const absl::Status s =
        store_->ScanBlocks(id, [&](uint64_t b, absl::string_view r) {
          out.emplace_back(b, std::string(r));
          return absl::OkStatus();
        });
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

 private:
  testing::TempDir dir_;
  std::unique_ptr<ColdStore> store_;
};

#if defined(KVMEM_CONFORMANCE_RADOS)
using Stores = ::testing::Types<RadosStore, CachedRadosStore>;
#else
using Stores =
    ::testing::Types<MemoryStore, RocksStore, ChecksummedMemoryStore,
                     CachedMemoryStore, WriteThroughCachedMemoryStore>;
#endif
class StoreNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, MemoryStore>) return "Memory";
    if (std::is_same_v<T, RocksStore>) return "RocksDb";
    if (std::is_same_v<T, RadosStore>) return "Rados";
    if (std::is_same_v<T, CachedRadosStore>) return "CachedRados";
    if (std::is_same_v<T, CachedMemoryStore>) return "CachedMemory";
    if (std::is_same_v<T, WriteThroughCachedMemoryStore>) {
      return "WriteThroughCachedMemory";
    }
    return "ChecksummedMemory";
  }
};
TYPED_TEST_SUITE(ColdStoreConformance, Stores, StoreNames);

TYPED_TEST(ColdStoreConformance, MissingRecordsAreNotFound) {
  ColdStore& s = this->store();
  EXPECT_EQ(s.GetFrame("cam", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetFrameMeta("cam", 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetBlockLayer("cam", 0, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(this->Blocks("cam").empty());
  auto list = s.ListStreams();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  auto acked = s.Acknowledged();
  ASSERT_TRUE(acked.ok()) << acked.status();
  EXPECT_TRUE(acked->empty());
  EXPECT_TRUE(s.DeleteStream("cam").ok());  // OK when it had none.
}

// Every part of one write, then reads of each.
TYPED_TEST(ColdStoreConformance, ACommitStoresEveryPart) {
  const std::string payload(200 * 1024, 'p');  // Large: RocksDB's blobs.
  StreamWrite w;
  w.stream_id = "cam";
  w.config = "cfg";
  w.state = "s1";
  w.frame.emplace(7, payload);
  w.frame_meta = "meta7";
  w.blocks = {{1, "b1"}, {2, "b2"}};
  w.block_layers = {{1, 0, "L0"}, {1, 1, std::string(10000, 'x')}, {2, 0, ""}};
  this->Commit(w);
  ColdStore& s = this->store();
  EXPECT_EQ(*s.GetFrame("cam", 7), payload);
  EXPECT_EQ(*s.GetFrameMeta("cam", 7), "meta7");
  EXPECT_EQ(*s.GetBlockLayer("cam", 1, 0), "L0");
  EXPECT_EQ(*s.GetBlockLayer("cam", 1, 1), std::string(10000, 'x'));
  EXPECT_EQ(*s.GetBlockLayer("cam", 2, 0), "");  // Empty is a value.
  EXPECT_EQ(this->Blocks("cam"), (std::vector<std::pair<uint64_t, std::string>>{
                                     {1, "b1"}, {2, "b2"}}));
  auto list = s.ListStreams();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].stream_id, "cam");
  EXPECT_EQ((*list)[0].config, "cfg");
  EXPECT_EQ((*list)[0].state, "s1");
  // A later write replaces what it names and keeps the rest.
  StreamWrite next;
  next.stream_id = "cam";
  next.state = "s2";
  next.frame.emplace(7, "p7");
  next.blocks = {{1, "b1v2"}};
  this->Commit(next);
  EXPECT_EQ(*s.GetFrame("cam", 7), "p7");
  list = s.ListStreams();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)[0].config, "cfg");
  EXPECT_EQ((*list)[0].state, "s2");
  EXPECT_EQ(this->Blocks("cam")[0].second, "b1v2");
}

// Deletions apply before the puts of the same write; ranges are inclusive
// and touch nothing outside them.
TYPED_TEST(ColdStoreConformance, DeletionsComeBeforePutsAndStayInRange) {
  StreamWrite w;
  w.stream_id = "cam";
  w.config = "cfg";
  this->Commit(w);
  for (uint64_t f = 0; f < 6; ++f) {
    StreamWrite fw;
    fw.stream_id = "cam";
    const std::string p = "f" + std::to_string(f);
    fw.frame.emplace(f, p);
    fw.frame_meta = "m" + std::to_string(f);
    fw.block_layers = {{f, 0, "l" + std::to_string(f)},
                       {f, 1, "k" + std::to_string(f)}};
    this->Commit(fw);
  }
  StreamWrite d;
  d.stream_id = "cam";
  d.delete_frames = {{1, 3}};
  d.delete_block_layers = {2, 4};
  d.frame.emplace(2, "again");  // Inside the deleted range: stays.
  d.frame_meta = "m-again";
  d.block_layers = {{4, 1, "new"}};  // Of a cleared block: stays.
  this->Commit(d);
  ColdStore& s = this->store();
  for (uint64_t f : {1u, 3u}) {
    EXPECT_EQ(s.GetFrame("cam", f).status().code(), absl::StatusCode::kNotFound)
        << f;
    EXPECT_EQ(s.GetFrameMeta("cam", f).status().code(),
              absl::StatusCode::kNotFound)
        << f;
  }
  EXPECT_EQ(*s.GetFrame("cam", 0), "f0");
  EXPECT_EQ(*s.GetFrame("cam", 2), "again");
  EXPECT_EQ(*s.GetFrameMeta("cam", 2), "m-again");
  EXPECT_EQ(*s.GetFrame("cam", 4), "f4");
  EXPECT_EQ(s.GetBlockLayer("cam", 2, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetBlockLayer("cam", 2, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetBlockLayer("cam", 4, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*s.GetBlockLayer("cam", 4, 1), "new");
  EXPECT_EQ(*s.GetBlockLayer("cam", 3, 0), "l3");
  EXPECT_EQ(*s.GetBlockLayer("cam", 5, 1), "k5");
}

// Block ids in numeric order (not the order of their decimal or
// little-endian bytes); the first error of the callback ends the scan and
// is returned.
TYPED_TEST(ColdStoreConformance, ScanBlocksOrdersByIdAndStopsOnError) {
  StreamWrite w;
  w.stream_id = "cam";
  w.config = "cfg";
  for (uint64_t b : {uint64_t{1} << 40, uint64_t{256}, uint64_t{2},
                     uint64_t{255}, uint64_t{0}}) {
    w.blocks.emplace_back(b, std::to_string(b));
  }
  this->Commit(w);
  std::vector<uint64_t> ids;
  for (const auto& [b, r] : this->Blocks("cam")) {
    ids.push_back(b);
    EXPECT_EQ(r, std::to_string(b));
  }
  EXPECT_EQ(ids, (std::vector<uint64_t>{0, 2, 255, 256, uint64_t{1} << 40}));
  int seen = 0;
  const absl::Status s =
      this->store().ScanBlocks("cam", [&](uint64_t b, absl::string_view) {
        ++seen;
        return b == 255 ? absl::AbortedError("stop at 255") : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "stop at 255");
  EXPECT_EQ(seen, 3);
}

// Streams whose ids prefix one another keep apart; only streams with a
// config are listed, in id order; deleting one leaves the others whole.
TYPED_TEST(ColdStoreConformance, StreamsKeepApartAndDeleteWhole) {
  for (const std::string id : {"cam2", "cam", "ca", "cam-1"}) {
    StreamWrite w;
    w.stream_id = id;
    w.config = "cfg-" + id;
    const std::string frame = "frame-" + id;  // Outlives the Commit.
    w.frame.emplace(0, frame);
    w.blocks = {{0, "block-" + id}};
    w.block_layers = {{0, 0, "layer-" + id}};
    this->Commit(w);
  }
  StreamWrite no_config;  // Records without a config: not listed.
  no_config.stream_id = "bare";
  no_config.frame.emplace(0, "x");
  this->Commit(no_config);
  ColdStore& s = this->store();
  auto list = s.ListStreams();
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> ids;
  for (const StreamRecord& r : *list) {
    ids.push_back(r.stream_id);
    EXPECT_EQ(r.config, "cfg-" + r.stream_id);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"ca", "cam", "cam-1", "cam2"}));
  ASSERT_TRUE(s.DeleteStream("cam").ok());
  EXPECT_EQ(s.GetFrame("cam", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetBlockLayer("cam", 0, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(this->Blocks("cam").empty());
  for (const std::string id : {"cam2", "ca", "cam-1"}) {
    EXPECT_EQ(*s.GetFrame(id, 0), "frame-" + id);
    EXPECT_EQ(*s.GetBlockLayer(id, 0, 0), "layer-" + id);
    ASSERT_EQ(this->Blocks(id).size(), 1u) << id;
  }
  list = s.ListStreams();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 3u);
}

// The batched read equals the single reads, in the order asked; a missing
// layer fails the call with NOT_FOUND.
TYPED_TEST(ColdStoreConformance, BatchedLayerReadsEqualSingleReads) {
  StreamWrite w;
  w.stream_id = "cam";
  for (uint32_t l = 0; l < 6; ++l) {
    w.block_layers.push_back({9, l, std::string(1000 + l, 'a' + l)});
  }
  this->Commit(w);
  ColdStore& s = this->store();
  const std::vector<uint32_t> layers = {5, 0, 3, 3};
  auto got = s.GetBlockLayers("cam", 9, layers);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_EQ((*got)[i], *s.GetBlockLayer("cam", 9, layers[i])) << i;
  }
  auto none = s.GetBlockLayers("cam", 9, {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto missing = s.GetBlockLayers("cam", 9, {1, 6, 2});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetBlockLayers("cam", 10, {0, 1}).status().code(),
            absl::StatusCode::kNotFound);
}

// Deleting only metas keeps the frames, and only the range's metas go.
TYPED_TEST(ColdStoreConformance, MetaDeletionsKeepTheFrames) {
  for (uint64_t f = 0; f < 4; ++f) {
    this->CommitFrame(f, "f" + std::to_string(f), "m" + std::to_string(f));
  }
  StreamWrite d;
  d.stream_id = "cam";
  d.delete_frame_metas = {{1, 2}};
  this->Commit(d);
  ColdStore& s = this->store();
  for (uint64_t f = 0; f < 4; ++f) {
    EXPECT_EQ(*s.GetFrame("cam", f), "f" + std::to_string(f));
    auto meta = s.GetFrameMeta("cam", f);
    if (f == 1 || f == 2) {
      EXPECT_EQ(meta.status().code(), absl::StatusCode::kNotFound) << f;
    } else {
      ASSERT_TRUE(meta.ok()) << f << ": " << meta.status();
      EXPECT_EQ(*meta, "m" + std::to_string(f));
    }
  }
}

// A block's frames read in one call equal the single reads, in frame
// order (one frame larger than a RADOS stripe); a frame missing from the
// range fails the call with NOT_FOUND.
TYPED_TEST(ColdStoreConformance, BatchedFrameReadsEqualSingleReads) {
  for (uint64_t f = 3; f <= 6; ++f) {
    const size_t bytes = f == 4 ? (5u << 20) + 17 : 1000 + f;
    this->CommitFrame(f, std::string(bytes, static_cast<char>('a' + f)));
  }
  ColdStore& s = this->store();
  auto got = s.GetFrames("cam", 3, 6);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 4u);
  for (uint64_t f = 3; f <= 6; ++f) {
    EXPECT_EQ((*got)[f - 3], *s.GetFrame("cam", f)) << "frame " << f;
  }
  auto one = s.GetFrames("cam", 5, 5);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->at(0), *s.GetFrame("cam", 5));
  EXPECT_EQ(s.GetFrames("cam", 3, 7).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetFrames("other", 3, 6).status().code(),
            absl::StatusCode::kNotFound);
}

// A frame written in parts reads back whole (alone and in a range), and
// its parts, in any order, equal the slices of its payload; a part past
// the end is DATA_LOSS; a frame written whole reads in parts of any size;
// a frame's deletion removes its parts.
TYPED_TEST(ColdStoreConformance, FramesWrittenInPartsReadWholeAndInParts) {
  ColdStore& s = this->store();
  std::string payload(1000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<char>(i * 7 + i / 251);
  }
  StreamWrite w;
  w.stream_id = "cam";
  w.frame.emplace(5, payload);
  w.frame_meta = "m5";
  w.frame_part_bytes = 300;  // 300, 300, 300, 100.
  this->Commit(w);
  this->CommitFrame(6, "whole frame six");
  ASSERT_EQ(*s.GetFrame("cam", 5), payload);
  auto range = s.GetFrames("cam", 5, 6);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->at(0), payload);
  EXPECT_EQ(range->at(1), "whole frame six");
  EXPECT_EQ(*s.GetFrameMeta("cam", 5), "m5");
  auto parts = s.GetFrameParts("cam", 300, {{5, 3}, {5, 0}, {6, 0}, {5, 1}});
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 4u);
  EXPECT_EQ(parts->at(0), payload.substr(900));
  EXPECT_EQ(parts->at(1), payload.substr(0, 300));
  EXPECT_EQ(parts->at(2), "whole frame six");  // One part of 300.
  EXPECT_EQ(parts->at(3), payload.substr(300, 300));
  auto small = s.GetFrameParts("cam", 4, {{6, 1}, {6, 3}});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->at(0), "e fr");
  EXPECT_EQ(small->at(1), "six");
  EXPECT_EQ(s.GetFrameParts("cam", 300, {{5, 4}}).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.GetFrameParts("cam", 300, {{7, 0}}).status().code(),
            absl::StatusCode::kNotFound);
  StreamWrite d;
  d.stream_id = "cam";
  d.delete_frames = {{5, 5}};
  this->Commit(d);
  EXPECT_EQ(s.GetFrame("cam", 5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetFrameParts("cam", 300, {{5, 0}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*s.GetFrame("cam", 6), "whole frame six");
}

TYPED_TEST(ColdStoreConformance, TheAcknowledgementRecordIsReplacedWhole) {
  ColdStore& s = this->store();
  ASSERT_TRUE(s.RecordAcknowledged({{"cam", 10}, {"cam2", 3}}).ok());
  auto a = s.Acknowledged();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::map<std::string, uint64_t>{{"cam", 10}, {"cam2", 3}}));
  ASSERT_TRUE(s.RecordAcknowledged({{"cam", 12}}).ok());
  a = s.Acknowledged();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::map<std::string, uint64_t>{{"cam", 12}}));
  ASSERT_TRUE(s.RecordAcknowledged({}).ok());
  a = s.Acknowledged();
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->empty());
}

// Writers on their own streams and readers of them at once: every commit
// that returned is read back whole (read your writes across threads), and
// a reader never sees a frame without the state written with it.
TYPED_TEST(ColdStoreConformance, ConcurrentWritersAndReadersSeeWholeWrites) {
  ColdStore& s = this->store();
  constexpr int kStreams = 3, kFrames = 60;
  std::atomic<int> done{0};
  std::atomic<int> torn{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      const std::string id = "cam" + std::to_string(t);
      for (int f = 0; f < kFrames; ++f) {
        StreamWrite w;
        w.stream_id = id;
        w.config = "cfg";
        w.state = std::to_string(f);
        const std::string p(1000 + f, static_cast<char>('a' + f % 26));
        w.frame.emplace(f, p);
        w.blocks = {{static_cast<uint64_t>(f), w.state.value()}};
        EXPECT_TRUE(s.Commit(w).ok());
        auto back = s.GetFrame(id, f);
        EXPECT_TRUE(back.ok() && *back == p) << id << " frame " << f;
      }
      done.fetch_add(1);
    });
  }
  threads.emplace_back([&] {
    while (done.load() < kStreams) {
      auto list = s.ListStreams();
      if (!list.ok()) continue;
      for (const StreamRecord& r : *list) {
        // The state names the last frame written with it: that frame and
        // its block are there.
        const uint64_t f = std::stoull(r.state);
        if (!s.GetFrame(r.stream_id, f).ok()) torn.fetch_add(1);
      }
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(torn.load(), 0);
  for (int t = 0; t < kStreams; ++t) {
    EXPECT_EQ(this->Blocks("cam" + std::to_string(t)).size(),
              static_cast<size_t>(kFrames));
  }
}

// The decorator's reads of records damaged in the inner store: DATA_LOSS
// naming the layer, never the wrong bytes.
#if !defined(KVMEM_CONFORMANCE_RADOS)
TEST(ChecksummedStoreTest, DamagedOrForeignRecordsAreDataLoss) {
  std::unique_ptr<ColdStore> inner = NewMemColdStore();
  ColdStore* raw = inner.get();  // Owned by the decorator below.
  std::unique_ptr<ColdStore> s = WithLayerChecksums(std::move(inner));
  StreamWrite w;
  w.stream_id = "cam";
  w.block_layers = {{1, 0, std::string(4096, 'a')}, {1, 1, "b"}};
  ASSERT_TRUE(s->Commit(w).ok());
  EXPECT_EQ(*s->GetBlockLayer("cam", 1, 0), std::string(4096, 'a'));
  // Stored with the trailer: 8 bytes more.
  EXPECT_EQ(raw->GetBlockLayer("cam", 1, 0)->size(), 4096u + 8);
  // One flipped bit, a record cut short, one written without a trailer,
  // and another key's record (trailer and all) under this key.
  std::string flipped = *raw->GetBlockLayer("cam", 1, 0);
  flipped[100] ^= 4;
  const std::string foreign = *raw->GetBlockLayer("cam", 1, 1);
  for (const std::string& bad :
       {flipped, flipped.substr(0, 50), std::string(4096, 'a'), foreign}) {
    StreamWrite d;
    d.stream_id = "cam";
    d.block_layers = {{1, 0, bad}};
    ASSERT_TRUE(raw->Commit(d).ok());
    auto one = s->GetBlockLayer("cam", 1, 0);
    EXPECT_EQ(one.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(one.status().message().find("layer 0 of block 1"),
              std::string::npos)
        << one.status();
    EXPECT_EQ(s->GetBlockLayers("cam", 1, {1, 0}).status().code(),
              absl::StatusCode::kDataLoss);
  }
  EXPECT_EQ(*s->GetBlockLayer("cam", 1, 1), "b");
}

TEST(StoreSpecTest, ParsesTheSchemesAndRefusesOthersByName) {
  auto r = ParseStoreSpec("rocksdb:/var/lib/kvmem");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, StoreSpec::Kind::kRocksDb);
  EXPECT_EQ(r->location, "/var/lib/kvmem");
  EXPECT_TRUE(r->durable());
  EXPECT_EQ(r->ToString(), "rocksdb:/var/lib/kvmem");
  auto m = ParseStoreSpec("memory:");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->durable());
  EXPECT_EQ(m->ToString(), "memory:");
  auto rados = ParseStoreSpec("rados:kvmem");
  ASSERT_TRUE(rados.ok()) << rados.status();
  EXPECT_EQ(rados->kind, StoreSpec::Kind::kRados);
  EXPECT_EQ(rados->location, "kvmem");
  EXPECT_TRUE(rados->durable());
  EXPECT_EQ(rados->ToString(), "rados:kvmem");
  for (const char* bad : {"", "rocksdb:", "/var/lib/kvmem", "memory:x",
                          "rados:", "s3:bucket", "RocksDB:/x"}) {
    auto b = ParseStoreSpec(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find(bad), std::string::npos) << b.status();
  }
  EXPECT_NE(ParseStoreSpec("s3:bucket")
                .status()
                .message()
                .find("rocksdb:DIR, rados:POOL or memory:"),
            std::string::npos);
}

#endif  // !KVMEM_CONFORMANCE_RADOS

}  // namespace
}  // namespace kvmem

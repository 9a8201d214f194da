#include "storage/rocks_cold_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "storage/rocks_store.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

absl::StatusOr<std::unique_ptr<ColdStore>> Open(const std::string& dir) {
  RocksColdStoreOptions o;
  o.path = dir + "/db";
  return OpenRocksColdStore(o);
}

std::vector<std::pair<uint64_t, std::string>> Blocks(ColdStore& s,
                                                     const std::string& id) {
  std::vector<std::pair<uint64_t, std::string>> out;
  EXPECT_TRUE(s.ScanBlocks(id, [&](uint64_t b, absl::string_view r) {
                 out.emplace_back(b, std::string(r));
                 return absl::OkStatus();
               }).ok());
  return out;
}

// Commits a block record with a stand-in into the store at o.path and
// reads it back; 0, or which step failed.
int CommitWithStandIn(const RocksColdStoreOptions& o, const std::string& record,
                      std::unique_ptr<ColdStore>* out) {
  auto store = OpenRocksColdStore(o);
  if (!store.ok()) return 2;
  StreamWrite w;
  w.stream_id = "s";
  w.state = "state";
  w.blocks = {{0, record}};
  w.block_stand_ins = {{0, "stand-in"}};
  if (!(*store)->Commit(w).ok()) return 3;
  auto now = Blocks(**store, "s");
  if (now.size() != 1 || now[0].second != record) return 4;
  *out = *std::move(store);
  return 0;
}

// A record with a stand-in (StreamWrite::block_stand_ins) is read back whole
// while the store is open and after a clean close (the close logs it);
// a crash (a child process that ends without closing the store: its WAL is
// in the page cache, its memtables are gone) leaves the logged stand-in,
// unless log_token_groups logs the record itself.
TEST(RocksColdStoreTest, ACrashLeavesTheStandInOfARecordWrittenOutsideTheWal) {
  const std::string record(300 * 1024, 'r');  // A blob, as a 7B record.
  for (const bool logged : {false, true}) {
    for (const bool crash : {false, true}) {
      testing::TempDir dir;
      RocksColdStoreOptions o;
      o.path = dir.path() + "/db";
      o.log_token_groups = logged;
      if (crash) {
        // The child waits for no background thread (a forked process has
        // none of its parent's): it writes and ends.
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
          std::unique_ptr<ColdStore> store;
          ::_exit(CommitWithStandIn(o, record, &store));
        }
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 0) << "logged " << logged;
      } else {
        std::unique_ptr<ColdStore> store;
        ASSERT_EQ(CommitWithStandIn(o, record, &store), 0);
      }
      auto store = OpenRocksColdStore(o);
      ASSERT_TRUE(store.ok()) << store.status();
      auto blocks = Blocks(**store, "s");
      ASSERT_EQ(blocks.size(), 1u);
      EXPECT_EQ(blocks[0].second, crash && !logged ? "stand-in" : record)
          << "logged " << logged << ", crash " << crash;
    }
  }
}

TEST(RocksColdStoreTest, CommitsAtomicallyAndSurvivesReopen) {
  testing::TempDir dir;
  const std::string big(300 * 1024, 'k');  // Goes to a blob file.
  {
    auto store = Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    StreamWrite w;
    w.stream_id = "cam";
    w.config = "cfg";
    w.state = "s0";
    ASSERT_TRUE((*store)->Commit(w).ok());
    for (uint64_t f = 0; f < 3; ++f) {
      StreamWrite fw;
      fw.stream_id = "cam";
      const std::string payload = big + std::to_string(f);
      fw.frame.emplace(f, payload);
      fw.state = "s" + std::to_string(f + 1);
      if (f == 1) fw.blocks.emplace_back(0, "block0");
      ASSERT_TRUE((*store)->Commit(fw).ok());
    }
    // A stream whose id is a prefix of another must not see its records.
    StreamWrite other;
    other.stream_id = "cam2";
    other.config = "cfg2";
    other.blocks.emplace_back(0, "other");
    ASSERT_TRUE((*store)->Commit(other).ok());
  }
  auto store = Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto list = (*store)->ListStreams();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].stream_id, "cam");
  EXPECT_EQ((*list)[0].config, "cfg");
  EXPECT_EQ((*list)[0].state, "s3");
  EXPECT_EQ((*list)[1].stream_id, "cam2");
  auto f2 = (*store)->GetFrame("cam", 2);
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(*f2, big + "2");
  EXPECT_EQ((*store)->GetFrame("cam", 3).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Blocks(**store, "cam"),
            (std::vector<std::pair<uint64_t, std::string>>{{0, "block0"}}));
  EXPECT_GT((*store)->ApproximatePayloadBytes(), 0u);

  ASSERT_TRUE((*store)->DeleteStream("cam").ok());
  EXPECT_EQ((*store)->GetFrame("cam", 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(Blocks(**store, "cam").empty());
  list = (*store)->ListStreams();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ(Blocks(**store, "cam2").size(), 1u);
}

// Every WAL policy commits and reads back across a reopen (what differs,
// power loss, cannot be staged here; kill -9 is the crash test's).
TEST(RocksColdStoreTest, EveryWalSyncPolicyCommitsAndReopens) {
  for (const char* name : {"commit", "interval", "off"}) {
    testing::TempDir dir;
    RocksColdStoreOptions o;
    o.path = dir.path() + "/db";
    ASSERT_TRUE(ParseWalSync(name, &o.wal_sync)) << name;
    EXPECT_EQ(std::string(WalSyncName(o.wal_sync)), name);
    o.wal_sync_interval_ms = 5;
    for (uint64_t f = 0; f < 2; ++f) {
      auto store = OpenRocksColdStore(o);
      ASSERT_TRUE(store.ok()) << store.status();
      StreamWrite w;
      w.stream_id = "cam";
      const std::string payload(5000, static_cast<char>('a' + f));
      w.frame.emplace(f, payload);  // A view: payload outlives the Commit.
      ASSERT_TRUE((*store)->Commit(w).ok());
      // Let the interval policy's thread sync at least once.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (uint64_t g = 0; g <= f; ++g) {
        auto got = (*store)->GetFrame("cam", g);
        ASSERT_TRUE(got.ok()) << name << " frame " << g << got.status();
        EXPECT_EQ(*got, std::string(5000, static_cast<char>('a' + g)));
      }
    }
  }
  WalSync w;
  EXPECT_FALSE(ParseWalSync("sometimes", &w));
  RocksColdStoreOptions o;
  testing::TempDir dir;
  o.path = dir.path() + "/db";
  o.wal_sync_interval_ms = 0;
  auto bad = OpenRocksColdStore(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("wal_sync_interval_ms is 0"),
            std::string::npos);
}

// The blob files under dir by name, and their bytes (files RocksDB deletes
// meanwhile count as gone).
std::map<std::string, uint64_t> BlobFiles(const std::string& dir) {
  std::map<std::string, uint64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".blob") continue;
    const uint64_t size = std::filesystem::file_size(e.path(), ec);
    if (!ec) out[e.path().filename().string()] = size;
  }
  return out;
}

// The bytes of the files of `of` still under dir.
uint64_t BytesLeft(const std::string& dir,
                   const std::map<std::string, uint64_t>& of) {
  uint64_t n = 0;
  for (const auto& [name, size] : BlobFiles(dir)) {
    if (of.count(name) > 0) n += size;
  }
  return n;
}

// Blob garbage collection relocates live blobs only once a column family's
// blob files are mostly garbage: appends alone, compactions and all,
// relocate nothing (always on, each compaction rewrote the oldest quarter
// of the files' live blobs); deleting the stream that held two thirds of
// every file turns it on, its files go, the other stream's frames stay
// intact; and it turns off again once the garbage is gone.
TEST(RocksColdStoreTest, BlobsAreRelocatedOnlyOnceGarbagePaysForIt) {
  testing::TempDir dir;
  RocksColdStoreOptions o;
  o.path = dir.path() + "/db";
  o.write_buffer_bytes = 1 << 20;  // A flush, and a blob file, per ~1 MiB.
  auto opened = OpenRocksColdStore(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto* store = dynamic_cast<RocksColdStore*>(opened->get());
  ASSERT_NE(store, nullptr);
  auto frame = [](const std::string& id, uint64_t f) {
    return std::string(64 << 10, static_cast<char>('a' + (f * 7 + id[0]) % 26));
  };
  auto put = [&](const std::string& id, uint64_t f) {
    const std::string payload = frame(id, f);
    StreamWrite w;
    w.stream_id = id;
    w.frame.emplace(f, payload);
    return store->Commit(w);
  };
  // Frames of "a" and "c" interleaved, two of a's for one of c's: every
  // blob file holds both.
  for (uint64_t f = 0; f < 120; ++f) {
    ASSERT_TRUE(put("a", 2 * f).ok());
    ASSERT_TRUE(put("a", 2 * f + 1).ok());
    ASSERT_TRUE(put("c", f).ok());
  }
  const std::map<std::string, uint64_t> old_files = BlobFiles(o.path);
  uint64_t before = 0;
  for (const auto& [name, size] : old_files) before += size;
  EXPECT_GT(before, 16u << 20);
  EXPECT_FALSE(store->blob_gc_on());
  EXPECT_EQ(store->relocated_blob_bytes(), 0u);

  ASSERT_TRUE(store->DeleteStream("a").ok());
  // Cameras "b" and "d" append (the checks ride on commits). Two checks a
  // second apart see two thirds of the blob bytes garbage: collection turns
  // on, and the compactions of b's and d's frames, whose keys span c's,
  // relocate c's blobs out of the shared files, which then go with a's
  // frames.
  uint64_t next = 120, now = before;
  for (int i = 0; i < 100 && now > before / 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(put("b", next).ok());
    ASSERT_TRUE(put("d", next++).ok());
    now = BytesLeft(o.path, old_files);
  }
  EXPECT_LE(now, before / 2) << "the shared blob files did not go";
  const uint64_t relocated = store->relocated_blob_bytes();
  EXPECT_GT(relocated, 0u);
  // About what the live streams hold (relocation copies live blobs).
  EXPECT_LT(relocated, (120 + 2 * next) * (64u << 10) * 3 / 2);
  for (uint64_t f = 0; f < 120; ++f) {
    auto got = store->GetFrame("c", f);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == frame("c", f)) << "frame " << f;
  }
  // The garbage gone, collection turns off again.
  bool off = false;
  for (int i = 0; i < 40 && !off; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(put("b", next).ok());
    ASSERT_TRUE(put("d", next++).ok());
    off = !store->blob_gc_on();
  }
  EXPECT_TRUE(off);
}

TEST(RocksColdStoreTest, ScanStopsOnCallbackError) {
  testing::TempDir dir;
  auto store = Open(dir.path());
  ASSERT_TRUE(store.ok());
  StreamWrite w;
  w.stream_id = "s";
  for (uint64_t b = 0; b < 5; ++b) w.blocks.emplace_back(b, "x");
  ASSERT_TRUE((*store)->Commit(w).ok());
  int seen = 0;
  absl::Status s = (*store)->ScanBlocks("s", [&](uint64_t, absl::string_view) {
    return ++seen == 2 ? absl::DataLossError("stop") : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(seen, 2);
}

TEST(RocksColdStoreTest, UnusablePathIsAnError) {
  RocksColdStoreOptions o;
  o.path = "/proc/kvmem-cannot-create";
  EXPECT_FALSE(OpenRocksColdStore(o).ok());
}

// Layer records carry kvmem's CRC32C trailer and are read with RocksDB's
// check off: records come back exactly as written, records written without
// the trailer (older stores) still read, and a damaged blob file gives
// DATA_LOSS, never wrong bytes.
std::string LayerBytes(uint64_t b, uint32_t l) {
  std::string s(256 * 1024, '\0');
  std::mt19937_64 rng(b * 100 + l);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

constexpr uint64_t kPartBytes = 100000;

void WriteLayers(const std::string& path, bool checksums, uint64_t blocks) {
  RocksColdStoreOptions o;
  o.path = path;
  o.write_buffer_bytes = 1 << 20;  // Flushes: the records reach blob files.
  o.layer_checksums = checksums;
  auto store = OpenRocksColdStore(o);
  ASSERT_TRUE(store.ok()) << store.status();
  for (uint64_t b = 0; b < blocks; ++b) {
    StreamWrite w;
    w.stream_id = "cam";
    for (uint32_t l = 0; l < 4; ++l) {
      w.block_layers.push_back({b, l, LayerBytes(b, l)});
    }
    const std::string frame = LayerBytes(b, 99);  // Frame b.
    w.frame.emplace(b, frame);
    ASSERT_TRUE((*store)->Commit(w).ok());
    // Frame 100 + b in parts of 100,000 bytes (three, the last shorter).
    StreamWrite parted;
    parted.stream_id = "cam";
    const std::string bytes = LayerBytes(b, 98);
    parted.frame.emplace(100 + b, bytes);
    parted.frame_part_bytes = kPartBytes;
    ASSERT_TRUE((*store)->Commit(parted).ok());
  }
}

TEST(RocksColdStoreTest, LayerRecordsAndFramesCarryTheirOwnChecksum) {
  for (bool written_with_trailer : {true, false}) {
    for (bool rocksdb_check : {false, true}) {
      testing::TempDir dir;
      WriteLayers(dir.path() + "/db", written_with_trailer, 6);
      RocksColdStoreOptions o;
      o.path = dir.path() + "/db";
      o.verify_layers_with_rocksdb = rocksdb_check;
      auto store = OpenRocksColdStore(o);
      ASSERT_TRUE(store.ok()) << store.status();
      for (uint64_t b = 0; b < 6; ++b) {
        for (uint32_t l = 0; l < 4; ++l) {
          auto got = (*store)->GetBlockLayer("cam", b, l);
          ASSERT_TRUE(got.ok()) << got.status();
          ASSERT_EQ(*got, LayerBytes(b, l))
              << written_with_trailer << rocksdb_check << b << l;
        }
        // The batched read gives the same bytes.
        const std::vector<uint32_t> order = {3, 0, 2, 1};
        auto all = (*store)->GetBlockLayers("cam", b, order);
        ASSERT_TRUE(all.ok()) << all.status();
        ASSERT_EQ(all->size(), order.size());
        for (size_t i = 0; i < order.size(); ++i) {
          ASSERT_EQ((*all)[i], LayerBytes(b, order[i]))
              << written_with_trailer << rocksdb_check << b << " batched " << i;
        }
        auto frame = (*store)->GetFrame("cam", b);
        ASSERT_TRUE(frame.ok()) << frame.status();
        ASSERT_EQ(*frame, LayerBytes(b, 99))
            << written_with_trailer << rocksdb_check << " frame " << b;
        auto parted = (*store)->GetFrame("cam", 100 + b);
        ASSERT_TRUE(parted.ok()) << parted.status();
        ASSERT_EQ(*parted, LayerBytes(b, 98)) << "parted frame " << b;
        auto parts = (*store)->GetFrameParts("cam", kPartBytes,
                                             {{100 + b, 2}, {100 + b, 0}});
        ASSERT_TRUE(parts.ok()) << parts.status();
        ASSERT_EQ(parts->at(0), LayerBytes(b, 98).substr(2 * kPartBytes));
        ASSERT_EQ(parts->at(1), LayerBytes(b, 98).substr(0, kPartBytes));
      }
      auto frames = (*store)->GetFrames("cam", 1, 4);
      ASSERT_TRUE(frames.ok()) << frames.status();
      ASSERT_EQ(frames->size(), 4u);
      for (uint64_t f = 1; f <= 4; ++f) {
        ASSERT_EQ((*frames)[f - 1], LayerBytes(f, 99)) << "frames " << f;
      }
    }
  }
}

TEST(RocksColdStoreTest, DamagedLayerRecordsAreDataLossNeverWrongBytes) {
  testing::TempDir dir;
  WriteLayers(dir.path() + "/db", true, 6);
  int blob_files = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(dir.path() + "/db")) {
    if (e.path().extension() != ".blob") continue;
    // 16 bytes at a third, a half and two thirds of the file: inside
    // records' values (the middle alone may fall on a record's header).
    const auto size = std::filesystem::file_size(e.path());
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (int k : {2, 3, 4}) {
      f.seekp(static_cast<std::streamoff>(size * k / 6));
      f.write(std::string(16, '\x5a').data(), 16);
    }
    ++blob_files;
  }
  ASSERT_GT(blob_files, 0);
  auto store = Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  int lost = 0;
  for (uint64_t b = 0; b < 6; ++b) {
    for (uint32_t l = 0; l < 4; ++l) {
      auto got = (*store)->GetBlockLayer("cam", b, l);
      if (!got.ok()) {
        EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss)
            << got.status();
        ++lost;
        continue;
      }
      EXPECT_EQ(*got, LayerBytes(b, l)) << "block " << b << " layer " << l;
    }
    // The batched read: DATA_LOSS where a layer is lost, else the bytes.
    auto all = (*store)->GetBlockLayers("cam", b, {0, 1, 2, 3});
    if (!all.ok()) {
      EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss)
          << all.status();
      continue;
    }
    for (uint32_t l = 0; l < 4; ++l) {
      EXPECT_EQ((*all)[l], LayerBytes(b, l)) << "batched block " << b;
    }
    auto frame = (*store)->GetFrame("cam", b);
    if (!frame.ok()) {
      EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss)
          << frame.status();
      ++lost;
      continue;
    }
    EXPECT_EQ(*frame, LayerBytes(b, 99)) << "frame " << b;
    // A frame in parts: each part checks alone.
    for (uint32_t p = 0; p < 3; ++p) {
      auto part = (*store)->GetFrameParts("cam", kPartBytes, {{100 + b, p}});
      if (!part.ok()) {
        EXPECT_EQ(part.status().code(), absl::StatusCode::kDataLoss)
            << part.status();
        ++lost;
        continue;
      }
      EXPECT_EQ(part->at(0),
                LayerBytes(b, 98).substr(p * kPartBytes, kPartBytes))
          << "part " << p << " of frame " << 100 + b;
    }
  }
  EXPECT_GE(lost, 1);
}

}  // namespace
}  // namespace kvmem

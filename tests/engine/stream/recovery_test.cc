// Recovery against the acknowledgement record, on a real RocksDB: a WAL
// that loses acknowledged commits (bytes flipped in its middle, truncated to
// half, damage in a log a flush passed) never passes silently:
// the streams that lost frames are quarantined with DATA_LOSS (salvage) or
// the engine refuses to open (strict); streams a config this build refuses
// are quarantined and deletable; a clean restart or a deletion raises
// nothing.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/codec/record_codec.h"
#include "engine/memory_engine.h"
#include "engine/stream_config.h"
#include "gtest/gtest.h"
#include "storage/rocks_cold_store.h"
#include "tests/engine_fixture.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

namespace fs = std::filesystem;

struct Opened {
  absl::StatusOr<std::unique_ptr<MemoryEngine>> engine;
  std::vector<std::string> errors;
};

// write_buffer_bytes: the default keeps everything in the WAL.
std::unique_ptr<Opened> Open(const std::string& dir, bool strict,
                             uint64_t write_buffer_bytes = 32 << 20) {
  auto out = std::make_unique<Opened>();
  RocksColdStoreOptions o;
  o.path = dir + "/db";
  o.write_buffer_bytes = write_buffer_bytes;
  o.strict_wal = strict;
  auto store = OpenRocksColdStore(o);
  if (!store.ok()) {
    out->engine = store.status();
    return out;
  }
  EngineOptions e;
  e.strict_recovery = strict;
  e.acknowledge_interval_ms = 0;  // The test records explicitly.
  std::vector<std::string>* errors = &out->errors;
  e.error = [errors](const std::string& m) { errors->push_back(m); };
  out->engine = MemoryEngine::Open(*std::move(store), e);
  return out;
}

// Opens stream `id` with the test config and appends n random frames from
// rng, then records the acknowledgement.
void AppendStream(MemoryEngine& e, const std::string& id, uint64_t n,
                  std::mt19937_64& rng) {
  const testing::TestGeometry g;
  ASSERT_TRUE(e.OpenStream(id, testing::TestConfig(g, 16, 4)).ok());
  for (uint64_t i = 0; i < n; ++i) {
    const testing::FloatFrame f = testing::RandomFrame(rng, g, 8);
    ASSERT_TRUE(e.Append(id, testing::FrameOf(f, i, g.dtype)).ok());
  }
  ASSERT_TRUE(e.RecordAcknowledged().ok());
}

// Streams a (60 frames), b (opened, 20 frames), recorded, engine closed.
// Returns the acknowledged frames per stream.
std::map<std::string, uint64_t> Fill(const std::string& dir,
                                     uint64_t write_buffer_bytes = 32 << 20) {
  auto o = Open(dir, false, write_buffer_bytes);
  EXPECT_TRUE(o->engine.ok()) << o->engine.status();
  std::mt19937_64 rng(1);
  std::map<std::string, uint64_t> acked = {{"a", 60}, {"b", 20}};
  for (const auto& [id, n] : acked) AppendStream(**o->engine, id, n, rng);
  return acked;
}

// Every stream the engine serves has all its acknowledged frames; every
// other acknowledged stream is quarantined with DATA_LOSS and reported.
// Returns the number quarantined.
size_t CheckNothingSilent(Opened& o,
                          const std::map<std::string, uint64_t>& acked) {
  MemoryEngine& e = **o.engine;
  std::map<std::string, absl::Status> q;
  for (const QuarantinedStream& s : e.Quarantined()) q[s.stream_id] = s.reason;
  for (const auto& [id, n] : acked) {
    auto st = e.GetStats(id);
    if (st.ok()) {
      EXPECT_EQ(st->last_durable_frame + 1, static_cast<int64_t>(n)) << id;
      EXPECT_EQ(q.count(id), 0u) << id;
      continue;
    }
    EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss) << st.status();
    EXPECT_NE(st.status().message().find("quarantined"), std::string::npos);
    if (q.count(id) != 1) {
      ADD_FAILURE() << id << " answers DATA_LOSS but is not listed";
      return q.size();
    }
    EXPECT_EQ(q[id].code(), absl::StatusCode::kDataLoss);
    const std::string quoted = "\"" + id + "\"";
    EXPECT_TRUE(std::any_of(o.errors.begin(), o.errors.end(),
                            [&quoted](const std::string& m) {
                              return m.find(quoted) != std::string::npos;
                            }))
        << id << " lost frames without an error naming it";
    // Recall answers the same; DeleteStream removes it for good.
    RecallQuery rq;
    rq.query.assign(64, 0.5f);
    EXPECT_EQ(e.Recall(id, rq).status().code(), absl::StatusCode::kDataLoss);
  }
  return q.size();
}

TEST(RecoveryTest, CleanRestartAndDeletionRaiseNothing) {
  testing::TempDir dir;
  const auto acked = Fill(dir.path());
  {
    auto o = Open(dir.path(), /*strict=*/true);
    ASSERT_TRUE(o->engine.ok()) << o->engine.status();
    EXPECT_EQ(CheckNothingSilent(*o, acked), 0u);
    EXPECT_TRUE(o->errors.empty());
    ASSERT_TRUE((*o->engine)->DeleteStream("b").ok());
  }
  auto o = Open(dir.path(), /*strict=*/true);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  EXPECT_TRUE((*o->engine)->Quarantined().empty());
  EXPECT_EQ((*o->engine)->GetStats("b").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RecoveryTest, FlippedWalBytesAreReportedNeverSilent) {
  testing::TempDir dir;
  const auto acked = Fill(dir.path());
  const std::string wal = testing::NewestWal(dir.path() + "/db");
  ASSERT_FALSE(wal.empty());
  testing::FlipMiddleBytes(wal);
  // strict: RocksDB itself refuses a corrupt record that is not the tail.
  {
    auto o = Open(dir.path(), /*strict=*/true);
    ASSERT_FALSE(o->engine.ok());
    EXPECT_EQ(o->engine.status().code(), absl::StatusCode::kDataLoss)
        << o->engine.status();
  }
  // salvage: starts, and the streams that lost frames say so.
  auto o = Open(dir.path(), /*strict=*/false);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  EXPECT_GE(CheckNothingSilent(*o, acked), 1u);
  // The loss stays reported across restarts until the stream is deleted.
  o.reset();
  o = Open(dir.path(), false);
  ASSERT_TRUE(o->engine.ok());
  const size_t lost = CheckNothingSilent(*o, acked);
  EXPECT_GE(lost, 1u);
  for (const QuarantinedStream& q : (*o->engine)->Quarantined()) {
    ASSERT_TRUE((*o->engine)->DeleteStream(q.stream_id).ok());
  }
  o.reset();
  o = Open(dir.path(), /*strict=*/true);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  EXPECT_TRUE((*o->engine)->Quarantined().empty());
}

// Memtables of 64 KiB: a (60 frames), b (20) and c (8) stream in one run;
// the frames' column family flushes several times while the others' records
// stay in older logs. Damage in the oldest log: point-in-time recovery
// refuses such a store ("SST file is ahead of WALs in CF payloads"), so
// salvage replays the logs up to the damage itself (OpenDbUpToDamage) and
// starts, every loss reported; what is written after it survives the next
// restart (the damaged logs were flushed away, not replayed again).
TEST(RecoveryTest, DamageInALogAFlushPassedIsReportedNeverSilent) {
  testing::TempDir dir;
  const uint64_t small = 64 << 10;
  std::map<std::string, uint64_t> acked = {{"a", 60}, {"b", 20}, {"c", 8}};
  std::mt19937_64 rng(2);
  {
    auto o = Open(dir.path(), false, small);
    ASSERT_TRUE(o->engine.ok()) << o->engine.status();
    for (const auto& [id, n] : acked) {
      ASSERT_NO_FATAL_FAILURE(AppendStream(**o->engine, id, n, rng));
    }
  }
  const std::vector<std::string> wals = testing::Wals(dir.path() + "/db");
  ASSERT_GE(wals.size(), 2u) << "one log: the case is not exercised";
  testing::FlipMiddleBytes(wals.front());
  {
    auto o = Open(dir.path(), /*strict=*/true, small);
    ASSERT_FALSE(o->engine.ok());
    EXPECT_EQ(o->engine.status().code(), absl::StatusCode::kDataLoss)
        << o->engine.status();
  }
  size_t lost = 0;
  {
    auto o = Open(dir.path(), /*strict=*/false, small);
    ASSERT_TRUE(o->engine.ok()) << o->engine.status();
    lost = CheckNothingSilent(*o, acked);
    EXPECT_GE(lost, 1u);
    EXPECT_NE(testing::ReadFile(dir.path() + "/db/LOG")
                  .find("kvmem: a write-ahead log is damaged"),
              std::string::npos)
        << "the replay up to the damage did not run";
    ASSERT_NO_FATAL_FAILURE(AppendStream(**o->engine, "d", 2, rng));
    acked["d"] = 2;
  }
  EXPECT_EQ(testing::Wals(dir.path() + "/db").size(), 1u);
  auto o = Open(dir.path(), /*strict=*/false, small);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  EXPECT_EQ(CheckNothingSilent(*o, acked), lost);
  EXPECT_TRUE((*o->engine)->GetStats("d").ok());
}

// Memtables of 64 KiB: a and b stream (the frames' column family flushes
// several times), the engine closes, c streams 2 frames in a second run
// (no flush). The second run's open flushes what it replayed, so none of
// the first run's logs is left: when the first run's last log held only
// the acknowledgement marker, the other column families started the second
// run at its new log, and damage in the first run's log made RocksDB's
// point-in-time recovery refuse the store ("SST file is ahead of WALs in CF
// streams"). Damage in the oldest log then opens in salvage mode with every
// loss reported.
TEST(RecoveryTest, TheOpenRetiresTheLastRunsLogs) {
  testing::TempDir dir;
  const uint64_t small = 64 << 10;
  auto acked = Fill(dir.path(), small);
  const std::vector<std::string> first_run = testing::Wals(dir.path() + "/db");
  ASSERT_FALSE(first_run.empty());
  {
    auto o = Open(dir.path(), false, small);
    ASSERT_TRUE(o->engine.ok()) << o->engine.status();
    std::mt19937_64 rng(2);
    ASSERT_NO_FATAL_FAILURE(AppendStream(**o->engine, "c", 2, rng));
    acked["c"] = 2;
  }
  for (const std::string& w : first_run) {
    EXPECT_FALSE(fs::exists(w)) << w << " outlived the next run's open";
  }
  const std::vector<std::string> wals = testing::Wals(dir.path() + "/db");
  ASSERT_FALSE(wals.empty());
  testing::FlipMiddleBytes(wals.front());
  auto o = Open(dir.path(), /*strict=*/false, small);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  EXPECT_GE(CheckNothingSilent(*o, acked), 1u);
}

TEST(RecoveryTest, TruncatedWalIsReportedInBothModes) {
  testing::TempDir dir;
  const auto acked = Fill(dir.path());
  const std::string wal = testing::NewestWal(dir.path() + "/db");
  ASSERT_FALSE(wal.empty());
  fs::resize_file(wal, fs::file_size(wal) / 2);
  // strict: RocksDB takes a cut tail as torn; the record shows the loss.
  {
    auto o = Open(dir.path(), /*strict=*/true);
    ASSERT_FALSE(o->engine.ok());
    EXPECT_EQ(o->engine.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(o->engine.status().message().find("strict recovery"),
              std::string::npos)
        << o->engine.status();
  }
  auto o = Open(dir.path(), /*strict=*/false);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  EXPECT_GE(CheckNothingSilent(*o, acked), 1u);
}

TEST(RecoveryTest, DamagedRecordIsReportedAndReplaced) {
  testing::TempDir dir;
  const auto acked = Fill(dir.path());
  {
    std::fstream f(dir.path() + "/db/KVMEM-ACKED",
                   std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(20);
    f.put('\x7f');
  }
  {
    auto o = Open(dir.path(), /*strict=*/true);
    ASSERT_FALSE(o->engine.ok());
    EXPECT_EQ(o->engine.status().code(), absl::StatusCode::kDataLoss);
  }
  {
    auto o = Open(dir.path(), /*strict=*/false);
    ASSERT_TRUE(o->engine.ok());
    ASSERT_EQ(o->errors.size(), 1u);
    EXPECT_NE(o->errors[0].find("cannot be verified"), std::string::npos)
        << o->errors[0];
    EXPECT_EQ(CheckNothingSilent(*o, acked), 0u);
  }
  // Rewritten at shutdown: the next start verifies again.
  auto o = Open(dir.path(), /*strict=*/true);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
}

// A stored config this build refuses (here: an NSG index, which FAISS
// accepts and then kills the process with SIGFPE at its first build) is
// quarantined with FAILED_PRECONDITION; the other streams serve; the
// stream can be deleted.
TEST(RecoveryTest, RefusedStoredConfigIsQuarantinedAndDeletable) {
  testing::TempDir dir;
  const auto acked = Fill(dir.path());
  {
    RocksColdStoreOptions so;
    so.path = dir.path() + "/db";
    auto store = OpenRocksColdStore(so);
    ASSERT_TRUE(store.ok());
    StreamConfig c =
        WithDefaults(testing::TestConfig(testing::TestGeometry(), 16, 4));
    c.index_factory = "NSG32,Flat";
    StreamWrite w;
    w.stream_id = "nsg";
    w.config = EncodeConfig(c);
    w.state = EncodeState(StreamState());
    ASSERT_TRUE((*store)->Commit(w).ok());
  }
  {
    auto o = Open(dir.path(), /*strict=*/true);
    ASSERT_FALSE(o->engine.ok());
    EXPECT_EQ(o->engine.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  auto o = Open(dir.path(), /*strict=*/false);
  ASSERT_TRUE(o->engine.ok()) << o->engine.status();
  MemoryEngine& e = **o->engine;
  EXPECT_EQ(CheckNothingSilent(*o, acked), 1u);  // "nsg" only.
  ASSERT_EQ(e.Quarantined().size(), 1u);
  const absl::Status s = e.GetStats("nsg").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("NSG32,Flat"), std::string::npos) << s;
  EXPECT_EQ(
      e.OpenStream("nsg", testing::TestConfig(testing::TestGeometry(), 16, 4))
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.DeleteStream("nsg").ok());
  EXPECT_EQ(e.GetStats("nsg").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      e.OpenStream("nsg", testing::TestConfig(testing::TestGeometry(), 16, 4))
          .ok());
}

}  // namespace
}  // namespace kvmem

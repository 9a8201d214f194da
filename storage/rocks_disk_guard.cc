// RocksColdStore (storage/rocks_store.h): the disk guard. A full disk must
// never reach RocksDB 7.8's write path twice (its build asserts when a
// failed WAL writer is used again), so writes are refused below the
// reserve and after a failed write, and the store reopens itself once
// space is back; and the WAL sync thread (WalSync::kInterval).
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rocksdb/convenience.h"
#include "storage/rocks_store.h"

namespace kvmem {

// Makes every WAL record written so far durable. Not DB::SyncWAL: in
// RocksDB 7.8 that syncs a WAL writer even after a write to it failed
// (disk full) and trips an assertion that Debian's build keeps
// (WritableFileWriter::AssertFalseAndGetStatusForPrevError); a synced
// write goes through the write queue, which refuses once the DB has a
// background error, and syncs every live WAL when it does run.
absl::Status RocksColdStore::SyncedMarker() {
  if (absl::Status g = WriteGate(/*freeing=*/true); !g.ok()) return g;
  kvmem::ReaderMutexLock lock(&db_mu_);
  KVMEM_STORE_OPEN_OR_RETURN();
  rocksdb::WriteOptions wo;
  wo.sync = true;
  rocksdb::WriteBatch batch;
  if (rocksdb::Status s = batch.Put(db_.handles[0], "kvmem-sync", "");
      !s.ok()) {
    return Written(s, "sync WAL");
  }
  return Written(DbWrite(wo, &batch), "sync WAL");
}

// Every write goes through here, into RocksDB's write queue (see
// kvmem::UninstrumentedCall for the ThreadSanitizer build). Callers hold
// db_mu_ and have checked the DB is open.
rocksdb::Status RocksColdStore::DbWrite(const rocksdb::WriteOptions& wo,
                                        rocksdb::WriteBatch* batch) {
  kvmem::UninstrumentedCall rocksdb_write_path;
  return db_.db->Write(wo, batch);
}

// A write that failed on I/O stops further writes until the reopen.
absl::Status RocksColdStore::Written(const rocksdb::Status& s,
                                     absl::string_view what) {
  if (!s.ok() && (s.IsNoSpace() || s.IsIOError())) {
    failed_.store(true);
    SetError(s.ToString());
  }
  if (s.IsNoSpace()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data dir ", options_.path, " is full (", what, ": ",
                     s.ToString(), "); writes resume by themselves ",
                     ResumeWhen(), "; reads keep working"));
  }
  return FromRocks(s, what);
}

namespace {

// The spare: a file of kSpareBytes in the data dir (held with fallocate, no
// bytes written). Free space is a threshold other writers ignore (RocksDB's
// own flushes past the reserve, other programs, a reserve of 0); the spare
// is room actually held. On a full disk a write that frees space (a
// deletion, the acknowledgement record before it) deletes the spare and so
// has room for its tombstones, a reopen's manifest and a new WAL; appends
// then need the spare's room on top of the reserve, and the spare is put
// back once both and a spare more are free.
constexpr uint64_t kSpareBytes = 8ull << 20;
constexpr char kSpareFile[] = "KVMEM-SPARE";

}  // namespace

bool RocksColdStore::TakeSpare() {
  kvmem::MutexLock lock(&spare_mu_);
  if (!spare_kept_.load()) return false;
  std::error_code ec;
  std::filesystem::remove(absl::StrCat(path_, "/", kSpareFile), ec);
  spare_kept_.store(false);
  return true;
}

void RocksColdStore::KeepSpare(uint64_t free) {
  kvmem::MutexLock lock(&spare_mu_);
  if (spare_kept_.load()) return;
  const std::string file = absl::StrCat(path_, "/", kSpareFile);
  std::error_code ec;
  if (std::filesystem::file_size(file, ec) == kSpareBytes && !ec) {
    spare_kept_.store(true);  // Kept by an earlier run.
    return;
  }
  if (free < reserve_ + 2 * kSpareBytes) return;
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const bool held = ::posix_fallocate(fd, 0, kSpareBytes) == 0;
  ::close(fd);
  if (!held) {
    std::filesystem::remove(file, ec);  // No half a spare.
    return;
  }
  spare_kept_.store(true);
}

uint64_t RocksColdStore::AppendFloor() const {
  return reserve_ + (spare_kept_.load() ? 0 : kSpareBytes);
}

// OK when a write may go to RocksDB now: the store is healthy and (unless
// the write frees space) the data dir has its reserve free, and the spare's
// room while the spare is given up. A write that frees space takes the
// spare when the disk is full (the store stopped on a failed write, or less
// than a spare free). A store that stopped (a failed write, a read-only
// open) is reopened once the space is back, at most once a second, or at
// once when the spare has just been taken. Otherwise RESOURCE_EXHAUSTED
// naming the data dir: nothing reaches RocksDB, whose 7.8 build asserts
// when a failed WAL writer is used again.
absl::Status RocksColdStore::WriteGate(bool freeing) {
  uint64_t free = FreeBytes(options_.path);
  bool stopped;
  {
    kvmem::ReaderMutexLock lock(&db_mu_);
    stopped = failed_.load() || db_.read_only || db_.db == nullptr;
  }
  const bool took_spare =
      freeing && (stopped || free < kSpareBytes) && TakeSpare();
  if (took_spare) free = FreeBytes(options_.path);
  if (stopped && free >= reserve_) {
    kvmem::MutexLock lock(&reopen_mu_);
    const absl::Time now = absl::Now();
    if (took_spare || now >= next_reopen_) {
      next_reopen_ = now + absl::Seconds(1);
      kvmem::MutexLock db_lock(&db_mu_);
      if (failed_.load() || db_.read_only || db_.db == nullptr) Reopen();
      stopped = failed_.load() || db_.read_only || db_.db == nullptr;
    }
  }
  if (stopped) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data dir ", options_.path, " stopped taking writes (", Error(), "); ",
        free, " bytes free: writes resume by themselves ", ResumeWhen(),
        "; reads keep working"));
  }
  const uint64_t floor = AppendFloor();
  if (!freeing && free < floor) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data dir ", options_.path, " has ", free,
        " bytes free, below its reserve of ", floor,
        floor > reserve_
            ? absl::StrCat(" (--disk_reserve_mib ", reserve_,
                           " bytes, plus the ", kSpareBytes,
                           "-byte spare given up when the disk was full)")
            : std::string(" (--disk_reserve_mib)"),
        ": appends are refused until space returns; reads keep working"));
  }
  if (!spare_kept_.load() && free >= reserve_ + 2 * kSpareBytes) {
    KeepSpare(free);
  }
  return absl::OkStatus();
}

// After a deletion's tombstones. DeleteFilesInRange drops the table files
// wholly inside the range, and the blob files only they referred to,
// without writing anything (tens of microseconds): on a full disk it is
// what brings space back. A compaction of the range then drops the rest
// (files shared with other streams, level 0, the memtable), but it writes
// (a flush of the two payload column families' memtables, the neighbours'
// keys), so only with room for those (the spare's room counts: this is
// what it is for); otherwise RocksDB's own compactions get to it later.
// Failures leave the deletion standing (it is in the WAL).
//
// The compaction takes 0.1-0.7 s on a node that ingests (kvmem bench's
// live cameras, 2026-12-06), and DeleteStream's caller held one of the
// server's workers for it while the next deletions waited their turn
// holding the others: the other cameras' appends stalled 0.4-0.7 s. So
// unless appends are refused for space (then the caller is freeing it and
// waits for what the compaction returns), it runs on the reclaimer thread,
// one range at a time in order; DeleteFilesInRange stays here, before any
// new write can land in the range (it would drop such a write's files; a
// compaction cannot, the tombstones are older than what it keeps).
void RocksColdStore::Reclaim(const std::string& begin, const std::string& end) {
  // Short of space as the caller found it (before this deletion's files go).
  const bool short_of_space = FreeBytes(options_.path) < AppendFloor();
  const rocksdb::Slice b(begin), e(end);
  for (auto* cf : {payloads_, block_layers_, frame_meta_, blocks_, streams_}) {
    rocksdb::DeleteFilesInRange(db_.db.get(), cf, &b, &e,
                                /*include_end=*/false)
        .PermitUncheckedError();
  }
  if (short_of_space) {
    CompactDeleted(begin, end);
    return;
  }
  kvmem::MutexLock lock(&reclaim_mu_);
  if (reclaim_stop_) return;
  reclaims_.emplace_back(begin, end);
  reclaims_queued_ += 1;
  if (!reclaimer_.joinable()) {
    reclaimer_ = std::thread([this] { ReclaimLoop(); });
  }
}

void RocksColdStore::CompactDeleted(const std::string& begin,
                                    const std::string& end) {
  if (FreeBytes(options_.path) <
      2 * options_.write_buffer_bytes + (1ull << 20)) {
    return;
  }
  const rocksdb::Slice b(begin), e(end);
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction =
      rocksdb::BottommostLevelCompaction::kForceOptimized;
  for (auto* cf : {payloads_, block_layers_, frame_meta_, blocks_, streams_}) {
    if (!db_.db->CompactRange(co, cf, &b, &e).ok()) return;
  }
  // The compaction counted the range's blobs as garbage: files shared with
  // other streams keep it until collection relocates their live blobs.
  TuneBlobGc();
}

void RocksColdStore::ReclaimLoop() {
  kvmem::MutexLock lock(&reclaim_mu_);
  for (;;) {
    reclaim_mu_.Await(kvmem::Condition(
        +[](RocksColdStore* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->reclaim_mu_) {
          return s->reclaim_stop_ || !s->reclaims_.empty();
        },
        this));
    if (reclaim_stop_) return;
    const std::pair<std::string, std::string> range =
        std::move(reclaims_.front());
    reclaims_.pop_front();
    reclaim_mu_.Unlock();
    {
      kvmem::ReaderMutexLock db_lock(&db_mu_);
      if (db_.db != nullptr && !db_.read_only) {
        CompactDeleted(range.first, range.second);
      }
    }
    reclaim_mu_.Lock();
    if (!reclaim_stop_) reclaims_done_ += 1;  // Not if told to stop in it.
  }
}

void RocksColdStore::StopReclaimer() {
  std::thread reclaimer;
  {
    kvmem::MutexLock lock(&reclaim_mu_);
    reclaim_stop_ = true;
    reclaims_.clear();
    reclaimer = std::move(reclaimer_);
  }
  if (!reclaimer.joinable()) return;
  kvmem::ReaderMutexLock lock(&db_mu_);
  if (db_.db == nullptr) {
    reclaimer.join();
    return;
  }
  // A compaction under way ends early (Status::Incomplete).
  db_.db->DisableManualCompaction();
  reclaimer.join();
  bool unfinished;
  {
    kvmem::MutexLock q(&reclaim_mu_);
    unfinished = reclaims_done_ < reclaims_queued_;
  }
  // The tombstones stand and RocksDB compacts the ranges later; the flush
  // each compaction would have started is done here, so the WAL records
  // the deletions superseded (a quarantined stream's damaged ones
  // included) are not read again at the next start.
  if (unfinished && !db_.read_only) {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    db_.db
        ->Flush(fo, {streams_, blocks_, payloads_, frame_meta_, block_layers_})
        .PermitUncheckedError();
  }
}

uint64_t RocksColdStore::reclaims_done() {
  kvmem::MutexLock lock(&reclaim_mu_);
  return reclaims_done_;
}

size_t RocksColdStore::reclaims_pending() {
  kvmem::MutexLock lock(&reclaim_mu_);
  // The one being compacted counts (it has left reclaims_ but is not done:
  // counting only the queue, a test that found done + pending 0 right after
  // a deletion failed when the reclaimer had just taken it). A stopped
  // reclaimer runs none.
  return reclaim_stop_ ? 0
                       : static_cast<size_t>(reclaims_queued_ - reclaims_done_);
}

std::string RocksColdStore::ResumeWhen() const {
  return reserve_ == 0 ? "when space is freed"
                       : absl::StrCat("once ", reserve_,
                                      " bytes are free (--disk_reserve_mib)");
}

// REQUIRES: db_mu_ exclusive.
void RocksColdStore::Reopen() {
  CloseDb();
  // Cleared before the open, so an error the new DB raises meanwhile
  // stays raised.
  failed_.store(false);
  Db next;
  // Plain point-in-time recovery, never the salvage replay: the engine's
  // streams were recovered against the database as it was, and a replay
  // that stopped at damage would drop acknowledged frames under them
  // unnoticed. Such damage keeps the store failed until a restart, whose
  // recovery salvages and reports the loss.
  rocksdb::Status s = OpenDb(options_, listener_, false, &next);
  if (!s.ok()) {
    SetError(s.ToString());
    s = OpenDb(options_, listener_, true, &next);
  }
  if (!s.ok()) {
    // Not even read-only: keep a closed store that answers errors.
    SetError(s.ToString());
    return;
  }
  db_ = std::move(next);
  Install();
}

// REQUIRES: db_mu_ exclusive (or no other user).
void RocksColdStore::CloseDb() {
  if (db_.db == nullptr) return;
  // No WAL sync here: after a failed write it is what asserts (above).
  // Records written outside the WAL and not flushed yet go to the WAL
  // (avoid_flush_during_shutdown, rocks_db.cc: nothing is flushed here).
  LogUnflushedRecords();
  CloseOpenDb(&db_);
  streams_ = blocks_ = payloads_ = frame_meta_ = block_layers_ = nullptr;
}

void RocksColdStore::SetError(std::string e) {
  kvmem::MutexLock lock(&error_mu_);
  last_error_ = std::move(e);
}

std::string RocksColdStore::Error() {
  kvmem::MutexLock lock(&error_mu_);
  return last_error_;
}

void RocksColdStore::Install() {
  streams_ = db_.handles[1];
  blocks_ = db_.handles[2];
  payloads_ = db_.handles[3];
  frame_meta_ = db_.handles[4];
  block_layers_ = db_.handles[5];
  // A database opens with collection off (rocks_db.cc).
  for (auto& on : blob_gc_on_) on.store(false);
  for (auto& wanted : blob_gc_wanted_) wanted.store(false);
}

bool RocksColdStore::blob_gc_on() const {
  for (const auto& on : blob_gc_on_) {
    if (on.load()) return true;
  }
  return false;
}

void RocksColdStore::TuneBlobGc() {
  if (db_.db == nullptr || db_.read_only) return;
  const int64_t t = absl::GetCurrentTimeNanos();
  int64_t due = next_gc_tune_ns_.load(std::memory_order_relaxed);
  if (t < due || !next_gc_tune_ns_.compare_exchange_strong(
                     due, t + absl::ToInt64Nanoseconds(kBlobGcCheckEvery))) {
    return;
  }
  rocksdb::ColumnFamilyHandle* const cfs[] = {blocks_, payloads_,
                                              block_layers_};
  for (int i = 0; i < 3; ++i) {
    uint64_t bytes = 0, garbage = 0;
    if (!db_.db->GetIntProperty(cfs[i], "rocksdb.live-blob-file-size",
                                &bytes) ||
        !db_.db->GetIntProperty(cfs[i], "rocksdb.live-blob-file-garbage-size",
                                &garbage)) {
      continue;
    }
    const bool on = blob_gc_on_[i].load();
    const bool want = WantBlobGc(on, bytes, garbage);
    // On only when two checks in a row want it: streams deleted one after
    // another (their frames share blob files) would otherwise have the
    // next one's blobs relocated just before it goes too.
    const bool seen = blob_gc_wanted_[i].exchange(want);
    if (want == on || (want && !seen)) continue;
    // A mutable option; the compactions after it relocate (rocks_db.cc).
    if (db_.db
            ->SetOptions(cfs[i], {{"enable_blob_garbage_collection",
                                   want ? "true" : "false"}})
            .ok()) {
      blob_gc_on_[i].store(want);
    }
  }
}

// kInterval: fsyncs the WAL every interval until the store closes.
void RocksColdStore::SyncLoop() {
  const uint32_t interval_ms = options_.wal_sync_interval_ms;
  kvmem::MutexLock lock(&sync_mu_);
  while (!stopping_) {
    sync_mu_.AwaitWithTimeout(kvmem::Condition(&stopping_),
                              absl::Milliseconds(interval_ms));
    if (stopping_) break;
    sync_mu_.Unlock();
    // Fails only on I/O errors, which the next Commit reports.
    SyncedMarker().IgnoreError();
    sync_mu_.Lock();
  }
}

}  // namespace kvmem

// RocksColdStore (storage/rocks_store.h): the disk guard. A full disk must
// never reach RocksDB 7.8's write path twice (its build asserts when a
// failed WAL writer is used again), so writes are refused below the
// reserve and after a failed write, and the store reopens itself once
// space is back; and the WAL sync thread (WalSync::kInterval).
#include <string>

#include "absl/strings/str_cat.h"
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

// OK when a write may go to RocksDB now: the store is healthy and (unless
// the write frees space) the data dir has its reserve free. A store that
// stopped (a failed write, a read-only open) is reopened once the space
// is back, at most once a second. Otherwise RESOURCE_EXHAUSTED naming the
// data dir: nothing reaches RocksDB, whose 7.8 build asserts when a
// failed WAL writer is used again.
absl::Status RocksColdStore::WriteGate(bool freeing) {
  const uint64_t free = FreeBytes(options_.path);
  bool stopped;
  {
    kvmem::ReaderMutexLock lock(&db_mu_);
    stopped = failed_.load() || db_.read_only || db_.db == nullptr;
  }
  if (stopped && free >= reserve_) {
    kvmem::MutexLock lock(&reopen_mu_);
    const absl::Time now = absl::Now();
    if (now >= next_reopen_) {
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
  if (!freeing && free < reserve_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data dir ", options_.path, " has ", free,
        " bytes free, below its reserve of ", reserve_,
        " (--disk_reserve_mib): appends are refused until space returns; "
        "reads keep working"));
  }
  return absl::OkStatus();
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
  for (auto* h : db_.handles) {
    db_.db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  db_.db->Close().PermitUncheckedError();
  db_.db.reset();
  db_.handles.clear();
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

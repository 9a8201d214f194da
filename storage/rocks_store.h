// RocksColdStore: the ColdStore on RocksDB (storage/rocks_cold_store.h has
// the layout and the durability contract), in three parts:
//   rocks_cold_store.cc  opening, reads and writes, the acknowledgement
//                        record;
//   rocks_disk_guard.cc  the disk guard: refusing writes below the
//                        reserve or after a failed write, reopening once
//                        space is back, and the WAL sync thread;
//   rocks_db.cc          the database's options and column families.
// Internal to storage/: the rest of kvmem sees only ColdStore.
//
// Thread safety: every public method is safe to call concurrently. Locks:
//   reopen_mu_  serialises reopen attempts (taken before db_mu_);
//   db_mu_      shared by every RocksDB call, exclusive for a reopen (which
//               replaces db_ and the column family handles);
//   error_mu_   a leaf: the last error's text, taken under either above;
//   ack_mu_     one writer of the acknowledgement record's file;
//   spare_mu_   a leaf: one creator or remover of the spare file;
//   sync_mu_    the WAL sync thread's stop flag;
//   reclaim_mu_ the reclaimer thread's queue of deleted ranges (taken
//               under db_mu_ by Reclaim, never held across a RocksDB call).
#ifndef KVMEM_STORAGE_ROCKS_STORE_H_
#define KVMEM_STORAGE_ROCKS_STORE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "storage/cold_store.h"
#include "storage/rocks_cold_store.h"
#include "storage/rocks_db.h"

namespace kvmem {

// In a RocksColdStore method holding db_mu_: the store's DB may be closed
// after a reopen that failed even read-only; answer instead of crashing.
#define KVMEM_STORE_OPEN_OR_RETURN()                                    \
  do {                                                                  \
    if (db_.db == nullptr) {                                            \
      return absl::UnavailableError(absl::StrCat(                       \
          "data dir ", options_.path,                                   \
          " is closed: RocksDB could not be "                           \
          "reopened (",                                                 \
          Error(), "); retried on the next write once space is free")); \
    }                                                                   \
  } while (false)

class RocksColdStore final : public ColdStore {
 public:
  // Opens read-write; on a disk too full to open read-write (RocksDB
  // replays the WAL into new files), read-only, so stored streams still
  // serve reads and appends resume once space returns.
  static absl::StatusOr<std::unique_ptr<ColdStore>> Open(
      const RocksColdStoreOptions& options);
  ~RocksColdStore() override;

  // ColdStore (storage/cold_store.h has the contracts).
  absl::Status Commit(const StreamWrite& write) override
      ABSL_LOCKS_EXCLUDED(db_mu_, reopen_mu_);
  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t frame_index) override
      ABSL_LOCKS_EXCLUDED(db_mu_);
  // Frames written in parts: each part's own Get (rocks_frame_parts.cc).
  absl::StatusOr<std::vector<std::string>> GetFrameParts(
      absl::string_view stream_id, uint64_t part_bytes,
      const std::vector<FramePart>& parts) override ABSL_LOCKS_EXCLUDED(db_mu_);
  absl::StatusOr<std::string> GetFrameMeta(absl::string_view stream_id,
                                           uint64_t frame_index) override
      ABSL_LOCKS_EXCLUDED(db_mu_);
  // GetBlockLayers: the default, one Get per layer. A MultiGet was
  // measured slower at 7B (its pinned values cost a copy more: cold reads
  // through shared memory 3.5 against 4.1 GB/s, medians of 5 alternating
  // runs of kvmem bench --fetch), and a local store has no round trip to
  // save.
  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override
      ABSL_LOCKS_EXCLUDED(db_mu_);
  // fn is called without db_mu_ (it may read the store).
  absl::Status ScanBlocks(
      absl::string_view stream_id,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      override ABSL_LOCKS_EXCLUDED(db_mu_);
  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override
      ABSL_LOCKS_EXCLUDED(db_mu_);
  absl::Status DeleteStream(absl::string_view stream_id) override
      ABSL_LOCKS_EXCLUDED(db_mu_, reopen_mu_);
  uint64_t ApproximatePayloadBytes() override ABSL_LOCKS_EXCLUDED(db_mu_);
  absl::Status RecordAcknowledged(const std::map<std::string, uint64_t>& frames)
      override ABSL_LOCKS_EXCLUDED(db_mu_, reopen_mu_, ack_mu_);
  absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() override;

  // Blob garbage collection (rocks_disk_guard.cc, rocks_db.h's WantBlobGc):
  // whether it is on for any blob column family, and the blob bytes
  // compactions have relocated since the store opened.
  bool blob_gc_on() const;
  uint64_t relocated_blob_bytes() const {
    return listener_->relocated_blob_bytes();
  }
  // Deleted streams' ranges compacted in the background (Reclaim), and
  // those waiting or being compacted: for tests and stats.
  uint64_t reclaims_done() ABSL_LOCKS_EXCLUDED(reclaim_mu_);
  size_t reclaims_pending() ABSL_LOCKS_EXCLUDED(reclaim_mu_);

 private:
  explicit RocksColdStore(const RocksColdStoreOptions& options);

  // A record written with a trailer (a layer record or a frame): read with
  // RocksDB's check off and checked by its trailer; one without a trailer
  // that checks is read again with RocksDB's check (older records, or
  // damaged ones: DATA_LOSS). what() names it in errors.
  absl::StatusOr<std::string> GetChecked(
      rocksdb::ColumnFamilyHandle* RocksColdStore::*cf, const std::string& key,
      const std::function<std::string()>& what) ABSL_LOCKS_EXCLUDED(db_mu_);
  // A frame written in parts, joined; NOT_FOUND when it has none.
  absl::StatusOr<std::string> GetPartedFrame(absl::string_view stream_id,
                                             uint64_t frame_index)
      ABSL_LOCKS_EXCLUDED(db_mu_);
  // cf names the handle member: read under the lock, a reopen replaces it.
  absl::StatusOr<std::string> Get(
      rocksdb::ColumnFamilyHandle* RocksColdStore::*cf, const std::string& key,
      const std::string& what, bool verify = true) ABSL_LOCKS_EXCLUDED(db_mu_);
  // The column family handles from db_'s.
  void Install() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // After a writable open: flushes what the open replayed from the last
  // run's logs, every column family, when the disk has room for it
  // (rocks_cold_store.cc says why).
  void FlushReplayed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  // Every write goes through here, into RocksDB's write queue (see
  // kvmem::UninstrumentedCall for the ThreadSanitizer build). Callers have
  // checked the DB is open.
  rocksdb::Status DbWrite(const rocksdb::WriteOptions& wo,
                          rocksdb::WriteBatch* batch)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);

  // --- The disk guard (rocks_disk_guard.cc). ---
  // Makes every WAL record written so far durable. Not DB::SyncWAL: in
  // RocksDB 7.8 that syncs a WAL writer even after a write to it failed
  // (disk full) and trips an assertion that Debian's build keeps
  // (WritableFileWriter::AssertFalseAndGetStatusForPrevError); a synced
  // write goes through the write queue, which refuses once the DB has a
  // background error, and syncs every live WAL when it does run.
  absl::Status SyncedMarker() ABSL_LOCKS_EXCLUDED(db_mu_, reopen_mu_);
  bool Low() const { return FreeBytes(options_.path) < reserve_; }
  // A write that failed on I/O stops further writes until the reopen.
  absl::Status Written(const rocksdb::Status& s, absl::string_view what);
  // OK when a write may go to RocksDB now: the store is healthy and (unless
  // the write frees space) the data dir has its reserve free. A store that
  // stopped (a failed write, a read-only open) is reopened once the space
  // is back, at most once a second. Otherwise RESOURCE_EXHAUSTED naming the
  // data dir: nothing reaches RocksDB, whose 7.8 build asserts when a
  // failed WAL writer is used again.
  absl::Status WriteGate(bool freeing) ABSL_LOCKS_EXCLUDED(db_mu_, reopen_mu_);
  std::string ResumeWhen() const;
  // The spare (rocks_disk_guard.cc): kSpareBytes held in a file of the data
  // dir and given up, on a full disk, to a write that frees space.
  // TakeSpare deletes it (true if it was there); KeepSpare puts it back
  // when the data dir (`free` bytes free) has the reserve and two spares.
  bool TakeSpare() ABSL_LOCKS_EXCLUDED(spare_mu_);
  void KeepSpare(uint64_t free) ABSL_LOCKS_EXCLUDED(spare_mu_);
  // Free bytes appends need: the reserve, plus the spare's room while the
  // spare is given up.
  uint64_t AppendFloor() const;
  // After a deletion's tombstones: drops the files wholly in [begin, end)
  // (no write needed) and compacts the range (CompactDeleted): here when
  // appends are refused for space, otherwise on the reclaimer thread.
  void Reclaim(const std::string& begin, const std::string& end)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_) ABSL_LOCKS_EXCLUDED(reclaim_mu_);
  // Compacts a deleted range, when there is room for the writes it makes.
  void CompactDeleted(const std::string& begin, const std::string& end)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // The reclaimer thread: deleted ranges' compactions, one at a time.
  void ReclaimLoop() ABSL_LOCKS_EXCLUDED(reclaim_mu_, db_mu_);
  // Stops the reclaimer (a compaction under way ends early; queued ranges
  // are left to RocksDB's own compactions, after a flush of the memtables
  // they would have flushed). Before the DB closes.
  void StopReclaimer() ABSL_LOCKS_EXCLUDED(reclaim_mu_, db_mu_);
  // Turns blob garbage collection on or off per blob column family by its
  // garbage (WantBlobGc; on after two checks in a row want it). Checks at
  // most every kBlobGcCheckEvery; called after each commit and deletion (a
  // store that writes nothing collects nothing).
  void TuneBlobGc() ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // The block records (id, full record) of a stream whose stand-ins
  // (StreamWrite::block_stand_ins) the commit just logged: outside the WAL,
  // so a crash before the memtable's flush leaves the stand-in
  // (RocksColdStoreOptions::log_token_groups). A failure here leaves the
  // stand-in too.
  void WriteUnlogged(
      absl::string_view stream_id,
      const std::vector<const std::pair<uint64_t, std::string>*>& records)
      ABSL_SHARED_LOCKS_REQUIRED(db_mu_);
  // At a clean close: the records WriteUnlogged wrote that no flush has
  // written yet go to the WAL, so a restart finds them whole without the
  // close flushing a column family (which would put its files ahead of a
  // WAL that salvage recovery may have to cut short).
  void LogUnflushedRecords() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  void Reopen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  void CloseDb() ABSL_EXCLUSIVE_LOCKS_REQUIRED(db_mu_);
  void SetError(std::string e) ABSL_LOCKS_EXCLUDED(error_mu_);
  std::string Error() ABSL_LOCKS_EXCLUDED(error_mu_);
  // kInterval: fsyncs the WAL every interval until the store closes.
  void SyncLoop() ABSL_LOCKS_EXCLUDED(sync_mu_);

  const RocksColdStoreOptions options_;
  const uint64_t reserve_;
  const std::string path_;
  // A write failed on I/O, or RocksDB raised a background error.
  std::atomic<bool> failed_{false};
  const std::shared_ptr<ErrorListener> listener_;
  // Per blob column family (blocks, payloads, block_layers): collection on.
  std::atomic<bool> blob_gc_on_[3] = {false, false, false};
  std::atomic<bool> blob_gc_wanted_[3] = {false, false, false};  // Last check.
  std::atomic<int64_t> next_gc_tune_ns_{0};
  kvmem::Mutex reopen_mu_ ABSL_ACQUIRED_BEFORE(db_mu_);
  absl::Time next_reopen_ ABSL_GUARDED_BY(reopen_mu_) = absl::InfinitePast();
  kvmem::Mutex db_mu_;
  Db db_ ABSL_GUARDED_BY(db_mu_);
  // Keys of block records written outside the WAL, each with a sequence
  // number at or after its write, until a flush of the blocks column family
  // passes it (ErrorListener::blocks_flushed_seq): at most a memtable's
  // worth of records.
  kvmem::Mutex unlogged_mu_;
  std::map<std::string, uint64_t> unlogged_ ABSL_GUARDED_BY(unlogged_mu_);
  rocksdb::ColumnFamilyHandle* streams_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* blocks_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* payloads_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* frame_meta_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  rocksdb::ColumnFamilyHandle* block_layers_ ABSL_GUARDED_BY(db_mu_) = nullptr;
  kvmem::Mutex error_mu_ ABSL_ACQUIRED_AFTER(db_mu_);
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  kvmem::Mutex ack_mu_;
  kvmem::Mutex spare_mu_;  // A leaf: one creator or remover of the spare.
  std::atomic<bool> spare_kept_{false};
  kvmem::Mutex sync_mu_;
  bool stopping_ ABSL_GUARDED_BY(sync_mu_) = false;
  std::thread syncer_;
  // Deleted ranges waiting for their compaction (Reclaim), the thread that
  // runs them (started by the first), and how many it has run.
  kvmem::Mutex reclaim_mu_ ABSL_ACQUIRED_AFTER(db_mu_);
  std::deque<std::pair<std::string, std::string>> reclaims_
      ABSL_GUARDED_BY(reclaim_mu_);
  bool reclaim_stop_ ABSL_GUARDED_BY(reclaim_mu_) = false;
  uint64_t reclaims_queued_ ABSL_GUARDED_BY(reclaim_mu_) = 0;
  uint64_t reclaims_done_ ABSL_GUARDED_BY(reclaim_mu_) = 0;
  std::thread reclaimer_ ABSL_GUARDED_BY(reclaim_mu_);
  rocksdb::WriteOptions write_options_;
};

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_STORE_H_

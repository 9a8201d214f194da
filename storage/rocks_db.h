// Opening the RocksDB store's database (storage/rocks_cold_store.h): its
// options and column families, a listener for RocksDB's background errors,
// an info log that a full disk cannot abort, and the disk's free space.
// Internal to storage/.
#ifndef KVMEM_STORAGE_ROCKS_DB_H_
#define KVMEM_STORAGE_ROCKS_DB_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rocksdb/db.h"
#include "rocksdb/listener.h"
#include "rocksdb/wal_filter.h"
#include "storage/rocks_cold_store.h"
#include "storage/rocks_keys.h"

namespace kvmem {

// RocksDB's status as absl's, the message prefixed with `what`.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what);

// Told of RocksDB's background errors (a WAL or flush write that hit a full
// disk): the store stops writing and recovers by reopening, never by
// RocksDB's own recovery, which in 7.8 can write through a failed WAL
// writer and abort. Also counts the blob bytes compactions wrote: blobs
// that blob garbage collection relocated (a compaction writes blob files
// for nothing else here: values reach blob files at their flush).
class ErrorListener final : public rocksdb::EventListener {
 public:
  explicit ErrorListener(std::atomic<bool>* failed) : failed_(failed) {}
  void OnBackgroundError(rocksdb::BackgroundErrorReason,
                         rocksdb::Status* error) override {
    if (error != nullptr && !error->ok()) failed_->store(true);
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
  void OnCompactionCompleted(rocksdb::DB*,
                             const rocksdb::CompactionJobInfo& ci) override {
    uint64_t bytes = 0;
    for (const auto& b : ci.blob_file_addition_infos) {
      bytes += b.total_blob_bytes;
    }
    relocated_blob_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  uint64_t relocated_blob_bytes() const {
    return relocated_blob_bytes_.load(std::memory_order_relaxed);
  }
  // The largest sequence number a flush of the block records' column
  // family has written to its files: every write to it at or below is on
  // disk (memtables flush in order).
  void OnFlushCompleted(rocksdb::DB*,
                        const rocksdb::FlushJobInfo& fi) override {
    if (fi.cf_name != kBlocksCf) return;
    uint64_t seen = blocks_flushed_seq_.load(std::memory_order_relaxed);
    while (fi.largest_seqno > seen &&
           !blocks_flushed_seq_.compare_exchange_weak(seen, fi.largest_seqno)) {
    }
  }
  uint64_t blocks_flushed_seq() const {
    return blocks_flushed_seq_.load(std::memory_order_acquire);
  }

 private:
  std::atomic<bool>* const failed_;
  std::atomic<uint64_t> relocated_blob_bytes_{0};
  std::atomic<uint64_t> blocks_flushed_seq_{0};
};

// Blob garbage collection (relocating a blob file's live blobs so the file
// can go) pays off only once the files hold enough garbage: always on, as
// RocksDB's option is, every compaction rewrote the live blobs of the
// oldest quarter of the blob files, and kvmem's frames are written once
// and deleted oldest first (files empty by themselves). On for a column
// family from this share of garbage in its blob files, off again below
// kBlobGcOffShare.
constexpr double kBlobGcOnShare = 0.5;
constexpr double kBlobGcOffShare = 0.2;
constexpr absl::Duration kBlobGcCheckEvery = absl::Seconds(1);
// Whether collection should be on, given whether it is and the column
// family's live blob bytes and garbage bytes (RocksDB's
// "rocksdb.live-blob-file-size" and "rocksdb.live-blob-file-garbage-size").
bool WantBlobGc(bool on, uint64_t blob_bytes, uint64_t garbage_bytes);

// An open database and its column family handles (default, streams,
// blocks, payloads, frame_meta, block_layers).
struct Db {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  bool read_only = false;
};

// Closes an open database: its handles, then the database (nothing is
// flushed: avoid_flush_during_shutdown).
void CloseOpenDb(Db* db);

// Flushes every column family of an open database and waits.
rocksdb::Status FlushEveryFamily(const Db& db);

// How an open replays the write-ahead logs: by default as the options say
// (point-in-time recovery, or strict); `filter`, when set, sees every
// record replayed; skip_damaged reads on past damaged records (the filter
// then decides where replay stops).
struct Replay {
  rocksdb::WalFilter* filter = nullptr;
  bool skip_damaged = false;
};

// Opens the store's RocksDB read-write, or read-only when asked, into *out.
rocksdb::Status OpenDb(const RocksColdStoreOptions& options,
                       std::shared_ptr<rocksdb::EventListener> listener,
                       bool read_only, Db* out, const Replay& replay = {});

// True for point-in-time recovery's refusal of a store in which a column
// family's files are newer than a damaged log record ("SST file is ahead of
// WALs"): the families flush one at a time, so the others' records can
// still be in older logs.
bool DamagedLogBehindFlush(const rocksdb::Status& s);

// Salvage's open after that refusal: replays exactly the records
// point-in-time recovery replays, up to the first damaged one (a first open
// lists them; the second reads past the damage and stops where the lists
// part), so every family not flushed past the damage holds the logs'
// prefix, as point-in-time recovery would give, and a family flushed past
// it keeps its files. Then flushes every family (the damaged logs become
// obsolete: left live, the next open would stop at the same damage, before
// everything written since) and opens the database again, plainly, into
// *out. A failed flush fails the open.
rocksdb::Status OpenDbUpToDamage(
    const RocksColdStoreOptions& options,
    std::shared_ptr<rocksdb::EventListener> listener, Db* out);

// The store's first read-write open: OpenDb, and under salvage recovery
// (not strict_wal) OpenDbUpToDamage when point-in-time recovery refuses for
// damage behind a flush (the engine's recovery then reports the loss). Not
// for a reopen under running streams (RocksColdStore::Reopen).
rocksdb::Status OpenDbForWrites(
    const RocksColdStoreOptions& options,
    std::shared_ptr<rocksdb::EventListener> listener, Db* out);

// Bytes free for unprivileged writes on path's filesystem (UINT64_MAX when
// unknown).
uint64_t FreeBytes(const std::string& path);

// The reserve kAutoReserve means for these options.
uint64_t AutoReserve(const RocksColdStoreOptions& o);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_DB_H_

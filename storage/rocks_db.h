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
#include "rocksdb/db.h"
#include "rocksdb/listener.h"
#include "storage/rocks_cold_store.h"

namespace kvmem {

// RocksDB's status as absl's, the message prefixed with `what`.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what);

// Told of RocksDB's background errors (a WAL or flush write that hit a full
// disk): the store stops writing and recovers by reopening, never by
// RocksDB's own recovery, which in 7.8 can write through a failed WAL
// writer and abort.
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

 private:
  std::atomic<bool>* const failed_;
};

// An open database and its column family handles (default, streams,
// blocks, payloads, frame_meta, block_layers).
struct Db {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  bool read_only = false;
};

// Opens the store's RocksDB read-write, or read-only when asked, into *out.
rocksdb::Status OpenDb(const RocksColdStoreOptions& options,
                       std::shared_ptr<rocksdb::EventListener> listener,
                       bool read_only, Db* out);

// Bytes free for unprivileged writes on path's filesystem (UINT64_MAX when
// unknown).
uint64_t FreeBytes(const std::string& path);

// The reserve kAutoReserve means for these options.
uint64_t AutoReserve(const RocksColdStoreOptions& o);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_DB_H_

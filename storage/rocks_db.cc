#include "storage/rocks_db.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#include "storage/rocks_crc32c.h"
#include "storage/rocks_keys.h"

namespace kvmem {
namespace {

// RocksDB's info LOG, written with plain write(2) whose failures are
// ignored. RocksDB's own file logger goes through a WritableFileWriter: on
// a full disk one failed append makes its next log line trip the 7.8
// assertion (storage/rocks_store.h; it is what aborted the server first: the
// error handler logs the very error that filled the disk). Lines are dropped,
// never fatal, while the disk is full.
class PlainFileLogger final : public rocksdb::Logger {
 public:
  explicit PlainFileLogger(const std::string& dir) {
    const std::string path = dir + "/LOG";
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) > (64ull << 20) && !ec) {
      std::filesystem::rename(path, path + ".old", ec);
    }
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  ~PlainFileLogger() override {
    if (fd_ >= 0) ::close(fd_);
  }
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    if (fd_ < 0) return;
    char line[1024];
    const absl::Time now = absl::Now();
    int n = absl::SNPrintF(
        line, sizeof(line), "%s ",
        absl::FormatTime("%Y/%m/%d-%H:%M:%E6S", now, absl::LocalTimeZone()));
    const int m = std::vsnprintf(line + n, sizeof(line) - n - 1, format, ap);
    if (m < 0) return;
    n = std::min<int>(n + m, sizeof(line) - 2);
    if (line[n - 1] != '\n') line[n++] = '\n';
    if (::write(fd_, line, static_cast<size_t>(n)) < 0) {
      // Full disk: the line is lost, the process is not.
    }
  }

 private:
  int fd_ = -1;
};

}  // namespace

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsBusy() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  return absl::InternalError(msg);
}

// Block records at least this large go to blob files (a 7B record is ~13
// MB; a small model's, a few KiB, stays in the SST files).
constexpr uint64_t kMinBlockRecordBlob = 256 << 10;

// cf with values of at least min_blob_size in blob files.
static rocksdb::ColumnFamilyOptions WithBlobFiles(
    rocksdb::ColumnFamilyOptions cf, uint64_t min_blob_size) {
  cf.enable_blob_files = true;
  cf.min_blob_size = min_blob_size;
  cf.blob_file_size = 256ull << 20;
  // Garbage collection off until garbage pays for it (WantBlobGc,
  // RocksColdStore::TuneBlobGc); then every blob file counts as old enough
  // (cutoff 1): a compaction relocates every live blob its SSTs point to,
  // and the files left with garbage alone go. Interleaved streams' keys
  // overlap, so their compactions reach the old SSTs. RocksDB's forced
  // collection (a force threshold below 1) is not used: in 7.8 it asserts
  // that the oldest blob file has an SST naming it as its oldest, which
  // fails once compactions have moved past it (it aborted the server in
  // the cameras bench).
  cf.enable_blob_garbage_collection = false;
  cf.blob_garbage_collection_age_cutoff = 1.0;
  cf.blob_garbage_collection_force_threshold = 1.0;
  return cf;
}

rocksdb::Status OpenDb(const RocksColdStoreOptions& options,
                       std::shared_ptr<rocksdb::EventListener> listener,
                       bool read_only, Db* out, const Replay& replay) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  // Two flush threads, so a payload column family's flush does not wait
  // behind another's (at two 7B cameras the single flush thread that two
  // jobs give made RocksDB stop writes while memtables waited); one
  // compaction thread.
  db_options.max_background_flushes = 2;
  db_options.max_background_compactions = 1;
  db_options.manual_wal_flush = false;
  // Opening never writes the WAL's contents into new files (they stay in
  // the memtables and flush as usual): a reopen on a nearly full disk needs
  // only a manifest and a new WAL.
  db_options.avoid_flush_during_recovery = true;
  // Closing never flushes (RocksDB would flush every memtable once any
  // write skipped the WAL); the store logs the block records it wrote
  // outside the WAL instead (RocksColdStore::LogUnflushedRecords).
  db_options.avoid_flush_during_shutdown = true;
  db_options.wal_recovery_mode =
      replay.skip_damaged ? rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords
      : options.strict_wal
          ? rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords
          : rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  db_options.wal_filter = replay.filter;

  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  // Index and filter blocks live in the block cache, so the memory of open
  // SST files is bounded by it instead of growing with their number (the
  // soak test saw RSS climb with every flush otherwise); L0's stay pinned.
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  rocksdb::ColumnFamilyOptions meta_cf;
  meta_cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  meta_cf.write_buffer_size =
      std::min<uint64_t>(options.write_buffer_bytes, 16ull << 20);
  rocksdb::ColumnFamilyOptions payload_cf =
      WithBlobFiles(meta_cf, options.min_blob_size);
  payload_cf.write_buffer_size = options.write_buffer_bytes;
  // Block records are small for small models and ~13 MB at 7B (summaries
  // and token codes of 32 indexed layers), written at each seal and each
  // tier move. In 16 MiB memtables with their values in SST files, each
  // record or two filled a memtable and RocksDB stopped every write while
  // two waited for their flush ("Stopping writes because we have 2
  // immutable memtables"): two 7B cameras' appends waited seconds. Large
  // records now go to blob files like payloads (compactions move their
  // index entries, not the records), in memtables the payloads' size.
  rocksdb::ColumnFamilyOptions blocks_cf = payload_cf;
  blocks_cf.min_blob_size = kMinBlockRecordBlob;

  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, meta_cf},
      {kStreamsCf, meta_cf},
      {kBlocksCf, blocks_cf},
      {kPayloadsCf, payload_cf},
      {kFrameMetaCf, meta_cf},
      {kBlockLayersCf, payload_cf}};
  db_options.listeners.push_back(std::move(listener));
  db_options.info_log = std::make_shared<PlainFileLogger>(options.path);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      read_only
          ? rocksdb::DB::OpenForReadOnly(db_options, options.path, cfs,
                                         &handles, &raw)
          : rocksdb::DB::Open(db_options, options.path, cfs, &handles, &raw);
  if (!s.ok()) return s;
  // The DB's LOG says whose CRC32C its checksums ran (rocks_crc32c.h).
  rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, db_options.info_log,
               "kvmem: RocksDB's CRC32C runs %s", RocksCrc32cKernel().c_str());
  out->db.reset(raw);
  out->handles = std::move(handles);
  out->read_only = read_only;
  return s;
}

namespace {

// A write batch's first sequence number: the first 8 bytes of its
// representation, little-endian (RocksDB's WriteBatch header: sequence,
// then count).
uint64_t BatchSequence(const rocksdb::WriteBatch& batch) {
  uint64_t seq = 0;
  const std::string& rep = batch.Data();
  if (rep.size() >= sizeof(seq)) std::memcpy(&seq, rep.data(), sizeof(seq));
  return seq;
}

// Lists the records an open replays (each log's, in order, by sequence
// number); or, given such lists, lets through the records that match them
// in order and stops replay at the first that does not.
class ReplayLists final : public rocksdb::WalFilter {
 public:
  using Lists = std::map<uint64_t, std::vector<uint64_t>>;
  explicit ReplayLists(const Lists* replay) : replay_(replay) {}
  WalProcessingOption LogRecordFound(unsigned long long log_number,
                                     const std::string&,
                                     const rocksdb::WriteBatch& batch,
                                     rocksdb::WriteBatch*, bool*) override {
    const uint64_t seq = BatchSequence(batch);
    if (replay_ == nullptr) {
      seen_[log_number].push_back(seq);
      return WalProcessingOption::kContinueProcessing;
    }
    size_t& n = next_[log_number];
    const auto it = replay_->find(log_number);
    if (stopped_ || it == replay_->end() || n >= it->second.size() ||
        it->second[n] != seq) {
      stopped_ = true;
      return WalProcessingOption::kStopReplay;
    }
    ++n;
    seen_[log_number].push_back(seq);
    return WalProcessingOption::kContinueProcessing;
  }
  const char* Name() const override { return "kvmem-replay-lists"; }
  const Lists& seen() const { return seen_; }

 private:
  const Lists* replay_;
  Lists seen_;
  std::map<uint64_t, size_t> next_;
  bool stopped_ = false;
};

}  // namespace

void CloseOpenDb(Db* db) {
  for (auto* h : db->handles) {
    db->db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  db->db->Close().PermitUncheckedError();
  db->db.reset();
  db->handles.clear();
}

rocksdb::Status FlushEveryFamily(const Db& db) {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  fo.allow_write_stall = true;
  return db.db->Flush(fo, db.handles);
}

bool DamagedLogBehindFlush(const rocksdb::Status& s) {
  return s.IsCorruption() &&
         s.ToString().find("SST file is ahead of WALs") != std::string::npos;
}

rocksdb::Status OpenDbUpToDamage(
    const RocksColdStoreOptions& options,
    std::shared_ptr<rocksdb::EventListener> listener, Db* out) {
  // A database holds its options' WAL filter for its life: each open that
  // gets one is closed before its filter goes.
  // Point-in-time recovery again, listing what it replays; it refuses
  // again, having written nothing.
  ReplayLists listing(nullptr);
  Replay first;
  first.filter = &listing;
  Db listed;
  rocksdb::Status s = OpenDb(options, listener, false, &listed, first);
  if (s.ok()) {
    CloseOpenDb(&listed);
    return OpenDb(options, listener, false, out);
  }
  if (!DamagedLogBehindFlush(s)) return s;
  ReplayLists prefix(&listing.seen());
  Replay second;
  second.filter = &prefix;
  second.skip_damaged = true;
  Db salvaged;
  s = OpenDb(options, listener, false, &salvaged, second);
  if (!s.ok()) return s;
  size_t records = 0;
  for (const auto& [log, seqs] : prefix.seen()) records += seqs.size();
  rocksdb::Log(rocksdb::InfoLogLevel::ERROR_LEVEL,
               salvaged.db->GetDBOptions().info_log,
               "kvmem: a write-ahead log is damaged and a column family was "
               "flushed past it: replayed the %zu records before the damage "
               "(point in time); flushing every column family",
               records);
  // Every family flushed makes the damaged logs obsolete: left live, the
  // next open would stop at the same damage, before everything written
  // since. Then the database opens again without the filter, replaying
  // nothing.
  s = FlushEveryFamily(salvaged);
  CloseOpenDb(&salvaged);
  if (!s.ok()) return s;
  return OpenDb(options, listener, false, out);
}

rocksdb::Status OpenDbForWrites(
    const RocksColdStoreOptions& options,
    std::shared_ptr<rocksdb::EventListener> listener, Db* out) {
  const rocksdb::Status s = OpenDb(options, listener, false, out);
  if (options.strict_wal || !DamagedLogBehindFlush(s)) return s;
  return OpenDbUpToDamage(options, std::move(listener), out);
}

bool WantBlobGc(bool on, uint64_t blob_bytes, uint64_t garbage_bytes) {
  if (blob_bytes == 0) return false;
  const double share = static_cast<double>(garbage_bytes) / blob_bytes;
  return on ? share > kBlobGcOffShare : share >= kBlobGcOnShare;
}

uint64_t FreeBytes(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return UINT64_MAX;  // Unknown.
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

uint64_t AutoReserve(const RocksColdStoreOptions& o) {
  // What the memtables can hold (flushed to files while their WAL still
  // exists: payloads, layer records, block records, and three small
  // column families), and a margin for compaction and the acknowledgement
  // record.
  return 3 * o.write_buffer_bytes +
         3 * std::min<uint64_t>(o.write_buffer_bytes, 16ull << 20) +
         (64ull << 20);
}

}  // namespace kvmem

#include "storage/rocks_cold_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/crc32c.h"
#include "base/sync.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/table.h"
#include "rocksdb/utilities/options_util.h"
#include "rocksdb/write_batch.h"

namespace kvmem {
namespace {

constexpr char kStreamsCf[] = "streams";
constexpr char kBlocksCf[] = "blocks";
constexpr char kPayloadsCf[] = "payloads";
constexpr char kFrameMetaCf[] = "frame_meta";
constexpr char kBlockLayersCf[] = "block_layers";

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

// Replaces dir/name with data: written to a temporary file, fsynced,
// renamed over the old one, and the directory fsynced, so a crash leaves
// either the old record or the new one.
absl::Status WriteFileDurably(const std::string& dir, const std::string& name,
                              absl::string_view data) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = path + ".tmp";
  auto fail = [&](absl::string_view what) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(what, " ", tmp, ": ", std::strerror(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
  };
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("open");
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status st = fail("write");
      ::close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status st = fail("fsync");
    ::close(fd);
    return st;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

std::string StreamPrefix(absl::string_view stream_id) {
  std::string k(stream_id);
  k.push_back('\0');
  return k;
}

std::string NumberedKey(absl::string_view stream_id, uint64_t n) {
  std::string k = StreamPrefix(stream_id);
  for (int shift = 56; shift >= 0; shift -= 8) {
    k.push_back(static_cast<char>((n >> shift) & 0xff));
  }
  return k;
}

uint64_t DecodeNumber(absl::string_view key_suffix) {
  uint64_t n = 0;
  for (char c : key_suffix) n = (n << 8) | static_cast<uint8_t>(c);
  return n;
}

std::string LayerKey(absl::string_view stream_id, uint64_t block,
                     uint32_t layer) {
  std::string k = NumberedKey(stream_id, block);
  for (int shift = 24; shift >= 0; shift -= 8) {
    k.push_back(static_cast<char>((layer >> shift) & 0xff));
  }
  return k;
}

std::string MetaKey(absl::string_view stream_id, char kind) {
  std::string k = StreamPrefix(stream_id);
  k.push_back(kind);
  return k;
}

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

// RocksDB's info LOG, written with plain write(2) whose failures are
// ignored. RocksDB's own file logger goes through a WritableFileWriter: on
// a full disk one failed append makes its next log line trip the 7.8
// assertion above (it is what aborted the server first: the error handler
// logs the very error that filled the disk). Lines are dropped, never
// fatal, while the disk is full.
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

struct Db {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  bool read_only = false;
};

// Opens the store's RocksDB read-write, or read-only when asked.
rocksdb::Status OpenDb(const RocksColdStoreOptions& options,
                       std::shared_ptr<rocksdb::EventListener> listener,
                       bool read_only, Db* out) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  db_options.manual_wal_flush = false;
  db_options.wal_recovery_mode =
      options.strict_wal
          ? rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords
          : rocksdb::WALRecoveryMode::kPointInTimeRecovery;

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
  rocksdb::ColumnFamilyOptions payload_cf = meta_cf;
  payload_cf.enable_blob_files = true;
  payload_cf.min_blob_size = options.min_blob_size;
  payload_cf.blob_file_size = 256ull << 20;
  payload_cf.enable_blob_garbage_collection = true;
  payload_cf.write_buffer_size = options.write_buffer_bytes;

  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, meta_cf},
      {kStreamsCf, meta_cf},
      {kBlocksCf, meta_cf},
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
  out->db.reset(raw);
  out->handles = std::move(handles);
  out->read_only = read_only;
  return s;
}

uint64_t FreeBytes(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return UINT64_MAX;  // Unknown.
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

uint64_t AutoReserve(const RocksColdStoreOptions& o) {
  // What the memtables can hold (flushed to files while their WAL still
  // exists), and a margin for compaction and the acknowledgement record.
  return 2 * o.write_buffer_bytes +
         4 * std::min<uint64_t>(o.write_buffer_bytes, 16ull << 20) +
         (64ull << 20);
}

// A layer record's trailer: CRC32C of its key then its bytes (little-
// endian), then kLayerMagic. The key is in the CRC so that a read that
// lands on another record (a damaged or stale blob index, which RocksDB
// does not check with its checksums off) fails it.
constexpr char kLayerMagic[4] = {'K', 'V', 'C', '1'};
constexpr size_t kTrailerBytes = 8;

uint32_t LayerCrc(absl::string_view key, const char* bytes, size_t n) {
  return Crc32c(bytes, n, Crc32c(key.data(), key.size()));
}

std::string LayerTrailer(absl::string_view key, absl::string_view bytes) {
  const uint32_t crc = LayerCrc(key, bytes.data(), bytes.size());
  std::string t(kTrailerBytes, '\0');
  for (int i = 0; i < 4; ++i) t[i] = static_cast<char>(crc >> (8 * i));
  std::memcpy(t.data() + 4, kLayerMagic, 4);
  return t;
}

// True (and the trailer stripped from *v) when *v ends with a trailer whose
// CRC matches. Otherwise the caller reads the record again with RocksDB's
// own check: a record written without a trailer, or a damaged one (which
// that check then reports).
bool StripLayerTrailer(absl::string_view key, std::string* v) {
  if (v->size() < kTrailerBytes ||
      std::memcmp(v->data() + v->size() - 4, kLayerMagic, 4) != 0) {
    return false;
  }
  const size_t n = v->size() - kTrailerBytes;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= uint32_t{static_cast<uint8_t>((*v)[n + i])} << (8 * i);
  }
  if (LayerCrc(key, v->data(), n) != stored) return false;
  v->resize(n);
  return true;
}

class RocksColdStore final : public ColdStore {
 public:
  // Opens read-write; on a disk too full to open read-write (RocksDB
  // replays the WAL into new files), read-only, so stored streams still
  // serve reads and appends resume once space returns.
  static absl::StatusOr<std::unique_ptr<ColdStore>> Open(
      const RocksColdStoreOptions& options) {
    std::unique_ptr<RocksColdStore> store(new RocksColdStore(options));
    rocksdb::Status s =
        OpenDb(options, store->listener_, /*read_only=*/false, &store->db_);
    if (!s.ok() && (s.IsNoSpace() || (s.IsIOError() && store->Low()))) {
      const rocksdb::Status first = s;
      s = OpenDb(options, store->listener_, /*read_only=*/true, &store->db_);
      if (s.ok()) store->SetError(first.ToString());
    }
    if (!s.ok()) {
      return FromRocks(s, absl::StrCat("open RocksDB at ", options.path));
    }
    store->Install();
    if (options.wal_sync == WalSync::kInterval) {
      store->syncer_ = std::thread([p = store.get()] { p->SyncLoop(); });
    }
    return std::unique_ptr<ColdStore>(std::move(store));
  }

  ~RocksColdStore() override {
    if (syncer_.joinable()) {
      {
        kvmem::MutexLock lock(&sync_mu_);
        stopping_ = true;
      }
      syncer_.join();
    }
    kvmem::MutexLock lock(&db_mu_);
    CloseDb();
  }

  absl::Status Commit(const StreamWrite& write) override {
    if (absl::Status g = WriteGate(/*freeing=*/false); !g.ok()) return g;
    kvmem::ReaderMutexLock lock(&db_mu_);
    KVMEM_STORE_OPEN_OR_RETURN();
    rocksdb::WriteBatch batch;
    for (uint64_t b : write.delete_block_layers) {
      batch.DeleteRange(block_layers_, NumberedKey(write.stream_id, b),
                        NumberedKey(write.stream_id, b + 1));
    }
    for (const auto& [first, last] : write.delete_frames) {
      for (auto* cf : {payloads_, frame_meta_}) {
        batch.DeleteRange(cf, NumberedKey(write.stream_id, first),
                          NumberedKey(write.stream_id, last + 1));
      }
    }
    if (write.config) {
      batch.Put(streams_, MetaKey(write.stream_id, 'c'), *write.config);
    }
    if (write.state) {
      batch.Put(streams_, MetaKey(write.stream_id, 'S'), *write.state);
    }
    if (write.frame) {
      const absl::string_view p = write.frame->second;
      batch.Put(payloads_, NumberedKey(write.stream_id, write.frame->first),
                rocksdb::Slice(p.data(), p.size()));
      if (write.frame_meta) {
        batch.Put(frame_meta_, NumberedKey(write.stream_id, write.frame->first),
                  *write.frame_meta);
      }
    }
    for (const auto& l : write.block_layers) {
      const std::string key = LayerKey(write.stream_id, l.block_id, l.layer);
      if (!options_.layer_checksums) {
        batch.Put(block_layers_, key, l.bytes);
        continue;
      }
      const std::string trailer = LayerTrailer(key, l.bytes);
      const rocksdb::Slice key_part(key), parts[2] = {l.bytes, trailer};
      batch.Put(block_layers_, rocksdb::SliceParts(&key_part, 1),
                rocksdb::SliceParts(parts, 2));
    }
    for (const auto& [id, record] : write.blocks) {
      batch.Put(blocks_, NumberedKey(write.stream_id, id), record);
    }
    return Written(DbWrite(write_options_, &batch), "commit");
  }

  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t frame_index) override {
    return Get(&RocksColdStore::payloads_, NumberedKey(stream_id, frame_index),
               absl::StrCat("frame ", frame_index, " of stream ", stream_id));
  }

  absl::StatusOr<std::string> GetFrameMeta(absl::string_view stream_id,
                                           uint64_t frame_index) override {
    return Get(
        &RocksColdStore::frame_meta_, NumberedKey(stream_id, frame_index),
        absl::StrCat("meta of frame ", frame_index, " of stream ", stream_id));
  }

  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override {
    const std::string key = LayerKey(stream_id, block_id, layer);
    auto what = [&] {
      return absl::StrCat("layer ", layer, " of block ", block_id,
                          " of stream ", stream_id);
    };
    if (options_.verify_layers_with_rocksdb) {
      absl::StatusOr<std::string> v =
          Get(&RocksColdStore::block_layers_, key, what(), /*verify=*/true);
      if (v.ok()) StripLayerTrailer(key, &*v);
      return v;
    }
    // Our own checksum (RocksDB's off, and nothing it reads so kept in its
    // block cache unchecked); a record without a good one is read again
    // with RocksDB's: older records, or damaged ones (DATA_LOSS).
    absl::StatusOr<std::string> v =
        Get(&RocksColdStore::block_layers_, key, what(), /*verify=*/false);
    if (!v.ok() || StripLayerTrailer(key, &*v)) return v;
    // RocksDB's check passed: a trailer that checks now was damaged in
    // flight the first time; none (or one that does not check) is an older
    // record's last bytes, returned whole (a wrong size is the engine's
    // DATA_LOSS).
    v = Get(&RocksColdStore::block_layers_, key, what(), /*verify=*/true);
    if (v.ok()) StripLayerTrailer(key, &*v);
    return v;
  }

  absl::Status ScanBlocks(
      absl::string_view stream_id,
      const std::function<absl::Status(uint64_t, absl::string_view)>& fn)
      override {
    const std::string prefix = StreamPrefix(stream_id);
    std::string upper(stream_id);
    upper.push_back('\x01');
    rocksdb::Slice upper_slice(upper);
    rocksdb::ReadOptions ro;
    ro.iterate_upper_bound = &upper_slice;
    // In batches, fn called without db_mu_: fn may read the store (a
    // reader lock taken twice deadlocks once a reopen waits between them).
    constexpr size_t kBatch = 256;
    std::string from = prefix;
    for (;;) {
      std::vector<std::pair<uint64_t, std::string>> batch;
      {
        kvmem::ReaderMutexLock lock(&db_mu_);
        KVMEM_STORE_OPEN_OR_RETURN();
        std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(ro, blocks_));
        for (it->Seek(from); it->Valid() && batch.size() < kBatch; it->Next()) {
          const rocksdb::Slice key = it->key();
          if (key.size() != prefix.size() + 8) {
            return absl::DataLossError(absl::StrCat("block key of stream ",
                                                    stream_id, " has ",
                                                    key.size(), " bytes"));
          }
          batch.emplace_back(
              DecodeNumber(absl::string_view(key.data() + prefix.size(), 8)),
              it->value().ToString());
        }
        if (!it->status().ok()) return FromRocks(it->status(), "scan blocks");
      }
      for (const auto& [id, value] : batch) {
        absl::Status st = fn(id, value);
        if (!st.ok()) return st;
      }
      if (batch.size() < kBatch) return absl::OkStatus();
      from = NumberedKey(stream_id, batch.back().first + 1);
    }
  }

  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override {
    std::vector<StreamRecord> out;
    kvmem::ReaderMutexLock lock(&db_mu_);
    KVMEM_STORE_OPEN_OR_RETURN();
    std::unique_ptr<rocksdb::Iterator> it(
        db_.db->NewIterator(rocksdb::ReadOptions(), streams_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const std::string key = it->key().ToString();
      const size_t nul = key.find('\0');
      if (nul == std::string::npos || nul + 2 != key.size()) continue;
      const std::string id = key.substr(0, nul);
      if (out.empty() || out.back().stream_id != id)
        out.push_back({id, "", ""});
      if (key[nul + 1] == 'c') out.back().config = it->value().ToString();
      if (key[nul + 1] == 'S') out.back().state = it->value().ToString();
    }
    if (!it->status().ok()) return FromRocks(it->status(), "list streams");
    std::vector<StreamRecord> with_config;
    for (auto& r : out) {
      if (!r.config.empty()) with_config.push_back(std::move(r));
    }
    return with_config;
  }

  absl::Status DeleteStream(absl::string_view stream_id) override {
    // Deleting is how space comes back: a few bytes of range tombstones,
    // allowed below the reserve.
    if (absl::Status g = WriteGate(/*freeing=*/true); !g.ok()) return g;
    kvmem::ReaderMutexLock lock(&db_mu_);
    KVMEM_STORE_OPEN_OR_RETURN();
    const std::string begin = StreamPrefix(stream_id);
    std::string end(stream_id);
    end.push_back('\x01');
    rocksdb::WriteBatch batch;
    for (auto* cf :
         {streams_, blocks_, payloads_, frame_meta_, block_layers_}) {
      batch.DeleteRange(cf, begin, end);
    }
    return Written(DbWrite(write_options_, &batch), "delete stream");
  }

  uint64_t ApproximatePayloadBytes() override {
    kvmem::ReaderMutexLock lock(&db_mu_);
    if (db_.db == nullptr) return 0;
    uint64_t total = 0;
    for (const char* prop :
         {"rocksdb.total-blob-file-size", "rocksdb.live-sst-files-size",
          "rocksdb.cur-size-all-mem-tables"}) {
      for (auto* cf : {payloads_, block_layers_}) {
        uint64_t v = 0;
        if (db_.db->GetIntProperty(cf, prop, &v)) total += v;
      }
    }
    return total;
  }

  absl::Status RecordAcknowledged(
      const std::map<std::string, uint64_t>& frames) override {
    // Every commit that returned is in the WAL (manual_wal_flush is off):
    // made durable first, the record never claims more than the disk holds.
    if (absl::Status st = SyncedMarker(); !st.ok()) return st;
    std::string out(kAckMagic);
    PutU64(&out, frames.size());
    for (const auto& [id, n] : frames) {
      PutU64(&out, id.size());
      out += id;
      PutU64(&out, n);
    }
    PutU64(&out, Fnv64(out));
    kvmem::MutexLock lock(&ack_mu_);  // One writer of the temporary file.
    return WriteFileDurably(path_, kAckFile, out);
  }

  absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() override {
    std::map<std::string, uint64_t> frames;
    const std::string file = absl::StrCat(path_, "/", kAckFile);
    std::error_code ec;
    if (!std::filesystem::exists(file, ec) && !ec) {
      return frames;  // Never recorded (a new store, or an older version's).
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      return absl::DataLossError(absl::StrCat(
          "acknowledgement record ", file, " exists and cannot be read",
          ec ? absl::StrCat(" (", ec.message(), ")") : std::string(),
          ": acknowledged frames cannot be verified"));
    }
    const std::string data((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(
          absl::StrCat("acknowledgement record ", file, " is unreadable (", why,
                       "): acknowledged frames cannot be verified"));
    };
    const size_t magic = sizeof(kAckMagic) - 1;
    if (data.size() < magic + 16 || data.compare(0, magic, kAckMagic) != 0) {
      return bad("no header");
    }
    absl::string_view body(data.data(), data.size() - 8);
    size_t pos = data.size() - 8;
    if (GetU64(data, &pos) != Fnv64(body)) return bad("checksum mismatch");
    pos = magic;
    const uint64_t count = GetU64(data, &pos);
    for (uint64_t i = 0; i < count; ++i) {
      if (pos + 8 > body.size()) return bad("truncated");
      const uint64_t len = GetU64(data, &pos);
      if (len > body.size() || pos + len + 8 > body.size()) {
        return bad("truncated");
      }
      std::string id = data.substr(pos, len);
      pos += len;
      frames[std::move(id)] = GetU64(data, &pos);
    }
    if (pos != body.size()) return bad("trailing bytes");
    return frames;
  }

 private:
  static constexpr char kAckMagic[] = "KVMEM-ACKED-1\n";
  static constexpr char kAckFile[] = "KVMEM-ACKED";

  static void PutU64(std::string* out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
  }
  static uint64_t GetU64(const std::string& in, size_t* pos) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(in[*pos + i])) << (8 * i);
    }
    *pos += 8;
    return v;
  }
  static uint64_t Fnv64(absl::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    return h;
  }

  // Makes every WAL record written so far durable. Not DB::SyncWAL: in
  // RocksDB 7.8 that syncs a WAL writer even after a write to it failed
  // (disk full) and trips an assertion that Debian's build keeps
  // (WritableFileWriter::AssertFalseAndGetStatusForPrevError); a synced
  // write goes through the write queue, which refuses once the DB has a
  // background error, and syncs every live WAL when it does run.
  absl::Status SyncedMarker() {
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
  rocksdb::Status DbWrite(const rocksdb::WriteOptions& wo,
                          rocksdb::WriteBatch* batch) {
    kvmem::UninstrumentedCall rocksdb_write_path;
    return db_.db->Write(wo, batch);
  }

  // --- disk full ---

  bool Low() const { return FreeBytes(options_.path) < reserve_; }

  // A write that failed on I/O stops further writes until the reopen.
  absl::Status Written(const rocksdb::Status& s, absl::string_view what) {
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
  absl::Status WriteGate(bool freeing) {
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
          "data dir ", options_.path, " stopped taking writes (", Error(),
          "); ", free, " bytes free: writes resume by themselves ",
          ResumeWhen(), "; reads keep working"));
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

  std::string ResumeWhen() const {
    return reserve_ == 0 ? "when space is freed"
                         : absl::StrCat("once ", reserve_,
                                        " bytes are free (--disk_reserve_mib)");
  }

  // REQUIRES: db_mu_ exclusive.
  void Reopen() {
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
  void CloseDb() {
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

  void SetError(std::string e) {
    kvmem::MutexLock lock(&error_mu_);
    last_error_ = std::move(e);
  }
  std::string Error() {
    kvmem::MutexLock lock(&error_mu_);
    return last_error_;
  }

  void Install() {
    streams_ = db_.handles[1];
    blocks_ = db_.handles[2];
    payloads_ = db_.handles[3];
    frame_meta_ = db_.handles[4];
    block_layers_ = db_.handles[5];
  }

  // cf names the handle member: read under the lock, a reopen replaces it.
  absl::StatusOr<std::string> Get(
      rocksdb::ColumnFamilyHandle* RocksColdStore::*cf, const std::string& key,
      const std::string& what, bool verify = true) {
    std::string value;
    kvmem::ReaderMutexLock lock(&db_mu_);
    KVMEM_STORE_OPEN_OR_RETURN();
    rocksdb::ReadOptions ro;
    ro.verify_checksums = verify;
    ro.fill_cache = verify;  // Unchecked blocks stay out of the cache.
    rocksdb::Status s = db_.db->Get(ro, this->*cf, key, &value);
    if (s.IsNotFound()) {
      return absl::NotFoundError(absl::StrCat(what, " is not stored"));
    }
    if (!s.ok()) return FromRocks(s, what);
    return value;
  }

  // kInterval: fsyncs the WAL every interval until the store closes.
  void SyncLoop() {
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

  explicit RocksColdStore(const RocksColdStoreOptions& options)
      : options_(options),
        reserve_(options.reserve_bytes == RocksColdStoreOptions::kAutoReserve
                     ? AutoReserve(options)
                     : options.reserve_bytes),
        path_(options.path),
        listener_(std::make_shared<ErrorListener>(&failed_)) {
    write_options_.sync = options.wal_sync == WalSync::kEveryCommit;
  }

  const RocksColdStoreOptions options_;
  const uint64_t reserve_;
  const std::string path_;
  std::atomic<bool> failed_{false};
  const std::shared_ptr<rocksdb::EventListener> listener_;
  // Shared by every RocksDB call, exclusive for a reopen.
  kvmem::Mutex db_mu_;
  Db db_;
  kvmem::Mutex reopen_mu_ ABSL_ACQUIRED_BEFORE(db_mu_);
  absl::Time next_reopen_ = absl::InfinitePast();
  kvmem::Mutex error_mu_;  // A leaf: taken under either of the above.
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  kvmem::Mutex ack_mu_;
  kvmem::Mutex sync_mu_;
  bool stopping_ ABSL_GUARDED_BY(sync_mu_) = false;
  std::thread syncer_;
  rocksdb::ColumnFamilyHandle* streams_ = nullptr;
  rocksdb::ColumnFamilyHandle* blocks_ = nullptr;
  rocksdb::ColumnFamilyHandle* payloads_ = nullptr;
  rocksdb::ColumnFamilyHandle* frame_meta_ = nullptr;
  rocksdb::ColumnFamilyHandle* block_layers_ = nullptr;
  rocksdb::WriteOptions write_options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ColdStore>> OpenRocksColdStore(
    const RocksColdStoreOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("cold store path is empty");
  }
  if (options.wal_sync == WalSync::kInterval &&
      options.wal_sync_interval_ms == 0) {
    return absl::InvalidArgumentError(
        "wal_sync_interval_ms is 0; must be at least 1 with wal_sync interval");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create cold store directory ", options.path, ": ",
                     ec.message()));
  }
  return RocksColdStore::Open(options);
}

const char* WalSyncName(WalSync w) {
  switch (w) {
    case WalSync::kEveryCommit:
      return "commit";
    case WalSync::kInterval:
      return "interval";
    case WalSync::kOff:
      return "off";
  }
  return "?";
}

bool ParseWalSync(const std::string& name, WalSync* out) {
  for (WalSync w : {WalSync::kEveryCommit, WalSync::kInterval, WalSync::kOff}) {
    if (name == WalSyncName(w)) {
      *out = w;
      return true;
    }
  }
  return false;
}

}  // namespace kvmem

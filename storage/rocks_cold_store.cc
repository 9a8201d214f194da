#include "storage/rocks_cold_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <filesystem>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
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
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                        0644);
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

class RocksColdStore final : public ColdStore {
 public:
  RocksColdStore(std::unique_ptr<rocksdb::DB> db, std::string path,
                 std::vector<rocksdb::ColumnFamilyHandle*> handles,
                 WalSync wal_sync, uint32_t interval_ms)
      : db_(std::move(db)), path_(std::move(path)), handles_(std::move(handles)) {
    write_options_.sync = wal_sync == WalSync::kEveryCommit;
    write_options_.disableWAL = false;
    streams_ = handles_[1];
    blocks_ = handles_[2];
    payloads_ = handles_[3];
    frame_meta_ = handles_[4];
    block_layers_ = handles_[5];
    if (wal_sync == WalSync::kInterval) {
      syncer_ = std::thread([this, interval_ms] { SyncLoop(interval_ms); });
    }
  }

  ~RocksColdStore() override {
    if (syncer_.joinable()) {
      {
        absl::MutexLock lock(&sync_mu_);
        stopping_ = true;
      }
      syncer_.join();
    }
    SyncedMarker().IgnoreError();  // Not FlushWAL: see SyncedMarker.
    for (auto* h : handles_)
      db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db_->Close().PermitUncheckedError();
  }

  absl::Status Commit(const StreamWrite& write) override {
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
      batch.Put(block_layers_, LayerKey(write.stream_id, l.block_id, l.layer),
                l.bytes);
    }
    for (const auto& [id, record] : write.blocks) {
      batch.Put(blocks_, NumberedKey(write.stream_id, id), record);
    }
    return FromRocks(db_->Write(write_options_, &batch), "commit");
  }

  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t frame_index) override {
    return Get(payloads_, NumberedKey(stream_id, frame_index),
               absl::StrCat("frame ", frame_index, " of stream ", stream_id));
  }

  absl::StatusOr<std::string> GetFrameMeta(absl::string_view stream_id,
                                           uint64_t frame_index) override {
    return Get(
        frame_meta_, NumberedKey(stream_id, frame_index),
        absl::StrCat("meta of frame ", frame_index, " of stream ", stream_id));
  }

  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override {
    return Get(block_layers_, LayerKey(stream_id, block_id, layer),
               absl::StrCat("layer ", layer, " of block ", block_id,
                            " of stream ", stream_id));
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
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, blocks_));
    for (it->Seek(prefix); it->Valid(); it->Next()) {
      const rocksdb::Slice key = it->key();
      if (key.size() != prefix.size() + 8) {
        return absl::DataLossError(absl::StrCat(
            "block key of stream ", stream_id, " has ", key.size(), " bytes"));
      }
      const uint64_t id =
          DecodeNumber(absl::string_view(key.data() + prefix.size(), 8));
      const rocksdb::Slice v = it->value();
      absl::Status st = fn(id, absl::string_view(v.data(), v.size()));
      if (!st.ok()) return st;
    }
    return FromRocks(it->status(), "scan blocks");
  }

  absl::StatusOr<std::vector<StreamRecord>> ListStreams() override {
    std::vector<StreamRecord> out;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), streams_));
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
    const std::string begin = StreamPrefix(stream_id);
    std::string end(stream_id);
    end.push_back('\x01');
    rocksdb::WriteBatch batch;
    for (auto* cf :
         {streams_, blocks_, payloads_, frame_meta_, block_layers_}) {
      batch.DeleteRange(cf, begin, end);
    }
    return FromRocks(db_->Write(write_options_, &batch), "delete stream");
  }

  uint64_t ApproximatePayloadBytes() override {
    uint64_t total = 0;
    for (const char* prop :
         {"rocksdb.total-blob-file-size", "rocksdb.live-sst-files-size",
          "rocksdb.cur-size-all-mem-tables"}) {
      for (auto* cf : {payloads_, block_layers_}) {
        uint64_t v = 0;
        if (db_->GetIntProperty(cf, prop, &v)) total += v;
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
    absl::MutexLock lock(&ack_mu_);  // One writer of the temporary file.
    return WriteFileDurably(path_, kAckFile, out);
  }

  absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() override {
    std::map<std::string, uint64_t> frames;
    const std::string file = absl::StrCat(path_, "/", kAckFile);
    std::ifstream in(file, std::ios::binary);
    if (!in) return frames;  // Never recorded (a new or pre-v5 store).
    const std::string data((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(
          "acknowledgement record ", file, " is unreadable (", why,
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
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Put(wo, handles_[0], "kvmem-sync", ""), "sync WAL");
  }

  absl::StatusOr<std::string> Get(rocksdb::ColumnFamilyHandle* cf,
                                  const std::string& key,
                                  const std::string& what) {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf, key, &value);
    if (s.IsNotFound()) {
      return absl::NotFoundError(absl::StrCat(what, " is not stored"));
    }
    if (!s.ok()) return FromRocks(s, what);
    return value;
  }

  // kInterval: fsyncs the WAL every interval until the store closes.
  void SyncLoop(uint32_t interval_ms) {
    absl::MutexLock lock(&sync_mu_);
    while (!stopping_) {
      sync_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                                absl::Milliseconds(interval_ms));
      if (stopping_) break;
      sync_mu_.Unlock();
      // Fails only on I/O errors, which the next Commit reports.
      SyncedMarker().IgnoreError();
      sync_mu_.Lock();
    }
  }

  std::unique_ptr<rocksdb::DB> db_;
  const std::string path_;
  absl::Mutex ack_mu_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  absl::Mutex sync_mu_;
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
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  db_options.manual_wal_flush = false;
  db_options.wal_recovery_mode =
      options.strict_wal ? rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords
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
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(db_options, options.path, cfs, &handles, &raw);
  if (!s.ok()) {
    return FromRocks(s, absl::StrCat("open RocksDB at ", options.path));
  }
  return std::unique_ptr<ColdStore>(
      new RocksColdStore(std::unique_ptr<rocksdb::DB>(raw), options.path,
                         std::move(handles),
                         options.wal_sync, options.wal_sync_interval_ms));
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

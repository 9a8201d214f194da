// RocksColdStore (storage/rocks_store.h): opening, reads and writes, the
// acknowledgement record.
#include "storage/rocks_cold_store.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/bounded_pool.h"
#include "base/status_macros.h"
#include "storage/ack_record.h"
#include "storage/layer_trailer.h"
#include "storage/rocks_keys.h"
#include "storage/rocks_store.h"

namespace kvmem {

absl::StatusOr<std::unique_ptr<ColdStore>> RocksColdStore::Open(
    const RocksColdStoreOptions& options) {
  std::unique_ptr<RocksColdStore> store(new RocksColdStore(options));
  {
    // No other thread knows the store yet; the lock is for the analysis.
    kvmem::MutexLock lock(&store->db_mu_);
    rocksdb::Status s = OpenDbForWrites(options, store->listener_, &store->db_);
    if (!s.ok() && (s.IsNoSpace() || (s.IsIOError() && store->Low()))) {
      const rocksdb::Status first = s;
      s = OpenDb(options, store->listener_, /*read_only=*/true, &store->db_);
      if (s.ok()) store->SetError(first.ToString());
    }
    if (!s.ok()) {
      return FromRocks(s, absl::StrCat("open RocksDB at ", options.path));
    }
    store->Install();
    store->FlushReplayed();
  }
  store->KeepSpare(FreeBytes(options.path));
  if (options.wal_sync == WalSync::kInterval) {
    store->syncer_ = std::thread([p = store.get()] { p->SyncLoop(); });
  }
  return std::unique_ptr<ColdStore>(std::move(store));
}

// The open keeps what it replays from the last run's logs in memtables
// (avoid_flush_during_recovery: a reopen on a nearly full disk writes no
// table files), so those logs stay live until each column family flushes,
// while a family that had nothing in them starts at the new log. Damage in
// such an older log then made point-in-time recovery refuse the store
// ("SST file is ahead of WALs": a family's files might hold data past the
// damage; salvage now replays up to it, OpenDbUpToDamage). Flushing every
// family once here retires the last run's logs. With less free space than
// AutoReserve (what the memtables hold, and 64 MiB) or the reserve, the
// flush is left to RocksDB, as before.
void RocksColdStore::FlushReplayed() {
  if (db_.read_only ||
      FreeBytes(options_.path) < std::max(reserve_, AutoReserve(options_))) {
    return;
  }
  // A failure is RocksDB's background error: the next write meets it.
  FlushEveryFamily(db_).PermitUncheckedError();
}

RocksColdStore::~RocksColdStore() {
  if (syncer_.joinable()) {
    {
      kvmem::MutexLock lock(&sync_mu_);
      stopping_ = true;
    }
    syncer_.join();
  }
  StopReclaimer();
  kvmem::MutexLock lock(&db_mu_);
  CloseDb();
}

namespace {

// A commit's batch holds its payloads: a 7B frame is 16 MiB, a demoted 7B
// block's layers 64 MiB. Built fresh, such a batch doubled its way up
// (a copy per doubling) into new pages (faults): a quarter of the server's
// CPU when 7B frames were ingested. Commits keep a few batches here
// (base/bounded_pool.h), each made once at the size it was first needed.
constexpr size_t kPooledBatches = 2;
constexpr size_t kPooledBatchBytes = (64ull << 20) + (1 << 20);

BoundedPool<std::unique_ptr<rocksdb::WriteBatch>>& Batches() {
  static auto* pool = new BoundedPool<std::unique_ptr<rocksdb::WriteBatch>>(
      kPooledBatches, kPooledBatchBytes);
  return *pool;
}

// About the bytes `w` puts in a batch: its values and a key's worth each.
size_t BatchBytes(const StreamWrite& w) {
  constexpr size_t kEntry = 64;  // Key, tag and lengths.
  const auto size = [](const std::optional<std::string>& v) {
    return v ? v->size() : 0;
  };
  size_t n =
      64 + size(w.config) + size(w.state) + size(w.frame_meta) + 4 * kEntry;
  if (w.frame) {
    const uint64_t bytes = w.frame->second.size();
    const uint64_t parts =
        w.frame_part_bytes > 0
            ? std::max<uint64_t>(
                  1, (bytes + w.frame_part_bytes - 1) / w.frame_part_bytes)
            : 1;
    n += bytes + parts * (kTrailerBytes + kEntry);
  }
  for (const auto& [id, record] : w.blocks) n += record.size() + kEntry;
  for (const BlockLayerWrite& l : w.block_layers) {
    n += l.bytes.size() + kTrailerBytes + kEntry;
  }
  n += (w.delete_block_layers.size() + 2 * w.delete_frames.size() +
        w.delete_frame_metas.size()) *
       2 * kEntry;
  return n;
}

// A pooled batch that holds `bytes` without growing, or a new one.
std::unique_ptr<rocksdb::WriteBatch> TakeBatch(size_t bytes) {
  std::unique_ptr<rocksdb::WriteBatch> b = Batches().Take();
  if (b != nullptr && b->Data().capacity() >= bytes) return b;
  return std::make_unique<rocksdb::WriteBatch>(bytes);
}

// Puts value under key in cf, followed by its trailer (layer_trailer.h)
// when `trailer` (one copy into the batch either way).
void PutRecord(rocksdb::WriteBatch* batch, rocksdb::ColumnFamilyHandle* cf,
               const std::string& key, absl::string_view value, bool trailer) {
  const rocksdb::Slice v(value.data(), value.size());
  if (!trailer) {
    batch->Put(cf, key, v);
    return;
  }
  const std::string t = LayerTrailer(key, value);
  const rocksdb::Slice key_part(key), parts[2] = {v, t};
  batch->Put(cf, rocksdb::SliceParts(&key_part, 1),
             rocksdb::SliceParts(parts, 2));
}

void GiveBackBatch(std::unique_ptr<rocksdb::WriteBatch> b) {
  b->Clear();
  const size_t bytes = b->Data().capacity();
  Batches().GiveBack(std::move(b), bytes);
}

}  // namespace

absl::Status RocksColdStore::Commit(const StreamWrite& write) {
  if (absl::Status g = WriteGate(/*freeing=*/false); !g.ok()) return g;
  kvmem::ReaderMutexLock lock(&db_mu_);
  KVMEM_STORE_OPEN_OR_RETURN();
  std::unique_ptr<rocksdb::WriteBatch> pooled = TakeBatch(BatchBytes(write));
  struct GiveBack {
    std::unique_ptr<rocksdb::WriteBatch>& b;
    ~GiveBack() { GiveBackBatch(std::move(b)); }
  } give_back{pooled};
  rocksdb::WriteBatch& batch = *pooled;
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
  for (const auto& [first, last] : write.delete_frame_metas) {
    batch.DeleteRange(frame_meta_, NumberedKey(write.stream_id, first),
                      NumberedKey(write.stream_id, last + 1));
  }
  if (write.config) {
    batch.Put(streams_, MetaKey(write.stream_id, 'c'), *write.config);
  }
  if (write.state) {
    batch.Put(streams_, MetaKey(write.stream_id, 'S'), *write.state);
  }
  if (write.frame) {
    // A frame is a block's durable copy until it leaves RAM, and with
    // --cold_form=frames after: read back unchecked by RocksDB, like layer
    // records (one pass over the bytes here, at SSE4.2 speed).
    const auto& [index, payload] = *write.frame;
    const uint64_t part = write.frame_part_bytes;
    if (part > 0 && !payload.empty()) {
      // Parts under (frame, part) keys, each with its own trailer: a read
      // of a few tokens reads their parts alone (GetFrameParts).
      for (uint64_t at = 0, p = 0; at < payload.size(); at += part, ++p) {
        PutRecord(&batch, payloads_,
                  LayerKey(write.stream_id, index, static_cast<uint32_t>(p)),
                  payload.substr(at, part), options_.layer_checksums);
      }
    } else {
      PutRecord(&batch, payloads_, NumberedKey(write.stream_id, index), payload,
                options_.layer_checksums);
    }
    if (write.frame_meta) {
      batch.Put(frame_meta_, NumberedKey(write.stream_id, write.frame->first),
                *write.frame_meta);
    }
  }
  for (const auto& l : write.block_layers) {
    PutRecord(&batch, block_layers_,
              LayerKey(write.stream_id, l.block_id, l.layer), l.bytes,
              options_.layer_checksums);
  }
  // A record with a stand-in (a seal's: its token groups are ~13 MB of a 7B
  // block's record) logs the stand-in; the record follows outside the WAL.
  const bool split =
      !options_.log_token_groups && !write.block_stand_ins.empty();
  std::vector<const std::pair<uint64_t, std::string>*> unlogged;
  for (const auto& block : write.blocks) {
    const std::string* put = &block.second;
    if (split) {
      for (const auto& [stand_in_id, stand_in] : write.block_stand_ins) {
        if (stand_in_id == block.first) put = &stand_in;
      }
      if (put != &block.second) unlogged.push_back(&block);
    }
    batch.Put(blocks_, NumberedKey(write.stream_id, block.first), *put);
  }
  absl::Status written = Written(DbWrite(write_options_, &batch), "commit");
  if (written.ok() && !unlogged.empty()) {
    WriteUnlogged(write.stream_id, unlogged);
  }
  if (written.ok()) TuneBlobGc();  // At most once a second.
  return written;
}

absl::StatusOr<std::string> RocksColdStore::GetFrame(
    absl::string_view stream_id, uint64_t frame_index) {
  const std::string key = NumberedKey(stream_id, frame_index);
  absl::StatusOr<std::string> whole =
      GetChecked(&RocksColdStore::payloads_, key, [&] {
        return absl::StrCat("frame ", frame_index, " of stream ", stream_id);
      });
  if (!absl::IsNotFound(whole.status())) return whole;
  return GetPartedFrame(stream_id, frame_index);
}

absl::StatusOr<std::string> RocksColdStore::GetFrameMeta(
    absl::string_view stream_id, uint64_t frame_index) {
  return Get(
      &RocksColdStore::frame_meta_, NumberedKey(stream_id, frame_index),
      absl::StrCat("meta of frame ", frame_index, " of stream ", stream_id));
}

absl::StatusOr<std::string> RocksColdStore::GetBlockLayer(
    absl::string_view stream_id, uint64_t block_id, uint32_t layer) {
  const std::string key = LayerKey(stream_id, block_id, layer);
  return GetChecked(&RocksColdStore::block_layers_, key, [&] {
    return absl::StrCat("layer ", layer, " of block ", block_id, " of stream ",
                        stream_id);
  });
}

absl::StatusOr<std::string> RocksColdStore::GetChecked(
    rocksdb::ColumnFamilyHandle* RocksColdStore::*cf, const std::string& key,
    const std::function<std::string()>& what) {
  if (options_.verify_layers_with_rocksdb) {
    absl::StatusOr<std::string> v = Get(cf, key, what(), /*verify=*/true);
    if (v.ok()) StripLayerTrailer(key, &*v);
    return v;
  }
  // Our own checksum (RocksDB's off, and nothing it reads so kept in its
  // block cache unchecked); a record without a good one is read again
  // with RocksDB's: older records, or damaged ones (DATA_LOSS).
  absl::StatusOr<std::string> v = Get(cf, key, what(), /*verify=*/false);
  if (!v.ok() || StripLayerTrailer(key, &*v)) return v;
  // RocksDB's check passed: a trailer that checks now was damaged in
  // flight the first time; none (or one that does not check) is an older
  // record's last bytes, returned whole (a wrong size is the engine's
  // DATA_LOSS).
  v = Get(cf, key, what(), /*verify=*/true);
  if (v.ok()) StripLayerTrailer(key, &*v);
  return v;
}

absl::Status RocksColdStore::ScanBlocks(
    absl::string_view stream_id,
    const std::function<absl::Status(uint64_t, absl::string_view)>& fn) {
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

absl::StatusOr<std::vector<StreamRecord>> RocksColdStore::ListStreams() {
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
    if (out.empty() || out.back().stream_id != id) out.push_back({id, "", ""});
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

absl::Status RocksColdStore::DeleteStream(absl::string_view stream_id) {
  // Deleting is how space comes back: a few bytes of range tombstones,
  // allowed below the reserve and, on a full disk, given the spare's room
  // (rocks_disk_guard.cc).
  if (absl::Status g = WriteGate(/*freeing=*/true); !g.ok()) return g;
  kvmem::ReaderMutexLock lock(&db_mu_);
  KVMEM_STORE_OPEN_OR_RETURN();
  const std::string begin = StreamPrefix(stream_id);
  std::string end(stream_id);
  end.push_back('\x01');
  rocksdb::WriteBatch batch;
  for (auto* cf : {streams_, blocks_, payloads_, frame_meta_, block_layers_}) {
    batch.DeleteRange(cf, begin, end);
  }
  KVMEM_RETURN_IF_ERROR(
      Written(DbWrite(write_options_, &batch), "delete stream"));
  Reclaim(begin, end);
  return absl::OkStatus();
}

uint64_t RocksColdStore::ApproximatePayloadBytes() {
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

absl::Status RocksColdStore::RecordAcknowledged(
    const std::map<std::string, uint64_t>& frames) {
  // Every commit that returned is in the WAL (manual_wal_flush is off):
  // made durable first, the record never claims more than the disk holds.
  if (absl::Status st = SyncedMarker(); !st.ok()) return st;
  kvmem::MutexLock lock(&ack_mu_);  // One writer of the temporary file.
  return WriteFileDurably(path_, kAckFile, EncodeAckRecord(frames));
}

absl::StatusOr<std::map<std::string, uint64_t>> RocksColdStore::Acknowledged() {
  const std::string file = absl::StrCat(path_, "/", kAckFile);
  std::error_code ec;
  if (!std::filesystem::exists(file, ec) && !ec) {
    // Never recorded (a new store, or an older version's).
    return std::map<std::string, uint64_t>();
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
  return DecodeAckRecord(data, file);
}

// cf names the handle member: read under the lock, a reopen replaces it.
absl::StatusOr<std::string> RocksColdStore::Get(
    rocksdb::ColumnFamilyHandle* RocksColdStore::*cf, const std::string& key,
    const std::string& what, bool verify) {
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

RocksColdStore::RocksColdStore(const RocksColdStoreOptions& options)
    : options_(options),
      reserve_(options.reserve_bytes == RocksColdStoreOptions::kAutoReserve
                   ? AutoReserve(options)
                   : options.reserve_bytes),
      path_(options.path),
      listener_(std::make_shared<ErrorListener>(&failed_)) {
  write_options_.sync = options.wal_sync == WalSync::kEveryCommit;
}

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

// RocksColdStore: the ColdStore on RocksDB. Column families:
//   "streams":  <stream_id> 0x00 'c' -> config record; ... 'S' -> state record
//   "blocks":   <stream_id> 0x00 <block_id, 8 bytes big-endian> -> block record
//   "payloads": <stream_id> 0x00 <frame_index, 8 bytes BE> -> KV payload
//   "frame_meta": same key -> the frame's signals record
//   "block_layers": <stream_id> 0x00 <block_id BE> <layer, 4 bytes BE> -> one
//               layer of a demoted block (full precision or int8)
// Payloads and layers go to integrated blob files (key-value separation), so
// compaction does not rewrite megabytes of KV. The WAL is always on;
// wal_sync decides when it is fsynced.
//
// Thread safety: safe for concurrent use. The store's own locks (a reopen
// lock, a shared lock over every RocksDB call that a reopen after a full
// disk takes exclusively, and leaves for the last error, the
// acknowledgement file and the WAL sync thread) are documented with the
// class, storage/rocks_store.h; the files by responsibility: keys
// (rocks_keys.h), the acknowledgement record (ack_record.h), the layer
// records' checksum trailer (layer_trailer.h), opening the database
// (rocks_db.h), the disk guard (rocks_disk_guard.cc), reads and writes
// (rocks_cold_store.cc).
#ifndef KVMEM_STORAGE_ROCKS_COLD_STORE_H_
#define KVMEM_STORAGE_ROCKS_COLD_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/cold_store.h"

namespace kvmem {

// When the WAL reaches the disk. Under every policy a Commit has written
// its batch to the WAL (in the OS) before it returns, so a crash of the
// process (kill -9) loses nothing committed; they differ on power loss or a
// kernel crash:
//   kEveryCommit: Commit returns after fsync (concurrent commits share one
//                 fsync through RocksDB's write groups): nothing is lost.
//   kInterval:    a thread fsyncs the WAL every wal_sync_interval_ms: at most
//                 that much of the latest commits is lost.
//   kOff:         the OS writes back when it likes (Linux: dirty pages older
//                 than vm.dirty_expire_centisecs, 30 s by default).
enum class WalSync { kEveryCommit, kInterval, kOff };
// "commit", "interval", "off".
const char* WalSyncName(WalSync w);
bool ParseWalSync(const std::string& name, WalSync* out);

struct RocksColdStoreOptions {
  std::string path;
  WalSync wal_sync = WalSync::kInterval;
  uint32_t wal_sync_interval_ms = 200;  // kInterval only; >= 1.
  // Payloads at least this large go to blob files.
  uint64_t min_blob_size = 4096;
  // Block cache for metadata and small payloads.
  uint64_t block_cache_bytes = 64ull << 20;
  // Memtable size per column family (RAM held before a flush to disk).
  uint64_t write_buffer_bytes = 64ull << 20;
  // WAL recovery: false replays the WAL up to its first damaged record
  // (RocksDB's point-in-time recovery; the engine then compares each
  // stream with the acknowledgement record, see ColdStore::Acknowledged);
  // true fails Open on any damaged record but a torn last one.
  bool strict_wal = false;
  // Bytes the data dir keeps free: below them appends are refused with
  // RESOURCE_EXHAUSTED naming the dir (deletes and reads still work), so
  // RocksDB never meets a full disk in normal operation; a store whose
  // writes failed anyway (another process filled the disk) stops writing
  // and reopens by itself once this much is free. kAutoReserve: what the
  // memtables hold plus 64 MiB (rocks_db.cc AutoReserve); 0: no threshold (the
  // 8 MiB spare file of rocks_disk_guard.cc is still held, for deletions on a
  // full disk).
  static constexpr uint64_t kAutoReserve = UINT64_MAX;
  uint64_t reserve_bytes = kAutoReserve;
  // Frames and block layer records (the cold and degraded tiers' forms)
  // carry a CRC32C of their own (base/crc32c.h: SSE4.2 where the CPU has
  // it) in an 8-byte trailer, and are read with RocksDB's checksum off:
  // Debian's RocksDB checks blobs in software at ~1.6 GB/s. A record without
  // the trailer (written before, or with this false) is read with RocksDB's
  // check. A mismatch is DATA_LOSS either way. false: write records as before
  // (tests of stores written by older builds).
  bool layer_checksums = true;
  // A seal's block record logs a stand-in without its token groups (group
  // summaries and token codes: ~13 MB of a 7B block's 13.3 MB record), and
  // the full record goes to the memtable outside the WAL: written once to
  // disk, at the flush, instead of twice. A crash before that flush leaves
  // the stand-in, and recovery builds the groups again from the block's
  // frames (the same groups: the seal is deterministic). true: log the full
  // record (kvmem-server --log_token_groups).
  bool log_token_groups = false;
  // Read frames and layer records with RocksDB's own check only (one
  // verified Get): the reference `kvmem bench --fetch` measures the
  // trailer against.
  bool verify_layers_with_rocksdb = false;
};

// Opens (creating if missing) the store at options.path.
absl::StatusOr<std::unique_ptr<ColdStore>> OpenRocksColdStore(
    const RocksColdStoreOptions& options);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_COLD_STORE_H_

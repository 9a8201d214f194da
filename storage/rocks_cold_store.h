// RocksColdStore: the ColdStore on RocksDB. Column families:
//   "streams":  <stream_id> 0x00 'c' -> config record; ... 'S' -> state record
//   "blocks":   <stream_id> 0x00 <block_id, 8 bytes big-endian> -> block record
//   "payloads": <stream_id> 0x00 <frame_index, 8 bytes BE> -> KV payload
//   "frame_meta": same key -> the frame's signals record
//   "block_layers": <stream_id> 0x00 <block_id BE> <layer, 4 bytes BE> -> one
//               layer of a demoted block (full precision or int8)
// Payloads and layers go to integrated blob files (key-value separation), so
// compaction does not rewrite megabytes of KV. The WAL is always on;
// sync_writes decides whether a commit waits for fsync.
//
// Thread safety: safe for concurrent use (RocksDB's own guarantees).
#ifndef KVMEM_STORAGE_ROCKS_COLD_STORE_H_
#define KVMEM_STORAGE_ROCKS_COLD_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/cold_store.h"

namespace kvmem {

struct RocksColdStoreOptions {
  std::string path;
  // true: every Commit fsyncs the WAL before returning (survives power loss).
  // false: the WAL is written to the OS before returning (survives a process
  // crash or kill -9, not a power loss).
  bool sync_writes = false;
  // Payloads at least this large go to blob files.
  uint64_t min_blob_size = 4096;
  // Block cache for metadata and small payloads.
  uint64_t block_cache_bytes = 64ull << 20;
  // Memtable size per column family (RAM held before a flush to disk).
  uint64_t write_buffer_bytes = 64ull << 20;
};

// Opens (creating if missing) the store at options.path.
absl::StatusOr<std::unique_ptr<ColdStore>> OpenRocksColdStore(
    const RocksColdStoreOptions& options);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_COLD_STORE_H_

// A local read cache in front of a remote cold store (the shared tier on
// RADOS): the payloads a server reads from the remote store (frames, block
// layer records) are kept in a RocksDB on the server's own disk, so a block
// read again is read locally, and keeps being served while the remote
// store cannot be reached. kvmem-server --store_cache=DIR puts one in front
// of a rados: store (docs/durable-tier.md, "A local read cache").
//
// What it keeps: GetFrame / GetFrames / GetBlockLayer / GetBlockLayers
// answers, as the inner store returned them (read-through); with
// write_through also the frames and layer records this server commits
// (after the inner Commit returned OK). Records, metas, the manifest and
// the acknowledgement record always go to the inner store: a recovery or a
// takeover needs the remote store.
//
// Why it is never stale: every payload a cache entry holds is one the inner
// store held under the same key at some point, and the entry goes when that
// can change:
// - Commit drops the entries of every frame and layer record the write
//   puts or deletes (before it returns, whatever its status);
// - ClaimStream, ReleaseStream and DeleteStream drop all of the stream's
//   entries (another server may write the stream between a release and the
//   next claim);
// - a read-through insert is skipped when a Commit, claim, release or
//   delete of the same stream ran while the inner read was in flight (a
//   per-stream generation), so an old answer cannot land after the drop.
// The cache belongs to the process: it is emptied when opened (what a
// previous run kept may have been overwritten by another owner since).
//
// Bounds: `capacity_bytes` of table files on disk (RocksDB's FIFO
// compaction drops the oldest when they pass it: first in, first out, not
// LRU) plus one memtable (a quarter of the capacity, at most 64 MiB). Writes
// into it skip RocksDB's write-ahead log (nothing survives a restart
// anyway). A failed insert (a full disk) is counted and ignored: the read
// still answers from the inner store. Reads check RocksDB's block
// checksums; damage found there is treated as a miss.
//
// Thread safety: as the inner store's; every method may be called from
// any thread.
#ifndef KVMEM_STORAGE_READ_CACHE_STORE_H_
#define KVMEM_STORAGE_READ_CACHE_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/cold_store.h"

namespace kvmem {

struct ReadCacheOptions {
  std::string path;                      // Required: a local directory.
  uint64_t capacity_bytes = 4ull << 30;  // Table files on disk.
  bool write_through = false;            // Also keep what this server commits.
};

// What the cache did since it opened (read at any time, e.g. by metrics).
struct ReadCacheCounters {
  std::atomic<uint64_t> hits{0};    // Payloads answered locally.
  std::atomic<uint64_t> misses{0};  // Payloads read from the inner store.
  std::atomic<uint64_t> hit_bytes{0};
  std::atomic<uint64_t> inserted_bytes{0};
  std::atomic<uint64_t> insert_errors{0};    // Inserts that failed (ignored).
  std::atomic<uint64_t> skipped_inserts{0};  // Raced with a change.
  // Misses the inner store failed (other than NOT_FOUND): during an outage
  // this grows while the hits are what the cache still served.
  std::atomic<uint64_t> inner_errors{0};
};

// `inner` with a read cache in front. INVALID_ARGUMENT for an empty path or
// a capacity below 64 MiB; the directory's RocksDB error when it cannot be
// created or opened. `counters` (optional) receives the cache's counters,
// valid as long as the returned store lives.
absl::StatusOr<std::unique_ptr<ColdStore>> WithReadCache(
    std::unique_ptr<ColdStore> inner, const ReadCacheOptions& options,
    const ReadCacheCounters** counters = nullptr);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_READ_CACHE_STORE_H_

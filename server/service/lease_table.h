// LeaseTable: the ranges of one shared-memory arena (server/service/
// shm_arenas.h) handed out as leases: first fit over a free list that
// merges neighbours, leases that expire (reclaimed only when a request
// needs the room), and a memory of reclaimed ids so a late release can be
// told its bytes may have been overwritten.
//
// Thread safety: all methods from any thread.
#ifndef KVMEM_SERVER_SERVICE_LEASE_TABLE_H_
#define KVMEM_SERVER_SERVICE_LEASE_TABLE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/sync.h"

namespace kvmem {

class LeaseTable {
 public:
  // arena_id names the arena in messages; bytes is its size.
  LeaseTable(uint64_t arena_id, uint64_t bytes);

  // (lease id, offset) of a free range of `bytes`, first fit; when none is
  // free, reclaims the expired leases (*reclaimed counts them) and tries
  // again. RESOURCE_EXHAUSTED when live leases leave no room. The new lease
  // cannot expire until Start: the server is still writing it.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Allocate(uint64_t bytes,
                                                         uint64_t* reclaimed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The lease's bytes are written and on their way: it may expire `lease`
  // from now.
  void Start(uint64_t lease_id, std::chrono::milliseconds lease)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Releases live leases; ids reclaimed earlier go to *expired. An id that
  // is neither is INVALID_ARGUMENT and nothing is released.
  absl::Status Release(const std::vector<uint64_t>& ids, uint32_t* released,
                       std::vector<uint64_t>* expired) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees a lease at once (its response was never sent).
  void Abandon(uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);

  struct Totals {
    uint64_t leases = 0, bytes = 0;
  };
  Totals Live() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Range {
    uint64_t offset = 0, bytes = 0;
    std::chrono::steady_clock::time_point expires;
  };
  std::optional<uint64_t> FirstFit(uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns a range to the free list, merged with its neighbours.
  void Free(const Range& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remember(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t arena_id_, bytes_;
  mutable kvmem::Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  std::map<uint64_t, Range> leases_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> reclaimed_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_LEASE_TABLE_H_

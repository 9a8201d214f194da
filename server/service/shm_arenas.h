// ShmArenas: the shared-memory data plane for clients on the server's host.
//
// A client connected over the unix socket asks for an arena
// (AttachSharedMemory): the server creates a memfd of that size (sealed
// against growing and shrinking), maps it, and answers with the arena's id,
// a one-time token and the path of a second unix socket, the hand-off
// socket. The client connects there and sends the token; the server answers
// with the arena's id and a *read-only* descriptor of the memfd, passed with
// SCM_RIGHTS. The client maps it PROT_READ and keeps that connection open:
// the arena lives as long as it does, so a client that dies (its socket
// closes with it) frees its arena at once.
//
// Why memfd + SCM_RIGHTS: the descriptor reaches exactly the process that
// proved it holds the token (which only the tenant that asked for the
// arena got, over its authenticated call); nothing is named in /dev/shm for
// another process of the same user to open, nothing outlives both ends, and
// a read-only descriptor means the client cannot write the server's bytes.
//
// Fetches and recalls that ask for shared-memory delivery reserve a range of
// the arena (a lease), write the KV bytes there (one copy from RAM or from
// the store's read) and answer with offsets. The client releases a lease
// when done with its bytes (ReleaseLeases); a lease not released within
// lease_ms is reclaimed at the next reservation that needs room, and its
// bytes may then be overwritten: ReleaseLeases reports such leases as
// expired, so a client knows its read may have been torn.
//
// Thread safety: all methods from any thread.
#ifndef KVMEM_SERVER_SERVICE_SHM_ARENAS_H_
#define KVMEM_SERVER_SERVICE_SHM_ARENAS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/sync.h"

namespace kvmem {

struct ShmOptions {
  // The hand-off socket (created owner-only); empty: no shared memory.
  std::string socket_path;
  // The largest arena one client may ask for, and all arenas together.
  uint64_t max_arena_bytes = 1ull << 30;
  uint64_t max_total_bytes = 4ull << 30;
  // Per tenant (attached or waiting for their hand-off): at most this many
  // arenas (each holds a descriptor: without a cap one client could take
  // every descriptor the process may open, and then the listeners cannot
  // accept), and at most this many bytes of arenas (0: max_total_bytes;
  // the server sets an equal share of it per tenant of its keys).
  uint32_t max_arenas_per_tenant = 64;
  uint64_t max_tenant_bytes = 0;
  // A lease older than this may be reclaimed (its bytes overwritten).
  std::chrono::milliseconds lease{30000};
  // A token not picked up on the hand-off socket within this is void (and
  // its arena freed).
  std::chrono::milliseconds attach_timeout{10000};
};

// Lease ids one call may name (ReleaseLeases.lease_ids, a delivery's
// release_lease_ids); more is INVALID_ARGUMENT naming `field`.
inline constexpr int kMaxLeaseIdsPerCall = 65536;
absl::Status CheckLeaseIds(int ids, absl::string_view field);

struct ShmStats {
  uint64_t arenas = 0;       // Attached or waiting for their hand-off.
  uint64_t arena_bytes = 0;  // Their sizes summed.
  uint64_t leases = 0;       // Live (not released, not reclaimed).
  uint64_t leased_bytes = 0;
  uint64_t reclaimed_leases = 0;  // Expired leases taken back, all time.
  uint64_t dead_clients = 0;      // Arenas freed because their client left.
};

class ShmArenas {
 public:
  // Binds the hand-off socket and starts its thread.
  static absl::StatusOr<std::unique_ptr<ShmArenas>> Start(ShmOptions options);
  // Stops the thread, closes every arena and removes the socket.
  ~ShmArenas();

  struct Created {
    uint64_t arena_id = 0;
    std::string token;  // 32 hex digits, good for one hand-off.
    uint64_t bytes = 0;
  };
  // A new arena of `bytes` (0: the largest that fits now, Count) for the
  // tenant.
  // INVALID_ARGUMENT above max_arena_bytes; RESOURCE_EXHAUSTED when the
  // tenant holds max_arenas_per_tenant arenas already, or when its arenas
  // would exceed max_tenant_bytes or all arenas max_total_bytes.
  absl::StatusOr<Created> Create(const std::string& tenant, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  class Arena;
  // A reserved range the server writes a response's bytes to. Holding it
  // keeps the server's mapping alive even if the client leaves meanwhile.
  struct Lease {
    std::shared_ptr<Arena> arena;
    uint64_t lease_id = 0;
    uint64_t offset = 0;  // In the arena; a multiple of 4 KiB.
    uint64_t bytes = 0;
    uint8_t* data = nullptr;  // The server's view of [offset, offset+bytes).
  };
  // Reserves `bytes` of the tenant's arena. NOT_FOUND for an arena this
  // server does not know for the tenant (another tenant's, freed, or made
  // before a restart); FAILED_PRECONDITION before its hand-off;
  // RESOURCE_EXHAUSTED when live leases leave no room.
  absl::StatusOr<Lease> Reserve(const std::string& tenant, uint64_t arena_id,
                                uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The lease's bytes are written: its lease time starts (until then it
  // cannot be reclaimed).
  void Written(const Lease& lease);
  // Gives back a reservation whose response was never sent (an error, a
  // cancelled call).
  void Abandon(const Lease& lease);

  struct Released {
    uint32_t released = 0;
    std::vector<uint64_t> expired;  // Reclaimed before the release.
  };
  absl::StatusOr<Released> Release(const std::string& tenant, uint64_t arena_id,
                                   const std::vector<uint64_t>& lease_ids)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases those of lease_ids that are live leases of the tenant's arena
  // and ignores the rest (releases that ride on a later delivery).
  void ReleaseLive(const std::string& tenant, uint64_t arena_id,
                   absl::Span<const uint64_t> lease_ids)
      ABSL_LOCKS_EXCLUDED(mu_);

  ShmStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const ShmOptions& options() const { return options_; }

 private:
  explicit ShmArenas(ShmOptions options) : options_(std::move(options)) {}
  void Serve() ABSL_LOCKS_EXCLUDED(mu_);
  // conn sent `token`: gives it its arena's descriptor, or closes it.
  void HandOff(int conn, absl::string_view token) ABSL_LOCKS_EXCLUDED(mu_);
  void Drop(uint64_t arena_id, bool dead_client) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Arena> Find(const std::string& tenant,
                              uint64_t arena_id) const ABSL_LOCKS_EXCLUDED(mu_);

  const ShmOptions options_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // A pipe that stops Serve.
  std::thread thread_;

  // Guards the arena map and the totals; never held across a system call
  // on an arena or across a lease table's lock.
  mutable kvmem::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Arena>> arenas_
      ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  struct TenantArenas {
    uint32_t arenas = 0;
    uint64_t bytes = 0;
  };
  // Each tenant's arenas counted in arenas_ (and those being created);
  // entries go when their counts reach zero.
  absl::flat_hash_map<std::string, TenantArenas> tenant_use_
      ABSL_GUARDED_BY(mu_);
  // Counts a new arena of `bytes` (0: the largest whole pages the limits
  // leave room for now) for the tenant and returns its size, or
  // RESOURCE_EXHAUSTED naming the limit it would pass.
  absl::StatusOr<uint64_t> Count(const std::string& tenant, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back a tenant's arena of `bytes` from the totals.
  void Uncount(const std::string& tenant, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t reclaimed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dead_clients_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_SHM_ARENAS_H_

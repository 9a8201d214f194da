// EtcdClient: the few calls of etcd's v3 API (gRPC, stubs generated from
// Debian's golang-etcd-server-dev protos: proto/CMakeLists.txt) that stream
// ownership needs: leases (grant, keep alive, revoke) and a key created only
// when absent, under a lease, whose create revision is the fencing token
// (etcd's revisions only grow, so a later owner's token is larger).
//
// Every call has a deadline (EtcdOptions::call_timeout); the channel sends
// gRPC keepalive pings, so a half-open connection to a paused or
// partitioned etcd fails calls instead of hanging them. Statuses: the
// gRPC status of the call (UNAVAILABLE, DEADLINE_EXCEEDED, ...) with the
// endpoint named; NOT_FOUND for a lease etcd no longer has.
//
// Several members (a cluster's client URLs, comma-separated): calls go to
// the member in use. One that cannot be reached (UNAVAILABLE: refused,
// down, no leader: calls carry etcd's require-leader metadata, so a member
// without one answers at once) passes the call on to the next, each member
// tried once within the call; one that does not answer within the deadline
// (paused, partitioned) fails that call, and the next call starts at the next
// member. Every call is safe to repeat on another member: a lease granted
// twice leaves an unused one that expires, a key created by an attempt
// whose answer was lost is found by the repeat with this lease (the same
// holding), renewals, revocations, reads and deletes are idempotent.
//
// Thread safety: every method may be called from any thread.
#ifndef KVMEM_SERVER_OWNERSHIP_ETCD_CLIENT_H_
#define KVMEM_SERVER_OWNERSHIP_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvmem {

// At most this many members in EtcdOptions::endpoint.
inline constexpr size_t kMaxEtcdMembers = 16;

struct EtcdOptions {
  // host:port of an etcd member (its client URL), or several members'
  // separated by commas: calls go to one member and move on to the next
  // when it cannot be reached or does not answer in time (EtcdClient).
  std::string endpoint;
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration keepalive_time = absl::Seconds(10);
};

// A key's holder as etcd stores it.
struct EtcdHolder {
  std::string value;
  int64_t lease = 0;
  int64_t create_revision = 0;  // The fencing token of this holding.
};

// The members of EtcdOptions::endpoint; INVALID_ARGUMENT for an empty
// list, an empty or repeated member, or more than kMaxEtcdMembers.
absl::StatusOr<std::vector<std::string>> EtcdMembers(
    const std::string& endpoints);

class EtcdClient {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const EtcdOptions& options);
  virtual ~EtcdClient() = default;

  // A lease of `ttl` (whole seconds, at least 1); its id.
  virtual absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) = 0;
  // Renews the lease once; the TTL etcd granted. NOT_FOUND when the lease
  // has expired or was revoked.
  virtual absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) = 0;
  virtual absl::Status RevokeLease(int64_t lease) = 0;

  // Creates key = value under `lease` if the key does not exist, in one
  // transaction. Either way returns the key's holder afterwards: this one
  // (lease equal, a new create revision) or the one that was there.
  virtual absl::StatusOr<EtcdHolder> CreateIfAbsent(const std::string& key,
                                                    const std::string& value,
                                                    int64_t lease) = 0;
  // The key's holder, or nullopt when the key does not exist.
  virtual absl::StatusOr<std::optional<EtcdHolder>> Get(
      const std::string& key) = 0;
  // Deletes the key if `lease` holds it (a clean hand-over).
  virtual absl::Status DeleteIfHeld(const std::string& key, int64_t lease) = 0;
  // The member calls go to now (host:port).
  virtual std::string member() const = 0;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_OWNERSHIP_ETCD_CLIENT_H_

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
// Thread safety: every method may be called from any thread.
#ifndef KVMEM_SERVER_OWNERSHIP_ETCD_CLIENT_H_
#define KVMEM_SERVER_OWNERSHIP_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvmem {

struct EtcdOptions {
  std::string endpoint;  // host:port of one etcd member (its client URL).
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration keepalive_time = absl::Seconds(10);
};

// A key's holder as etcd stores it.
struct EtcdHolder {
  std::string value;
  int64_t lease = 0;
  int64_t create_revision = 0;  // The fencing token of this holding.
};

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
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_OWNERSHIP_ETCD_CLIENT_H_

// EtcdOwnership: stream ownership (engine/ownership.h) through etcd, for
// servers sharing a RADOS store.
//
// - A server holds one etcd lease (TTL: `ttl`) and renews it every ttl/3
//   on its own thread. Each stream it owns is a key "<prefix>streams/<id>"
//   whose value is the server's address (`advertise`), created only when
//   absent and attached to that lease; the key's create revision is the
//   holding's fencing token, which the engine claims the stream's head in
//   the store with (a later holding's revision is larger, so the store
//   itself refuses the earlier owner's writes).
// - One lease for all streams (as etcd's own concurrency sessions do):
//   renewals cost one call per ttl/3 whatever the number of streams, and
//   all of a server's streams lapse together when it stops renewing.
// - The server counts its lease as valid until the send time of the last
//   renewal etcd answered plus the TTL etcd granted, on the monotonic clock,
//   and stops serving (CheckServing: UNAVAILABLE) a safety margin (ttl/6,
//   at least 500 ms) before that: it stops writing before the lease can
//   expire. Past that point every stream it held is dropped (OnLost); it
//   goes on renewing, and streams are taken up again on demand when the
//   lease answers again (etcd restarted and kept it) or under a new lease.
// - Acquire on a key held by another lease answers UNAVAILABLE naming the
//   holder's address (WithOwner), which the service puts in the call's
//   trailing metadata (kvmem-owner) for clients to follow.
// - An owner that is gone does not hold its streams until its lease
//   expires: Acquire on a key held by another server's lease first probes
//   that server's address (ProbePeer, `probe_timeout`); when every address
//   refuses the connection (nothing listens there: the process was killed
//   or crashed) it revokes that lease, which frees every stream the dead
//   server held, and takes the stream. A paused, slow or unreachable owner
//   does not refuse, and keeps its streams until its lease expires. An
//   owner on another host's loopback is not probed (only a server that is
//   itself on loopback can see it), nor one probed in the last 250 ms that
//   did not refuse. Safety does not rest on the probe: a stream taken from
//   an owner that was alive after all is fenced by the store.
// - The destructor revokes the lease: a stopped server hands its streams
//   over at once instead of after the TTL.
#ifndef KVMEM_SERVER_OWNERSHIP_ETCD_OWNERSHIP_H_
#define KVMEM_SERVER_OWNERSHIP_ETCD_OWNERSHIP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "base/timing.h"
#include "engine/ownership.h"
#include "server/ownership/etcd_client.h"

namespace kvmem {

struct EtcdOwnershipOptions {
  EtcdOptions etcd;
  std::string key_prefix = "kvmem/";
  // This server's address as clients reach it (host:port); the value of
  // every key it holds.
  std::string advertise;
  absl::Duration ttl = absl::Seconds(10);
  // How long Acquire waits for an owner's address to refuse a connection
  // before leaving its streams to its lease; zero: never probe.
  absl::Duration probe_timeout = absl::Milliseconds(250);
  // Told when the lease lapses, renews again, or a call to etcd fails.
  std::function<void(const std::string&)> warn;
};

class EtcdOwnership final : public StreamOwnership {
 public:
  // Connects, grants the lease and starts renewing it. INVALID_ARGUMENT
  // for an empty advertise address or endpoint or a TTL under 2 s;
  // UNAVAILABLE when etcd does not answer.
  static absl::StatusOr<std::unique_ptr<EtcdOwnership>> Start(
      const EtcdOwnershipOptions& options);
  ~EtcdOwnership() override;

  absl::StatusOr<uint64_t> Acquire(const std::string& id) override;
  void Release(const std::string& id) override;
  absl::Status Moved(const std::string& id, const absl::Status& cause) override;
  absl::Status CheckServing() override;
  void OnLost(std::function<void(const absl::Status&)> fn) override;

  // The key of a stream.
  std::string Key(const std::string& id) const;
  int64_t lease() const;

 private:
  EtcdOwnershipOptions options_;
  std::unique_ptr<EtcdClient> etcd_;
  explicit EtcdOwnership(const EtcdOwnershipOptions& options,
                         std::unique_ptr<EtcdClient> etcd);
  void RenewLoop();
  // Renews once (or grants a new lease when the old one is gone).
  void RenewOnce();
  // Stops serving and tells OnLost's callback, once per lapse (again: also
  // when this lapse was told already).
  void Lose(const absl::Status& why, bool again = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration Margin() const;
  // The key's holder after creating it under `lease` if absent.
  absl::StatusOr<EtcdHolder> Claim(const std::string& id, int64_t lease);
  // True when the server at `address` is gone (refuses connections) and
  // may have its lease revoked (see above).
  bool OwnerGone(const std::string& address) ABSL_LOCKS_EXCLUDED(probe_mu_);

  mutable kvmem::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  SteadyClock::time_point valid_until_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;     // Streams dropped since.
  bool failing_ ABSL_GUARDED_BY(mu_) = false;  // Told once per spell.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  kvmem::Mutex lost_mu_;  // Held while the OnLost callback runs.
  std::function<void(const absl::Status&)> on_lost_ ABSL_GUARDED_BY(lost_mu_);
  std::thread renewer_;
  kvmem::Mutex probe_mu_;
  // Owners that did not refuse a probe, and until when that answer stands.
  absl::flat_hash_map<std::string, SteadyClock::time_point> probed_
      ABSL_GUARDED_BY(probe_mu_);
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_OWNERSHIP_ETCD_OWNERSHIP_H_

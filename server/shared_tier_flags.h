// kvmem-server's flags for the shared durable tier (--store=rados:POOL):
// the Ceph cluster, the local read cache in front of it, and ownership
// through etcd; part of the kvmem-server binary (server/main.cc has the
// rest).
#ifndef KVMEM_SERVER_SHARED_TIER_FLAGS_H_
#define KVMEM_SERVER_SHARED_TIER_FLAGS_H_

#include "absl/status/status.h"
#include "server/server.h"

namespace kvmem {

// Fills o->rados, o->store_cache and the ownership options from the flags;
// INVALID_ARGUMENT naming a flag out of range.
absl::Status SharedTierOptionsFromFlags(ServerOptions* o);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SHARED_TIER_FLAGS_H_

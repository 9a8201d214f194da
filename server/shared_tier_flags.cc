#include "server/shared_tier_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, ceph_conf, "",
          "With --store=rados:POOL: the Ceph cluster's configuration file "
          "(empty: librados' search, CEPH_CONF then /etc/ceph/ceph.conf).");
ABSL_FLAG(std::string, ceph_user, "client.admin",
          "With --store=rados:POOL: the Ceph user this server connects as "
          "(its key from the keyring ceph.conf names), e.g. client.kvmem "
          "with caps mon 'allow r' and osd 'allow rwx pool=POOL'.");
ABSL_FLAG(std::string, rados_prefix, "",
          "With --store=rados:POOL: prepended to every stream's RADOS "
          "namespace and to the stream index: deployments with different "
          "prefixes share a pool without seeing each other's streams.");
ABSL_FLAG(int32_t, rados_timeout_ms, 30000,
          "With --store=rados:POOL: the deadline of every RADOS operation "
          "(>= 1000); a commit past it fails UNAVAILABLE and is never "
          "acknowledged.");
ABSL_FLAG(std::string, store_cache, "",
          "With --store=rados:POOL: a local directory for a read cache of "
          "the frames and layer records this server reads from RADOS (a "
          "RocksDB, emptied at start); reads it holds are served locally, "
          "also while RADOS cannot be reached. Empty: no cache.");
ABSL_FLAG(int64_t, store_cache_mib, 4096,
          "With --store_cache: its size on disk in MiB (>= 64; the oldest "
          "entries go first), plus one memtable in RAM (a quarter of it, at "
          "most 64 MiB).");
ABSL_FLAG(bool, store_cache_write_through, false,
          "With --store_cache: also keep the frames and layer records this "
          "server writes (every ingested byte is then written to the local "
          "disk too).");
ABSL_FLAG(std::string, etcd, "",
          "etcd's client address (host:port), or its members' separated by "
          "commas (calls move on from a member that is down or does not "
          "answer): stream ownership for servers "
          "sharing --store=rados:POOL. Each stream is served by one server "
          "at a time, holding an etcd key under its lease; others redirect "
          "clients to it (UNAVAILABLE, trailing metadata kvmem-owner). "
          "Empty: this server owns every stream of its store.");
ABSL_FLAG(std::string, etcd_prefix, "kvmem/",
          "With --etcd: the prefix of this deployment's keys in etcd.");
ABSL_FLAG(std::string, advertise, "",
          "With --etcd: this server's address as clients reach it "
          "(host:port), which other servers redirect clients to; empty: "
          "--listen when it names a host and a port.");
ABSL_FLAG(int32_t, ownership_ttl_s, 10,
          "With --etcd: the TTL of this server's ownership lease in seconds "
          "(2..300); renewed every third of it. A server that cannot renew "
          "stops serving before it can expire; another server takes its "
          "streams over once it has.");

ABSL_FLAG(int32_t, ownership_probe_ms, 250,
          "With --etcd: asked for a stream another server holds, this server "
          "first connects to that owner's address for at most this long; "
          "when it refuses (nothing listens: the process died), its lease is "
          "revoked and the stream taken over at once instead of after the "
          "lease's TTL. 0: never probe (wait for the lease). 0..5000.");

namespace kvmem {

absl::Status SharedTierOptionsFromFlags(ServerOptions* o) {
  o->rados.ceph_conf = absl::GetFlag(FLAGS_ceph_conf);
  o->rados.prefix = absl::GetFlag(FLAGS_rados_prefix);
  o->rados.client_name = absl::GetFlag(FLAGS_ceph_user);
  const int32_t rados_ms = absl::GetFlag(FLAGS_rados_timeout_ms);
  if (rados_ms < 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rados_timeout_ms is ", rados_ms, "; must be at least 1000"));
  }
  o->rados.op_timeout = absl::Milliseconds(rados_ms);
  o->store_cache.path = absl::GetFlag(FLAGS_store_cache);
  const int64_t cache_mib = absl::GetFlag(FLAGS_store_cache_mib);
  if (cache_mib < 64 || cache_mib > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--store_cache_mib is ", cache_mib, "; must be in 64..", 1 << 30));
  }
  o->store_cache.capacity_bytes = static_cast<uint64_t>(cache_mib) << 20;
  o->store_cache.write_through = absl::GetFlag(FLAGS_store_cache_write_through);
  o->etcd = absl::GetFlag(FLAGS_etcd);
  o->etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
  o->advertise = absl::GetFlag(FLAGS_advertise);
  const int32_t ttl_s = absl::GetFlag(FLAGS_ownership_ttl_s);
  if (ttl_s < 2 || ttl_s > 300) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ownership_ttl_s is ", ttl_s, "; must be in 2..300"));
  }
  o->ownership_ttl = absl::Seconds(ttl_s);
  const int32_t probe_ms = absl::GetFlag(FLAGS_ownership_probe_ms);
  if (probe_ms < 0 || probe_ms > 5000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ownership_probe_ms is ", probe_ms, "; must be in 0..5000"));
  }
  o->ownership_probe = absl::Milliseconds(probe_ms);
  return absl::OkStatus();
}

}  // namespace kvmem

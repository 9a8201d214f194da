// RadosColdStore: the ColdStore contract (storage/cold_store.h) on a Ceph
// RADOS pool, for streams that must outlive the server that ingests them.
//
// Layout, per stream, in the RADOS namespace named by the stream id (after
// RadosColdStoreOptions::prefix):
// - "head": its omap holds the small records (config "c", state "s", frame
//   metas "m/<frame>", the acknowledged mark "a") and the manifest of
//   payload objects ("f/<frame>", "b/<block>" and "l/<block>/<layer>":
//   object name, offset, length); its xattr
//   "kvmem.epoch" holds the epoch of the store instance that owns the
//   stream.
// - payload objects, immutable: "f.<frame>.<epoch>.<seq>" (a frame),
//   "b.<block>.<epoch>.<seq>" (a block record: tens of KiB with summaries
//   and token codes, read in parallel at recovery) and
//   "l.<block>.<epoch>.<seq>" (the layers one commit wrote for a block,
//   concatenated). Names carry the writer's epoch, so a fenced writer never
//   overwrites its successor's objects, and end in their size: each is
//   striped over 4 MiB RADOS objects (rados_io.h).
// And in the pool's default namespace, "<prefix>kvmem.streams": an omap of
// stream ids, for ListStreams.
//
// Commit writes the payload objects in parallel (aio, each write_full
// returns once every replica has it on disk), then commits with one
// compound operation on the head: compare the epoch, remove the deleted
// keys, set the new ones. That operation is the commit point: readers
// follow the manifest, so a payload object is invisible until its head
// commit, and an error before or at the head changes nothing a read sees.
// Objects no record refers to any more are removed after the commit (left
// behind by a crash, they are removed with the stream).
//
// Ownership: a store instance owns every stream it touches. The first touch
// claims the stream: the head's epoch goes from e to e + 1 (or to
// `fencing_token` when one is given, which must be larger) with a compare
// on e, and only then is the manifest read. Every later head commit of the
// earlier owner fails its compare inside RADOS and is ABORTED, changing
// nothing; that instance never writes the stream again. Until ownership
// comes from a coordinator (etcd leases), give each server its own pool:
// a second server opening the same pool takes over each stream it lists.
//
// Every call has a deadline (`op_timeout`, librados' rados_osd_op_timeout
// and rados_mon_op_timeout): a commit that times out is UNAVAILABLE with
// its outcome unknown (the contract's one exception), and the stream's
// manifest is read again before its next use.
#ifndef KVMEM_STORAGE_RADOS_COLD_STORE_H_
#define KVMEM_STORAGE_RADOS_COLD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/cold_store.h"

namespace kvmem {

struct RadosColdStoreOptions {
  std::string pool;       // Required; must exist.
  std::string ceph_conf;  // Empty: librados' search (CEPH_CONF, /etc/ceph).
  std::string client_name = "client.admin";
  // Prepended to every stream's namespace and to the index object's name:
  // stores with different prefixes share a pool without seeing each other
  // (tests use one per test).
  std::string prefix;
  // 0: each claim takes the stream's epoch + 1. Otherwise the epoch every
  // claim sets (a coordinator's fencing token), refused when not larger
  // than the stored one.
  uint64_t fencing_token = 0;
  absl::Duration op_timeout = absl::Seconds(30);
};

// Connects to the cluster and opens the pool. FAILED_PRECONDITION when the
// pool does not exist, UNAVAILABLE when the
// cluster cannot be reached within op_timeout, INVALID_ARGUMENT for an
// empty pool name or an unreadable ceph_conf.
absl::StatusOr<std::unique_ptr<ColdStore>> OpenRadosColdStore(
    const RadosColdStoreOptions& options);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_RADOS_COLD_STORE_H_

// Which cold store a server opens, named by one string (kvmem-server
// --store):
//   rocksdb:DIR  RocksDB in DIR, created if missing (the default:
//                rocksdb:<--data_dir>); RocksColdStoreOptions tune it.
//   memory:      in memory (NewMemColdStore): nothing survives the process;
//                for tests and demos.
//   rados:POOL   a Ceph RADOS pool (storage/rados_cold_store.h): the shared
//                durable tier; RadosColdStoreOptions name the cluster.
// Any other scheme is INVALID_ARGUMENT naming the schemes this build has.
// server/ opens its store only through OpenColdStore and uses only the
// ColdStore contract (storage/cold_store.h).
#ifndef KVMEM_STORAGE_STORE_FACTORY_H_
#define KVMEM_STORAGE_STORE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/cold_store.h"
#include "storage/rados_cold_store.h"
#include "storage/rocks_cold_store.h"

namespace kvmem {

struct StoreSpec {
  enum class Kind { kRocksDb, kMemory, kRados };
  Kind kind = Kind::kRocksDb;
  std::string location;  // kRocksDb: the directory; kRados: the pool.

  bool durable() const { return kind != Kind::kMemory; }
  // The spec as ParseStoreSpec reads it ("rocksdb:DIR", "memory:",
  // "rados:POOL").
  std::string ToString() const;
};

// INVALID_ARGUMENT (naming the text and the schemes) for an unknown scheme,
// a missing ':', an empty rocksdb directory or rados pool.
absl::StatusOr<StoreSpec> ParseStoreSpec(absl::string_view text);

// Opens the store `spec` names. rocksdb: `rocks` with its path replaced by
// the spec's directory; rados: `rados` with its pool replaced by the
// spec's.
absl::StatusOr<std::unique_ptr<ColdStore>> OpenColdStore(
    const StoreSpec& spec, const RocksColdStoreOptions& rocks,
    const RadosColdStoreOptions& rados = {});

}  // namespace kvmem

#endif  // KVMEM_STORAGE_STORE_FACTORY_H_

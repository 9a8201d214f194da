// A ColdStore decorator that gives any backend's block layer records the
// CRC32C trailer RocksColdStore writes itself (storage/layer_trailer.h: the
// CRC covers the record's logical key, rocks_keys.h LayerKey, then its
// bytes): Commit appends it to every layer record, reads check and strip
// it, and a record that fails the check (damaged, cut short, written
// without one, or another key's bytes) is DATA_LOSS naming the layer,
// never wrong bytes. Everything else goes to the inner store unchanged.
//
// RocksColdStore does not need it: it writes the same trailer without a
// copy (SliceParts) and, on a failed check, falls back to RocksDB's own
// checksum to tell older records from damaged ones. A remote backend (the
// shared tier) gets end-to-end checking from this. Commit copies the write
// (its frame stays a view of the caller's bytes) to append the trailers.
#ifndef KVMEM_STORAGE_CHECKSUMMED_STORE_H_
#define KVMEM_STORAGE_CHECKSUMMED_STORE_H_

#include <memory>

#include "storage/cold_store.h"

namespace kvmem {

std::unique_ptr<ColdStore> WithLayerChecksums(std::unique_ptr<ColdStore> inner);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_CHECKSUMMED_STORE_H_

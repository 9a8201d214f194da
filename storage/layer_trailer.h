// A layer record's trailer: CRC32C (base/crc32c.h) of its key then its
// bytes, little-endian, then the magic "KVC1". The store writes it after
// every layer record and checks it on reads with RocksDB's own checksums
// off (a software CRC in Debian's build, several times slower than the
// SSE4.2 one); the key is in the CRC so that a read that lands on another
// record (a damaged or stale blob index, which RocksDB does not check with
// its checksums off) fails it. Pure functions.
#ifndef KVMEM_STORAGE_LAYER_TRAILER_H_
#define KVMEM_STORAGE_LAYER_TRAILER_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace kvmem {

inline constexpr size_t kTrailerBytes = 8;

// The trailer of the record `bytes` stored under `key`.
std::string LayerTrailer(absl::string_view key, absl::string_view bytes);

// True (and the trailer stripped from *v) when *v ends with a trailer whose
// CRC matches. Otherwise the caller reads the record again with RocksDB's
// own check: a record written without a trailer, or a damaged one (which
// that check then reports).
bool StripLayerTrailer(absl::string_view key, std::string* v);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_LAYER_TRAILER_H_

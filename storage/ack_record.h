// The acknowledgement record: how many frames of each stream the store has
// acknowledged, kept in a file of its own beside RocksDB's (so a WAL that
// lost its tail cannot take the record with it), replaced atomically.
// Recovery compares what it finds with it: a stream that recovers fewer
// frames than were acknowledged is quarantined (engine/memory_engine.h).
//
// Format: "KVMEM-ACKED-1\n", the number of streams, then per stream its id
// (length-prefixed) and frame count, then the FNV-1a 64 of all that; every
// number 8 bytes little-endian. Pure functions, but WriteFileDurably,
// which writes one file (callers serialise writers of the same file).
#ifndef KVMEM_STORAGE_ACK_RECORD_H_
#define KVMEM_STORAGE_ACK_RECORD_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvmem {

inline constexpr char kAckFile[] = "KVMEM-ACKED";

std::string EncodeAckRecord(const std::map<std::string, uint64_t>& frames);
// DATA_LOSS naming `file` (for messages) for bytes that are not a whole
// record.
absl::StatusOr<std::map<std::string, uint64_t>> DecodeAckRecord(
    const std::string& data, const std::string& file);

// Replaces dir/name with data: written to a temporary file, fsynced,
// renamed over the old one, and the directory fsynced, so a crash leaves
// either the old record or the new one.
absl::Status WriteFileDurably(const std::string& dir, const std::string& name,
                              absl::string_view data);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ACK_RECORD_H_

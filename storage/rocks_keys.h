// The RocksDB store's column families and keys (storage/rocks_cold_store.h
// describes the layout): a stream's records share the prefix
// <stream_id> 0x00, so one range covers all of a stream; numbers are
// big-endian, so keys sort as the numbers do. Pure functions.
#ifndef KVMEM_STORAGE_ROCKS_KEYS_H_
#define KVMEM_STORAGE_ROCKS_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kvmem {

inline constexpr char kStreamsCf[] = "streams";
inline constexpr char kBlocksCf[] = "blocks";
inline constexpr char kPayloadsCf[] = "payloads";
inline constexpr char kFrameMetaCf[] = "frame_meta";
inline constexpr char kBlockLayersCf[] = "block_layers";

// <stream_id> 0x00.
std::string StreamPrefix(absl::string_view stream_id);
// The prefix and n, 8 bytes big-endian (frames, blocks).
std::string NumberedKey(absl::string_view stream_id, uint64_t n);
// n from its 8 big-endian bytes.
uint64_t DecodeNumber(absl::string_view key_suffix);
// A block's layer record: NumberedKey(block) and the layer, 4 bytes BE.
std::string LayerKey(absl::string_view stream_id, uint64_t block,
                     uint32_t layer);
// The stream's records of kind ('c' config, 'S' state).
std::string MetaKey(absl::string_view stream_id, char kind);

}  // namespace kvmem

#endif  // KVMEM_STORAGE_ROCKS_KEYS_H_

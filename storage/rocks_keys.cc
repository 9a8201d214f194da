#include "storage/rocks_keys.h"

namespace kvmem {

std::string StreamPrefix(absl::string_view stream_id) {
  std::string k(stream_id);
  k.push_back('\0');
  return k;
}

std::string NumberedKey(absl::string_view stream_id, uint64_t n) {
  std::string k = StreamPrefix(stream_id);
  for (int shift = 56; shift >= 0; shift -= 8) {
    k.push_back(static_cast<char>((n >> shift) & 0xff));
  }
  return k;
}

uint64_t DecodeNumber(absl::string_view key_suffix) {
  uint64_t n = 0;
  for (char c : key_suffix) n = (n << 8) | static_cast<uint8_t>(c);
  return n;
}

std::string LayerKey(absl::string_view stream_id, uint64_t block,
                     uint32_t layer) {
  std::string k = NumberedKey(stream_id, block);
  for (int shift = 24; shift >= 0; shift -= 8) {
    k.push_back(static_cast<char>((layer >> shift) & 0xff));
  }
  return k;
}

std::string MetaKey(absl::string_view stream_id, char kind) {
  std::string k = StreamPrefix(stream_id);
  k.push_back(kind);
  return k;
}

}  // namespace kvmem

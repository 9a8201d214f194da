#include "storage/layer_trailer.h"

#include <cstdint>
#include <cstring>

#include "base/crc32c.h"

namespace kvmem {
namespace {

constexpr char kLayerMagic[4] = {'K', 'V', 'C', '1'};

uint32_t LayerCrc(absl::string_view key, const char* bytes, size_t n) {
  return Crc32c(bytes, n, Crc32c(key.data(), key.size()));
}

}  // namespace

std::string LayerTrailer(absl::string_view key, absl::string_view bytes) {
  const uint32_t crc = LayerCrc(key, bytes.data(), bytes.size());
  std::string t(kTrailerBytes, '\0');
  for (int i = 0; i < 4; ++i) t[i] = static_cast<char>(crc >> (8 * i));
  std::memcpy(t.data() + 4, kLayerMagic, 4);
  return t;
}

bool StripLayerTrailer(absl::string_view key, std::string* v) {
  if (v->size() < kTrailerBytes ||
      std::memcmp(v->data() + v->size() - 4, kLayerMagic, 4) != 0) {
    return false;
  }
  const size_t n = v->size() - kTrailerBytes;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= uint32_t{static_cast<uint8_t>((*v)[n + i])} << (8 * i);
  }
  if (LayerCrc(key, v->data(), n) != stored) return false;
  v->resize(n);
  return true;
}

}  // namespace kvmem

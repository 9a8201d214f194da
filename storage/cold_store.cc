#include "storage/cold_store.h"

namespace kvmem {

absl::StatusOr<std::vector<std::string>> ColdStore::GetBlockLayers(
    absl::string_view stream_id, uint64_t block_id,
    const std::vector<uint32_t>& layers) {
  std::vector<std::string> out;
  out.reserve(layers.size());
  for (uint32_t l : layers) {
    absl::StatusOr<std::string> v = GetBlockLayer(stream_id, block_id, l);
    if (!v.ok()) return v.status();
    out.push_back(*std::move(v));
  }
  return out;
}

}  // namespace kvmem

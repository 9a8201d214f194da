#include "storage/checksummed_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/forwarding_store.h"
#include "storage/layer_trailer.h"
#include "storage/rocks_keys.h"

namespace kvmem {
namespace {

// Checks and strips the trailer of a record read for (stream, block, layer).
absl::Status CheckLayer(absl::string_view stream_id, uint64_t block_id,
                        uint32_t layer, std::string* v) {
  if (StripLayerTrailer(LayerKey(stream_id, block_id, layer), v)) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(
      "layer ", layer, " of block ", block_id, " of stream ", stream_id,
      " fails its checksum (damaged, or written without one)"));
}

class ChecksummedStore final : public ForwardingColdStore {
 public:
  explicit ChecksummedStore(std::unique_ptr<ColdStore> inner)
      : ForwardingColdStore(std::move(inner)) {}

  absl::Status Commit(const StreamWrite& write) override {
    if (write.block_layers.empty()) return inner().Commit(write);
    StreamWrite w = write;  // The frame stays a view of the caller's bytes.
    for (BlockLayerWrite& l : w.block_layers) {
      l.bytes +=
          LayerTrailer(LayerKey(w.stream_id, l.block_id, l.layer), l.bytes);
    }
    return inner().Commit(w);
  }

  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override {
    absl::StatusOr<std::string> v =
        inner().GetBlockLayer(stream_id, block_id, layer);
    if (!v.ok()) return v;
    if (absl::Status c = CheckLayer(stream_id, block_id, layer, &*v); !c.ok()) {
      return c;
    }
    return v;
  }

  absl::StatusOr<std::vector<std::string>> GetBlockLayers(
      absl::string_view stream_id, uint64_t block_id,
      const std::vector<uint32_t>& layers) override {
    absl::StatusOr<std::vector<std::string>> v =
        inner().GetBlockLayers(stream_id, block_id, layers);
    if (!v.ok()) return v;
    for (size_t i = 0; i < layers.size(); ++i) {
      absl::Status c = CheckLayer(stream_id, block_id, layers[i], &(*v)[i]);
      if (!c.ok()) return c;
    }
    return v;
  }
};

}  // namespace

std::unique_ptr<ColdStore> WithLayerChecksums(
    std::unique_ptr<ColdStore> inner) {
  return std::make_unique<ChecksummedStore>(std::move(inner));
}

}  // namespace kvmem

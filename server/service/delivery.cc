#include "server/service/delivery.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/stream_config.h"

namespace kvmem {

absl::Status NoSharedMemory() {
  return absl::FailedPreconditionError(
      "this server has no shared memory (it serves no unix socket, or runs "
      "with --shm_max_total_bytes=0)");
}

absl::StatusOr<PayloadLayout> LayoutFromProto(v1::PayloadLayout layout,
                                              int layers) {
  switch (layout) {
    case v1::PAYLOAD_LAYOUT_UNSPECIFIED:
    case v1::PAYLOAD_LAYOUT_FRAME_MAJOR:
      if (layers > 0) {
        return absl::InvalidArgumentError(
            "layers is set; it needs layout PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR");
      }
      return PayloadLayout::kFrameMajor;
    case v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR:
      return PayloadLayout::kBlockLayerMajor;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("layout is ", static_cast<int>(layout),
                       "; use FRAME_MAJOR or BLOCK_LAYER_MAJOR"));
  }
}

namespace {

// The payload bytes of each block in the layout (layers checked first).
absl::StatusOr<std::vector<uint64_t>> PayloadSizes(const DeliveryRequest& r) {
  const Geometry& g = r.stream->config().geometry;
  KVMEM_RETURN_IF_ERROR(ValidateLayerList(g, r.layers));
  std::vector<uint64_t> sizes;
  sizes.reserve(r.block_ids.size());
  for (uint64_t id : r.block_ids) {
    KVMEM_ASSIGN_OR_RETURN(const BlockInfo b, r.stream->GetBlock(id));
    sizes.push_back(
        BlockPayloadBytes(g, b.token_count, r.layout, r.layers.size()));
  }
  return sizes;
}

}  // namespace

absl::StatusOr<Delivered> Deliver(const DeliveryRequest& r,
                                  DeliverySink* sink) {
  sink->Prepare();
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes, PayloadSizes(r));
  KVMEM_RETURN_IF_ERROR(sink->Reserve(sizes));
  Delivered out;
  for (uint64_t s : sizes) out.bytes += s;
  // Blocks are read and copied in parallel (a second core while the client
  // waits); each lands in its own slot.
  const size_t n = r.block_ids.size();
  std::vector<BlockInfo> info(n);
  std::vector<absl::Status> status(n);
  ParallelFor(
      r.executor, n, r.executor == nullptr ? 0 : r.helpers, [&](size_t i) {
        status[i] =
            r.stream
                ->ReadBlockPayloadInto(r.block_ids[i], r.layout, r.layers,
                                       sink->Slot(i), sizes[i], &info[i])
                .status();
      });
  for (const absl::Status& s : status) {
    if (!s.ok()) {
      sink->Abandon();
      return s;
    }
  }
  sink->Finish();
  out.blocks = std::move(info);
  return out;
}

}  // namespace kvmem

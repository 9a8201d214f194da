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
                                              int layers,
                                              absl::string_view prefix) {
  switch (layout) {
    case v1::PAYLOAD_LAYOUT_UNSPECIFIED:
    case v1::PAYLOAD_LAYOUT_FRAME_MAJOR:
      if (layers > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "layers is set; it needs ", prefix,
                         "layout PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR or "
                         "PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR"));
      }
      return PayloadLayout::kFrameMajor;
    case v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR:
    case v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR:
      return PayloadLayout::kBlockLayerMajor;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "layout is ", static_cast<int>(layout),
          "; use FRAME_MAJOR, BLOCK_LAYER_MAJOR or TOKEN_LAYER_MAJOR"));
  }
}

namespace {

// The payload bytes of each block in the layout (layers and tokens checked
// first).
absl::StatusOr<std::vector<uint64_t>> PayloadSizes(const DeliveryRequest& r) {
  const Geometry& g = r.stream->config().geometry;
  KVMEM_RETURN_IF_ERROR(ValidateLayerList(g, r.layers));
  std::vector<uint64_t> sizes;
  sizes.reserve(r.block_ids.size());
  for (size_t i = 0; i < r.block_ids.size(); ++i) {
    KVMEM_ASSIGN_OR_RETURN(const BlockInfo b,
                           r.stream->GetBlock(r.block_ids[i]));
    uint32_t tokens = b.token_count;
    if (!r.tokens.empty() && !r.tokens[i].empty()) {
      KVMEM_RETURN_IF_ERROR(
          ValidateTokenList(r.tokens[i], b.token_count, b.id, "tokens"));
      tokens = static_cast<uint32_t>(r.tokens[i].size());
    }
    sizes.push_back(BlockPayloadBytes(g, tokens, r.layout, r.layers.size()));
  }
  return sizes;
}

// Block i of the request into dst (size bytes).
absl::Status ReadOne(const DeliveryRequest& r, size_t i, uint8_t* dst,
                     uint64_t size, BlockInfo* info) {
  if (!r.tokens.empty()) {
    return r.stream
        ->ReadBlockTokensInto(r.block_ids[i], r.tokens[i], r.layers, dst, size,
                              info)
        .status();
  }
  return r.stream
      ->ReadBlockPayloadInto(r.block_ids[i], r.layout, r.layers, dst, size,
                             info)
      .status();
}

}  // namespace

absl::StatusOr<Delivered> Deliver(const DeliveryRequest& r,
                                  DeliverySink* sink) {
  if (!r.tokens.empty() && (r.tokens.size() != r.block_ids.size() ||
                            r.layout != PayloadLayout::kBlockLayerMajor)) {
    return absl::InternalError(
        "token delivery needs a token list per block "
        "and the block layer-major layout");
  }
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes, PayloadSizes(r));
  KVMEM_RETURN_IF_ERROR(sink->Reserve(sizes));
  Delivered out;
  for (uint64_t s : sizes) out.bytes += s;
  // Blocks are read and copied in parallel (a second core while the client
  // waits); each lands in its own slot.
  const size_t n = r.block_ids.size();
  std::vector<BlockInfo> info(n);
  std::vector<absl::Status> status(n);
  ParallelFor(r.executor, n, r.executor == nullptr ? 0 : r.helpers,
              [&](size_t i) {
                status[i] = ReadOne(r, i, sink->Slot(i), sizes[i], &info[i]);
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

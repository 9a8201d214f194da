#include "server/service/delivery.h"

#include "absl/container/flat_hash_set.h"
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

// The payload bytes of each block in the layout (layers checked first), and
// their sum in *total.
absl::StatusOr<std::vector<uint64_t>> PayloadSizes(
    const StreamHandle& stream, const std::vector<uint64_t>& block_ids,
    PayloadLayout layout, const std::vector<uint32_t>& layers,
    uint64_t* total) {
  const Geometry& g = stream.config().geometry;
  KVMEM_RETURN_IF_ERROR(ValidateLayerList(g, layers));
  std::vector<uint64_t> sizes;
  *total = 0;
  for (uint64_t id : block_ids) {
    KVMEM_ASSIGN_OR_RETURN(const BlockInfo b, stream.GetBlock(id));
    sizes.push_back(BlockPayloadBytes(g, b.token_count, layout, layers.size()));
    *total += sizes.back();
  }
  return sizes;
}

}  // namespace

absl::StatusOr<Placed> PlaceBlocks(
    ShmArenas* shm, Executor* executor, int helpers, const Caller& caller,
    uint64_t arena_id, const StreamHandle& stream,
    const std::vector<uint64_t>& block_ids, PayloadLayout layout,
    const std::vector<uint32_t>& layers, const std::vector<uint64_t>& release) {
  if (shm == nullptr) return NoSharedMemory();
  shm->ReleaseLive(caller.tenant(), arena_id, release);
  uint64_t total = 0;
  KVMEM_ASSIGN_OR_RETURN(
      const std::vector<uint64_t> sizes,
      PayloadSizes(stream, block_ids, layout, layers, &total));
  Placed p;
  KVMEM_ASSIGN_OR_RETURN(p.lease,
                         shm->Reserve(caller.tenant(), arena_id, total));
  std::vector<uint64_t> at(block_ids.size(), 0);
  for (size_t i = 1; i < block_ids.size(); ++i) {
    at[i] = at[i - 1] + sizes[i - 1];
  }
  // Blocks are read and copied in parallel (a second core while the
  // client waits); each lands at its own offset.
  p.blocks.resize(block_ids.size());
  std::vector<absl::Status> status(block_ids.size());
  ParallelFor(executor, block_ids.size(), helpers, [&](size_t i) {
    status[i] =
        stream
            .ReadBlockPayloadInto(block_ids[i], layout, layers,
                                  p.lease.data + at[i], sizes[i], &p.blocks[i])
            .status();
  });
  for (size_t i = 0; i < block_ids.size(); ++i) {
    if (!status[i].ok()) {
      shm->Abandon(p.lease);
      return status[i];
    }
    v1::ShmRegion& r = p.regions.emplace_back();
    r.set_lease_id(p.lease.lease_id);
    r.set_offset(p.lease.offset + at[i]);
    r.set_length(sizes[i]);
  }
  shm->Written(p.lease);
  return p;
}

namespace {

// The blocks of a recall response (all its sets), each once, in order.
std::vector<uint64_t> RecalledIds(const v1::RecallResponse& resp) {
  std::vector<uint64_t> ids;
  absl::flat_hash_set<uint64_t> seen;
  auto add =
      [&](const google::protobuf::RepeatedPtrField<v1::RecalledBlock>& blocks) {
        for (const v1::RecalledBlock& b : blocks) {
          if (seen.insert(b.block_id()).second) ids.push_back(b.block_id());
        }
      };
  add(resp.blocks());
  for (const v1::LayerRecallSet& s : resp.layer_sets()) add(s.blocks());
  return ids;
}

}  // namespace

absl::Status DeliverRecall(ShmArenas* shm, Executor* executor, int helpers,
                           const Caller& caller, const StreamHandle& stream,
                           const v1::RecallDelivery& req,
                           uint64_t max_inline_bytes,
                           v1::RecallResponse* resp) {
  KVMEM_ASSIGN_OR_RETURN(const PayloadLayout layout,
                         LayoutFromProto(req.layout(), req.layers_size()));
  const std::vector<uint32_t> layers(req.layers().begin(), req.layers().end());
  const absl::flat_hash_set<uint64_t> held(req.held_block_ids().begin(),
                                           req.held_block_ids().end());
  std::vector<uint64_t> ids;
  for (uint64_t id : RecalledIds(*resp)) {
    if (held.contains(id)) {
      resp->set_held_blocks(resp->held_blocks() + 1);
    } else {
      ids.push_back(id);
    }
  }
  if (req.mode() == v1::RecallDelivery::MODE_SHARED_MEMORY) {
    KVMEM_ASSIGN_OR_RETURN(
        Placed p,
        PlaceBlocks(shm, executor, helpers, caller, req.shm_arena_id(), stream,
                    ids, layout, layers,
                    std::vector<uint64_t>(req.release_lease_ids().begin(),
                                          req.release_lease_ids().end())));
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::DeliveredBlock* d = resp->add_delivered();
      d->set_block_id(ids[i]);
      *d->mutable_shm() = p.regions[i];
    }
    resp->set_delivered_bytes(p.lease.bytes);
    return absl::OkStatus();
  }
  if (req.mode() != v1::RecallDelivery::MODE_INLINE) {
    return absl::InvalidArgumentError(
        absl::StrCat("delivery.mode is ", static_cast<int>(req.mode()),
                     "; use MODE_INLINE or MODE_SHARED_MEMORY"));
  }
  uint64_t total = 0;
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes,
                         PayloadSizes(stream, ids, layout, layers, &total));
  if (total > max_inline_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "inline delivery of ", ids.size(), " blocks is ", total,
        " bytes; a response may carry at most ", max_inline_bytes,
        ": deliver through shared memory, or fetch with FetchBlocks"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::DeliveredBlock* d = resp->add_delivered();
    d->set_block_id(ids[i]);
    std::string* data = d->mutable_data();
    data->resize(sizes[i]);
    KVMEM_RETURN_IF_ERROR(
        stream
            .ReadBlockPayloadInto(ids[i], layout, layers,
                                  reinterpret_cast<uint8_t*>(data->data()),
                                  sizes[i])
            .status());
  }
  resp->set_delivered_bytes(total);
  return absl::OkStatus();
}

}  // namespace kvmem

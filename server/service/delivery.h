// Delivery of blocks' KV bytes into memory the client will read: a
// DeliverySink says where each block goes, Deliver() reads the blocks into
// it. Two sinks exist (server/service/delivery_sinks.h): inline, into a
// RecallResponse's own bytes, and shared memory, into a lease of the
// client's arena (server/service/shm_arenas.h). FetchBlocks' shared-memory
// path and recall-with-delivery (unary Recall and Session) both deliver
// through them; FetchBlocks' byte stream sends slices of the blocks where
// they are instead (server/service/fetch_reactor.cc).
//
//   InlineSink sink(max_inline_bytes);
//   KVMEM_ASSIGN_OR_RETURN(Delivered d, Deliver(request, &sink));
//   for (size_t i = 0; i < ids.size(); ++i) sink.Describe(i,
//   resp->add_delivered());
//
// Thread safety: Deliver runs on the calling thread and up to
// request.helpers executor tasks; a sink is used by one delivery.
#ifndef KVMEM_SERVER_SERVICE_DELIVERY_H_
#define KVMEM_SERVER_SERVICE_DELIVERY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "base/executor.h"
#include "engine/memory_engine.h"
#include "kvmem/v1/service.pb.h"

namespace kvmem {

// Where a delivery's blocks go. Deliver calls, in order: Reserve once for
// all the blocks; Slot for each block (from several threads at
// once, each block once), writing that block's bytes there; then Finish
// when every block was written, or Abandon when something failed after
// Reserve succeeded. Describe may be called after Finish.
class DeliverySink {
 public:
  virtual ~DeliverySink() = default;
  // Room for blocks of these sizes, in this order. An error (e.g.
  // RESOURCE_EXHAUSTED: no room) ends the delivery with nothing written.
  virtual absl::Status Reserve(const std::vector<uint64_t>& sizes) = 0;
  // Where block i's bytes go: sizes[i] writable bytes.
  virtual uint8_t* Slot(size_t i) = 0;
  // Every block is written: the client may read them.
  virtual void Finish() = 0;
  // Nothing of the delivery reaches the client: room goes back.
  virtual void Abandon() = 0;
  // Where block i went, as a response tells the client (the target of
  // kvmem.v1.DeliveredBlock: its bytes or its shared-memory region).
  virtual void Describe(size_t i, v1::DeliveredBlock* out) = 0;
};

// What to deliver (per-call parameters).
struct DeliveryRequest {
  const StreamHandle* stream = nullptr;
  std::vector<uint64_t> block_ids;  // Delivered in this order.
  PayloadLayout layout = PayloadLayout::kFrameMajor;
  std::vector<uint32_t> layers;  // kBlockLayerMajor: these (empty: all).
  // Token delivery (TOKEN_LAYER_MAJOR; layout kBlockLayerMajor): when not
  // empty, block i's tokens to deliver, tokens[i] (empty: all of them).
  std::vector<std::vector<uint32_t>> tokens;
  // Blocks are read and copied in parallel on the calling thread and up to
  // `helpers` tasks of `executor` (null: the calling thread alone).
  Executor* executor = nullptr;
  int helpers = 0;
};

struct Delivered {
  uint64_t bytes = 0;             // In all.
  std::vector<BlockInfo> blocks;  // Each block's metadata as read.
};

// Reads every block's payload into its slot of the sink, one copy from RAM
// or from the store's read. Block errors (NOT_FOUND for an evicted block,
// INVALID_ARGUMENT for a layer out of range, DATA_LOSS...) and the sink's
// are returned, the sink abandoned.
absl::StatusOr<Delivered> Deliver(const DeliveryRequest& request,
                                  DeliverySink* sink);

// FAILED_PRECONDITION: this server has no shared memory.
absl::Status NoSharedMemory();

// The engine's layout for a request's layout and layers (layers need
// BLOCK_LAYER_MAJOR or TOKEN_LAYER_MAJOR, which is kBlockLayerMajor with
// tokens chosen); INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<PayloadLayout> LayoutFromProto(v1::PayloadLayout layout,
                                              int layers,
                                              absl::string_view prefix = "");

// True for TOKEN_LAYER_MAJOR: deliveries choose tokens.
inline bool GathersTokens(v1::PayloadLayout layout) {
  return layout == v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR;
}

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_DELIVERY_H_

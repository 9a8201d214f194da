// Delivery of blocks' KV bytes beyond FetchBlocks' chunked stream: into a
// caller's shared-memory arena (server/service/shm_arenas.h), shared by
// FetchBlocks and recall-with-delivery (unary Recall and Session), and
// inline in a RecallResponse.
#ifndef KVMEM_SERVER_SERVICE_DELIVERY_H_
#define KVMEM_SERVER_SERVICE_DELIVERY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "base/executor.h"
#include "engine/memory_engine.h"
#include "kvmem/v1/service.pb.h"
#include "server/ops/tenancy.h"
#include "server/service/shm_arenas.h"

namespace kvmem {

// FAILED_PRECONDITION: this server has no shared memory.
absl::Status NoSharedMemory();

// The engine's layout for a request's layout and layers (layers need
// BLOCK_LAYER_MAJOR); INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<PayloadLayout> LayoutFromProto(v1::PayloadLayout layout,
                                              int layers);

// Blocks placed in an arena under one lease: blocks[i] at regions[i].
struct Placed {
  ShmArenas::Lease lease;
  std::vector<BlockInfo> blocks;  // As read.
  std::vector<v1::ShmRegion> regions;
};

// Reserves one lease of the caller's arena for the blocks (in this order)
// and writes each block's payload there, one copy from RAM or the store's
// read, blocks in parallel on this thread and up to `helpers` executor
// tasks. On error the lease is given back. shm null: FAILED_PRECONDITION.
// Leases in `release` (the client is done with them) are released first.
absl::StatusOr<Placed> PlaceBlocks(ShmArenas* shm, Executor* executor,
                                   int helpers, const Caller& caller,
                                   uint64_t arena_id,
                                   const StreamHandle& stream,
                                   const std::vector<uint64_t>& block_ids,
                                   PayloadLayout layout,
                                   const std::vector<uint32_t>& layers,
                                   const std::vector<uint64_t>& release = {});

// Fills resp->delivered for a recall made with req.delivery: every block of
// resp (of all its sets, once, in recall order) the client does not hold.
// Inline bytes count against max_inline_bytes (RESOURCE_EXHAUSTED beyond).
absl::Status DeliverRecall(ShmArenas* shm, Executor* executor, int helpers,
                           const Caller& caller, const StreamHandle& stream,
                           const v1::RecallDelivery& req,
                           uint64_t max_inline_bytes, v1::RecallResponse* resp);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_DELIVERY_H_

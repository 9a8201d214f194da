// The kvmem.v1 calls' work, shared by the unary methods
// (server/service/kvmem_service.h) and the Session reactor: parsed request
// in, response out, engine status back. No gRPC types beyond the messages.
//
// Thread safety: safe from any thread; they may block on storage (run them
// on the executor, except RunRecall without delivery, which touches RAM
// only).
#ifndef KVMEM_SERVER_SERVICE_HANDLERS_H_
#define KVMEM_SERVER_SERVICE_HANDLERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/executor.h"
#include "engine/memory_engine.h"
#include "kvmem/v1/service.pb.h"
#include "server/ops/metrics.h"
#include "server/ops/tenancy.h"
#include "server/service/service_options.h"

namespace kvmem {

// Opens the caller's stream req.stream_id (new streams count against the
// tenant's limit).
absl::Status RunOpen(MemoryEngine* engine, const Caller& caller,
                     const v1::OpenStreamRequest& req,
                     v1::OpenStreamResponse* resp);

// Runs a recall on the stream with engine id engine_id and fills resp; its
// time goes to metrics (when not null) under the method that asked. An
// answer over max_answer_bytes (0: unchecked) is RESOURCE_EXHAUSTED, with
// its size and what to ask for instead.
absl::Status RunRecall(MemoryEngine* engine, const std::string& engine_id,
                       const v1::RecallRequest& req, v1::RecallResponse* resp,
                       ServerMetrics* metrics = nullptr, bool session = false,
                       uint64_t max_answer_bytes = 0);

// True when a recall also delivers its blocks' bytes (req.delivery).
bool Delivers(const v1::RecallRequest& req);

// Where a recall's blocks go and who asks (per-call parameters).
struct RecallDeliveryCall {
  MemoryEngine* engine = nullptr;
  Executor* executor = nullptr;
  const Caller* caller = nullptr;
  const ServiceOptions* options = nullptr;
  // The stream's engine id, or why the caller may not name it (the
  // request's leases still go back: RunRecallDelivering).
  absl::StatusOr<std::string> engine_id;
  bool session = false;
};

// RunRecall, then, when req.delivery asks for it, delivery of every block
// of the response (of all its sets, once, in recall order) the client does
// not hold (req.delivery.held_block_ids), inline or into the caller's
// shared-memory arena (server/service/delivery.h). The leases the request
// releases (delivery.release_lease_ids) go back first, whatever follows.
absl::Status RunRecallDelivering(const RecallDeliveryCall& call,
                                 const v1::RecallRequest& req,
                                 v1::RecallResponse* resp);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_HANDLERS_H_

// ServiceOptions: what the kvmem.v1 service's handlers and reactors share:
// size limits, tenancy and admission, metrics, shared memory.
#ifndef KVMEM_SERVER_SERVICE_SERVICE_OPTIONS_H_
#define KVMEM_SERVER_SERVICE_SERVICE_OPTIONS_H_

#include <cstdint>

#include "server/ops/metrics.h"
#include "server/ops/tenancy.h"
#include "server/service/shm_arenas.h"

namespace kvmem {

struct ServiceOptions {
  // Largest FetchBlocks chunk the server sends (also the cap on a request's
  // max_chunk_bytes); keep below the transport's max message size.
  uint32_t max_chunk_bytes = 4u << 20;
  // Session responses queued for a slow reader before reads pause, and
  // their bytes (the call and its tenant's share,
  // Limits::max_queued_response_bytes, bound what it holds). Past either,
  // the Session stops reading requests until the client reads; HTTP/2 flow
  // control then stops the client (the server does not grow its receive
  // windows: Server::StartGrpc).
  uint32_t session_queue_limit = 64;
  uint64_t session_queue_bytes = 16ull << 20;
  // API keys, tenants and limits (server/ops/tenancy.h); null: none (the
  // service makes its own defaults). REQUIRES: outlive the service.
  const Tenancy* tenancy = nullptr;
  const Admission* admission = nullptr;
  // Recall latency and deleted streams' counters go here; null: not
  // recorded. REQUIRES: outlives the service.
  ServerMetrics* metrics = nullptr;
  // Shared-memory arenas (AttachSharedMemory, delivery into them); null:
  // none. REQUIRES: outlives the service.
  ShmArenas* shm = nullptr;
  // Executor tasks that help copy a delivery's blocks (beside the task
  // placing them).
  int copy_helpers = 1;
  // The most KV bytes a recall delivers inline (keep below the transport's
  // max message size).
  uint64_t max_inline_bytes = 60ull << 20;
  // The largest answer the transport sends (its max message size less an
  // envelope's room): a recall whose sets would not fit is refused with
  // what to change, not left to the transport ("Sent message larger than
  // max"); inline delivery takes what its sets leave. 0: unchecked.
  uint64_t max_answer_bytes = 0;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_SERVICE_OPTIONS_H_

// KvMemoryService: the kvmem.v1.KvMemory gRPC service on the callback API.
// A thin layer: convert proto to engine types, call the MemoryEngine, map
// absl::Status to grpc::Status. Work that may block on storage runs on the
// Executor, never on a gRPC callback thread.
//
// Thread safety: gRPC calls the service from many threads; it holds no state
// of its own beyond const options and thread-safe collaborators.
#ifndef KVMEM_SERVER_SERVICE_KVMEM_SERVICE_H_
#define KVMEM_SERVER_SERVICE_KVMEM_SERVICE_H_

#include <cstdint>
#include <memory>

#include "base/executor.h"
#include "engine/memory_engine.h"
#include "kvmem/v1/service.grpc.pb.h"
#include "server/ops/metrics.h"
#include "server/ops/tenancy.h"
#include "server/service/shm_arenas.h"

namespace kvmem {

struct ServiceOptions {
  // Largest FetchBlocks chunk the server sends (also the cap on a request's
  // max_chunk_bytes); keep below the transport's max message size.
  uint32_t max_chunk_bytes = 4u << 20;
  // Session responses queued for a slow reader before reads pause.
  uint32_t session_queue_limit = 64;
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
  // Executor tasks that help copy a shared-memory delivery's blocks (beside
  // the task placing them).
  int copy_helpers = 1;
  // The most KV bytes a recall delivers inline (keep below the transport's
  // max message size).
  uint64_t max_inline_bytes = 60ull << 20;
};

// The generated service with every method taking raw bytes
// (server/service/wire.h says why): the service parses requests and serialises
// responses itself.
using KvMemoryRawService = v1::KvMemory::WithRawCallbackMethod_OpenStream<
    v1::KvMemory::WithRawCallbackMethod_CloseStream<
        v1::KvMemory::WithRawCallbackMethod_DeleteStream<
            v1::KvMemory::WithRawCallbackMethod_ListStreams<
                v1::KvMemory::WithRawCallbackMethod_GetStreamStats<
                    v1::KvMemory::WithRawCallbackMethod_AppendFrames<
                        v1::KvMemory::WithRawCallbackMethod_Recall<
                            v1::KvMemory::WithRawCallbackMethod_Session<
                                v1::KvMemory::WithRawCallbackMethod_FetchBlocks<
                                    v1::KvMemory::
                                        WithRawCallbackMethod_AttachSharedMemory<
                                            v1::KvMemory::
                                                WithRawCallbackMethod_ReleaseLeases<
                                                    v1::KvMemory::
                                                        Service>>>>>>>>>>>;

class KvMemoryService final : public KvMemoryRawService {
 public:
  // REQUIRES: engine and executor outlive the service and its calls.
  KvMemoryService(MemoryEngine* engine, Executor* executor,
                  const ServiceOptions& options);

  // Unary: kvmem.v1 request bytes in, response bytes out.
  grpc::ServerUnaryReactor* OpenStream(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* CloseStream(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* DeleteStream(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ListStreams(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetStreamStats(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Recall(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* AppendFrames(
      grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchBlocks(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* AttachSharedMemory(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* req,
                                               grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ReleaseLeases(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req,
                                          grpc::ByteBuffer* resp) override;

 private:
  MemoryEngine* const engine_;
  Executor* const executor_;
  ServiceOptions options_;
  std::unique_ptr<Tenancy> own_tenancy_;
  std::unique_ptr<Admission> own_admission_;
};

// Shared by Recall and Session: runs a recall on the stream with engine id
// engine_id and fills resp; its time goes to metrics (when not null) under
// the method that asked.
absl::Status RunRecall(MemoryEngine* engine, const std::string& engine_id,
                       const v1::RecallRequest& req, v1::RecallResponse* resp,
                       ServerMetrics* metrics = nullptr, bool session = false);

// True when a recall also delivers its blocks' bytes (req.delivery).
bool Delivers(const v1::RecallRequest& req);

// RunRecall, then, when the request asks for it, delivery of the recalled
// blocks' bytes (server/service/delivery.h).
absl::Status RunRecallDelivering(MemoryEngine* engine, Executor* executor,
                                 const Caller& caller,
                                 const ServiceOptions& options,
                                 const std::string& engine_id,
                                 const v1::RecallRequest& req,
                                 v1::RecallResponse* resp, bool session);

// Shared by OpenStream and Session: opens the caller's stream req.stream_id.
absl::Status RunOpen(MemoryEngine* engine, const Caller& caller,
                     const v1::OpenStreamRequest& req,
                     v1::OpenStreamResponse* resp);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_KVMEM_SERVICE_H_

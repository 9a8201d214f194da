// KvMemoryService: the kvmem.v1.KvMemory gRPC service on the callback API.
// A thin layer: authenticate the caller, parse the request, run its handler
// (server/service/handlers.h) or start its reactor
// (server/service/reactors.h), map absl::Status to grpc::Status. Work that
// may block on storage runs on the Executor, never on a gRPC callback
// thread.
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
#include "server/ops/tenancy.h"
#include "server/service/service_options.h"

namespace kvmem {

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

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_KVMEM_SERVICE_H_

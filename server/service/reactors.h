// The streaming RPCs' reactors. Each is heap-allocated per call and deletes
// itself in OnDone. Reactor callbacks only hand work to the Executor; the
// work (which may block on RocksDB) then starts the next read or write, so a
// call has at most one task in flight and its state needs no lock beyond the
// Session's write queue.
#ifndef KVMEM_SERVER_SERVICE_REACTORS_H_
#define KVMEM_SERVER_SERVICE_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "base/executor.h"
#include "engine/memory_engine.h"
#include "kvmem/v1/service.pb.h"
#include "server/ops/metrics.h"
#include "server/ops/tenancy.h"
#include "server/service/service_options.h"

namespace kvmem {

// Each takes the authenticated caller (its tenant's namespace, its slot
// among the calls in flight, its quotas).
// Messages travel as raw bytes (server/service/wire.h): the reactors parse what
// they read and serialise what they write.
grpc::ServerReadReactor<grpc::ByteBuffer>* NewAppendFramesReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    grpc::ByteBuffer* resp);

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewSessionReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    const ServiceOptions& options);

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFetchBlocksReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    const v1::FetchBlocksRequest& req, const ServiceOptions& options);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_REACTORS_H_

#include "server/service/kvmem_service.h"

#include <chrono>
#include <memory>

#include "base/status_macros.h"
#include "server/service/delivery.h"
#include "server/service/handlers.h"
#include "server/service/proto_convert.h"
#include "server/service/reactors.h"
#include "server/service/shm_arenas.h"
#include "server/service/status_util.h"
#include "server/service/wire.h"

namespace kvmem {
namespace {

// A stream's stats as the client names it (its id without the tenant).
absl::Status StatsToProto(const absl::StatusOr<StreamStats>& stats,
                          const std::string& client_id, v1::StreamStats* out) {
  if (!stats.ok()) return stats.status();
  ToProto(*stats, out);
  out->set_stream_id(client_id);
  return absl::OkStatus();
}

// Authenticates the call, parses its request, then runs
// fn(caller, request, &response) on the executor and finishes the unary call
// with its status (namespace prefixes scrubbed) and, when OK, the response's
// bytes in *out.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* Deferred(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out,
                                   const ServiceOptions& o, Executor* executor,
                                   Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Caller> caller = Caller::Enter(o.tenancy, o.admission, *ctx);
  auto call = std::make_shared<std::pair<Req, Resp>>();
  absl::Status s = caller.status();
  if (s.ok()) s = ParseRequest(*in, &call->first);
  if (!s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  executor->Submit(
      [reactor, out, call, c = *std::move(caller), fn = std::move(fn)]() {
        const absl::Status done = c.Scrub(fn(c, call->first, &call->second));
        reactor->Finish(done.ok() ? SerializeMessage(call->second, out)
                                  : ToGrpcStatus(done));
      });
  return reactor;
}

}  // namespace

KvMemoryService::KvMemoryService(MemoryEngine* engine, Executor* executor,
                                 const ServiceOptions& options)
    : engine_(engine), executor_(executor), options_(options) {
  if (options_.tenancy == nullptr) {
    own_tenancy_ = std::make_unique<Tenancy>();
    options_.tenancy = own_tenancy_.get();
  }
  if (options_.admission == nullptr) {
    own_admission_ =
        std::make_unique<Admission>(options_.tenancy, engine, Limits());
    options_.admission = own_admission_.get();
  }
}

grpc::ServerUnaryReactor* KvMemoryService::OpenStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Deferred<v1::OpenStreamRequest, v1::OpenStreamResponse>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::OpenStreamRequest& req,
          v1::OpenStreamResponse* resp) {
        return RunOpen(engine_, c, req, resp);
      });
}

grpc::ServerUnaryReactor* KvMemoryService::CloseStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Deferred<v1::CloseStreamRequest, v1::CloseStreamResponse>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::CloseStreamRequest& req,
          v1::CloseStreamResponse* resp) -> absl::Status {
        KVMEM_ASSIGN_OR_RETURN(const std::string id,
                               c.EngineId(req.stream_id()));
        return StatsToProto(engine_->CloseStream(id), req.stream_id(),
                            resp->mutable_stats());
      });
}

grpc::ServerUnaryReactor* KvMemoryService::DeleteStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Deferred<v1::DeleteStreamRequest, v1::DeleteStreamResponse>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::DeleteStreamRequest& req,
          v1::DeleteStreamResponse*) -> absl::Status {
        KVMEM_ASSIGN_OR_RETURN(const std::string id,
                               c.EngineId(req.stream_id()));
        // Its counters stay in the global totals.
        absl::StatusOr<StreamStats> last = engine_->GetStats(id);
        KVMEM_RETURN_IF_ERROR(engine_->DeleteStream(id));
        if (last.ok() && options_.metrics != nullptr) {
          options_.metrics->RetireStream(*last);
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvMemoryService::ListStreams(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  // Stats walk every kept block: off the callback thread, like the others.
  return Deferred<v1::ListStreamsRequest, v1::ListStreamsResponse>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::ListStreamsRequest&,
          v1::ListStreamsResponse* resp) {
        for (const StreamStats& s : engine_->ListStreams()) {
          const std::optional<std::string> id = c.ClientId(s.stream_id);
          if (!id) continue;  // Another tenant's.
          v1::StreamStats* p = resp->add_streams();
          ToProto(s, p);
          p->set_stream_id(*id);
        }
        for (const QuarantinedStream& q : engine_->Quarantined()) {
          const std::optional<std::string> id = c.ClientId(q.stream_id);
          if (!id) continue;
          v1::QuarantinedStream* p = resp->add_quarantined();
          p->set_stream_id(*id);
          p->set_code(absl::StatusCodeToString(q.reason.code()));
          p->set_reason(std::string(c.Scrub(q.reason).message()));
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvMemoryService::GetStreamStats(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Deferred<v1::GetStreamStatsRequest, v1::StreamStats>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::GetStreamStatsRequest& req,
          v1::StreamStats* resp) -> absl::Status {
        KVMEM_ASSIGN_OR_RETURN(const std::string id,
                               c.EngineId(req.stream_id()));
        return StatsToProto(engine_->GetStats(id), req.stream_id(), resp);
      });
}

grpc::ServerUnaryReactor* KvMemoryService::Recall(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  // Recall touches only RAM (summaries and index): run it inline. With
  // delivery it may read the store, and a stream this server has not taken
  // up yet (servers sharing a store) is read from the store first: on the
  // executor.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Caller> c =
      Caller::Enter(options_.tenancy, options_.admission, *ctx);
  absl::Status s = c.status();
  v1::RecallRequest req;
  v1::RecallResponse resp;
  if (s.ok()) s = ParseRequest(*in, &req);
  auto taken_up = [&] {
    if (!engine_->adopts_streams()) return true;
    absl::StatusOr<std::string> id = c->EngineId(req.stream_id());
    return !id.ok() || engine_->Holds(*id);
  };
  if (s.ok() && (Delivers(req) || !taken_up())) {
    executor_->Submit([this, reactor, out, req = std::move(req),
                       c = *std::move(c)] {
      v1::RecallResponse resp;
      const absl::Status s = c.Scrub(RunRecallDelivering(
          {engine_, executor_, &c, &options_, c.EngineId(req.stream_id()),
           /*session=*/false},
          req, &resp));
      reactor->Finish(s.ok() ? SerializeMessage(resp, out) : ToGrpcStatus(s));
    });
    return reactor;
  }
  if (s.ok()) {
    absl::StatusOr<std::string> id = c->EngineId(req.stream_id());
    s = id.ok() ? RunRecall(engine_, *id, req, &resp, options_.metrics,
                            /*session=*/false, options_.max_answer_bytes)
                : id.status();
    s = c->Scrub(s);
  }
  reactor->Finish(s.ok() ? SerializeMessage(resp, out) : ToGrpcStatus(s));
  return reactor;
}

// The streaming calls authenticate before their reactor starts; a refused
// call gets a reactor that only finishes.
namespace {

template <typename Base>
class Refused final : public Base {
 public:
  explicit Refused(const absl::Status& s) { this->Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* KvMemoryService::AppendFrames(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  absl::StatusOr<Caller> c =
      Caller::Enter(options_.tenancy, options_.admission, *ctx);
  if (!c.ok()) {
    return new Refused<grpc::ServerReadReactor<grpc::ByteBuffer>>(c.status());
  }
  return NewAppendFramesReactor(engine_, executor_, *std::move(c), resp);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
KvMemoryService::Session(grpc::CallbackServerContext* ctx) {
  absl::StatusOr<Caller> c =
      Caller::Enter(options_.tenancy, options_.admission, *ctx);
  if (!c.ok()) {
    return new Refused<
        grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(
        c.status());
  }
  return NewSessionReactor(engine_, executor_, *std::move(c), options_);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvMemoryService::FetchBlocks(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in) {
  absl::StatusOr<Caller> c =
      Caller::Enter(options_.tenancy, options_.admission, *ctx);
  v1::FetchBlocksRequest req;
  absl::Status s = c.status();
  if (s.ok()) s = ParseRequest(*in, &req);
  if (!s.ok()) {
    return new Refused<grpc::ServerWriteReactor<grpc::ByteBuffer>>(s);
  }
  return NewFetchBlocksReactor(engine_, executor_, *std::move(c), req,
                               options_);
}

namespace {

// Shared memory needs the caller on this host: a unix-socket connection.
absl::Status OnUnixSocket(const grpc::CallbackServerContext& ctx) {
  if (ctx.peer().rfind("unix:", 0) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "shared memory is for clients on the server's host, connected over its "
      "unix socket; this call came from ",
      ctx.peer(), " (use FetchBlocks' byte stream)"));
}

}  // namespace

grpc::ServerUnaryReactor* KvMemoryService::AttachSharedMemory(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  const absl::Status local = OnUnixSocket(*ctx);
  return Deferred<v1::AttachSharedMemoryRequest,
                  v1::AttachSharedMemoryResponse>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::AttachSharedMemoryRequest& req,
          v1::AttachSharedMemoryResponse* resp) -> absl::Status {
        KVMEM_RETURN_IF_ERROR(local);
        if (options_.shm == nullptr) return NoSharedMemory();
        KVMEM_ASSIGN_OR_RETURN(ShmArenas::Created a,
                               options_.shm->Create(c.tenant(), req.bytes()));
        resp->set_arena_id(a.arena_id);
        resp->set_token(a.token);
        resp->set_bytes(a.bytes);
        resp->set_socket_path(options_.shm->options().socket_path);
        resp->set_lease_ms(
            static_cast<uint64_t>(options_.shm->options().lease.count()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvMemoryService::ReleaseLeases(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out) {
  return Deferred<v1::ReleaseLeasesRequest, v1::ReleaseLeasesResponse>(
      ctx, in, out, options_, executor_,
      [=](const Caller& c, const v1::ReleaseLeasesRequest& req,
          v1::ReleaseLeasesResponse* resp) -> absl::Status {
        if (options_.shm == nullptr) return NoSharedMemory();
        KVMEM_RETURN_IF_ERROR(CheckLeaseIds(req.lease_ids_size(), "lease_ids"));
        KVMEM_ASSIGN_OR_RETURN(
            ShmArenas::Released r,
            options_.shm->Release(
                c.tenant(), req.arena_id(),
                std::vector<uint64_t>(req.lease_ids().begin(),
                                      req.lease_ids().end())));
        resp->set_released(r.released);
        for (uint64_t id : r.expired) resp->add_expired(id);
        return absl::OkStatus();
      });
}

}  // namespace kvmem

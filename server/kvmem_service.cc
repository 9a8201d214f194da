#include "server/kvmem_service.h"

#include "server/proto_convert.h"
#include "server/reactors.h"
#include "server/status_util.h"

namespace kvmem {
namespace {

// Runs fn on the executor and finishes the unary call with its status.
template <typename Fn>
grpc::ServerUnaryReactor* Deferred(grpc::CallbackServerContext* ctx,
                                   Executor* executor, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor->Submit([reactor, fn = std::move(fn)]() mutable {
    reactor->Finish(ToGrpcStatus(fn()));
  });
  return reactor;
}

}  // namespace

absl::Status RunOpen(MemoryEngine* engine, const v1::OpenStreamRequest& req,
                     v1::OpenStreamResponse* resp) {
  absl::StatusOr<OpenStreamResult> r =
      engine->OpenStream(req.stream_id(), FromProto(req.config()));
  if (!r.ok()) return r.status();
  resp->set_created(r->created);
  ToProto(r->stats, resp->mutable_stats());
  return absl::OkStatus();
}

absl::Status RunRecall(MemoryEngine* engine, const std::string& stream_id,
                       const v1::RecallRequest& req, v1::RecallResponse* resp) {
  absl::StatusOr<RecallResult> r = engine->Recall(stream_id, FromProto(req));
  if (!r.ok()) return r.status();
  ToProto(*r, resp);
  return absl::OkStatus();
}

KvMemoryService::KvMemoryService(MemoryEngine* engine, Executor* executor,
                                 const ServiceOptions& options)
    : engine_(engine), executor_(executor), options_(options) {}

grpc::ServerUnaryReactor* KvMemoryService::OpenStream(
    grpc::CallbackServerContext* ctx, const v1::OpenStreamRequest* req,
    v1::OpenStreamResponse* resp) {
  return Deferred(ctx, executor_, [=] { return RunOpen(engine_, *req, resp); });
}

grpc::ServerUnaryReactor* KvMemoryService::CloseStream(
    grpc::CallbackServerContext* ctx, const v1::CloseStreamRequest* req,
    v1::CloseStreamResponse* resp) {
  return Deferred(ctx, executor_, [=]() -> absl::Status {
    absl::StatusOr<StreamStats> s = engine_->CloseStream(req->stream_id());
    if (!s.ok()) return s.status();
    ToProto(*s, resp->mutable_stats());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvMemoryService::DeleteStream(
    grpc::CallbackServerContext* ctx, const v1::DeleteStreamRequest* req,
    v1::DeleteStreamResponse*) {
  return Deferred(ctx, executor_,
                  [=] { return engine_->DeleteStream(req->stream_id()); });
}

grpc::ServerUnaryReactor* KvMemoryService::ListStreams(
    grpc::CallbackServerContext* ctx, const v1::ListStreamsRequest*,
    v1::ListStreamsResponse* resp) {
  for (const StreamStats& s : engine_->ListStreams()) {
    ToProto(s, resp->add_streams());
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* KvMemoryService::GetStreamStats(
    grpc::CallbackServerContext* ctx, const v1::GetStreamStatsRequest* req,
    v1::StreamStats* resp) {
  absl::StatusOr<StreamStats> s = engine_->GetStats(req->stream_id());
  if (s.ok()) ToProto(*s, resp);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s.status()));
  return reactor;
}

grpc::ServerUnaryReactor* KvMemoryService::Recall(
    grpc::CallbackServerContext* ctx, const v1::RecallRequest* req,
    v1::RecallResponse* resp) {
  // Recall touches only RAM (summaries and index): run it inline.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(RunRecall(engine_, req->stream_id(), *req, resp)));
  return reactor;
}

grpc::ServerReadReactor<v1::AppendFramesRequest>* KvMemoryService::AppendFrames(
    grpc::CallbackServerContext*, v1::AppendFramesResponse* resp) {
  return NewAppendFramesReactor(engine_, executor_, resp);
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>*
KvMemoryService::Session(grpc::CallbackServerContext*) {
  return NewSessionReactor(engine_, executor_, options_.session_queue_limit);
}

grpc::ServerWriteReactor<v1::FetchBlocksResponse>* KvMemoryService::FetchBlocks(
    grpc::CallbackServerContext*, const v1::FetchBlocksRequest* req) {
  return NewFetchBlocksReactor(engine_, executor_, *req,
                               options_.max_chunk_bytes);
}

}  // namespace kvmem

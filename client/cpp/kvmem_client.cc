#include "client/cpp/kvmem_client.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>

namespace kvmem {

std::shared_ptr<grpc::Channel> KvmemClient::MakeChannel(
    const std::string& target, const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.own_connection)
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    auto read = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
    };
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = read(options.tls_ca_file);
    if (!options.tls_cert_file.empty()) {
      ssl.pem_cert_chain = read(options.tls_cert_file);
      ssl.pem_private_key = read(options.tls_key_file);
    }
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

std::unique_ptr<KvmemClient> KvmemClient::Connect(
    const std::string& target, const ClientOptions& options) {
  return std::unique_ptr<KvmemClient>(
      new KvmemClient(target, MakeChannel(target, options), options));
}

void KvmemClient::Authorize(const ClientOptions& options,
                            grpc::ClientContext* ctx,
                            const std::string& stream_id) {
  if (!options.api_key.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options.api_key);
  }
  if (!stream_id.empty()) ctx->AddMetadata(kStreamIdHeader, stream_id);
}

KvmemClient::KvmemClient(std::string target,
                         std::shared_ptr<grpc::Channel> channel,
                         const ClientOptions& options)
    : channel_(std::move(channel)),
      stub_(v1::KvMemory::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      options_(options),
      target_(std::move(target)) {}

std::string KvmemClient::RouteOf(const std::string& stream_id) const {
  std::lock_guard<std::mutex> lock(route_mu_);
  auto it = routes_.find(stream_id);
  return it == routes_.end() ? target_ : it->second;
}

v1::KvMemory::Stub* KvmemClient::StubFor(const std::string& stream_id) {
  std::lock_guard<std::mutex> lock(route_mu_);
  auto it = routes_.find(stream_id);
  if (it == routes_.end()) return stub_.get();
  std::unique_ptr<v1::KvMemory::Stub>& stub = owner_stubs_[it->second];
  if (!stub) stub = v1::KvMemory::NewStub(MakeChannel(it->second, options_));
  return stub.get();
}

bool KvmemClient::Follow(const std::string& stream_id,
                         const grpc::ClientContext& ctx,
                         const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kOwnerHeader);
  if (it == trailers.end() || it->second.empty()) {
    // A redirect's target that is gone (or no longer has the stream and
    // cannot say who does): back to the first guess.
    std::lock_guard<std::mutex> lock(route_mu_);
    return routes_.erase(stream_id) > 0;
  }
  const std::string owner(it->second.data(), it->second.size());
  std::lock_guard<std::mutex> lock(route_mu_);
  auto route = routes_.find(stream_id);
  const std::string& now = route == routes_.end() ? target_ : route->second;
  if (owner == now) return false;  // No progress: say why instead.
  if (owner == target_) {
    routes_.erase(stream_id);
  } else {
    routes_[stream_id] = owner;
  }
  return true;
}

grpc::Status KvmemClient::Routed(
    const std::string& stream_id,
    const std::function<grpc::Status(v1::KvMemory::Stub*,
                                     grpc::ClientContext*)>& call) {
  for (int hop = 0;; ++hop) {
    grpc::ClientContext ctx;
    Authorize(options_, &ctx, stream_id);
    grpc::Status st = call(StubFor(stream_id), &ctx);
    if (hop >= options_.max_redirects || !Follow(stream_id, ctx, st)) {
      return st;
    }
  }
}

bool KvmemClient::WaitForReady(std::chrono::milliseconds timeout) {
  return channel_->WaitForConnected(std::chrono::system_clock::now() + timeout);
}

namespace {

// A unary call about one stream: the stream id in the request.
template <typename Req, typename Resp>
std::function<grpc::Status(v1::KvMemory::Stub*, grpc::ClientContext*)>
UnaryCall(grpc::Status (v1::KvMemory::Stub::*method)(grpc::ClientContext*,
                                                     const Req&, Resp*),
          const std::string& stream_id, Req* req, Resp* resp) {
  req->set_stream_id(stream_id);
  return
      [method, req, resp](v1::KvMemory::Stub* stub, grpc::ClientContext* ctx) {
        return (stub->*method)(ctx, *req, resp);
      };
}

}  // namespace

grpc::Status KvmemClient::OpenStream(const std::string& stream_id,
                                     const v1::StreamConfig& config,
                                     v1::OpenStreamResponse* resp) {
  v1::OpenStreamRequest req;
  *req.mutable_config() = config;
  return Routed(stream_id, UnaryCall(&v1::KvMemory::Stub::OpenStream, stream_id,
                                     &req, resp));
}

grpc::Status KvmemClient::CloseStream(const std::string& stream_id,
                                      v1::StreamStats* stats) {
  v1::CloseStreamRequest req;
  v1::CloseStreamResponse resp;
  grpc::Status s = Routed(stream_id, UnaryCall(&v1::KvMemory::Stub::CloseStream,
                                               stream_id, &req, &resp));
  if (s.ok() && stats != nullptr) *stats = resp.stats();
  return s;
}

grpc::Status KvmemClient::DeleteStream(const std::string& stream_id) {
  v1::DeleteStreamRequest req;
  v1::DeleteStreamResponse resp;
  return Routed(stream_id, UnaryCall(&v1::KvMemory::Stub::DeleteStream,
                                     stream_id, &req, &resp));
}

grpc::Status KvmemClient::ListStreams(v1::ListStreamsResponse* resp) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx);
  return stub_->ListStreams(&ctx, v1::ListStreamsRequest(), resp);
}

grpc::Status KvmemClient::GetStreamStats(const std::string& stream_id,
                                         v1::StreamStats* stats) {
  v1::GetStreamStatsRequest req;
  return Routed(stream_id, UnaryCall(&v1::KvMemory::Stub::GetStreamStats,
                                     stream_id, &req, stats));
}

grpc::Status KvmemClient::AppendFrames(const std::string& stream_id,
                                       const std::vector<OutgoingFrame>& frames,
                                       v1::AppendFramesResponse* resp) {
  // After a redirect, frames the owner already holds (an earlier owner
  // stored them before it lost the stream) are not sent again.
  int64_t held = -1;
  return Routed(stream_id, [&](v1::KvMemory::Stub* stub,
                               grpc::ClientContext* ctx) {
    if (stub != stub_.get() || held >= 0) {
      v1::GetStreamStatsRequest req;
      req.set_stream_id(stream_id);
      v1::StreamStats stats;
      grpc::ClientContext stats_ctx;
      Authorize(options_, &stats_ctx, stream_id);
      if (stub->GetStreamStats(&stats_ctx, req, &stats).ok()) {
        held = stats.last_durable_frame();
      }
    }
    auto stored = [&](const OutgoingFrame& f) {
      return held >= 0 && static_cast<int64_t>(f.header.frame_index()) <= held;
    };
    if (!frames.empty() && std::all_of(frames.begin(), frames.end(), stored)) {
      resp->Clear();  // The owner has every one of them.
      resp->set_last_durable_frame(held);
      return grpc::Status::OK;
    }
    auto writer = stub->AppendFrames(ctx, resp);
    bool first = true;
    for (const OutgoingFrame& f : frames) {
      if (stored(f)) continue;
      const bool sent = ForEachFrameMessage(
          f, options_.chunk_bytes,
          [&](v1::FrameHeader* header, v1::PayloadChunk* chunk) {
            v1::AppendFramesRequest req;
            if (first) req.set_stream_id(stream_id);
            first = false;
            if (header != nullptr) *req.mutable_frame() = std::move(*header);
            if (chunk != nullptr) *req.mutable_chunk() = std::move(*chunk);
            return writer->Write(req);
          });
      if (!sent) break;  // The server ended the call; Finish says why.
    }
    writer->WritesDone();
    return writer->Finish();
  });
}

grpc::Status KvmemClient::Recall(const v1::RecallRequest& req,
                                 v1::RecallResponse* resp) {
  return Routed(req.stream_id(),
                [&](v1::KvMemory::Stub* stub, grpc::ClientContext* ctx) {
                  return stub->Recall(ctx, req, resp);
                });
}

grpc::Status KvmemClient::CheckHealth(
    const std::string& service, grpc::health::v1::HealthCheckResponse* resp) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  return health_->Check(&ctx, req, resp);
}

grpc::Status KvmemClient::StartSession(const std::string& stream_id,
                                       const v1::StreamConfig* config,
                                       std::unique_ptr<SessionClient>* session,
                                       v1::OpenStreamResponse* opened) {
  for (int hop = 0;; ++hop) {
    std::unique_ptr<SessionClient> s(
        new SessionClient(this, stream_id, StubFor(stream_id)));
    v1::SessionRequest req;
    req.mutable_open()->set_stream_id(stream_id);
    if (config != nullptr) *req.mutable_open()->mutable_config() = *config;
    v1::SessionResponse resp;
    grpc::Status st = s->Exchange(&req, &resp, true);
    if (!st.ok()) {
      // A refused open ends the call: its trailers name the owner.
      if (hop < options_.max_redirects && s->finished_ &&
          Follow(stream_id, s->ctx_, st)) {
        continue;
      }
      return st;
    }
    if (opened != nullptr) *opened = resp.opened();
    *session = std::move(s);
    return grpc::Status::OK;
  }
}

SessionClient::SessionClient(KvmemClient* client, const std::string& stream_id,
                             v1::KvMemory::Stub* stub)
    : client_(client), chunk_bytes_(client->options().chunk_bytes) {
  KvmemClient::Authorize(client->options(), &ctx_, stream_id);
  stream_ = stub->Session(&ctx_);
}

SessionClient::~SessionClient() {
  if (!finished_) {
    ctx_.TryCancel();
    stream_->Finish().IgnoreError();
  }
}

grpc::Status SessionClient::Broken() {
  finished_ = true;
  grpc::Status s = stream_->Finish();
  if (s.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the session ended unexpectedly");
  }
  return s;
}

grpc::Status SessionClient::Exchange(v1::SessionRequest* req,
                                     v1::SessionResponse* resp,
                                     bool wait_for_response) {
  if (finished_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the session is finished");
  }
  req->set_seq(++seq_);
  if (!stream_->Write(*req)) return Broken();
  if (!wait_for_response) return grpc::Status::OK;
  if (!stream_->Read(resp)) return Broken();
  if (resp->seq() != seq_) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "session response out of order");
  }
  if (resp->has_error()) {
    return grpc::Status(static_cast<grpc::StatusCode>(resp->error().code()),
                        resp->error().message());
  }
  return grpc::Status::OK;
}

grpc::Status SessionClient::Append(const OutgoingFrame& frame,
                                   v1::AppendAck* ack) {
  // Only the message completing the frame gets a response.
  size_t total = frame.payload.size() <= chunk_bytes_
                     ? 1
                     : 1 + (frame.payload.size() - 1) / chunk_bytes_;
  size_t sent = 0;
  grpc::Status st;
  v1::SessionResponse resp;
  ForEachFrameMessage(frame, chunk_bytes_,
                      [&](v1::FrameHeader* header, v1::PayloadChunk* chunk) {
                        v1::SessionRequest req;
                        if (header != nullptr) {
                          *req.mutable_frame() = std::move(*header);
                        }
                        if (chunk != nullptr) {
                          *req.mutable_chunk() = std::move(*chunk);
                        }
                        st = Exchange(&req, &resp, ++sent == total);
                        return st.ok();
                      });
  if (!st.ok()) return st;
  if (!resp.has_ack()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "session answered a frame without an ack");
  }
  if (ack != nullptr) *ack = resp.ack();
  return grpc::Status::OK;
}

grpc::Status SessionClient::Recall(const v1::RecallRequest& req,
                                   v1::RecallResponse* resp) {
  v1::SessionRequest sreq;
  *sreq.mutable_recall() = req;
  v1::SessionResponse sresp;
  grpc::Status st = Exchange(&sreq, &sresp, true);
  if (st.ok()) *resp = sresp.recall();
  return st;
}

grpc::Status SessionClient::Finish() {
  if (finished_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the session is finished");
  }
  finished_ = true;
  stream_->WritesDone();
  return stream_->Finish();
}

}  // namespace kvmem

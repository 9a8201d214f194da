#include "client/cpp/kvmem_client.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

namespace kvmem {

std::unique_ptr<KvmemClient> KvmemClient::Connect(
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
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  return std::unique_ptr<KvmemClient>(new KvmemClient(channel, options));
}

void KvmemClient::Authorize(const ClientOptions& options,
                            grpc::ClientContext* ctx,
                            const std::string& stream_id) {
  if (!options.api_key.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options.api_key);
  }
  if (!stream_id.empty()) ctx->AddMetadata(kStreamIdHeader, stream_id);
}

KvmemClient::KvmemClient(std::shared_ptr<grpc::Channel> channel,
                         const ClientOptions& options)
    : channel_(std::move(channel)),
      stub_(v1::KvMemory::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      options_(options) {}

bool KvmemClient::WaitForReady(std::chrono::milliseconds timeout) {
  return channel_->WaitForConnected(std::chrono::system_clock::now() + timeout);
}

namespace {

// A unary call about one stream: the options' credentials, the stream id in
// the request and as routing metadata.
template <typename Req, typename Resp>
grpc::Status StreamCall(v1::KvMemory::Stub* stub, const ClientOptions& options,
                        grpc::Status (v1::KvMemory::Stub::*method)(
                            grpc::ClientContext*, const Req&, Resp*),
                        const std::string& stream_id, Req req, Resp* resp) {
  grpc::ClientContext ctx;
  KvmemClient::Authorize(options, &ctx, stream_id);
  req.set_stream_id(stream_id);
  return (stub->*method)(&ctx, req, resp);
}

}  // namespace

grpc::Status KvmemClient::OpenStream(const std::string& stream_id,
                                     const v1::StreamConfig& config,
                                     v1::OpenStreamResponse* resp) {
  v1::OpenStreamRequest req;
  *req.mutable_config() = config;
  return StreamCall(stub_.get(), options_, &v1::KvMemory::Stub::OpenStream,
                    stream_id, std::move(req), resp);
}

grpc::Status KvmemClient::CloseStream(const std::string& stream_id,
                                      v1::StreamStats* stats) {
  v1::CloseStreamResponse resp;
  grpc::Status s =
      StreamCall(stub_.get(), options_, &v1::KvMemory::Stub::CloseStream,
                 stream_id, v1::CloseStreamRequest(), &resp);
  if (s.ok() && stats != nullptr) *stats = resp.stats();
  return s;
}

grpc::Status KvmemClient::DeleteStream(const std::string& stream_id) {
  v1::DeleteStreamResponse resp;
  return StreamCall(stub_.get(), options_, &v1::KvMemory::Stub::DeleteStream,
                    stream_id, v1::DeleteStreamRequest(), &resp);
}

grpc::Status KvmemClient::ListStreams(v1::ListStreamsResponse* resp) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx);
  return stub_->ListStreams(&ctx, v1::ListStreamsRequest(), resp);
}

grpc::Status KvmemClient::GetStreamStats(const std::string& stream_id,
                                         v1::StreamStats* stats) {
  return StreamCall(stub_.get(), options_, &v1::KvMemory::Stub::GetStreamStats,
                    stream_id, v1::GetStreamStatsRequest(), stats);
}

grpc::Status KvmemClient::AppendFrames(const std::string& stream_id,
                                       const std::vector<OutgoingFrame>& frames,
                                       v1::AppendFramesResponse* resp) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx, stream_id);
  auto writer = stub_->AppendFrames(&ctx, resp);
  bool first = true;
  for (const OutgoingFrame& f : frames) {
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
}

grpc::Status KvmemClient::Recall(const v1::RecallRequest& req,
                                 v1::RecallResponse* resp) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx, req.stream_id());
  return stub_->Recall(&ctx, req, resp);
}

v1::FetchBlocksRequest KvmemClient::FetchRequest(
    const std::string& stream_id, const std::vector<uint64_t>& block_ids,
    const FetchOptions& o) {
  v1::FetchBlocksRequest req;
  req.set_stream_id(stream_id);
  for (uint64_t id : block_ids) req.add_block_ids(id);
  req.set_max_chunk_bytes(o.max_chunk_bytes);
  req.set_layout(o.layout);
  for (uint32_t l : o.layers) req.add_layers(l);
  for (const v1::BlockTokens& t : o.tokens) *req.add_tokens() = t;
  return req;
}

void KvmemClient::NoteFetchedTokens(const FetchOptions& o,
                                    std::vector<BlockView>* views) {
  if (o.layout != v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR) return;
  for (BlockView& v : *views) {
    const uint64_t id = v.info.block_id();
    auto named = std::find_if(
        o.tokens.begin(), o.tokens.end(),
        [id](const v1::BlockTokens& t) { return t.block_id() == id; });
    v.token_offsets.clear();
    if (named != o.tokens.end() && named->token_offsets_size() > 0) {
      v.token_offsets.assign(named->token_offsets().begin(),
                             named->token_offsets().end());
      continue;
    }
    for (uint32_t j = 0; j < v.info.token_count(); ++j) {
      v.token_offsets.push_back(j);
    }
  }
}

namespace {

// Reads a FetchBlocks byte stream to its end, each chunk checked to continue
// its block: on_chunk(chunk, first), first when the chunk starts a block.
// DATA_LOSS (the call cancelled) for a chunk out of order.
grpc::Status ReadFetchStream(
    grpc::ClientContext* ctx,
    grpc::ClientReader<v1::FetchBlocksResponse>* reader,
    const std::function<void(v1::FetchBlocksResponse*, bool)>& on_chunk) {
  v1::FetchBlocksResponse chunk;
  bool in_block = false;
  uint64_t block_bytes = 0;  // Of the current block, so far.
  while (reader->Read(&chunk)) {
    if (chunk.has_block()) {
      in_block = true;
      block_bytes = 0;
    }
    if (!in_block || block_bytes != chunk.offset()) {
      ctx->TryCancel();
      reader->Finish().IgnoreError();
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          "FetchBlocks chunks arrived out of order");
    }
    block_bytes += chunk.data().size();
    on_chunk(&chunk, chunk.has_block());
  }
  return reader->Finish();
}

}  // namespace

grpc::Status KvmemClient::FetchBlocks(const std::string& stream_id,
                                      const std::vector<uint64_t>& block_ids,
                                      std::vector<FetchedBlock>* blocks,
                                      uint32_t max_chunk_bytes) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx, stream_id);
  FetchOptions options;
  options.max_chunk_bytes = max_chunk_bytes;
  auto reader =
      stub_->FetchBlocks(&ctx, FetchRequest(stream_id, block_ids, options));
  blocks->clear();
  return ReadFetchStream(
      &ctx, reader.get(), [&](v1::FetchBlocksResponse* chunk, bool first) {
        if (first) {
          blocks->push_back({chunk->block(), std::string()});
          blocks->back().payload.reserve(chunk->block().payload_bytes());
        }
        blocks->back().payload.append(chunk->data());
      });
}

grpc::Status KvmemClient::FetchInto(const std::string& stream_id,
                                    const std::vector<uint64_t>& block_ids,
                                    const FetchOptions& options,
                                    std::vector<uint8_t>* buffer,
                                    std::vector<BlockView>* views) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx, stream_id);
  auto reader =
      stub_->FetchBlocks(&ctx, FetchRequest(stream_id, block_ids, options));
  views->clear();
  std::vector<size_t> starts;
  size_t used = 0;
  grpc::Status s = ReadFetchStream(
      &ctx, reader.get(), [&](v1::FetchBlocksResponse* chunk, bool first) {
        if (first) {
          starts.push_back(used);
          BlockView& v = views->emplace_back();
          v.block_id = chunk->block_id();
          v.info = chunk->block();
        }
        const std::string& d = chunk->data();
        if (buffer->size() < used + d.size()) buffer->resize(used + d.size());
        std::memcpy(buffer->data() + used, d.data(), d.size());
        used += d.size();
        views->back().size += d.size();
      });
  // Pointers last: the buffer may have grown while the chunks came.
  for (size_t i = 0; i < views->size(); ++i) {
    (*views)[i].data = buffer->data() + starts[i];
  }
  NoteFetchedTokens(options, views);
  return s;
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
  std::unique_ptr<SessionClient> s(new SessionClient(this, stream_id));
  v1::SessionRequest req;
  req.mutable_open()->set_stream_id(stream_id);
  if (config != nullptr) *req.mutable_open()->mutable_config() = *config;
  v1::SessionResponse resp;
  grpc::Status st = s->Exchange(&req, &resp, true);
  if (!st.ok()) return st;
  if (opened != nullptr) *opened = resp.opened();
  *session = std::move(s);
  return grpc::Status::OK;
}

SessionClient::SessionClient(KvmemClient* client, const std::string& stream_id)
    : client_(client), chunk_bytes_(client->options().chunk_bytes) {
  KvmemClient::Authorize(client->options(), &ctx_, stream_id);
  stream_ = client->stub()->Session(&ctx_);
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

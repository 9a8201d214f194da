// The real kvmem-server binary on a unix socket and a loopback TCP port,
// driven through the C++ client library.
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <thread>

#include "client/cpp/kvmem_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reflection_probe.grpc.pb.h"
#include "tests/stream_model.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToOutgoing;

constexpr uint32_t kFpb = 4;
constexpr uint32_t kWindow = 96;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  // SIGTERM must drain and exit 0; in sanitizer builds the server's log must
  // hold no report (leaks are checked at that exit).
  void TearDown() override {
    if (server_ == nullptr) return;
    // Close this process's idle channels first: gRPC's graceful shutdown
    // waits for each connection to answer its GOAWAY ping, and an idle sync
    // client only polls its sockets every 5 s (the backup poller).
    unix_.reset();
    tcp_.reset();
    EXPECT_EQ(server_->Stop(), 0);
    const std::string log = testing::ReadFile(dir_.path() + "/server.log");
    EXPECT_EQ(log.find("Sanitizer"), std::string::npos) << log;
    EXPECT_EQ(log.find("runtime error"), std::string::npos) << log;
  }

  void StartServer() {
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = dir_.path() + "/data";
    o.unix_socket = dir_.path() + "/kvmem.sock";
    o.listen = "127.0.0.1:0";
    o.log_file = dir_.path() + "/server.log";
    server_ = std::make_unique<ServerProcess>(o);
    std::string error;
    ASSERT_TRUE(server_->Start(std::chrono::seconds(30), &error)) << error;
    ClientOptions co;
    co.chunk_bytes = 1000;  // Forces multi-chunk frames.
    unix_ = KvmemClient::Connect(server_->target(), co);
    tcp_ = KvmemClient::Connect(server_->tcp_target(), co);
    ASSERT_THAT(server_->target(), HasSubstr("unix:"));
  }

  static v1::StreamConfig Config(const TestGeometry& g) {
    return testing::WireConfig(g, kWindow, kFpb, {1, 2});
  }

  // Runs `n` random queries through `client` (one to three query vectors,
  // with the front end's window log-sum-exp or kvmem's estimate) and checks
  // each against the oracle; returns the responses for later comparison.
  std::vector<v1::RecallResponse> CheckRecalls(KvmemClient& client,
                                               const std::string& id,
                                               const StreamModel& model,
                                               uint64_t seed, int n) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> lse(4.0f, 2.0f);
    const size_t heads = model.heads();
    std::vector<v1::RecallResponse> out;
    size_t returned = 0;
    for (int i = 0; i < n; ++i) {
      v1::RecallRequest req;
      req.set_stream_id(id);
      std::vector<float> q, window;
      for (int j = 0; j <= i % 3; ++j) {
        for (float x : testing::RandomQuery(rng, model.summary_dim())) {
          q.push_back(4 * x);
        }
      }
      if (i % 2 == 0) {
        for (size_t k = 0; k < q.size() / model.summary_dim() * heads; ++k) {
          window.push_back(lse(rng));
        }
      }
      req.mutable_query()->Assign(q.begin(), q.end());
      req.mutable_window_lse()->Assign(window.begin(), window.end());
      req.mutable_budget()->set_top_k(i % 3 == 2 ? 2 : 0);
      req.mutable_budget()->set_max_tokens(20 + 17 * i);
      v1::RecallResponse resp;
      grpc::Status s = client.Recall(req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      const auto want =
          model.MassRecall(q, window, i % 3 == 2 ? 2 : 0, 20 + 17 * i);
      EXPECT_EQ(resp.blocks_size(), static_cast<int>(want.size()));
      EXPECT_EQ(resp.query_vectors(), 1u + i % 3);
      EXPECT_EQ(resp.window_estimated(), window.empty());
      uint32_t tokens = 0;
      for (int j = 0;
           j < resp.blocks_size() && j < static_cast<int>(want.size()); ++j) {
        EXPECT_EQ(resp.blocks(j).block_id(), want[j].block_id);
        EXPECT_NEAR(resp.blocks(j).mass(), want[j].mass, 1e-4 * want[j].mass);
        tokens += resp.blocks(j).token_count();
      }
      EXPECT_LE(tokens, 20u + 17 * i);
      EXPECT_EQ(tokens, resp.total_tokens());
      returned += want.size();
      out.push_back(resp);
    }
    EXPECT_GT(returned, 0u);
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<KvmemClient> unix_, tcp_;
};

TEST_F(ServerTest, HealthAndReflection) {
  for (KvmemClient* c : {unix_.get(), tcp_.get()}) {
    for (const char* service : {"", "kvmem.v1.KvMemory"}) {
      grpc::health::v1::HealthCheckResponse h;
      ASSERT_TRUE(c->CheckHealth(service, &h).ok());
      EXPECT_EQ(h.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    }
  }
  auto channel = grpc::CreateChannel(server_->tcp_target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) {
    names.push_back(s.name());
  }
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {"kvmem.v1.KvMemory", "grpc.health.v1.Health"}));
  // The descriptor of the service is served too (what ghz/grpcurl need).
  req.set_file_containing_symbol("kvmem.v1.KvMemory");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, TwoStreamsOverBothTransportsMatchOracleAndSurviveKill) {
  TestGeometry g16;  // fp16 over the unix socket with AppendFrames.
  TestGeometry g32;  // fp32 over TCP with a Session.
  g32.dtype = DType::kFp32;
  g32.head_dim = 8;
  StreamModel a(g16, kFpb, kWindow, {1, 2});
  StreamModel b(g32, kFpb, kWindow, {1, 2});
  std::mt19937_64 rng(11);

  v1::OpenStreamResponse opened;
  ASSERT_TRUE(unix_->OpenStream("cam-a", Config(g16), &opened).ok());
  EXPECT_TRUE(opened.created());
  std::vector<OutgoingFrame> batch;
  for (uint64_t i = 0; i < 300; ++i) {
    batch.push_back(ToOutgoing(a.AddFrame(rng, 1 + rng() % 16, rng() % 4), i));
    if (batch.size() == 50) {
      v1::AppendFramesResponse resp;
      grpc::Status s = unix_->AppendFrames("cam-a", batch, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(resp.last_durable_frame(), static_cast<int64_t>(i));
      EXPECT_EQ(resp.frames_written(), 50u);
      batch.clear();
    }
  }

  std::unique_ptr<SessionClient> session;
  const v1::StreamConfig config_b = Config(g32);
  ASSERT_TRUE(tcp_->StartSession("cam-b", &config_b, &session).ok());
  for (uint64_t i = 0; i < 202; ++i) {
    v1::AppendAck ack;
    grpc::Status s = session->Append(ToOutgoing(b.AddFrame(rng, 16), i), &ack);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(ack.last_durable_frame(), static_cast<int64_t>(i));
    EXPECT_EQ(ack.sealed_block(), (i + 1) % kFpb == 0);
  }
  ASSERT_TRUE(session->Finish().ok());

  // Answers are the same whichever transport asks.
  const auto before_a = CheckRecalls(*unix_, "cam-a", a, 1, 40);
  CheckRecalls(*tcp_, "cam-a", a, 1, 5);
  const auto before_b = CheckRecalls(*tcp_, "cam-b", b, 2, 40);

  // FetchBlocks returns exactly the appended bytes, in small chunks.
  std::vector<uint64_t> ids = {0, 17, 5, 74};
  std::vector<FetchedBlock> fetched;
  grpc::Status s = unix_->FetchBlocks("cam-a", ids, &fetched, 1024);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(fetched.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(fetched[i].info.block_id(), ids[i]);
    EXPECT_EQ(fetched[i].payload, a.BlockBytes(ids[i])) << "block " << ids[i];
    EXPECT_EQ(fetched[i].payload.size(), fetched[i].info.payload_bytes());
  }

  // The append path's CPU by stage, through the wire: this server's
  // appends and seals (engine/stream/ingest_cpu.h).
  v1::StreamStats stats;
  ASSERT_TRUE(unix_->GetStreamStats("cam-a", &stats).ok());
  EXPECT_GT(stats.ingest_cpu().validate_ns(), 0u);
  EXPECT_GT(stats.ingest_cpu().summarize_ns(), 0u);
  EXPECT_GT(stats.ingest_cpu().warm_copy_ns(), 0u);
  EXPECT_GT(stats.ingest_cpu().commit_ns(), 0u);

  // kill -9, restart on the same directory: same answers, resume point kept.
  server_->Kill();
  StartServer();
  ASSERT_TRUE(unix_->GetStreamStats("cam-a", &stats).ok());
  // Counted since the stream was opened in this server: nothing appended.
  EXPECT_EQ(stats.ingest_cpu().commit_ns(), 0u);
  EXPECT_EQ(stats.last_durable_frame(), 299);
  EXPECT_EQ(stats.sealed_blocks(), 75u);
  // The indexes' RAM beside the records' summaries: a fp32 copy of each
  // block's summary at least; none copied under the writer's lock.
  EXPECT_GE(stats.index().bytes(),
            stats.sealed_blocks() * stats.summary_dim() * sizeof(float));
  EXPECT_EQ(stats.index().copied_in_place(), 0u);
  ASSERT_TRUE(tcp_->GetStreamStats("cam-b", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 201);
  EXPECT_EQ(stats.open_block_frames(), 2u);
  const auto after_a = CheckRecalls(*unix_, "cam-a", a, 1, 40);
  const auto after_b = CheckRecalls(*tcp_, "cam-b", b, 2, 40);
  for (size_t i = 0; i < before_a.size(); ++i) {
    ASSERT_EQ(before_a[i].blocks_size(), after_a[i].blocks_size());
    for (int j = 0; j < before_a[i].blocks_size(); ++j) {
      EXPECT_EQ(before_a[i].blocks(j).block_id(),
                after_a[i].blocks(j).block_id());
      EXPECT_EQ(before_a[i].blocks(j).score(), after_a[i].blocks(j).score());
    }
  }
  for (size_t i = 0; i < before_b.size(); ++i) {
    ASSERT_EQ(before_b[i].blocks_size(), after_b[i].blocks_size());
  }
  // The client resumes after the last durable frame; a replay is refused.
  std::vector<OutgoingFrame> resume = {ToOutgoing(b.AddFrame(rng, 16), 202),
                                       ToOutgoing(b.AddFrame(rng, 16), 203)};
  v1::AppendFramesResponse ar;
  ASSERT_TRUE(tcp_->AppendFrames("cam-b", resume, &ar).ok());
  EXPECT_EQ(ar.last_durable_frame(), 203);
  EXPECT_EQ(ar.sealed_blocks(), 1u);  // The block open across the kill.
  CheckRecalls(*tcp_, "cam-b", b, 3, 20);
  s = tcp_->AppendFrames("cam-b", {resume[0]}, &ar);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), HasSubstr("last durable frame is 203"));
}

TEST_F(ServerTest, InvalidRequestsGetPreciseStatus) {
  TestGeometry g;
  StreamModel m(g, kFpb, kWindow, {1, 2});
  std::mt19937_64 rng(5);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(unix_->OpenStream("s", Config(g), &opened).ok());

  // Unknown stream, on every call that names one.
  v1::RecallRequest rr;
  rr.set_stream_id("ghost");
  rr.add_query(1.0f);
  v1::RecallResponse resp;
  grpc::Status s = unix_->Recall(rr, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("\"ghost\""));
  v1::StreamStats stats;
  EXPECT_EQ(unix_->GetStreamStats("ghost", &stats).error_code(),
            grpc::StatusCode::NOT_FOUND);
  std::vector<FetchedBlock> fetched;
  EXPECT_EQ(unix_->FetchBlocks("ghost", {0}, &fetched).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::AppendFramesResponse ar;
  s = unix_->AppendFrames("ghost", {ToOutgoing(m.AddFrame(rng, 4), 0)}, &ar);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unix_->DeleteStream("ghost").error_code(),
            grpc::StatusCode::NOT_FOUND);

  // Payload length that does not match the geometry.
  OutgoingFrame bad = ToOutgoing(m.frames()[0], 0);
  bad.payload.resize(bad.payload.size() - 2);
  s = unix_->AppendFrames("s", {bad}, &ar);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("frame.payload_bytes is"));
  EXPECT_THAT(s.error_message(), HasSubstr("last durable frame is -1"));

  // Zero-dimension query and wrong-dimension query.
  rr.set_stream_id("s");
  rr.clear_query();
  s = unix_->Recall(rr, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("query is empty"));
  rr.add_query(1.0f);
  s = unix_->Recall(rr, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("query has 1 floats"));

  // Bad config fields.
  v1::StreamConfig c = Config(g);
  c.mutable_geometry()->set_head_dim(0);
  s = unix_->OpenStream("t", c, &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("config.geometry.head_dim is 0"));
  s = unix_->OpenStream("bad id!", Config(g), &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("stream_id"));

  // A chunk that skips bytes ends the call; the frame is not stored.
  {
    grpc::ClientContext ctx;
    v1::AppendFramesResponse r;
    auto w = unix_->stub()->AppendFrames(&ctx, &r);
    v1::AppendFramesRequest req;
    req.set_stream_id("s");
    const auto& f = m.frames()[0];
    req.mutable_frame()->set_frame_index(0);
    req.mutable_frame()->set_token_count(f.kv.tokens);
    req.mutable_frame()->set_payload_bytes(f.bytes.size());
    req.mutable_frame()->set_payload(f.bytes.substr(0, 100));
    w->Write(req);
    v1::AppendFramesRequest chunk;
    chunk.mutable_chunk()->set_frame_index(0);
    chunk.mutable_chunk()->set_offset(200);
    chunk.mutable_chunk()->set_data(f.bytes.substr(200));
    w->Write(chunk);
    w->WritesDone();
    s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("chunk.offset is 200"));
  }
  ASSERT_TRUE(unix_->GetStreamStats("s", &stats).ok());
  EXPECT_EQ(stats.frames(), 0u);

  // A session survives a rejected query and keeps appending.
  std::unique_ptr<SessionClient> session;
  ASSERT_TRUE(unix_->StartSession("s", nullptr, &session).ok());
  v1::AppendAck ack;
  ASSERT_TRUE(session->Append(ToOutgoing(m.frames()[0], 0), &ack).ok());
  v1::RecallRequest empty;
  s = session->Recall(empty, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(session->Append(ToOutgoing(m.AddFrame(rng, 4), 1), &ack).ok());
  EXPECT_EQ(ack.last_durable_frame(), 1);
  // A frame gap ends the session with FAILED_PRECONDITION.
  s = session->Append(ToOutgoing(m.AddFrame(rng, 4), 7), &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("next expected is 2"));

  // Fetching a block that does not exist.
  s = unix_->FetchBlocks("s", {99}, &fetched);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("block_ids has 99"));
}

// A Session driven with many requests in flight: responses come back in
// request order; an error mid-stream still delivers the acks of the frames
// stored before it; clients that vanish mid-call leave the server healthy.
// Every RPC's bad inputs, one case each, against the real server: the
// status code and a message naming the field and value. Afterwards the
// server still serves and the stream's acknowledged frames are intact. The
// case count and codes are printed for docs/reliability.md's table.
TEST_F(ServerTest, BadInputCatalogue) {
  TestGeometry g;
  StreamModel m(g, kFpb, kWindow, {1, 2});
  std::mt19937_64 rng(9);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(unix_->OpenStream("s", Config(g), &opened).ok());
  v1::AppendFramesResponse ar;
  std::vector<OutgoingFrame> first;  // One sealed block.
  for (uint64_t i = 0; i < kFpb; ++i) {
    first.push_back(ToOutgoing(m.AddFrame(rng, 4), i));
  }
  ASSERT_TRUE(unix_->AppendFrames("s", first, &ar).ok());
  ASSERT_TRUE(unix_->OpenStream("closed", Config(g), &opened).ok());
  v1::StreamStats stats;
  ASSERT_TRUE(unix_->CloseStream("closed", &stats).ok());
  const testing::ModelFrame next = m.AddFrame(rng, 4);  // Frame 4, unsent.

  using grpc::StatusCode;
  struct Case {
    std::string rpc, input;
    std::function<grpc::Status()> call;
    StatusCode code;
    std::string message;
  };
  auto open = [&](const std::string& id, const v1::StreamConfig& c) {
    v1::OpenStreamResponse r;
    return unix_->OpenStream(id, c, &r);
  };
  auto with = [&](const std::function<void(v1::StreamConfig*)>& edit) {
    v1::StreamConfig c = Config(g);
    edit(&c);
    return open("new-stream", c);
  };
  // AppendFrames with exactly these messages.
  auto raw_append = [&](std::vector<v1::AppendFramesRequest> reqs) {
    grpc::ClientContext ctx;
    v1::AppendFramesResponse r;
    auto w = unix_->stub()->AppendFrames(&ctx, &r);
    for (const auto& q : reqs) {
      if (!w->Write(q)) break;
    }
    w->WritesDone();
    return w->Finish();
  };
  auto header = [&](const testing::ModelFrame& f, uint64_t index) {
    v1::AppendFramesRequest q;
    q.set_stream_id("s");
    v1::FrameHeader* h = q.mutable_frame();
    h->set_frame_index(index);
    h->set_first_token_position(f.first_pos);
    h->set_token_count(f.kv.tokens);
    h->set_payload_bytes(f.bytes.size());
    h->set_payload(f.bytes);
    return q;
  };
  auto chunk = [&](const std::string& bytes, uint64_t index, uint64_t off,
                   size_t n) {
    v1::AppendFramesRequest q;
    q.mutable_chunk()->set_frame_index(index);
    q.mutable_chunk()->set_offset(off);
    q.mutable_chunk()->set_data(bytes.substr(off, n));
    return q;
  };
  auto split = [&](uint64_t first_bytes) {  // Header with a leading part.
    v1::AppendFramesRequest h = header(next, 4);
    h.mutable_frame()->set_payload(next.bytes.substr(0, first_bytes));
    return h;
  };
  // A Session: these requests, then the first error (a SessionError
  // response, or the call's status).
  auto raw_session = [&](std::vector<v1::SessionRequest> reqs) {
    grpc::ClientContext ctx;
    auto rw = unix_->stub()->Session(&ctx);
    for (auto& q : reqs) {
      if (!rw->Write(q)) break;
    }
    rw->WritesDone();
    v1::SessionResponse resp;
    std::optional<grpc::Status> err;
    while (rw->Read(&resp)) {
      if (resp.has_error() && !err) {
        err = grpc::Status(static_cast<StatusCode>(resp.error().code()),
                           resp.error().message());
      }
    }
    grpc::Status end = rw->Finish();
    return err ? *err : end;
  };
  auto session_open = [](const std::string& id) {
    v1::SessionRequest q;
    q.mutable_open()->set_stream_id(id);
    return q;
  };
  auto recall = [&](const std::function<void(v1::RecallRequest*)>& edit) {
    v1::RecallRequest req;
    req.set_stream_id("s");
    for (size_t i = 0; i < m.summary_dim(); ++i) req.add_query(0.5f);
    edit(&req);
    v1::RecallResponse resp;
    return unix_->Recall(req, &resp);
  };
  auto fetch = [&](const std::function<void(v1::FetchBlocksRequest*)>& edit) {
    v1::FetchBlocksRequest req;
    req.set_stream_id("s");
    req.add_block_ids(0);
    edit(&req);
    grpc::ClientContext ctx;
    auto r = unix_->stub()->FetchBlocks(&ctx, req);
    v1::FetchBlocksResponse resp;
    while (r->Read(&resp)) {
    }
    return r->Finish();
  };
  // The frame with one indexed key (layer 1, head 0, token 0, dim 3) set to
  // the fp16 value `bits`.
  auto poisoned = [&](uint16_t bits) {
    v1::AppendFramesRequest q = header(next, 4);
    std::string p = next.bytes;
    const size_t slice = size_t{g.kv_heads} * next.kv.tokens * g.head_dim;
    const size_t at = (2 * slice * 1 + 3) * 2;
    p[at] = static_cast<char>(bits & 0xff);
    p[at + 1] = static_cast<char>(bits >> 8);
    q.mutable_frame()->set_payload(p);
    return raw_append({q});
  };
  // A channel that sends messages of any size, to meet the server's limit.
  grpc::ChannelArguments big;
  big.SetMaxSendMessageSize(-1);
  auto big_stub = v1::KvMemory::NewStub(grpc::CreateCustomChannel(
      server_->target(), grpc::InsecureChannelCredentials(), big));

  const std::vector<Case> cases = {
      {"OpenStream", "empty stream_id", [&] { return open("", Config(g)); },
       StatusCode::INVALID_ARGUMENT, "stream_id"},
      // Accepted before, it made every recall without a budget fail naming
      // budget.max_tokens as 0.
      {"OpenStream", "recall_defaults.max_tokens 4e9",
       [&] {
         return with([](auto* c) {
           c->mutable_recall_defaults()->set_max_tokens(4000000000u);
         });
       },
       StatusCode::INVALID_ARGUMENT,
       "config.recall_defaults.max_tokens is 4000000000"},
      {"OpenStream", "stream_id of 200 bytes",
       [&] { return open(std::string(200, 'a'), Config(g)); },
       StatusCode::INVALID_ARGUMENT, "stream_id"},
      {"OpenStream", "stream_id with a space and '!'",
       [&] { return open("bad id!", Config(g)); }, StatusCode::INVALID_ARGUMENT,
       "stream_id"},
      {"OpenStream", "geometry.layers 0",
       [&] {
         return with([](auto* c) { c->mutable_geometry()->set_layers(0); });
       },
       StatusCode::INVALID_ARGUMENT, "config.geometry.layers is 0"},
      {"OpenStream", "geometry.kv_heads 0",
       [&] {
         return with([](auto* c) { c->mutable_geometry()->set_kv_heads(0); });
       },
       StatusCode::INVALID_ARGUMENT, "config.geometry.kv_heads is 0"},
      {"OpenStream", "geometry.head_dim 5000",
       [&] {
         return with(
             [](auto* c) { c->mutable_geometry()->set_head_dim(5000); });
       },
       StatusCode::INVALID_ARGUMENT, "config.geometry.head_dim is 5000"},
      {"OpenStream", "geometry.dtype 99",
       [&] {
         return with([](auto* c) {
           c->mutable_geometry()->set_dtype(static_cast<v1::DType>(99));
         });
       },
       StatusCode::INVALID_ARGUMENT, "dtype"},
      {"OpenStream", "geometry.max_tokens_per_frame 70000",
       [&] {
         return with([](auto* c) {
           c->mutable_geometry()->set_max_tokens_per_frame(70000);
         });
       },
       StatusCode::INVALID_ARGUMENT, "max_tokens_per_frame is 70000"},
      {"OpenStream", "index_policy.indexed_layers has 99",
       [&] {
         return with([](auto* c) {
           c->mutable_index_policy()->add_indexed_layers(99);
         });
       },
       StatusCode::INVALID_ARGUMENT, "99"},
      {"OpenStream", "index_policy.index_factory \"Bogus\"",
       [&] {
         return with([](auto* c) {
           c->mutable_index_policy()->set_index_factory("Bogus");
         });
       },
       StatusCode::INVALID_ARGUMENT, "Bogus"},
      {"OpenStream",
       "index_factory \"HNSW8111111111111111111111111\" (found by fuzzing: "
       "FAISS's parser threw std::out_of_range)",
       [&] {
         return with([](auto* c) {
           c->mutable_index_policy()->set_index_factory(
               "HNSW8111111111111111111111111");
         });
       },
       StatusCode::INVALID_ARGUMENT, "\" is not one of: Flat, Progressive"},
      {"OpenStream", "index_factory \"IVF1000000,Flat\"",
       [&] {
         return with([](auto* c) {
           c->mutable_index_policy()->set_index_factory("IVF1000000,Flat");
         });
       },
       StatusCode::INVALID_ARGUMENT, "(n 1..1024)"},
      {"OpenStream",
       "index_factory \"PQ5\" (FAISS threw \"d % M == 0\" and aborted the "
       "server)",
       [&] {
         return with([](auto* c) {
           c->mutable_index_policy()->set_index_factory("PQ5");
         });
       },
       StatusCode::INVALID_ARGUMENT, "sub-quantizers; the count must divide"},
      {"OpenStream", "recall_policy.identity_share -0.5",
       [&] {
         return with([](auto* c) {
           c->mutable_recall_policy()->set_identity_share(-0.5f);
         });
       },
       StatusCode::INVALID_ARGUMENT,
       "config.recall_policy.identity_share is -0.5"},
      {"OpenStream", "index_policy.groups_per_block 65",
       [&] {
         return with([](auto* c) {
           c->mutable_index_policy()->set_groups_per_block(65);
         });
       },
       StatusCode::INVALID_ARGUMENT, "groups_per_block is 65"},
      {"OpenStream", "recall_defaults.gate_temperature NaN",
       [&] {
         return with([](auto* c) {
           c->mutable_recall_defaults()->set_gate_temperature(std::nanf(""));
         });
       },
       StatusCode::INVALID_ARGUMENT, "gate_temperature"},
      {"OpenStream",
       "recall_defaults.gate_temperature 1e-45 (its gates were NaN)",
       [&] {
         return with([](auto* c) {
           c->mutable_recall_defaults()->set_gate_temperature(1e-45f);
         });
       },
       StatusCode::INVALID_ARGUMENT, "must be in [0.001, 1e6]"},
      {"OpenStream", "an existing stream with another config",
       [&] {
         v1::StreamConfig c = Config(g);
         c.set_hot_window_tokens(kWindow + 1);
         return open("s", c);
       },
       StatusCode::ALREADY_EXISTS, "\"s\""},
      {"CloseStream", "unknown stream",
       [&] {
         v1::StreamStats st;
         return unix_->CloseStream("ghost", &st);
       },
       StatusCode::NOT_FOUND, "\"ghost\""},
      {"DeleteStream", "unknown stream",
       [&] { return unix_->DeleteStream("ghost"); }, StatusCode::NOT_FOUND,
       "\"ghost\""},
      {"GetStreamStats", "unknown stream",
       [&] {
         v1::StreamStats st;
         return unix_->GetStreamStats("ghost", &st);
       },
       StatusCode::NOT_FOUND, "\"ghost\""},
      {"AppendFrames", "unknown stream",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.set_stream_id("ghost");
         return raw_append({q});
       },
       StatusCode::NOT_FOUND, "\"ghost\""},
      {"AppendFrames", "no stream_id on the first message",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.clear_stream_id();
         return raw_append({q});
       },
       StatusCode::INVALID_ARGUMENT, "stream_id"},
      {"AppendFrames", "payload 2 bytes short",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.mutable_frame()->set_payload_bytes(next.bytes.size() - 2);
         q.mutable_frame()->mutable_payload()->resize(next.bytes.size() - 2);
         return raw_append({q});
       },
       StatusCode::INVALID_ARGUMENT, "payload"},
      {"AppendFrames", "token_count 0",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.mutable_frame()->set_token_count(0);
         return raw_append({q});
       },
       StatusCode::INVALID_ARGUMENT, "token_count is 0"},
      {"AppendFrames", "token_count 17 (max_tokens_per_frame 16)",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.mutable_frame()->set_token_count(17);
         return raw_append({q});
       },
       StatusCode::INVALID_ARGUMENT, "token_count is 17"},
      {"AppendFrames", "a stored frame again (duplicate)",
       [&] { return raw_append({header(m.frames()[0], 0)}); },
       StatusCode::ALREADY_EXISTS, "last durable frame is 3"},
      {"AppendFrames", "frame 9 after frame 3 (out of order)",
       [&] { return raw_append({header(next, 9)}); },
       StatusCode::FAILED_PRECONDITION, "next expected is 4"},
      // Said at the header, before any payload (a front end would have
      // sent the whole frame first; with none, "the call ended inside the
      // frame" hid the cause).
      {"AppendFrames", "frame 9 after frame 3, header alone",
       [&] {
         v1::AppendFramesRequest q = header(next, 9);
         q.mutable_frame()->clear_payload();
         return raw_append({q});
       },
       StatusCode::FAILED_PRECONDITION, "next expected is 4"},
      {"AppendFrames", "first_token_position inside the previous frame",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.mutable_frame()->set_first_token_position(1);
         return raw_append({q});
       },
       StatusCode::INVALID_ARGUMENT, "first_token_position 1"},
      {"AppendFrames", "a NaN key in an indexed layer",
       [&] { return poisoned(0x7e00); }, StatusCode::INVALID_ARGUMENT,
       "NaN, Inf or beyond +-65536 at layer 1, kv_head 0, token 0, dim 3"},
      {"AppendFrames", "an Inf key in an indexed layer",
       [&] { return poisoned(0x7c00); }, StatusCode::INVALID_ARGUMENT,
       "NaN, Inf or beyond +-65536 at layer 1"},
      {"AppendFrames", "a detection box of NaN",
       [&] {
         v1::AppendFramesRequest q = header(next, 4);
         q.mutable_frame()->mutable_signals()->add_detections()->set_x_min(
             std::nanf(""));
         return raw_append({q});
       },
       StatusCode::INVALID_ARGUMENT, "signals"},
      {"AppendFrames", "a chunk that skips bytes",
       [&] {
         return raw_append({split(100), chunk(next.bytes, 4, 200, 50)});
       },
       StatusCode::INVALID_ARGUMENT, "chunk.offset is 200"},
      {"AppendFrames", "a chunk that repeats bytes",
       [&] {
         return raw_append({split(100), chunk(next.bytes, 4, 50, 100)});
       },
       StatusCode::INVALID_ARGUMENT, "chunk.offset is 50"},
      {"AppendFrames", "a chunk with no frame header before it",
       [&] {
         v1::AppendFramesRequest c = chunk(next.bytes, 4, 0, 10);
         c.set_stream_id("s");
         return raw_append({c});
       },
       StatusCode::INVALID_ARGUMENT, "chunk"},
      {"AppendFrames", "a chunk for another frame_index",
       [&] {
         return raw_append({split(100), chunk(next.bytes, 5, 100, 10)});
       },
       StatusCode::INVALID_ARGUMENT, "frame_index"},
      {"AppendFrames", "the call ends inside a frame",
       [&] { return raw_append({split(100)}); }, StatusCode::INVALID_ARGUMENT,
       "frame 4"},
      {"AppendFrames", "a closed stream",
       [&] {
         v1::AppendFramesRequest q = header(m.frames()[0], 0);
         q.set_stream_id("closed");
         return raw_append({q});
       },
       StatusCode::FAILED_PRECONDITION, "closed"},
      {"AppendFrames", "a message over --max_message_bytes (64 MiB)",
       [&] {
         grpc::ClientContext ctx;
         v1::AppendFramesResponse r;
         auto w = big_stub->AppendFrames(&ctx, &r);
         v1::AppendFramesRequest q = header(next, 4);
         q.mutable_frame()->mutable_payload()->resize(65 << 20);
         w->Write(q);
         w->WritesDone();
         return w->Finish();
       },
       StatusCode::RESOURCE_EXHAUSTED, "larger than max"},
      {"Recall", "unknown stream",
       [&] { return recall([](auto* r) { r->set_stream_id("ghost"); }); },
       StatusCode::NOT_FOUND, "\"ghost\""},
      {"Recall", "empty query",
       [&] { return recall([](auto* r) { r->clear_query(); }); },
       StatusCode::INVALID_ARGUMENT, "query is empty"},
      {"Recall", "query of 1 float",
       [&] {
         return recall([](auto* r) {
           r->clear_query();
           r->add_query(1.0f);
         });
       },
       StatusCode::INVALID_ARGUMENT, "query has 1 floats"},
      {"Recall", "NaN in the query",
       [&] { return recall([](auto* r) { r->set_query(2, std::nanf("")); }); },
       StatusCode::INVALID_ARGUMENT, "query"},
      {"Recall", "Inf in the query",
       [&] { return recall([](auto* r) { r->set_query(0, INFINITY); }); },
       StatusCode::INVALID_ARGUMENT, "query"},
      {"Recall", "3e38 in the query (finite; its scores overflowed to inf)",
       [&] { return recall([](auto* r) { r->set_query(1, 3e38f); }); },
       StatusCode::INVALID_ARGUMENT,
       "query[1] is 3e+38; must be finite and in [-65536, 65536]"},
      {"Recall", "current_token_position 2^64-1 (it gave 0 candidates)",
       [&] {
         return recall(
             [](auto* r) { r->set_current_token_position(~uint64_t{0}); });
       },
       StatusCode::INVALID_ARGUMENT, "must be at most 2^63"},
      {"Recall", "budget.top_k 5000",
       [&] {
         return recall([](auto* r) { r->mutable_budget()->set_top_k(5000); });
       },
       StatusCode::INVALID_ARGUMENT, "budget.top_k is 5000"},
      {"Recall", "budget.max_tokens 2^25",
       [&] {
         return recall(
             [](auto* r) { r->mutable_budget()->set_max_tokens(1u << 25); });
       },
       StatusCode::INVALID_ARGUMENT, "budget.max_tokens is 33554432"},
      {"Recall", "budget.window_fraction -0.5",
       [&] {
         return recall(
             [](auto* r) { r->mutable_budget()->set_window_fraction(-0.5f); });
       },
       StatusCode::INVALID_ARGUMENT, "budget.window_fraction is -0.5"},
      {"Recall", "budget.window_fraction 2",
       [&] {
         return recall(
             [](auto* r) { r->mutable_budget()->set_window_fraction(2.0f); });
       },
       StatusCode::INVALID_ARGUMENT, "budget.window_fraction is 2"},
      {"Recall", "1025 query vectors",
       [&] {
         return recall([](auto* r) {
           const auto one = r->query();
           for (int i = 0; i < 1024; ++i) r->mutable_query()->MergeFrom(one);
         });
       },
       StatusCode::INVALID_ARGUMENT, "n in [1, 1024]"},
      {"Recall", "budget.identity_share 1.5",
       [&] {
         return recall(
             [](auto* r) { r->mutable_budget()->set_identity_share(1.5f); });
       },
       StatusCode::INVALID_ARGUMENT, "budget.identity_share is 1.5"},
      {"Recall", "budget.mass_target 2",
       [&] {
         return recall(
             [](auto* r) { r->mutable_budget()->set_mass_target(2.0f); });
       },
       StatusCode::INVALID_ARGUMENT, "budget.mass_target is 2"},
      {"Recall", "window_lse of 3 floats",
       [&] {
         return recall([](auto* r) {
           for (int i = 0; i < 3; ++i) r->add_window_lse(1.0f);
         });
       },
       StatusCode::INVALID_ARGUMENT, "window_lse has 3 floats"},
      {"Recall", "NaN in window_lse",
       [&] {
         return recall([](auto* r) {
           for (int i = 0; i < 4; ++i) r->add_window_lse(std::nanf(""));
         });
       },
       StatusCode::INVALID_ARGUMENT, "window_lse"},
      {"Recall", "per_head with per_layer",
       [&] {
         return recall([](auto* r) {
           r->set_per_head(true);
           r->set_per_layer(true);
         });
       },
       StatusCode::INVALID_ARGUMENT, "per_head and per_layer"},
      {"Recall", "delivery.layout 77",
       [&] {
         return recall([](auto* r) {
           r->mutable_delivery()->set_mode(v1::RecallDelivery::MODE_INLINE);
           r->mutable_delivery()->set_layout(
               static_cast<v1::PayloadLayout>(77));
         });
       },
       StatusCode::INVALID_ARGUMENT, "delivery.layout is 77"},
      {"Recall", "delivery.layers has 9 (3 layers)",
       [&] {
         return recall([](auto* r) {
           r->mutable_delivery()->set_mode(v1::RecallDelivery::MODE_INLINE);
           r->mutable_delivery()->set_layout(
               v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
           r->mutable_delivery()->add_layers(9);
         });
       },
       StatusCode::INVALID_ARGUMENT, "delivery.layers has 9"},
      // Sets x blocks unbounded built a 91 MB answer gRPC refused to send.
      {"Recall", "per_head with budget.max_tokens 2^21",
       [&] {
         return recall([](auto* r) {
           r->set_per_head(true);
           r->mutable_budget()->set_max_tokens(1u << 21);
         });
       },
       StatusCode::RESOURCE_EXHAUSTED, "sets of up to 2097152 tokens each"},
      {"FetchBlocks", "unknown stream",
       [&] { return fetch([](auto* r) { r->set_stream_id("ghost"); }); },
       StatusCode::NOT_FOUND, "\"ghost\""},
      {"FetchBlocks", "no block_ids",
       [&] { return fetch([](auto* r) { r->clear_block_ids(); }); },
       StatusCode::INVALID_ARGUMENT, "block_ids"},
      {"FetchBlocks", "1025 block_ids",
       [&] {
         return fetch([](auto* r) {
           for (int i = 0; i < 1024; ++i) r->add_block_ids(0);
         });
       },
       StatusCode::INVALID_ARGUMENT, "1025"},
      {"FetchBlocks", "a block that does not exist",
       [&] { return fetch([](auto* r) { r->set_block_ids(0, 99); }); },
       StatusCode::NOT_FOUND, "block_ids has 99"},
      {"FetchBlocks", "max_chunk_bytes above the server's 4 MiB",
       [&] {
         return fetch([](auto* r) { r->set_max_chunk_bytes(100u << 20); });
       },
       StatusCode::INVALID_ARGUMENT, "max_chunk_bytes is 104857600"},
      {"FetchBlocks", "layout 77",
       [&] {
         return fetch([](auto* r) {
           r->set_layout(static_cast<v1::PayloadLayout>(77));
         });
       },
       StatusCode::INVALID_ARGUMENT, "layout"},
      {"FetchBlocks", "layers has 9 (3 layers)",
       [&] {
         return fetch([](auto* r) {
           r->set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
           r->add_layers(9);
         });
       },
       StatusCode::INVALID_ARGUMENT, "layers has 9"},
      // A layer named again and again would make the server read (and
      // hold) the same record without bound.
      {"FetchBlocks", "layer 1 named twice",
       [&] {
         return fetch([](auto* r) {
           r->set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
           r->add_layers(1);
           r->add_layers(0);
           r->add_layers(1);
         });
       },
       StatusCode::INVALID_ARGUMENT, "layers names layer 1 twice"},
      {"FetchBlocks", "an arena this server never made",
       [&] { return fetch([](auto* r) { r->set_shm_arena_id(12345); }); },
       StatusCode::NOT_FOUND, "shared-memory arena 12345"},
      // One message a byte: an audit's 1 MiB fetch cost 16 s of server CPU.
      {"FetchBlocks", "max_chunk_bytes 1",
       [&] { return fetch([](auto* r) { r->set_max_chunk_bytes(1); }); },
       StatusCode::INVALID_ARGUMENT,
       "max_chunk_bytes is 1; must be 0 or at least 1024"},
      // Checked before it is copied to the block's 1,024 places (the copies
      // took 1 GB for a 735 KB request, then the same refusal): the server's
      // peak RSS grows by far less than one copy per place.
      {"FetchBlocks", "200,000 token offsets for a block named 1,024 times",
       [&] {
         const double peak0 = testing::PeakRssKib(server_->pid());
         const grpc::Status st = fetch([](auto* r) {
           for (int i = 1; i < 1024; ++i) r->add_block_ids(0);
           r->set_layout(v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR);
           v1::BlockTokens* t = r->add_tokens();
           t->set_block_id(0);
           for (uint32_t i = 0; i < 200000; ++i) t->add_token_offsets(i);
         });
         if (!KVMEM_TEST_ASAN) {  // ASan's quarantine keeps what is freed.
           EXPECT_LT(testing::PeakRssKib(server_->pid()) - peak0,
                     100 * 1024.0);  // Copies per place: 800 MB.
         }
         return st;
       },
       StatusCode::INVALID_ARGUMENT, "tokens of block 0 has offset"},
      {"FetchBlocks", "65,537 release_lease_ids",
       [&] {
         return fetch([](auto* r) {
           for (int i = 0; i <= 65536; ++i) r->add_release_lease_ids(i + 1);
         });
       },
       StatusCode::INVALID_ARGUMENT, "release_lease_ids has 65537 lease ids"},
      // Checked before the ids are read (their deduplication was quadratic:
      // 320,000 ids took 11 s of a worker).
      {"ReleaseLeases", "65,537 lease_ids",
       [&] {
         std::vector<uint64_t> ids(65537);
         for (size_t i = 0; i < ids.size(); ++i) ids[i] = i + 1;
         v1::ReleaseLeasesResponse r;
         return unix_->ReleaseLeases(12345, ids, &r);
       },
       StatusCode::INVALID_ARGUMENT, "lease_ids has 65537 lease ids"},
      {"Session", "a frame before open",
       [&] {
         v1::SessionRequest q;
         *q.mutable_frame() = header(next, 4).frame();
         return raw_session({q});
       },
       StatusCode::FAILED_PRECONDITION, "send SessionRequest.open first"},
      {"Session", "a second open",
       [&] {
         return raw_session({session_open("s"), session_open("s")});
       },
       StatusCode::FAILED_PRECONDITION, "already bound"},
      {"Session", "open of an unknown stream without config",
       [&] { return raw_session({session_open("ghost")}); },
       StatusCode::NOT_FOUND, "\"ghost\""},
      {"Session", "a request with no item",
       [&] {
         return raw_session({session_open("s"), v1::SessionRequest()});
       },
       StatusCode::INVALID_ARGUMENT, "item"},
      {"Session", "an empty query (answered, the session goes on)",
       [&] {
         v1::SessionRequest q;
         q.mutable_recall();
         return raw_session({session_open("s"), q});
       },
       StatusCode::INVALID_ARGUMENT, "query is empty"},
  };
  std::map<StatusCode, int> by_code;
  for (const Case& c : cases) {
    const grpc::Status st = c.call();
    EXPECT_EQ(st.error_code(), c.code)
        << c.rpc << ", " << c.input << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(c.message))
        << c.rpc << ", " << c.input;
    ++by_code[st.error_code()];
    std::printf("| %s | %s | %d | %s |\n", c.rpc.c_str(), c.input.c_str(),
                st.error_code(), st.error_message().c_str());
  }
  std::printf("bad-input cases: %zu;", cases.size());
  for (const auto& [code, n] : by_code) std::printf(" code %d: %d", code, n);
  std::printf("\n");
  // Nothing acknowledged was lost, and the stream takes its next frame.
  ASSERT_TRUE(unix_->GetStreamStats("s", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 3);
  ASSERT_TRUE(raw_append({header(next, 4)}).ok());
  std::vector<OutgoingFrame> rest;
  for (uint64_t i = 5; i < 2 * kFpb; ++i) {
    rest.push_back(ToOutgoing(m.AddFrame(rng, 4), i));
  }
  ASSERT_TRUE(unix_->AppendFrames("s", rest, &ar).ok());
  std::vector<FetchedBlock> fetched;
  ASSERT_TRUE(unix_->FetchBlocks("s", {0, 1}, &fetched).ok());
  ASSERT_EQ(fetched.size(), 2u);
  EXPECT_EQ(fetched[0].payload, m.BlockBytes(0));
  EXPECT_EQ(fetched[1].payload, m.BlockBytes(1));
}

TEST_F(ServerTest, SessionPipelinedErrorsAndCancellation) {
  TestGeometry g;
  StreamModel m(g, kFpb, kWindow, {1, 2});
  std::mt19937_64 rng(21);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(unix_->OpenStream("p", Config(g), &opened).ok());
  for (int i = 0; i < 120; ++i) m.AddFrame(rng, 1 + rng() % 16);

  grpc::ClientContext ctx;
  auto stream = unix_->stub()->Session(&ctx);
  uint64_t seq = 0;
  v1::SessionRequest open;
  open.set_seq(++seq);
  open.mutable_open()->set_stream_id("p");
  ASSERT_TRUE(stream->Write(open));
  // 100 frames (some chunked), each followed by a recall, all written before
  // reading anything; then frame 50 again (a duplicate), then more frames.
  auto write_frame = [&](uint64_t i) {
    return ForEachFrameMessage(ToOutgoing(m.frames()[i], i), 700,
                               [&](v1::FrameHeader* h, v1::PayloadChunk* c) {
                                 v1::SessionRequest r;
                                 r.set_seq(++seq);
                                 if (h) *r.mutable_frame() = *h;
                                 if (c) *r.mutable_chunk() = *c;
                                 return stream->Write(r);
                               });
  };
  std::thread writer([&] {
    for (uint64_t i = 0; i < 100; ++i) {
      if (!write_frame(i)) return;
      v1::SessionRequest r;
      r.set_seq(++seq);
      for (size_t d = 0; d < m.summary_dim(); ++d)
        r.mutable_recall()->add_query(1.0f);
      if (!stream->Write(r)) return;
    }
    if (!write_frame(50)) return;
    for (uint64_t i = 100; i < 110; ++i) {
      if (!write_frame(i)) return;
    }
    stream->WritesDone();
  });
  v1::SessionResponse resp;
  int acks = 0, recalls = 0;
  uint64_t last_seq = 0;
  while (stream->Read(&resp)) {
    EXPECT_GT(resp.seq(), last_seq);
    last_seq = resp.seq();
    if (resp.has_ack()) {
      EXPECT_EQ(resp.ack().frame_index(), static_cast<uint64_t>(acks));
      ++acks;
    }
    if (resp.has_recall()) {
      ++recalls;
      EXPECT_LE(resp.recall().total_tokens(), resp.recall().budget_tokens());
    }
  }
  writer.join();
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), HasSubstr("last durable frame is 99"));
  EXPECT_EQ(acks, 100);  // Every stored frame was acknowledged.
  EXPECT_EQ(recalls, 100);
  v1::StreamStats stats;
  ASSERT_TRUE(unix_->GetStreamStats("p", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 99);

  // Clients that cancel mid-call, with requests and responses in flight.
  for (int round = 0; round < 20; ++round) {
    grpc::ClientContext c2;
    auto s2 = tcp_->stub()->Session(&c2);
    v1::SessionRequest o;
    o.mutable_open()->set_stream_id("p");
    s2->Write(o);
    for (int i = 0; i < 30; ++i) {
      v1::SessionRequest r;
      for (size_t d = 0; d < m.summary_dim(); ++d)
        r.mutable_recall()->add_query(0.5f);
      if (!s2->Write(r)) break;
    }
    if (round % 2 == 1) s2->Read(&resp);
    c2.TryCancel();
    s2->Finish().IgnoreError();
  }
  grpc::health::v1::HealthCheckResponse h;
  ASSERT_TRUE(unix_->CheckHealth("", &h).ok());
  EXPECT_EQ(h.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_TRUE(unix_->GetStreamStats("p", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 99);
}

// A heat-aware stream with tight budgets, through the real server: its
// blocks spread over warm, cold and degraded; Recall returns degraded blocks
// flagged as such; FetchBlocks sends them flagged, dequantised, and one layer
// at a time when asked.
TEST_F(ServerTest, TiersThroughTheServer) {
  TestGeometry g;
  StreamModel m(g, 2, kWindow, {1, 2});
  std::mt19937_64 rng(31);
  v1::StreamConfig c = Config(g);
  c.mutable_block_policy()->set_frames_per_block(2);
  const uint64_t block_bytes = 3 * 2 * 2 * 8 * 16 * 2;  // 8 tokens a block.
  v1::TierPolicy* t = c.mutable_tier_policy();
  t->set_replacement(v1::REPLACEMENT_POLICY_HEAT);
  t->set_warm_budget_bytes(3 * 4096 * 3);  // Three blocks (4 KiB per layer).
  t->set_cold_budget_bytes(5 * block_bytes);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(unix_->OpenStream("tiered", c, &opened).ok());
  std::vector<OutgoingFrame> frames;
  for (uint64_t i = 0; i < 80; ++i) {
    frames.push_back(ToOutgoing(m.AddFrame(rng, 4), i));
  }
  v1::AppendFramesResponse ar;
  ASSERT_TRUE(unix_->AppendFrames("tiered", frames, &ar).ok());
  v1::StreamStats stats;
  ASSERT_TRUE(unix_->GetStreamStats("tiered", &stats).ok());
  EXPECT_EQ(stats.sealed_blocks(), 40u);
  EXPECT_EQ(stats.warm().blocks(), 3u);
  EXPECT_EQ(stats.cold().blocks(), 5u);
  EXPECT_EQ(stats.degraded().blocks(), 32u);
  EXPECT_LE(stats.warm().bytes(), t->warm_budget_bytes());
  EXPECT_GT(stats.policy().demotions(), 0u);
  EXPECT_GT(stats.policy().degradations(), 0u);
  EXPECT_EQ(stats.config().tier_policy().replacement(),
            v1::REPLACEMENT_POLICY_HEAT);

  uint64_t degraded_id = 0;
  bool found = false;
  for (int i = 0; i < 20 && !found; ++i) {
    v1::RecallRequest req;
    req.set_stream_id("tiered");
    for (float x : testing::RandomQuery(rng, m.summary_dim())) req.add_query(x);
    req.mutable_budget()->set_top_k(8);
    req.mutable_budget()->set_max_tokens(64);
    v1::RecallResponse resp;
    ASSERT_TRUE(unix_->Recall(req, &resp).ok());
    for (const auto& b : resp.blocks()) {
      if (b.tier() == v1::TIER_DEGRADED) {
        EXPECT_TRUE(b.degraded());
        degraded_id = b.block_id();
        found = true;
      }
    }
  }
  ASSERT_TRUE(found) << "no recall returned a degraded block";

  // Fetch it: flagged, same size as the original, values within the bound.
  std::vector<FetchedBlock> fetched;
  ASSERT_TRUE(unix_->FetchBlocks("tiered", {degraded_id}, &fetched).ok());
  ASSERT_EQ(fetched.size(), 1u);
  EXPECT_TRUE(fetched[0].info.degraded());
  const std::string want = m.BlockBytes(degraded_id);
  ASSERT_EQ(fetched[0].payload.size(), want.size());
  EXPECT_NE(fetched[0].payload, want);
  std::vector<float> x(want.size() / 2), y(want.size() / 2);
  DecodeToFloat(reinterpret_cast<const uint8_t*>(want.data()), x.size(),
                DType::kFp16, x.data());
  DecodeToFloat(reinterpret_cast<const uint8_t*>(fetched[0].payload.data()),
                y.size(), DType::kFp16, y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::fabs(x[i] - y[i]), 2.0f / 254 + 2.0f / 1024) << i;
  }

  // One layer of a cold block, in block layout, equals the original's.
  uint64_t cold_id = 0;
  for (uint64_t b = 0; b < 40; ++b) {
    std::vector<FetchedBlock> one;
    ASSERT_TRUE(unix_->FetchBlocks("tiered", {b}, &one).ok());
    if (one[0].info.tier() == v1::TIER_COLD) {
      cold_id = b;
      EXPECT_EQ(one[0].payload, m.BlockBytes(b));
      break;
    }
  }
  grpc::ClientContext ctx;
  v1::FetchBlocksRequest fr;
  fr.set_stream_id("tiered");
  fr.add_block_ids(cold_id);
  fr.set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
  fr.add_layers(2);
  auto reader = unix_->stub()->FetchBlocks(&ctx, fr);
  v1::FetchBlocksResponse chunk;
  std::string layer;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.layer(), 2u);
    layer += chunk.data();
  }
  ASSERT_TRUE(reader->Finish().ok());
  // Expected: K then V of layer 2, [head][block token][dim], from the frames.
  const auto& f0 = m.frames()[2 * cold_id];
  const auto& f1 = m.frames()[2 * cold_id + 1];
  std::vector<float> expect;
  for (int kv = 0; kv < 2; ++kv) {
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      for (const auto* f : {&f0, &f1}) {
        const size_t slice = g.kv_heads * f->kv.tokens * g.head_dim;
        for (uint32_t tok = 0; tok < f->kv.tokens; ++tok) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            expect.push_back(
                f->kv.values[2 * slice * 2 + kv * slice +
                             (h * f->kv.tokens + tok) * g.head_dim + d]);
          }
        }
      }
    }
  }
  std::vector<float> got(layer.size() / 2);
  DecodeToFloat(reinterpret_cast<const uint8_t*>(layer.data()), got.size(),
                DType::kFp16, got.data());
  EXPECT_EQ(got, expect);
}

}  // namespace
}  // namespace kvmem

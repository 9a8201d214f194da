// Tenants, API keys, limits and TLS against the real kvmem-server: each
// RPC refuses a caller without a valid key, no tenant can
// see or touch another's stream through any RPC, quotas answer
// RESOURCE_EXHAUSTED, the TCP listener speaks TLS (with client
// certificates when asked), and keys never reach the log.
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <random>
#include <thread>

#include "client/cpp/kvmem_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/stream_model.h"
#include "tests/test_util.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToOutgoing;
using StatusCode = grpc::StatusCode;

constexpr char kKeyA[] = "key-of-tenant-a-0123456789";
constexpr char kKeyB[] = "key-of-tenant-b-9876543210";

v1::StreamConfig Config(const TestGeometry& g) {
  return testing::WireConfig(g, 8, 2, {1});
}

class SecurityTest : public ::testing::Test {
 protected:
  std::unique_ptr<ServerProcess> Start(std::vector<std::string> args) {
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = dir_.path() + "/data";
    o.unix_socket = dir_.path() + "/kvmem.sock";
    o.listen = "127.0.0.1:0";
    o.log_file = dir_.path() + "/server.log";
    o.extra_args = std::move(args);
    auto server = std::make_unique<ServerProcess>(o);
    std::string error;
    EXPECT_TRUE(server->Start(std::chrono::seconds(30), &error)) << error;
    return server;
  }
  std::unique_ptr<KvmemClient> Client(const ServerProcess& s,
                                      const std::string& key) {
    ClientOptions o;
    o.api_key = key;
    o.chunk_bytes = 500;
    return KvmemClient::Connect(s.target(), o);
  }
  std::string KeysFile() {
    const std::string path = dir_.path() + "/keys";
    std::ofstream(path) << "# tenant:key\ntenant-a:" << kKeyA
                        << "\n\ntenant-b:" << kKeyB << "\n";
    return path;
  }
  testing::TempDir dir_;
};

// Every RPC, as one caller: returns the statuses in a fixed order.
std::vector<std::pair<std::string, grpc::Status>> EveryRpc(
    KvmemClient& c, const std::string& id, const StreamModel& m) {
  std::vector<std::pair<std::string, grpc::Status>> out;
  v1::StreamStats stats;
  out.emplace_back("GetStreamStats", c.GetStreamStats(id, &stats));
  v1::RecallRequest rr;
  rr.set_stream_id(id);
  for (size_t i = 0; i < m.summary_dim(); ++i) rr.add_query(1.0f);
  v1::RecallResponse resp;
  out.emplace_back("Recall", c.Recall(rr, &resp));
  std::vector<FetchedBlock> fetched;
  out.emplace_back("FetchBlocks", c.FetchBlocks(id, {0}, &fetched));
  v1::AppendFramesResponse ar;
  out.emplace_back("AppendFrames",
                   c.AppendFrames(id, {ToOutgoing(m.frames()[0], 0)}, &ar));
  std::unique_ptr<SessionClient> session;
  out.emplace_back("Session", c.StartSession(id, nullptr, &session));
  out.emplace_back("CloseStream", c.CloseStream(id, &stats));
  out.emplace_back("DeleteStream", c.DeleteStream(id));
  return out;
}

TEST_F(SecurityTest, TenantsAreIsolatedOnEveryRpcAndKeysAreRequired) {
  auto server = Start({"--api_keys_file=" + KeysFile()});
  TestGeometry g;
  StreamModel m(g, 2, 8, {1});
  std::mt19937_64 rng(3);
  for (int i = 0; i < 6; ++i) m.AddFrame(rng, 4);
  auto a = Client(*server, kKeyA);
  auto b = Client(*server, kKeyB);
  auto none = Client(*server, "");
  auto wrong = Client(*server, "not-a-key-of-anyone-at-all");

  // Tenant A's stream "cam" with 6 frames.
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(a->OpenStream("cam", Config(g), &opened).ok());
  EXPECT_EQ(opened.stats().stream_id(), "cam");
  std::vector<OutgoingFrame> frames;
  for (uint64_t i = 0; i < 6; ++i)
    frames.push_back(ToOutgoing(m.frames()[i], i));
  v1::AppendFramesResponse ar;
  ASSERT_TRUE(a->AppendFrames("cam", frames, &ar).ok());

  // No key or a wrong key: UNAUTHENTICATED on every RPC (ListStreams and
  // OpenStream too).
  for (KvmemClient* c : {none.get(), wrong.get()}) {
    for (const auto& [rpc, st] : EveryRpc(*c, "cam", m)) {
      EXPECT_EQ(st.error_code(), StatusCode::UNAUTHENTICATED) << rpc;
    }
    v1::ListStreamsResponse list;
    EXPECT_EQ(c->ListStreams(&list).error_code(), StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(c->OpenStream("x", Config(g), &opened).error_code(),
              StatusCode::UNAUTHENTICATED);
  }
  // Tenant B cannot see, read, recall, fetch, append to, close or delete
  // A's stream: to B it does not exist.
  for (const auto& [rpc, st] : EveryRpc(*b, "cam", m)) {
    EXPECT_EQ(st.error_code(), StatusCode::NOT_FOUND) << rpc;
    EXPECT_THAT(st.error_message(), Not(HasSubstr("tenant-a"))) << rpc;
  }
  v1::ListStreamsResponse list;
  ASSERT_TRUE(b->ListStreams(&list).ok());
  EXPECT_EQ(list.streams_size(), 0);
  // B's own "cam" is another stream; A's is untouched.
  ASSERT_TRUE(b->OpenStream("cam", Config(g), &opened).ok());
  EXPECT_TRUE(opened.created());
  ASSERT_TRUE(b->AppendFrames("cam", {frames[0]}, &ar).ok());
  v1::StreamStats stats;
  ASSERT_TRUE(a->GetStreamStats("cam", &stats).ok());
  EXPECT_EQ(stats.stream_id(), "cam");
  EXPECT_EQ(stats.last_durable_frame(), 5);
  ASSERT_TRUE(b->GetStreamStats("cam", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 0);
  ASSERT_TRUE(a->ListStreams(&list).ok());
  ASSERT_EQ(list.streams_size(), 1);
  EXPECT_EQ(list.streams(0).stream_id(), "cam");
  EXPECT_EQ(list.streams(0).last_durable_frame(), 5);
  std::vector<FetchedBlock> fetched;
  ASSERT_TRUE(a->FetchBlocks("cam", {0, 2}, &fetched).ok());
  EXPECT_EQ(fetched[1].payload, m.BlockBytes(2));
  // A stream id may not name a namespace.
  EXPECT_EQ(b->GetStreamStats("tenant-a/cam", &stats).error_code(),
            StatusCode::INVALID_ARGUMENT);
  // Errors speak of the tenant's own ids.
  OutgoingFrame gap = frames[0];
  gap.header.set_frame_index(9);
  grpc::Status st = a->AppendFrames("cam", {gap}, &ar);
  EXPECT_EQ(st.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(),
              HasSubstr("stream \"cam\" last durable frame is 5"));
  EXPECT_THAT(st.error_message(), Not(HasSubstr("tenant-a")));
  // B deleting its "cam" leaves A's.
  ASSERT_TRUE(b->DeleteStream("cam").ok());
  ASSERT_TRUE(a->GetStreamStats("cam", &stats).ok());

  // Namespaces survive a restart; keys never reach the log.
  a.reset();
  b.reset();
  none.reset();
  wrong.reset();
  EXPECT_EQ(server->Stop(), 0);
  server = Start({"--api_keys_file=" + KeysFile()});
  a = Client(*server, kKeyA);
  ASSERT_TRUE(a->GetStreamStats("cam", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 5);
  a.reset();
  EXPECT_EQ(server->Stop(), 0);
  const std::string log = ReadFile(dir_.path() + "/server.log");
  EXPECT_THAT(log, HasSubstr("API keys on: 2 tenants"));
  EXPECT_THAT(log, Not(HasSubstr(kKeyA)));
  EXPECT_THAT(log, Not(HasSubstr(kKeyB)));
}

TEST_F(SecurityTest, LimitsAnswerResourceExhausted) {
  TestGeometry g;
  StreamModel m(g, 2, 8, {1});
  std::mt19937_64 rng(4);
  for (int i = 0; i < 4; ++i) m.AddFrame(rng, 4);
  const uint64_t frame_bytes = m.frames()[0].bytes.size();
  auto server = Start({"--max_streams_per_tenant=2",
                       "--max_stream_bytes=" + std::to_string(3 * frame_bytes),
                       "--max_calls_in_flight=3"});
  auto c = Client(*server, "");
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(c->OpenStream("s1", Config(g), &opened).ok());
  ASSERT_TRUE(c->OpenStream("s2", Config(g), &opened).ok());
  grpc::Status st = c->OpenStream("s3", Config(g), &opened);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--max_streams_per_tenant"));
  // Reopening an existing stream is not a new one.
  EXPECT_TRUE(c->OpenStream("s1", Config(g), &opened).ok());

  // Three frames fit, the fourth does not; nothing acknowledged is lost.
  v1::AppendFramesResponse ar;
  std::vector<OutgoingFrame> four;
  for (uint64_t i = 0; i < 4; ++i) four.push_back(ToOutgoing(m.frames()[i], i));
  st = c->AppendFrames("s1", four, &ar);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--max_stream_bytes"));
  EXPECT_THAT(st.error_message(), HasSubstr("last durable frame is 2"));
  v1::StreamStats stats;
  ASSERT_TRUE(c->GetStreamStats("s1", &stats).ok());
  EXPECT_EQ(stats.last_durable_frame(), 2);

  // Open sessions hold their slots: three open sessions take all three,
  // and a fourth call is refused until one ends.
  // A unary call's slot is freed when the server sees it end, which may be
  // after the client has its answer: retry while an earlier call lingers.
  std::unique_ptr<SessionClient> x, y, z;
  auto start = [&](const std::string& id, std::unique_ptr<SessionClient>* s) {
    grpc::Status status;
    for (int i = 0; i < 100; ++i) {
      status = c->StartSession(id, nullptr, s);
      if (status.error_code() != StatusCode::RESOURCE_EXHAUSTED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status;
  };
  ASSERT_TRUE(start("s1", &x).ok());
  ASSERT_TRUE(start("s2", &y).ok());
  ASSERT_TRUE(start("s2", &z).ok());
  st = c->GetStreamStats("s1", &stats);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--max_calls_in_flight"));
  ASSERT_TRUE(z->Finish().ok());
  z.reset();
  // The slot comes back once the server has seen the call end.
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    freed = c->GetStreamStats("s1", &stats).ok();
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(freed);
  ASSERT_TRUE(x->Finish().ok());
  ASSERT_TRUE(y->Finish().ok());
  x.reset();
  y.reset();
  c.reset();
  EXPECT_EQ(server->Stop(), 0);
}

// What a frame's signals keep in RAM counts against the byte limits with
// its payload: frames of one token (384 payload bytes) with 1,024 new
// tracks and an 8,192-float scene embedding each are refused past
// --max_stream_bytes (1 MiB) after a few frames, where their payload alone
// (24 KiB for all 64) would never reach it.
TEST_F(SecurityTest, SignalsCountAgainstTheByteLimits) {
  TestGeometry g;
  StreamModel m(g, 2, 8, {1});
  std::mt19937_64 rng(6);
  constexpr uint64_t kLimit = 1 << 20;
  auto server = Start({"--max_stream_bytes=" + std::to_string(kLimit)});
  auto c = Client(*server, "");
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(c->OpenStream("s", Config(g), &opened).ok());
  std::vector<OutgoingFrame> frames;
  for (uint64_t i = 0; i < 64; ++i) {
    OutgoingFrame f = ToOutgoing(m.AddFrame(rng, 1), i);
    v1::FrameSignals* sig = f.header.mutable_signals();
    for (uint64_t k = 0; k < 1024; ++k) {
      v1::Detection* d = sig->add_detections();
      d->set_track_id(i * 1024 + k + 1);
      d->set_x_max(0.5f);
      d->set_y_max(0.5f);
      d->set_score(0.9f);
    }
    for (int k = 0; k < 8192; ++k) sig->add_scene_embedding(k % 7 * 0.1f);
    frames.push_back(std::move(f));
  }
  v1::AppendFramesResponse ar;
  const grpc::Status st = c->AppendFrames("s", frames, &ar);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--max_stream_bytes"));
  EXPECT_THAT(st.error_message(), HasSubstr("signals"));
  v1::StreamStats stats;
  ASSERT_TRUE(c->GetStreamStats("s", &stats).ok());
  EXPECT_GE(stats.last_durable_frame(), 2);
  EXPECT_LT(stats.last_durable_frame(), 63);
  EXPECT_LT(stats.payload_bytes(), 64u * 384);
  // Refused because payload and signals together reach the limit.
  EXPECT_GT(stats.signal_bytes(), kLimit / 2);
  EXPECT_GT(stats.signal_bytes() + stats.payload_bytes() + 384, kLimit);
  EXPECT_GT(stats.track_histories(), 0u);
  std::cout << "refused after frame " << stats.last_durable_frame()
            << ": payload " << stats.payload_bytes() << " bytes, signals "
            << stats.signal_bytes() << " bytes in RAM\n";
  c.reset();
  EXPECT_EQ(server->Stop(), 0);
}

// Exactly one credential per call: two different keys (two tenants, or a
// valid key beside an invalid one) are UNAUTHENTICATED whichever header
// carries which; the same key in both headers is one credential.
TEST_F(SecurityTest, ExactlyOneCredentialPerCall) {
  auto server = Start({"--api_keys_file=" + KeysFile()});
  auto c = Client(*server, "");
  auto call = [&](std::vector<std::pair<std::string, std::string>> md) {
    grpc::ClientContext ctx;
    for (const auto& [k, v] : md) ctx.AddMetadata(k, v);
    v1::ListStreamsResponse resp;
    return c->stub()->ListStreams(&ctx, v1::ListStreamsRequest(), &resp);
  };
  const std::string bearer_a = std::string("Bearer ") + kKeyA;
  const std::string bearer_b = std::string("Bearer ") + kKeyB;
  EXPECT_TRUE(call({{"x-api-key", kKeyA}}).ok());
  EXPECT_TRUE(call({{"x-api-key", kKeyA}, {"authorization", bearer_a}}).ok());
  for (const auto& md :
       std::vector<std::vector<std::pair<std::string, std::string>>>{
           {{"x-api-key", kKeyA}, {"authorization", bearer_b}},
           {{"authorization", bearer_b}, {"x-api-key", kKeyA}},
           {{"authorization", bearer_a}, {"authorization", bearer_b}},
           {{"x-api-key", kKeyA}, {"x-api-key", "not-a-key-at-all-0000"}}}) {
    grpc::Status st = call(md);
    EXPECT_EQ(st.error_code(), StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(st.error_message(), HasSubstr("send exactly one"));
  }
  c.reset();
  EXPECT_EQ(server->Stop(), 0);
}

// Server-wide limits are split into per-tenant shares: tenant A holding
// all its calls, filling its bytes, or racing its stream creations
// refuses only itself; B keeps working; no refusal names the server's
// totals or the other tenant's use.
TEST_F(SecurityTest, TenantsCannotStarveEachOther) {
  TestGeometry g;
  StreamModel m(g, 2, 8, {1});
  std::mt19937_64 rng(4);
  for (int i = 0; i < 8; ++i) m.AddFrame(rng, 4);
  const uint64_t frame = m.frames()[0].bytes.size();
  auto server = Start({"--api_keys_file=" + KeysFile(),
                       "--max_calls_in_flight=6",  // 3 per tenant.
                       "--max_total_bytes=" + std::to_string(6 * frame),
                       "--max_frame_bytes_in_flight=" +
                           std::to_string(3 * frame),  // 1.5 frames each.
                       "--max_streams_per_tenant=2"});
  auto a = Client(*server, kKeyA);
  auto b = Client(*server, kKeyB);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(a->OpenStream("cam", Config(g), &opened).ok());
  ASSERT_TRUE(b->OpenStream("cam", Config(g), &opened).ok());

  std::vector<OutgoingFrame> five;
  for (uint64_t i = 0; i < 5; ++i) five.push_back(ToOutgoing(m.frames()[i], i));
  // Frame bytes in flight: a frame header reserves the whole frame; A's
  // share (1.5 frames) holds one; a second concurrent one is refused, B's
  // is not.
  ASSERT_TRUE(a->OpenStream("cam2", Config(g), &opened).ok());
  auto partial = [&](KvmemClient& c, const std::string& id,
                     grpc::ClientContext* ctx, v1::AppendFramesResponse* resp) {
    auto w = c.stub()->AppendFrames(ctx, resp);
    v1::AppendFramesRequest req;
    req.set_stream_id(id);
    *req.mutable_frame() = five[3].header;
    req.mutable_frame()->set_frame_index(0);
    req.mutable_frame()->set_payload_bytes(frame);
    req.mutable_frame()->set_payload(five[3].payload.substr(0, 16));
    EXPECT_TRUE(w->Write(req));
    return w;
  };
  grpc::ClientContext ctx1, ctx2, ctx3;
  v1::AppendFramesResponse r1, r2, r3;
  ctx1.AddMetadata("x-api-key", kKeyA);
  ctx2.AddMetadata("x-api-key", kKeyA);
  ctx3.AddMetadata("x-api-key", kKeyB);
  auto w1 = partial(*a, "cam2", &ctx1, &r1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto w2 = partial(*a, "cam", &ctx2, &r2);
  w2->WritesDone();
  grpc::Status st = w2->Finish();
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(),
              HasSubstr("its share of --max_frame_bytes_in_flight"));
  auto w3 = partial(*b, "cam", &ctx3, &r3);
  w3->WritesDone();
  st = w3->Finish();  // B's frame is admitted: only the call ends short.
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("the call ended inside frame 0"));
  w1->WritesDone();
  EXPECT_EQ(w1->Finish().error_code(), StatusCode::INVALID_ARGUMENT);

  // Bytes: A's share is 3 frames; the 4th is refused; B still appends.
  v1::AppendFramesResponse ar;
  st = a->AppendFrames("cam", five, &ar);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("its share of --max_total_bytes"));
  EXPECT_THAT(st.error_message(),
              HasSubstr("the server allows " + std::to_string(3 * frame)));
  EXPECT_THAT(st.error_message(), Not(HasSubstr(std::to_string(6 * frame))));
  EXPECT_THAT(st.error_message(), HasSubstr("last durable frame is 2"));
  std::vector<OutgoingFrame> three(five.begin(), five.begin() + 3);
  st = b->AppendFrames("cam", three, &ar);
  EXPECT_TRUE(st.ok()) << st.error_message();

  // Calls in flight: A holds its 3; its 4th is refused, B's are not.
  std::vector<std::unique_ptr<SessionClient>> held(3);
  for (auto& s : held) {
    grpc::Status started;
    for (int i = 0; i < 100; ++i) {
      started = a->StartSession("cam", nullptr, &s);
      if (started.error_code() != StatusCode::RESOURCE_EXHAUSTED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(started.ok()) << started.error_message();
  }
  v1::StreamStats stats;
  st = a->GetStreamStats("cam", &stats);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(),
              HasSubstr("its share of --max_calls_in_flight is 3"));
  EXPECT_THAT(st.error_message(), Not(HasSubstr("6")));
  EXPECT_TRUE(b->GetStreamStats("cam", &stats).ok());
  for (auto& s : held) ASSERT_TRUE(s->Finish().ok());
  held.clear();

  // Creations race: 8 threads create 8 streams of B at once; its limit is
  // 2 and it has 1: exactly one more is created.
  for (int round = 0; round < 5; ++round) {
    std::vector<std::thread> threads;
    std::atomic<int> created{0};
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        auto c = Client(*server, kKeyB);
        v1::OpenStreamResponse r;
        grpc::Status s =
            c->OpenStream("race-" + std::to_string(t), Config(g), &r);
        if (s.ok()) created += 1;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(created.load(), 1) << "round " << round;
    v1::ListStreamsResponse list;
    ASSERT_TRUE(b->ListStreams(&list).ok());
    EXPECT_EQ(list.streams_size(), 2);
    for (const auto& s : list.streams()) {
      if (s.stream_id() != "cam") {
        ASSERT_TRUE(b->DeleteStream(s.stream_id()).ok());
      }
    }
  }
  a.reset();
  b.reset();
  EXPECT_EQ(server->Stop(), 0);
}

TEST_F(SecurityTest, TlsListenerWithClientCertificates) {
  // A CA, a server certificate for localhost / 127.0.0.1 and a client
  // certificate, made with the openssl CLI.
  const std::string d = dir_.path();
  const std::string script =
      "cd " + d +
      " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kvmem-ca"
      " -keyout ca.key -out ca.pem"
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost"
      " -keyout server.key -out server.csr"
      " && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key"
      " -CAcreateserial -days 2 -extfile san.ext -out server.pem"
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=front-end"
      " -keyout client.key -out client.csr"
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key"
      " -CAcreateserial -days 2 -out client.pem) > openssl.log 2>&1";
  ASSERT_EQ(std::system(("(" + script).c_str()), 0)
      << ReadFile(d + "/openssl.log");
  auto server = Start({"--tls_cert_file=" + d + "/server.pem",
                       "--tls_key_file=" + d + "/server.key",
                       "--tls_client_ca_file=" + d + "/ca.pem"});
  ClientOptions tls;
  tls.tls_ca_file = d + "/ca.pem";
  tls.tls_cert_file = d + "/client.pem";
  tls.tls_key_file = d + "/client.key";
  auto good = KvmemClient::Connect(server->tcp_target(), tls);
  v1::ListStreamsResponse list;
  grpc::Status st = good->ListStreams(&list);
  EXPECT_TRUE(st.ok()) << st.error_message();
  // Without a client certificate, or in plaintext: no call gets through.
  ClientOptions no_cert;
  no_cert.tls_ca_file = d + "/ca.pem";
  auto anonymous = KvmemClient::Connect(server->tcp_target(), no_cert);
  EXPECT_EQ(anonymous->ListStreams(&list).error_code(),
            StatusCode::UNAVAILABLE);
  auto plain = KvmemClient::Connect(server->tcp_target());
  EXPECT_EQ(plain->ListStreams(&list).error_code(), StatusCode::UNAVAILABLE);
  // The unix socket is owner-only.
  struct stat sb;
  ASSERT_EQ(::stat((d + "/kvmem.sock").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  good.reset();
  anonymous.reset();
  plain.reset();
  EXPECT_EQ(server->Stop(), 0);
}

}  // namespace
}  // namespace kvmem

namespace kvmem {
namespace {

// A Session whose client sends recalls as fast as it can and reads none of
// the answers, until the server stops answering (no new answer for a
// second, after at least `seconds`; at most 60 s, for a slow build):
// requests the server answered (the stream's recall count) at the end and a
// second before it.
struct UnreadSession {
  uint64_t written = 0, answered = 0, answered_before = 0;
};
UnreadSession SendUnread(v1::KvMemory::Stub* stub,
                         const v1::RecallRequest& recall, KvmemClient& c,
                         int seconds) {
  v1::StreamStats before;
  EXPECT_TRUE(c.GetStreamStats("cam", &before).ok());
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::SessionRequest open;
  open.set_seq(1);
  open.mutable_open()->set_stream_id("cam");
  EXPECT_TRUE(stream->Write(open));
  std::atomic<uint64_t> written{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    v1::SessionRequest r;
    *r.mutable_recall() = recall;
    for (uint64_t seq = 2; !stop.load(); ++seq) {
      r.set_seq(seq);
      if (!stream->Write(r)) return;
      written.fetch_add(1);
    }
  });
  UnreadSession out;
  v1::StreamStats st;
  std::this_thread::sleep_for(std::chrono::seconds(seconds - 1));
  EXPECT_TRUE(c.GetStreamStats("cam", &st).ok());
  out.answered = st.recalls() - before.recalls();
  for (int waited = seconds - 1; waited < 60; ++waited) {
    out.answered_before = out.answered;
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_TRUE(c.GetStreamStats("cam", &st).ok());
    out.answered = st.recalls() - before.recalls();
    if (waited + 1 >= seconds && out.answered == out.answered_before) break;
  }
  out.written = written.load();
  stop = true;
  ctx.TryCancel();
  writer.join();
  return out;
}

// Clients that send recalls on a Session and never read the answers: the
// server queues at most 64 answers (16 MiB) per Session, then stops reading
// that Session; with its receive windows kept small, the requests parked in
// the server stay small too. What the client's own transport accepts is
// the client's memory: a client with gRPC's default (growing) windows takes
// ~20,000 answers before it stops the server; one with small windows a few
// hundred. Either way the server's RSS stays flat.
TEST_F(SecurityTest, ASessionThatIsNeverReadIsBounded) {
  auto server = Start({});
  auto c = Client(*server, "");
  TestGeometry g;
  StreamModel m(g, 8, 32, {1});
  std::mt19937_64 rng(3);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(c->OpenStream("cam", Config(g), &opened).ok());
  std::vector<OutgoingFrame> frames;
  for (int f = 0; f < 64; ++f) {
    frames.push_back(ToOutgoing(m.AddFrame(rng, 8), f));
  }
  v1::AppendFramesResponse ar;
  ASSERT_TRUE(c->AppendFrames("cam", frames, &ar).ok());
  const double rss0 = testing::RssKib(server->pid());
  v1::RecallRequest recall;
  for (size_t d = 0; d < m.summary_dim(); ++d) recall.add_query(1.0f);
  recall.mutable_budget()->set_max_tokens(64);

  // gRPC's defaults (the client's windows grow).
  const UnreadSession wide = SendUnread(c->stub(), recall, *c, 4);
  const double rss_wide = testing::RssKib(server->pid());
  // Small client windows: what the server answers is then its own bound.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto narrow_stub = v1::KvMemory::NewStub(grpc::CreateCustomChannel(
      server->target(), grpc::InsecureChannelCredentials(), args));
  const UnreadSession narrow = SendUnread(narrow_stub.get(), recall, *c, 4);
  const double rss_narrow = testing::RssKib(server->pid());
  std::cout << "unread Session, default client: wrote " << wide.written
            << ", answered " << wide.answered << " (" << wide.answered_before
            << " a second before), server RSS +" << (rss_wide - rss0)
            << " KiB; small-window client: wrote " << narrow.written
            << ", answered " << narrow.answered << " ("
            << narrow.answered_before << " a second before), server RSS +"
            << (rss_narrow - rss0) << " KiB\n";
  // Stopped: nothing answered in the last second.
  EXPECT_EQ(wide.answered, wide.answered_before);
  EXPECT_EQ(narrow.answered, narrow.answered_before);
  EXPECT_LT(narrow.answered, 2000u);
  // Requests parked in flight: the client's writes beyond the answers.
  EXPECT_LT(narrow.written - narrow.answered, 2000u);
  EXPECT_LT(wide.written - wide.answered, 2000u);
  if (!KVMEM_TEST_ASAN) {  // ASan's quarantine keeps what is freed.
    EXPECT_LT(rss_wide - rss0, 3 * 1024.0);
    EXPECT_LT(rss_narrow - rss0, 3 * 1024.0);
  }
  // The Session still works for a client that reads.
  std::unique_ptr<SessionClient> s;
  ASSERT_TRUE(c->StartSession("cam", nullptr, &s).ok());
  v1::RecallRequest q;
  for (size_t d = 0; d < m.summary_dim(); ++d) q.add_query(1.0f);
  v1::RecallResponse r;
  EXPECT_TRUE(s->Recall(q, &r).ok());
  EXPECT_TRUE(s->Finish().ok());
}

// FetchBlocks calls whose chunks are never read: each block a call reads
// counts in its tenant's share of --max_queued_response_bytes until its
// last chunk is written, and a read ahead must leave half the share free.
// With cold blocks of 2 MiB and a share of 4 MiB two calls hold a block each
// and the other fourteen are refused before reading anything; without the
// count each call pinned two blocks (64 MiB for the sixteen). A fetch of one
// layer counts the whole block (its read builds the block from its frames).
// A reader then fetches every block, and the client resumes a fetch refused
// for room once the share comes back.
TEST_F(SecurityTest, FetchesThatAreNeverReadHoldAtMostTheirShare) {
  auto server = Start({"--max_queued_response_bytes=4194304"});
  auto c = Client(*server, "");
  TestGeometry g;
  g.layers = 4;
  g.kv_heads = 8;
  g.head_dim = 128;  // 16 KiB a token: 256 KiB frames, 2 MiB blocks.
  StreamModel m(g, 8, 32, {1});
  std::mt19937_64 rng(8);
  v1::StreamConfig config = testing::WireConfig(g, 32, 8, {1});
  config.mutable_tier_policy()->set_warm_budget_bytes(1);  // All cold.
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(c->OpenStream("cam", config, &opened).ok());
  std::vector<OutgoingFrame> frames;
  for (int f = 0; f < 66; ++f) {
    frames.push_back(ToOutgoing(m.AddFrame(rng, 16), f));
  }
  v1::AppendFramesResponse ar;
  ASSERT_TRUE(c->AppendFrames("cam", frames, &ar).ok());
  v1::StreamStats stats;
  ASSERT_TRUE(c->GetStreamStats("cam", &stats).ok());
  ASSERT_GE(stats.sealed_blocks(), 8u);
  ASSERT_EQ(stats.warm().blocks(), 0u);

  // Small client windows (no BDP probe): the server holds what it read.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub = v1::KvMemory::NewStub(grpc::CreateCustomChannel(
      server->target(), grpc::InsecureChannelCredentials(), args));
  constexpr int kCalls = 16;
  // kCalls fetches of `req` left unread for a while: how many were refused,
  // and the server's RSS growth meanwhile (KiB).
  auto unread = [&](const v1::FetchBlocksRequest& req, double* grown) {
    const double rss0 = testing::RssKib(server->pid());
    std::vector<std::unique_ptr<grpc::ClientContext>> ctx(kCalls);
    std::vector<std::unique_ptr<grpc::ClientReader<v1::FetchBlocksResponse>>>
        readers(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      ctx[i] = std::make_unique<grpc::ClientContext>();
      ctx[i]->AddMetadata("kvmem-stream-id", "cam");
      readers[i] = stub->FetchBlocks(ctx[i].get(), req);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    *grown = testing::RssKib(server->pid()) - rss0;
    int refused = 0;
    for (int i = 0; i < kCalls; ++i) {
      v1::FetchBlocksResponse chunk;
      if (readers[i]->Read(&chunk)) {  // One holding a block: let it go.
        ctx[i]->TryCancel();
        readers[i]->Finish();
        continue;
      }
      const grpc::Status st = readers[i]->Finish();
      EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(st.error_message(), HasSubstr("FetchBlocks sent 0 of 8"));
      // The count also in the trailing metadata, for clients to resume by.
      const auto& trailers = ctx[i]->GetServerTrailingMetadata();
      auto sent = trailers.find("kvmem-blocks-sent");
      EXPECT_TRUE(sent != trailers.end() &&
                  std::string(sent->second.data(), sent->second.size()) == "0");
      EXPECT_THAT(st.error_message(), HasSubstr("--max_queued_response_bytes"));
      ++refused;
    }
    return refused;
  };
  // The share comes back: a client that reads gets every block, intact.
  auto read_all = [&] {
    std::vector<FetchedBlock> fetched;
    grpc::Status st;
    for (int attempt = 0; attempt < 50; ++attempt) {
      st = c->FetchBlocks("cam", {0, 1, 2, 3, 4, 5, 6, 7}, &fetched);
      if (st.error_code() != StatusCode::RESOURCE_EXHAUSTED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(fetched.size(), 8u);
    for (uint64_t b = 0; b < 8; ++b) {
      EXPECT_EQ(fetched[b].payload, m.BlockBytes(b)) << "block " << b;
    }
  };
  v1::FetchBlocksRequest req;
  req.set_stream_id("cam");
  for (uint64_t b = 0; b < 8; ++b) req.add_block_ids(b);
  double grown = 0;
  int refused = unread(req, &grown);
  std::cout << "unread fetches: " << refused << " of " << kCalls
            << " refused, server RSS +" << grown << " KiB\n";
  EXPECT_GE(refused, kCalls - 2);
  if (!KVMEM_TEST_ASAN) {  // ASan's quarantine keeps what is freed.
    EXPECT_LT(grown, 24 * 1024.0);
  }
  read_all();
  // One layer of four, layer-major: each read still holds a whole block.
  req.set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
  req.add_layers(0);
  refused = unread(req, &grown);
  std::cout << "unread one-layer fetches: " << refused << " of " << kCalls
            << " refused\n";
  EXPECT_GE(refused, kCalls - 2);
  read_all();

  // The client resumes a fetch refused for room: two unread fetches hold
  // the share (a probe is refused), and are let go 150 ms into the
  // client's FetchBlocks, which still returns every block, intact, in one
  // call (before 2026-12-07 it returned the refusal).
  req.set_layout(v1::PAYLOAD_LAYOUT_FRAME_MAJOR);
  req.clear_layers();
  std::vector<std::unique_ptr<grpc::ClientContext>> hold_ctx(3);
  std::vector<std::unique_ptr<grpc::ClientReader<v1::FetchBlocksResponse>>>
      holders(3);
  for (int i = 0; i < 3; ++i) {
    hold_ctx[i] = std::make_unique<grpc::ClientContext>();
    hold_ctx[i]->AddMetadata("kvmem-stream-id", "cam");
    holders[i] = stub->FetchBlocks(hold_ctx[i].get(), req);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  v1::FetchBlocksResponse probe;
  EXPECT_FALSE(holders[2]->Read(&probe));
  const grpc::Status probed = holders[2]->Finish();
  EXPECT_EQ(probed.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << probed.error_message();
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    for (int i = 0; i < 2; ++i) {
      hold_ctx[i]->TryCancel();
      holders[i]->Finish();
    }
  });
  std::vector<FetchedBlock> fetched;
  const grpc::Status resumed =
      c->FetchBlocks("cam", {0, 1, 2, 3, 4, 5, 6, 7}, &fetched);
  release.join();
  ASSERT_TRUE(resumed.ok()) << resumed.error_message();
  ASSERT_EQ(fetched.size(), 8u);
  for (uint64_t b = 0; b < 8; ++b) {
    EXPECT_EQ(fetched[b].payload, m.BlockBytes(b)) << "block " << b;
  }
  c.reset();
  EXPECT_EQ(server->Stop(), 0);
}

// Large answers (recalls delivering their tokens inline, 1 MiB each): the
// Session stops reading once its tenant's queued answers pass its share of
// --max_queued_response_bytes (4 MiB here), long before 64 answers, and
// reads again for a client that reads.
TEST_F(SecurityTest, QueuedAnswersCountInTheTenantsShare) {
  auto server = Start({"--max_queued_response_bytes=4194304"});
  auto c = KvmemClient::Connect(server->target(), ClientOptions{});
  TestGeometry g;
  g.layers = 8;
  g.kv_heads = 4;
  g.head_dim = 64;
  StreamModel m(g, 8, 32, {1});
  std::mt19937_64 rng(4);
  v1::OpenStreamResponse opened;
  ASSERT_TRUE(c->OpenStream("cam", Config(g), &opened).ok());
  for (int f = 0; f < 96; ++f) {
    v1::AppendFramesResponse ar;
    const grpc::Status st =
        c->AppendFrames("cam", {ToOutgoing(m.AddFrame(rng, 16), f)}, &ar);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  v1::RecallRequest recall;
  for (size_t d = 0; d < m.summary_dim(); ++d) recall.add_query(1.0f);
  recall.mutable_budget()->set_max_tokens(128);
  recall.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_INLINE);
  recall.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR);
  // One answer's size, read normally.
  std::unique_ptr<SessionClient> s;
  ASSERT_TRUE(c->StartSession("cam", nullptr, &s).ok());
  v1::RecallResponse one;
  ASSERT_TRUE(s->Recall(recall, &one).ok());
  ASSERT_TRUE(s->Finish().ok());
  const double answer_kib = one.ByteSizeLong() / 1024.0;
  ASSERT_GT(answer_kib, 512);
  ASSERT_GT(one.delivered_bytes(), 512u << 10);
  const double rss0 = testing::RssKib(server->pid());

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::KvMemory::NewStub(grpc::CreateCustomChannel(
      server->target(), grpc::InsecureChannelCredentials(), args));
  const UnreadSession u = SendUnread(stub.get(), recall, *c, 4);
  const double rss = testing::RssKib(server->pid());
  std::cout << "unread Session of " << answer_kib << " KiB answers: answered "
            << u.answered << ", server RSS +" << (rss - rss0) << " KiB\n";
  EXPECT_EQ(u.answered, u.answered_before);
  // 4 MiB of answers held, one more queued past it, one in the client's
  // window: far below the Session's own bound of 64 (16 MiB).
  EXPECT_LE(u.answered, static_cast<uint64_t>(4096 / answer_kib) + 3);
  if (!KVMEM_TEST_ASAN) {  // ASan's quarantine keeps what is freed.
    EXPECT_LT(rss - rss0, 4096 + 3 * answer_kib + 4096);
  }
  // A Session that reads is answered in full meanwhile and after.
  ASSERT_TRUE(c->StartSession("cam", nullptr, &s).ok());
  for (int i = 0; i < 3; ++i) {
    v1::RecallResponse r;
    ASSERT_TRUE(s->Recall(recall, &r).ok());
    // Timings vary in their varints' length; what is delivered does not.
    EXPECT_EQ(r.delivered_bytes(), one.delivered_bytes());
    EXPECT_EQ(r.total_tokens(), one.total_tokens());
  }
  EXPECT_TRUE(s->Finish().ok());
}

}  // namespace
}  // namespace kvmem

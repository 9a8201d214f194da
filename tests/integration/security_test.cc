// Tenants, API keys, limits and TLS against the real kvmem-server
// (issue 7): each RPC refuses a caller without a valid key, no tenant can
// see or touch another's stream through any RPC, quotas answer
// RESOURCE_EXHAUSTED, the TCP listener speaks TLS (with client
// certificates when asked), and keys never reach the log.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <thread>

#include "client/kvmem_client.h"
#include "client/server_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/stream_model.h"
#include "tests/wire_fixture.h"

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

// Scale-out through an existing proxy: three real kvmem-server
// instances behind nginx, configured by deploy/nginx/kvmem.conf (only its
// upstream addresses and listen port swapped for loopback ones). Checks that
// every call of a stream (OpenStream, AppendFrames, Session, Recall,
// GetStreamStats, FetchBlocks) lands on one instance, that stopping and
// restarting one instance leaves the other instances' streams untouched and
// working, that the stopped instance's streams fail (UNAVAILABLE) instead of
// moving, and that they recover with their data after the restart.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "client/cpp/kvmem_client.h"
#include "gtest/gtest.h"
#include "tests/stream_model.h"
#include "tests/test_util.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

extern char** environ;

namespace kvmem {
namespace {

using testing::ReadFile;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToOutgoing;

constexpr int kInstances = 3;
constexpr int kStreams = 24;
constexpr uint32_t kTokens = 16;

// deploy/nginx/kvmem.conf with its upstream servers and listen port
// replaced; fails the test when the file no longer has the expected lines.
std::string LoopbackConfig(const std::vector<int>& ports, int listen_port) {
  std::string conf = ReadFile(KVMEM_NGINX_CONF);
  const std::regex server_line(R"(server kvmem-(\d):50551 ([^;]*);)");
  size_t found = 0;
  std::string out;
  auto begin = std::sregex_iterator(conf.begin(), conf.end(), server_line);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const int i = std::stoi((*it)[1]);
    EXPECT_LT(i, static_cast<int>(ports.size()));
    out += conf.substr(last, it->position() - last);
    out += "server 127.0.0.1:" + std::to_string(ports.at(i)) + " " +
           (*it)[2].str() + ";";
    last = it->position() + it->length();
    ++found;
  }
  out += conf.substr(last);
  EXPECT_EQ(found, ports.size())
      << "upstream server lines in " << KVMEM_NGINX_CONF;
  const std::string listen = "listen 50550 http2;";
  const size_t at = out.find(listen);
  EXPECT_NE(at, std::string::npos) << KVMEM_NGINX_CONF;
  if (at != std::string::npos) {
    out.replace(at, listen.size(),
                "listen 127.0.0.1:" + std::to_string(listen_port) + " http2;");
  }
  return out;
}

class Nginx {
 public:
  Nginx(const std::string& dir, const std::string& conf) : dir_(dir) {
    std::filesystem::create_directories(dir + "/logs");
    std::ofstream(dir + "/nginx.conf") << conf;
    const std::string globals = "daemon off; pid " + dir + "/nginx.pid; " +
                                "error_log " + dir + "/error.log info;";
    std::vector<std::string> args = {KVMEM_NGINX,         "-p", dir + "/", "-c",
                                     dir + "/nginx.conf", "-g", globals};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) !=
        0) {
      pid_ = -1;
    }
  }
  ~Nginx() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  bool running() const {
    return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0;
  }
  std::string error_log() const { return ReadFile(dir_ + "/error.log"); }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

struct Cam {
  std::string id;
  StreamModel model;
  std::string instance;            // Where ListStreams found it.
  std::vector<uint64_t> recalled;  // Last recall's block ids.
};

class NginxShardingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(KVMEM_NGINX))
        << KVMEM_NGINX << " missing: run deploy/bootstrap.sh (installs nginx)";
  }

  std::unique_ptr<ServerProcess> StartInstance(int i, int port) {
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = dir_.path() + "/data-" + std::to_string(i);
    o.listen = "127.0.0.1:" + std::to_string(port);
    o.log_file = dir_.path() + "/server-" + std::to_string(i) + ".log";
    o.extra_args = {"--instance_name=kvmem-" + std::to_string(i)};
    auto s = std::make_unique<ServerProcess>(o);
    std::string error;
    EXPECT_TRUE(s->Start(std::chrono::seconds(30), &error)) << error;
    return s;
  }

  static v1::RecallRequest Query(const Cam& c) {
    std::mt19937_64 rng(std::hash<std::string>()(c.id));
    std::normal_distribution<float> n;
    v1::RecallRequest r;
    r.set_stream_id(c.id);
    for (size_t i = 0; i < c.model.summary_dim(); ++i) r.add_query(n(rng));
    r.mutable_budget()->set_top_k(4);
    r.mutable_budget()->set_max_tokens(128);
    return r;
  }

  // GetStreamStats through the proxy; *instance gets the kvmem-instance
  // response metadata.
  static grpc::Status StatsVia(KvmemClient& c, const std::string& id,
                               v1::StreamStats* stats, std::string* instance) {
    grpc::ClientContext ctx;
    KvmemClient::Authorize(c.options(), &ctx, id);
    v1::GetStreamStatsRequest req;
    req.set_stream_id(id);
    grpc::Status s = c.stub()->GetStreamStats(&ctx, req, stats);
    const auto& md = ctx.GetServerInitialMetadata();
    auto it = md.find(kInstanceHeader);
    instance->assign(it == md.end()
                         ? ""
                         : std::string(it->second.data(), it->second.size()));
    return s;
  }

  // Which instance each stream is on, asked of each instance directly.
  std::map<std::string, std::vector<std::string>> Placement() {
    std::map<std::string, std::vector<std::string>> where;
    for (int i = 0; i < kInstances; ++i) {
      if (!servers_[i]) continue;
      auto direct = KvmemClient::Connect(servers_[i]->tcp_target());
      v1::ListStreamsResponse list;
      EXPECT_TRUE(direct->ListStreams(&list).ok());
      for (const auto& s : list.streams()) {
        where[s.stream_id()].push_back("kvmem-" + std::to_string(i));
      }
    }
    return where;
  }

  // Appends frames [from, to) of c's model over AppendFrames.
  static void Append(KvmemClient& c, Cam& cam, size_t from, size_t to) {
    std::vector<OutgoingFrame> frames;
    for (size_t f = from; f < to; ++f) {
      frames.push_back(ToOutgoing(cam.model.frames()[f], f));
    }
    v1::AppendFramesResponse resp;
    grpc::Status s = c.AppendFrames(cam.id, frames, &resp);
    ASSERT_TRUE(s.ok()) << cam.id << ": " << s.error_message();
    ASSERT_EQ(resp.last_durable_frame(), static_cast<int64_t>(to) - 1);
  }

  testing::TempDir dir_;
  std::unique_ptr<ServerProcess> servers_[kInstances];
};

TEST_F(NginxShardingTest, StreamsStayOnOneInstanceAcrossARestart) {
  std::vector<int> ports;
  for (int i = 0; i < kInstances; ++i) {
    servers_[i] = StartInstance(i, 0);
    ASSERT_FALSE(servers_[i]->tcp_target().empty());
    ports.push_back(std::stoi(servers_[i]->tcp_target().substr(10)));
  }
  const int proxy_port = testing::FreeLoopbackPort();
  Nginx nginx(dir_.path() + "/nginx", LoopbackConfig(ports, proxy_port));
  auto client = KvmemClient::Connect("127.0.0.1:" + std::to_string(proxy_port));
  grpc::health::v1::HealthCheckResponse health;
  for (int t = 0; t < 100 && !client->CheckHealth("", &health).ok(); ++t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(client->CheckHealth("", &health).ok())
      << "nginx not serving: " << nginx.error_log();

  // A per-stream call without kvmem-stream-id would be hashed nowhere
  // (nginx round-robins an empty key): refused; ListStreams passes.
  {
    grpc::ClientContext ctx;
    v1::GetStreamStatsRequest req;
    req.set_stream_id("cam-0");
    v1::StreamStats stats;
    grpc::Status st = client->stub()->GetStreamStats(&ctx, req, &stats);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("missing metadata kvmem-stream-id"),
              std::string::npos)
        << st.error_message();
    v1::ListStreamsResponse list;
    EXPECT_TRUE(client->ListStreams(&list).ok());
  }

  const TestGeometry g;
  std::mt19937_64 rng(42);
  std::vector<Cam> cams;
  for (int i = 0; i < kStreams; ++i) {
    cams.push_back(
        {"cam-" + std::to_string(i), StreamModel(g, 4, 64, {1}), "", {}});
    for (int f = 0; f < 12; ++f) cams.back().model.AddFrame(rng, kTokens);
  }
  const v1::StreamConfig config = testing::WireConfig(g, 64, 4, {1});

  // Every kind of call, through the proxy.
  for (Cam& c : cams) {
    v1::OpenStreamResponse opened;
    ASSERT_TRUE(client->OpenStream(c.id, config, &opened).ok());
    Append(*client, c, 0, 8);
    std::unique_ptr<SessionClient> session;
    ASSERT_TRUE(client->StartSession(c.id, nullptr, &session).ok());
    for (size_t f = 8; f < 12; ++f) {
      v1::AppendAck ack;
      ASSERT_TRUE(
          session->Append(ToOutgoing(c.model.frames()[f], f), &ack).ok());
    }
    v1::RecallResponse via_session;
    ASSERT_TRUE(session->Recall(Query(c), &via_session).ok());
    ASSERT_TRUE(session->Finish().ok());
    v1::RecallResponse resp;
    ASSERT_TRUE(client->Recall(Query(c), &resp).ok());
    ASSERT_GT(resp.blocks_size(), 0);
    for (const auto& b : resp.blocks()) c.recalled.push_back(b.block_id());
    std::vector<uint64_t> session_ids;
    for (const auto& b : via_session.blocks()) {
      session_ids.push_back(b.block_id());
    }
    ASSERT_EQ(session_ids, c.recalled) << c.id;
    std::vector<FetchedBlock> blocks;
    ASSERT_TRUE(client->FetchBlocks(c.id, c.recalled, &blocks).ok());
    ASSERT_EQ(blocks.size(), c.recalled.size());
  }

  // Each stream exists on exactly one instance, which saw all its calls.
  std::map<std::string, int> per_instance;
  auto where = Placement();
  for (Cam& c : cams) {
    ASSERT_EQ(where[c.id].size(), 1u) << c.id << " is on several instances";
    c.instance = where[c.id][0];
    ++per_instance[c.instance];
    auto direct =
        KvmemClient::Connect(servers_[c.instance.back() - '0']->tcp_target());
    v1::StreamStats s;
    ASSERT_TRUE(direct->GetStreamStats(c.id, &s).ok());
    EXPECT_EQ(s.frames(), 12u) << c.id;
    EXPECT_EQ(s.recalls(), 2u) << c.id;  // Session's and the unary one.
    // Stable: repeated calls through the proxy name the same instance.
    for (int k = 0; k < 3; ++k) {
      std::string instance;
      ASSERT_TRUE(StatsVia(*client, c.id, &s, &instance).ok());
      EXPECT_EQ(instance, c.instance) << c.id;
    }
  }
  for (const auto& [name, n] : per_instance) {
    std::printf("  %s holds %d of %d streams\n", name.c_str(), n, kStreams);
  }
  ASSERT_GE(per_instance.size(), 2u) << "hashing put every stream on one "
                                        "instance";

  // Stop the instance holding the most streams.
  std::string victim;
  for (const auto& [name, n] : per_instance) {
    if (victim.empty() || n > per_instance[victim]) victim = name;
  }
  const int v = victim.back() - '0';
  ASSERT_EQ(servers_[v]->Stop(), 0);
  servers_[v].reset();
  size_t moved_calls = 0;
  for (Cam& c : cams) {
    v1::StreamStats s;
    std::string instance;
    grpc::Status st = StatsVia(*client, c.id, &s, &instance);
    if (c.instance == victim) {
      // Fails rather than reaching another instance.
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE)
          << c.id << ": " << st.error_message();
      EXPECT_NE(st.error_message().find("instance holding this stream is "
                                        "unavailable"),
                std::string::npos)
          << st.error_message();
      moved_calls += st.ok();
      continue;
    }
    // The others' streams: untouched and still writable.
    ASSERT_TRUE(st.ok()) << c.id << ": " << st.error_message();
    EXPECT_EQ(instance, c.instance);
    EXPECT_EQ(s.frames(), 12u);
    for (int f = 0; f < 4; ++f) c.model.AddFrame(rng, kTokens);
    Append(*client, c, 12, 16);
    v1::RecallResponse resp;
    ASSERT_TRUE(client->Recall(Query(c), &resp).ok());
  }
  EXPECT_EQ(moved_calls, 0u);
  for (const auto& [id, on] : Placement()) {
    EXPECT_EQ(on.size(), 1u) << id << " was opened on a second instance";
  }

  // Restart it on the same port: its streams come back with their data.
  servers_[v] = StartInstance(v, ports[v]);
  for (Cam& c : cams) {
    v1::StreamStats s;
    std::string instance;
    grpc::Status st;
    for (int t = 0; t < 50; ++t) {  // nginx reconnects to the instance.
      st = StatsVia(*client, c.id, &s, &instance);
      if (st.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(st.ok()) << c.id << ": " << st.error_message();
    EXPECT_EQ(instance, c.instance) << c.id;
    const uint64_t frames = c.instance == victim ? 12 : 16;
    EXPECT_EQ(s.frames(), frames) << c.id;
    EXPECT_EQ(s.last_durable_frame(), static_cast<int64_t>(frames) - 1);
    if (c.instance != victim) continue;
    v1::RecallResponse resp;
    ASSERT_TRUE(client->Recall(Query(c), &resp).ok());
    std::vector<uint64_t> ids;
    for (const auto& b : resp.blocks()) ids.push_back(b.block_id());
    EXPECT_EQ(ids, c.recalled) << c.id << ": recall changed by the restart";
    std::vector<FetchedBlock> blocks;
    ASSERT_TRUE(client->FetchBlocks(c.id, {0, 1}, &blocks).ok());
    ASSERT_EQ(blocks.size(), 2u);
    EXPECT_EQ(blocks[0].payload, c.model.BlockBytes(0));
    EXPECT_EQ(blocks[1].payload, c.model.BlockBytes(1));
    for (int f = 0; f < 4; ++f) c.model.AddFrame(rng, kTokens);
    Append(*client, c, 12, 16);  // Resumes at durable + 1.
  }
  for (const auto& [id, on] : Placement()) {
    EXPECT_EQ(on.size(), 1u) << id;
  }
  EXPECT_TRUE(nginx.running());
}

}  // namespace
}  // namespace kvmem
